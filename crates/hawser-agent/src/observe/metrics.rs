//! The agent's Prometheus metrics (`GET /metrics` on the admin listener).
//!
//! Two kinds:
//! - counted as requests run: per volume and operation, requests, bytes, errors and a latency
//!   histogram, and requests in flight. Counted at the volume's NBD export, which outlives
//!   engine swaps, so the series do not restart when a volume's replicas change. The handles
//!   are made once per export: a request touches atomics and one histogram, no map lookup.
//! - read at scrape time from what already exists: each engine's status (epoch, replica
//!   states, resync progress, activity log) and each pool's usage (`state`), and the
//!   process's CPU and memory.
//!
//! Labels are bounded: volume, operation, replica (at most 8 per volume), pool, state. Never
//! a per-request or per-offset label.
//!
//! Scrapes need the cluster's metrics token (or the controller's credentials): the
//! controller hands its digest to the agent with every heartbeat answer, so a rotation
//! reaches every agent within a heartbeat.

use std::sync::{Arc, RwLock};

use hawser_api::auth::{self, TokenDigest};
use hawser_api::metrics::ProcessCollector;
use prometheus_client::registry::Registry;

use crate::engine::registry::Engines;
use crate::observe::devices::DeviceMetrics;
use crate::observe::refusals::RefusalMetrics;
use crate::observe::state::StateCollector;
use crate::storage::pools::NodeStorage;

/// The agent's metrics registry and its scrape credential.
pub struct AgentMetrics {
    registry: Registry,
    devices: DeviceMetrics,
    refusals: RefusalMetrics,
    /// Digests of the metrics tokens the controller last said are valid.
    scrape_tokens: RwLock<Vec<TokenDigest>>,
}

impl AgentMetrics {
    /// The registry of the request metrics of `Engines`' exports, and of the state of
    /// `Engines` and `storage`.
    pub fn new(engines: Arc<Engines>, storage: Arc<NodeStorage>) -> Arc<AgentMetrics> {
        let io = engines.io().clone();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let h = registry.sub_registry_with_prefix("hawser");
        io.register(h);
        let devices = DeviceMetrics::default();
        devices.register(h);
        let refusals = RefusalMetrics::default();
        refusals.register(h);
        h.register_collector(Box::new(StateCollector { engines, storage }));
        Arc::new(AgentMetrics {
            registry,
            devices,
            refusals,
            scrape_tokens: RwLock::new(Vec::new()),
        })
    }

    /// The kernel devices' family, for [`crate::frontends::devices`] to keep.
    pub fn devices(&self) -> DeviceMetrics {
        self.devices.clone()
    }

    /// The replica server's refusals, for [`crate::replica::server::serve`] to count.
    pub fn refusals(&self) -> RefusalMetrics {
        self.refusals.clone()
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
    use crate::observe::io::{unix_ms, IoMetrics, IoOp};

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
            devices: DeviceMetrics::default(),
            refusals: RefusalMetrics::default(),
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
