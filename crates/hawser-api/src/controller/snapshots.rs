//! Snapshots (`/v1/volumes/{name}/snapshots`).

use serde::{Deserialize, Serialize};

/// A snapshot's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    /// Being taken; not usable yet.
    Creating,
    /// Every replica in sync when it was taken holds it.
    Ready,
    /// Its copies are being removed.
    Deleting,
}

/// A crash-consistent snapshot of a volume: its data at one point between two
/// acknowledged writes, kept on the replicas that were in sync then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// Unique in the cluster.
    pub name: String,
    pub volume: String,
    /// The name of its copies on the replicas (the name and a random suffix, so a name used
    /// again never meets a stale copy).
    pub id: String,
    pub size_bytes: u64,
    /// Unix milliseconds.
    pub created_ms: u64,
    pub state: SnapshotState,
    /// Replica ids holding a copy.
    pub replicas: Vec<String>,
    /// How long the volume's requests were held while it was taken (an attached volume),
    /// microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_micros: Option<u64>,
    /// How the replicas copied it: "reflink" (shared extents), "copy", or "mixed".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
}

/// `POST /v1/snapshots`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    pub name: String,
    pub volume: String,
}
