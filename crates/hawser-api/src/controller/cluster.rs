//! The cluster itself (`/v1/cluster`, `/v1/trash`): its identity, nodes waiting to be let in,
//! `cluster recover`, and the rotation of the volume key-encryption key.

use serde::{Deserialize, Serialize};

use super::volumes::Volume;

/// `GET /v1/trash`: a replica in a node's pool trash (an orphan: moved there instead of
/// deleted, and purged by its agent after the grace period).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrphanReplica {
    pub node: String,
    #[serde(flatten)]
    pub replica: crate::agent::TrashedReplica,
}

/// `GET /v1/cluster`: the cluster's identity and the nodes it refuses because their
/// replicas belong to another cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterInfo {
    pub id: String,
    pub created_ms: u64,
    pub waiting: Vec<WaitingNode>,
}

/// A node that asked to join while its replicas name another cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitingNode {
    pub node: String,
    pub cluster_id: String,
    pub admin_addr: String,
    /// Unix milliseconds of its last attempt.
    pub last_seen_ms: u64,
}

/// `POST /v1/cluster/recover`: adopt the waiting nodes' cluster (only into a store without
/// volumes) and rebuild the record of every volume whose replicas the nodes hold but the
/// store does not know.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverCluster {
    /// Wait at most this long for the adopted nodes to register again (default 30).
    #[serde(default)]
    pub wait_secs: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverReport {
    pub cluster_id: String,
    /// The store took the nodes' cluster id (it was empty, wiped or of a new cluster).
    pub adopted: bool,
    pub volumes: Vec<Volume>,
    /// Volumes or replicas left alone, with why.
    pub skipped: Vec<String>,
}

/// `POST /v1/cluster/volume-key`: what rotating the key-encryption key did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeKeyRotated {
    /// The new key-encryption key's id.
    pub kek: u32,
    /// The volumes whose data keys were re-wrapped under it.
    pub rewrapped: Vec<String>,
    /// After the rotation: how many volumes each key-encryption key wraps. A key that wraps
    /// none, when `behind` is empty, can be deleted; one below the new id that still wraps
    /// some (a volume created during the rotation) is taken by rotating again.
    pub wrapping: std::collections::BTreeMap<u32, u64>,
    /// The replicas whose copy of their volume's wrapped data key the rotation could not
    /// update (a node down), each with why: they may still hold a copy under an older key.
    /// Rotating again once their nodes are back updates them. Left out when empty, so a CLI
    /// from before it still reads the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<String>,
}
