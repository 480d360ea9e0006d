//! The state shared by all request handlers.
//!
//! It holds each part of the controller (its store, agent client, tokens, TLS, events,
//! metrics, backup settings), and each part's handlers take it as axum's one `State`. So the
//! types it holds live in files that import nothing that takes the state (`metrics.rs` here,
//! `auth/tls.rs`, `cluster/events.rs`, `cluster/waiting.rs`, `snapshots/backup_settings.rs`,
//! ...): the layout test (`crates/hawser/tests/layout.rs`) refuses an import circle.

pub mod metrics;

use std::sync::Arc;

use crate::auth::tls::ControllerTls;
use crate::auth::ClusterTokens;
use crate::cluster::agent_client::AgentClient;
use crate::cluster::events::ClusterEvents;
use crate::cluster::waiting::Waiting;
use crate::errors::ControllerError;
use crate::snapshots::backup_settings::BackupSettings;
use crate::state::metrics::ControllerMetrics;
use crate::store::records::Records;

use crate::healing::placement::Candidate;
use crate::healing::reservations::Reservations;
use crate::store::leader::Leadership;
use crate::store::locks::KeyedLocks;
use crate::store::model::{now_ms, NodeRecord};

pub struct AppState {
    pub records: Records,
    pub agents: AgentClient,
    /// The cluster's token digests, checked on every request.
    pub tokens: ClusterTokens,
    pub volume_locks: KeyedLocks,
    pub reservations: Reservations,
    pub node_timeout_ms: u64,
    /// The URL agents reach this controller at (sent to engines for outdate reports).
    pub controller_url: String,
    /// Whether this controller leads (and may serve the API).
    pub leadership: Leadership,
    /// What happened: recent events for the API, and Events on the volumes' PVCs.
    pub events: ClusterEvents,
    /// Nodes refused as of another cluster (`cluster/mod.rs`).
    pub waiting: Waiting,
    /// The CA and this controller's certificate; `None` with `--insecure`.
    pub tls: Option<Arc<ControllerTls>>,
    /// What `/metrics` counts as it happens.
    pub metrics: ControllerMetrics,
    /// The key-encryption keys of encrypted volumes' data keys (`volumes/keys.rs`).
    pub keks: crate::volumes::keys::Keks,
    /// Backups' credentials directory and rate (`snapshots/backup_targets.rs`).
    pub backups: BackupSettings,
}

impl AppState {
    /// The controller's TLS material, or the refusal of a controller started with
    /// `--insecure` to what needs it (joins, certificates, a CA rotation).
    pub fn required_tls(&self) -> Result<&Arc<ControllerTls>, ControllerError> {
        self.tls.as_ref().ok_or_else(|| ControllerError::Refused {
            message: "this controller runs without TLS (--insecure): nodes do not join, they use \
                      the agent token"
                .into(),
        })
    }

    /// The controller URLs an engine reports to, comma-separated: this one (the leader)
    /// first, then every other live controller, so the engine can find the next leader
    /// after this one is gone.
    pub async fn engine_controller_urls(&self) -> String {
        let mut urls = vec![self.controller_url.clone()];
        match self.records.controller_urls().await {
            Ok(others) => {
                for u in others {
                    if !urls.contains(&u) {
                        urls.push(u);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the other controllers"),
        }
        urls.join(",")
    }

    /// Whether `node` heartbeated within the node timeout, counting only time this
    /// controller has led: after a takeover or a store outage, the heartbeats the nodes sent
    /// meanwhile could not be heard, so silence counts from when leading began.
    pub fn is_online(&self, node: &NodeRecord) -> bool {
        let now = now_ms();
        let heard_since = node.last_seen_ms.max(self.leadership.since_ms());
        now.saturating_sub(heard_since) <= self.node_timeout_ms
    }

    pub fn candidates(&self, nodes: &[NodeRecord]) -> Vec<Candidate> {
        nodes
            .iter()
            .map(|n| Candidate {
                node: n.name.clone(),
                online: self.is_online(n),
                zone: n.zone().map(String::from),
                pools: n.pools.clone(),
            })
            .collect()
    }
}
