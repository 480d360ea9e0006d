//! The request metrics of each volume's export, counted as requests run: per volume and
//! operation, requests, bytes, errors and a latency histogram, and requests in flight and
//! throttled (see [`super::metrics`] for the rules on labels).
//!
//! A file apart from the registry ([`super::metrics`]) because the engines' exports hold these
//! counters while the registry reads the engines: each side uses this file, not the other.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Instant;

use hawser_api::agent::{OpCounters, VolumeIoCounters};
use hawser_api::metrics::LATENCY_BUCKETS_SECS;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

type Labels = Vec<(&'static str, String)>;

/// The operations counted, as their `op` label says them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum IoOp {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
}

impl IoOp {
    pub(crate) const ALL: [IoOp; 5] = [
        IoOp::Read,
        IoOp::Write,
        IoOp::Flush,
        IoOp::Trim,
        IoOp::WriteZeroes,
    ];

    fn label(self) -> &'static str {
        match self {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::Flush => "flush",
            IoOp::Trim => "trim",
            IoOp::WriteZeroes => "write_zeroes",
        }
    }
}

/// The families of the request metrics; one series per (volume, op). Clones share them.
#[derive(Clone)]
pub struct IoMetrics {
    requests: Family<Labels, Counter>,
    bytes: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
    in_flight: Family<Labels, Gauge>,
    throttled: Family<Labels, Counter>,
    throttle_wait: Family<Labels, Counter<f64, AtomicU64>>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_SECS)
}

impl Default for IoMetrics {
    fn default() -> Self {
        IoMetrics {
            requests: Family::default(),
            bytes: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            in_flight: Family::default(),
            throttled: Family::default(),
            throttle_wait: Family::default(),
        }
    }
}

impl IoMetrics {
    pub(crate) fn register(&self, h: &mut Registry) {
        h.register(
            "volume_requests",
            "Requests answered, by volume and operation",
            self.requests.clone(),
        );
        h.register_with_unit(
            "volume_request",
            "Bytes read or written by requests that succeeded",
            Unit::Bytes,
            self.bytes.clone(),
        );
        h.register(
            "volume_request_errors",
            "Requests answered with an error",
            self.errors.clone(),
        );
        h.register_with_unit(
            "volume_request_duration",
            "Time from a request's arrival at the volume to its answer",
            Unit::Seconds,
            self.latency.clone(),
        );
        h.register(
            "volume_requests_in_flight",
            "Requests the volume is running now",
            self.in_flight.clone(),
        );
        h.register(
            "volume_requests_throttled",
            "Requests the volume's limits (QoS) held back before they ran",
            self.throttled.clone(),
        );
        h.register_with_unit(
            "volume_throttle_wait",
            "Time requests waited for the volume's limits (QoS), summed",
            Unit::Seconds,
            self.throttle_wait.clone(),
        );
    }

    /// The request metrics of `volume`'s export (made now; their series go when it drops).
    pub fn volume(&self, volume: &str) -> VolumeIo {
        let op = |op: IoOp| {
            let l = labels(volume, Some(op));
            OpIo {
                requests: self.requests.get_or_create(&l).clone(),
                bytes: self.bytes.get_or_create(&l).clone(),
                errors: self.errors.get_or_create(&l).clone(),
                latency: self.latency.get_or_create(&l).clone(),
                latency_ns: AtomicU64::new(0),
            }
        };
        VolumeIo {
            volume: volume.to_string(),
            started_ms: unix_ms(),
            ops: IoOp::ALL.map(op),
            in_flight: self.in_flight.get_or_create(&labels(volume, None)).clone(),
            throttled: self.throttled.get_or_create(&labels(volume, None)).clone(),
            throttle_wait: self
                .throttle_wait
                .get_or_create(&labels(volume, None))
                .clone(),
            families: self.clone(),
        }
    }
}

/// One operation's handles.
struct OpIo {
    requests: Counter,
    bytes: Counter,
    errors: Counter,
    latency: Histogram,
    /// The latencies' sum, for `GET /v1/io` (the histogram does not tell its sum).
    latency_ns: AtomicU64,
}

/// A volume's request metrics, held by its export.
pub struct VolumeIo {
    volume: String,
    /// When the export started, Unix milliseconds.
    started_ms: u64,
    ops: [OpIo; 5],
    in_flight: Gauge,
    throttled: Counter,
    throttle_wait: Counter<f64, AtomicU64>,
    families: IoMetrics,
}

/// A request being counted: ends with [`VolumeIo::done`].
pub struct Started {
    op: IoOp,
    at: Instant,
}

impl VolumeIo {
    /// Counts the start of a request.
    pub fn start(&self, op: IoOp) -> Started {
        self.in_flight.inc();
        Started {
            op,
            at: Instant::now(),
        }
    }

    /// Counts the end of a request that moved `bytes` (or failed: `ok` false).
    pub fn done(&self, s: Started, bytes: u64, ok: bool) {
        self.in_flight.dec();
        // `ops` is in the order of `IoOp::ALL`, which is the declaration order.
        let m = &self.ops[s.op as usize];
        m.requests.inc();
        if ok {
            m.bytes.inc_by(bytes);
        } else {
            m.errors.inc();
        }
        let took = s.at.elapsed();
        m.latency.observe(took.as_secs_f64());
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        m.latency_ns.fetch_add(ns, AtomicOrdering::Relaxed);
    }

    /// Counts a request the volume's limits held back for `waited`.
    pub fn throttled(&self, waited: std::time::Duration) {
        self.throttled.inc();
        self.throttle_wait.inc_by(waited.as_secs_f64());
    }

    /// The counts so far, for `GET /v1/io` (`node` is this agent's).
    pub fn counters(&self, node: &str) -> VolumeIoCounters {
        let op = |op: IoOp| {
            let m = &self.ops[op as usize];
            OpCounters {
                requests: m.requests.get(),
                bytes: m.bytes.get(),
                errors: m.errors.get(),
                latency_sum_secs: m.latency_ns.load(AtomicOrdering::Relaxed) as f64 / 1e9,
            }
        };
        let (trim, zeroes) = (op(IoOp::Trim), op(IoOp::WriteZeroes));
        VolumeIoCounters {
            volume: self.volume.clone(),
            node: node.to_string(),
            started_ms: self.started_ms,
            read: op(IoOp::Read),
            write: op(IoOp::Write),
            flush: op(IoOp::Flush),
            other: OpCounters {
                requests: trim.requests + zeroes.requests,
                bytes: trim.bytes + zeroes.bytes,
                errors: trim.errors + zeroes.errors,
                latency_sum_secs: trim.latency_sum_secs + zeroes.latency_sum_secs,
            },
            in_flight: self.in_flight.get(),
        }
    }
}

pub(crate) fn unix_ms() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Drop for VolumeIo {
    /// A stopped export's series go with it: the label set stays bounded by the volumes
    /// this node serves now.
    fn drop(&mut self) {
        for op in IoOp::ALL {
            let l = labels(&self.volume, Some(op));
            self.families.requests.remove(&l);
            self.families.bytes.remove(&l);
            self.families.errors.remove(&l);
            self.families.latency.remove(&l);
        }
        let l = labels(&self.volume, None);
        self.families.in_flight.remove(&l);
        self.families.throttled.remove(&l);
        self.families.throttle_wait.remove(&l);
    }
}

fn labels(volume: &str, op: Option<IoOp>) -> Labels {
    let mut l = vec![("volume", volume.to_string())];
    if let Some(op) = op {
        l.push(("op", op.label().to_string()));
    }
    l
}
