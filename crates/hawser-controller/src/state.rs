//! The state shared by all request handlers.

use crate::agent_client::AgentClient;
use crate::locks::KeyedLocks;
use crate::model::{now_ms, NodeRecord};
use crate::placement::Candidate;
use crate::records::Records;
use crate::reservations::Reservations;

pub struct AppState {
    pub records: Records,
    pub agents: AgentClient,
    pub volume_locks: KeyedLocks,
    pub reservations: Reservations,
    pub node_timeout_ms: u64,
    /// The URL agents reach this controller at (sent to engines for outdate reports).
    pub controller_url: String,
}

impl AppState {
    pub fn is_online(&self, node: &NodeRecord) -> bool {
        node.is_online(now_ms(), self.node_timeout_ms)
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
