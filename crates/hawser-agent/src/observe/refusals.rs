//! Connections the agent did not serve because a limit was reached (issue 44), each counted
//! and logged at warn with the limit's name, at most once per [`LOG_EVERY`] per limit (with
//! how many since), so that a flood of them cannot flood the log too:
//! - the replica server's refusals (`constants.rs`), as
//!   `hawser_replica_connections_refused_total{limit}`. A refusal used to be a debug line
//!   only, and an engine node that ran out of connections to this node saw a TLS handshake
//!   end and nothing said why;
//! - an NBD listener at `MAX_CONNECTIONS_PER_LISTENER` (`nbd/server.rs`), as
//!   `hawser_nbd_listener_full_total{listener}`: it stops accepting, and new clients wait
//!   in the kernel's backlog, where nothing used to say why.

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
    full: Family<Labels, Counter>,
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
        h.register(
            "nbd_listener_full",
            "Times an NBD listener reached its connection limit and stopped accepting (new \
             clients wait in the backlog), by listener",
            self.full.clone(),
        );
    }

    /// NBD listener `listener` (`tcp` or `unix`) serves `max` connections and stops
    /// accepting until one ends.
    pub fn listener_full(&self, listener: &'static str, max: usize) {
        self.full
            .get_or_create(&vec![("listener", listener.to_owned())])
            .inc();
        if let Some(quiet) = self.due("MAX_CONNECTIONS_PER_LISTENER") {
            tracing::warn!(
                listener,
                max,
                full_since_last_warn = quiet,
                "NBD listener full: MAX_CONNECTIONS_PER_LISTENER ({max}) connections are \
                 open; new clients wait until one closes"
            );
        }
    }

    /// Whether a warn about `limit` is due now; if so, how many went unlogged since the last.
    fn due(&self, limit: &'static str) -> Option<u64> {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match logged.get_mut(limit) {
            Some((at, quiet)) if now.duration_since(*at) < LOG_EVERY => {
                *quiet += 1;
                None
            }
            entry => {
                let before = entry.map_or(0, |(_, quiet)| *quiet);
                logged.insert(limit, (now, 0));
                Some(before)
            }
        }
    }

    /// `peer`'s connection was refused at `limit` (a constant's name), which allows `max`.
    pub fn refused(&self, limit: &'static str, max: usize, peer: SocketAddr) {
        self.refused
            .get_or_create(&vec![("limit", limit.to_owned())])
            .inc();
        if let Some(before) = self.due(limit) {
            tracing::warn!(
                %peer, limit, max, refused_since_last_warn = before,
                "replica connection refused: {limit} ({max}) reached"
            );
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
