//! The agent's Prometheus metrics (`GET /metrics` on the admin listener).
//!
//! Two kinds:
//! - counted as requests run: per volume and operation, requests, bytes, errors and a latency
//!   histogram, and requests in flight. Counted at the volume's NBD export, which outlives
//!   engine swaps, so the series do not restart when a volume's replicas change. The handles
//!   are made once per export: a request touches atomics and one histogram, no map lookup.
//! - read at scrape time from what already exists: each engine's status (epoch, replica
//!   states, resync progress, activity log) and each pool's usage (`metrics_state`), and the
//!   process's CPU and memory.
//!
//! Labels are bounded: volume, operation, replica (at most 8 per volume), pool, state. Never
//! a per-request or per-offset label.
//!
//! Scrapes need the cluster's metrics token (or the controller's credentials): the
//! controller hands its digest to the agent with every heartbeat answer, so a rotation
//! reaches every agent within a heartbeat.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use hawser_api::agent::{OpCounters, VolumeIoCounters};
use hawser_api::auth::{self, TokenDigest};
use hawser_api::metrics::{ProcessCollector, LATENCY_BUCKETS_SECS};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::engines::Engines;
use crate::metrics_state::StateCollector;
use crate::node_storage::NodeStorage;

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
    const ALL: [IoOp; 5] = [
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
    fn register(&self, h: &mut Registry) {
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

fn unix_ms() -> u64 {
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

/// The agent's metrics registry and its scrape credential.
pub struct AgentMetrics {
    registry: Registry,
    /// Digests of the metrics tokens the controller last said are valid.
    scrape_tokens: RwLock<Vec<TokenDigest>>,
}

impl AgentMetrics {
    /// The registry of the request metrics of `engines`' exports, and of the state of
    /// `engines` and `storage`.
    pub fn new(engines: Arc<Engines>, storage: Arc<NodeStorage>) -> Arc<AgentMetrics> {
        let io = engines.io().clone();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let h = registry.sub_registry_with_prefix("hawser");
        io.register(h);
        h.register_collector(Box::new(StateCollector { engines, storage }));
        Arc::new(AgentMetrics {
            registry,
            scrape_tokens: RwLock::new(Vec::new()),
        })
    }

    /// Everything, in the format `accept` asks for: (content type, body).
    pub fn render(&self, accept: Option<&str>) -> (&'static str, String) {
        hawser_api::metrics::render(&self.registry, accept)
    }

    /// The metrics tokens now valid, as hex digests from the controller (bad ones are
    /// skipped: they would admit nobody).
    pub fn set_scrape_tokens(&self, hex: &[String]) {
        let digests = hex
            .iter()
            .filter_map(|h| auth::parse_digest_hex(h))
            .collect();
        *self
            .scrape_tokens
            .write()
            .unwrap_or_else(|p| p.into_inner()) = digests;
    }

    /// Whether `token` is a valid metrics token (constant-time comparisons, all of them).
    pub fn admits(&self, token: &str) -> bool {
        let d = auth::digest(token);
        let valid = self.scrape_tokens.read().unwrap_or_else(|p| p.into_inner());
        valid
            .iter()
            .fold(false, |ok, v| ok | auth::digests_equal(&d, v))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn scrape(io: &IoMetrics) -> String {
        let mut r = Registry::default();
        io.register(r.sub_registry_with_prefix("hawser"));
        hawser_api::metrics::render(&r, None).1
    }

    fn value(body: &str, series: &str) -> Option<f64> {
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn requests_are_counted_per_volume_and_op_and_their_series_go_with_the_export() {
        assert!(IoOp::ALL
            .iter()
            .enumerate()
            .all(|(i, op)| *op as usize == i));
        let io = IoMetrics::default();
        let v = io.volume("v1");
        let w = v.start(IoOp::Write);
        assert_eq!(
            value(
                &scrape(&io),
                r#"hawser_volume_requests_in_flight{volume="v1"}"#
            ),
            Some(1.0)
        );
        v.done(w, 4096, true);
        let r = v.start(IoOp::Read);
        v.done(r, 8192, false);
        let body = scrape(&io);
        let series = |name: &str, op: &str| format!(r#"{name}{{volume="v1",op="{op}"}}"#);
        assert_eq!(
            value(&body, &series("hawser_volume_requests_total", "write")),
            Some(1.0)
        );
        assert_eq!(
            value(&body, &series("hawser_volume_request_bytes_total", "write")),
            Some(4096.0)
        );
        // A failed read is a request and an error, and moved no bytes.
        assert_eq!(
            value(&body, &series("hawser_volume_requests_total", "read")),
            Some(1.0)
        );
        assert_eq!(
            value(&body, &series("hawser_volume_request_errors_total", "read")),
            Some(1.0)
        );
        assert_eq!(
            value(&body, &series("hawser_volume_request_bytes_total", "read")),
            Some(0.0)
        );
        assert_eq!(
            value(
                &body,
                &series("hawser_volume_request_duration_seconds_count", "write")
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&body, r#"hawser_volume_requests_in_flight{volume="v1"}"#),
            Some(0.0)
        );
        drop(v);
        assert!(
            !scrape(&io).contains("v1"),
            "a dropped export's series are gone"
        );
    }

    #[test]
    fn only_the_tokens_the_controller_named_are_admitted() {
        let m = AgentMetrics {
            registry: Registry::default(),
            scrape_tokens: RwLock::new(Vec::new()),
        };
        assert!(!m.admits("t1"), "no digest yet: nobody");
        let hex = |t: &str| auth::digest_hex(&auth::digest(t));
        m.set_scrape_tokens(&[hex("t1"), "not hex".into(), hex("t2")]);
        assert!(m.admits("t1") && m.admits("t2"));
        assert!(!m.admits("t3"));
        m.set_scrape_tokens(&[hex("t2")]);
        assert!(!m.admits("t1"), "a rotated-out token stops working");
    }

    #[test]
    fn counters_tell_what_the_series_count() {
        let io = IoMetrics::default();
        let v = io.volume("v1");
        let before = unix_ms();
        for op in [
            IoOp::Write,
            IoOp::Write,
            IoOp::Read,
            IoOp::Trim,
            IoOp::WriteZeroes,
        ] {
            let s = v.start(op);
            v.done(s, 4096, true);
        }
        let f = v.start(IoOp::Flush);
        v.done(f, 0, false);
        let _open = v.start(IoOp::Read);
        let c = v.counters("n1");
        assert_eq!((c.volume.as_str(), c.node.as_str()), ("v1", "n1"));
        assert!(c.started_ms <= before + 1000 && c.started_ms + 60_000 >= before);
        assert_eq!(
            (c.write.requests, c.write.bytes, c.write.errors),
            (2, 8192, 0)
        );
        assert_eq!((c.read.requests, c.read.bytes), (1, 4096));
        assert_eq!((c.flush.requests, c.flush.errors), (1, 1));
        assert_eq!((c.other.requests, c.other.bytes), (2, 8192));
        assert_eq!(c.in_flight, 1);
        assert!(c.write.latency_sum_secs > 0.0 && c.write.latency_sum_secs < 10.0);
        let body = scrape(&io);
        assert_eq!(
            value(
                &body,
                r#"hawser_volume_requests_total{volume="v1",op="write"}"#
            ),
            Some(2.0)
        );
    }
}
