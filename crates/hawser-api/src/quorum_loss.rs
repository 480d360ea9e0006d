//! What a volume does without a quorum: a volume option the controller keeps and each engine
//! the agent starts is given.

use serde::{Deserialize, Serialize};

/// What a volume's writes do while too few of its replicas are in sync to form a quorum
/// (fewer than a majority, or exactly half without the store's tie-break).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuorumLoss {
    /// Writes a lost replica missed wait (no error, no acknowledgement) until a replica
    /// returns; I/O resumes by itself.
    #[default]
    Suspend,
    /// Writes a lost replica missed fail with EIO at once; the replicas never diverge either
    /// way (their ranges are resynced when the replica returns).
    Fail,
}
