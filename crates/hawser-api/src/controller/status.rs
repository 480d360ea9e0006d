//! The cluster's status (`GET /v1/status`) and events (`GET /v1/events`).

use serde::{Deserialize, Serialize};

use super::volumes::VolumeState;

/// `GET /v1/events`: one thing that happened in the cluster (an outdate, a resync done, a
/// failover, a replica replaced by self-healing, a node going silent or coming back), as
/// the leader saw it. Kept in the leader's memory, the newest few hundred; a new leader
/// starts with none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterEvent {
    /// Increases by one per event of this leader's term.
    pub seq: u64,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// A warning (something is wrong or was lost) rather than a normal event.
    pub warning: bool,
    /// A CamelCase word, as Kubernetes event reasons are: `Degraded`, `Resynced`, ...
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub message: String,
}

/// `GET /v1/status`: what `hawser status` summarises.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterStatus {
    pub nodes: u32,
    /// Nodes without a heartbeat for longer than the node timeout.
    pub nodes_offline: Vec<String>,
    pub nodes_evacuating: Vec<String>,
    pub volumes: u32,
    /// Volumes with fewer in-sync replicas than their replica count.
    pub degraded: Vec<DegradedVolume>,
    /// Replicas being copied to by an engine now.
    pub resyncs: Vec<ResyncProgress>,
    /// Scrub passes of attached volumes: under way, or the last one where it found bad
    /// blocks (docs/checksums.md).
    #[serde(default)]
    pub scrubs: Vec<ScrubProgress>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubProgress {
    pub volume: String,
    /// Where its engine runs.
    pub node: String,
    pub scrub: crate::agent::ScrubStatus,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DegradedVolume {
    pub name: String,
    pub state: VolumeState,
    pub in_sync: u32,
    pub replica_count: u32,
    /// Each replica not in sync: "id on node (outdated, blank)".
    pub lagging: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResyncProgress {
    pub volume: String,
    pub replica: String,
    pub node: String,
    pub blank: bool,
    /// The engine's state of the replica (syncing, marking, outdated while it is away, ...).
    pub state: String,
    pub copied_bytes: u64,
    pub remaining_bytes: u64,
    pub bytes_per_sec: u64,
    /// `remaining_bytes / bytes_per_sec`, when there is a rate.
    pub eta_secs: Option<u64>,
}
