//! Connections the replica server refused at a limit (`constants.rs`): counted as
//! `hawser_replica_connections_refused_total{limit}` and logged at warn, naming the limit,
//! at most once per [`LOG_EVERY`] per limit (with how many were refused since), so that a
//! flood of refusals cannot flood the log too. A refusal used to be a debug line only, and
//! an engine node that ran out of connections to this node saw a TLS handshake end and
//! nothing said why (issue 44).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// At most one warn per limit this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

type Labels = Vec<(&'static str, String)>;

#[derive(Clone, Default)]
pub struct RefusalMetrics {
    refused: Family<Labels, Counter>,
    /// Per limit: when it was last logged, and refusals since that were not.
    logged: Arc<Mutex<HashMap<&'static str, (Instant, u64)>>>,
}

impl RefusalMetrics {
    pub(crate) fn register(&self, h: &mut Registry) {
        h.register(
            "replica_connections_refused",
            "Connections the replica server closed unread because a limit was reached, by limit",
            self.refused.clone(),
        );
    }

    /// `peer`'s connection was refused at `limit` (a constant's name), which allows `max`.
    pub fn refused(&self, limit: &'static str, max: usize, peer: SocketAddr) {
        self.refused
            .get_or_create(&vec![("limit", limit.to_owned())])
            .inc();
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match logged.get_mut(limit) {
            Some((at, quiet)) if now.duration_since(*at) < LOG_EVERY => *quiet += 1,
            entry => {
                let before = entry.map_or(0, |(_, quiet)| *quiet);
                logged.insert(limit, (now, 0));
                tracing::warn!(
                    %peer, limit, max, refused_since_last_warn = before,
                    "replica connection refused: {limit} ({max}) reached"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_by_limit() {
        let m = RefusalMetrics::default();
        let peer: SocketAddr = "192.0.2.1:5000".parse().expect("addr");
        for _ in 0..3 {
            m.refused("REPLICA_UNGREETED_MAX_PER_PEER", 16, peer);
        }
        m.refused("REPLICA_SERVER_MAX_CONNS", 1024, peer);
        let mut r = Registry::default();
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encode");
        assert!(
            out.contains(
                r#"replica_connections_refused_total{limit="REPLICA_UNGREETED_MAX_PER_PEER"} 3"#
            ),
            "{out}"
        );
        assert!(
            out.contains(
                r#"replica_connections_refused_total{limit="REPLICA_SERVER_MAX_CONNS"} 1"#
            ),
            "{out}"
        );
        // The second and third of a burst were not logged; the first was.
        let logged = m.logged.lock().expect("lock");
        assert_eq!(logged["REPLICA_UNGREETED_MAX_PER_PEER"].1, 2);
        assert_eq!(logged["REPLICA_SERVER_MAX_CONNS"].1, 0);
    }
}
