//! Replicas (`/v1/replicas`, `/v1/volumes/{name}/replicas/{id}/...`): a replica with its volume,
//! and the engine's outdate and in-sync calls.

use serde::{Deserialize, Serialize};

use super::volumes::Replica;

/// `GET /v1/replicas[/{id}]`: one replica with its volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaInfo {
    pub volume: String,
    pub replica: Replica,
    /// Removed from the volume (replaced or moved); its file is deleted when its node answers.
    pub retired: bool,
}

/// Sent by an engine that lost a replica: remove it from the in-sync set. Succeeds only while
/// `epoch` is the volume's current epoch (compare-and-swap), so a fenced engine cannot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outdate {
    pub epoch: u64,
    pub reason: String,
    /// A disk error: the replica becomes `failed` (never resynced automatically) instead of
    /// `outdated`.
    #[serde(default)]
    pub failed: bool,
}

/// Sent by an engine that resynced an outdated replica (every chunk it missed copied and
/// flushed): make it in-sync again. Succeeds only while `epoch` is the volume's current epoch
/// and the replica is `outdated` (a failed replica stays failed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkInSync {
    pub epoch: u64,
}
