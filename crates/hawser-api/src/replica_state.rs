//! A replica's place in its volume's in-sync set: the word the controller's records, the
//! engines' status and the agents' admin API all use.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Has every acknowledged write; receives all new writes.
    InSync,
    /// Missed writes; removed from the in-sync set by compare-and-swap. Never read from.
    Outdated,
    /// Disk error or corruption; never read from.
    Failed,
}
