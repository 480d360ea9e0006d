//! A node's storage pools as the agents report them and the controller lists them
//! (`GET /v1/pools`, and each node's `RegisterNode`).

use serde::{Deserialize, Serialize};

/// A storage pool on a node, as reported by its agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolInfo {
    pub node: String,
    pub name: String,
    pub path: String,
    /// Size of the filesystem the pool lives on (or its configured limit).
    pub capacity_bytes: u64,
    /// Free bytes on that filesystem.
    pub free_bytes: u64,
    /// Sum of the sizes of replicas placed in the pool (thin replicas count at full size).
    pub provisioned_bytes: u64,
    /// Thin replicas may be placed while provisioned <= capacity * this ratio.
    pub overprovision_ratio: f64,
    pub replicas: u32,
    /// Which replicas the pool takes: thin, thick or both.
    #[serde(default)]
    pub kind: PoolKind,
    /// Snapshot copies its replicas hold.
    #[serde(default)]
    pub snapshots: u32,
    /// Bytes the snapshot copies' files occupy; extents shared by reflinks (XFS, btrfs) are
    /// counted in full, so it is at most what deleting them frees (exact on ext4, where
    /// snapshots are copies).
    #[serde(default)]
    pub snapshot_bytes: u64,
}

/// Which replicas a pool takes. An overprovisioned pool may be kept thin-only so a thick
/// replica cannot take the real space its thin replicas were promised; a pool may be kept
/// thick-only for predictable latency (no allocation on first write).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Thin and thick replicas.
    #[default]
    Any,
    Thin,
    Thick,
}

impl PoolKind {
    pub fn allows(self, thin: bool) -> bool {
        match self {
            PoolKind::Any => true,
            PoolKind::Thin => thin,
            PoolKind::Thick => !thin,
        }
    }
}

impl PoolInfo {
    /// The most that may be provisioned in the pool: capacity times the overprovision ratio.
    pub fn overprovision_limit(&self) -> u64 {
        // Float-to-int `as` saturates, which is the wanted bound for a huge ratio.
        #[allow(clippy::cast_possible_truncation)]
        let limit = (self.capacity_bytes as f64 * self.overprovision_ratio) as u64;
        limit
    }

    /// Whether a new replica of `size` fits: thick replicas need real free space, thin ones
    /// must stay within the overprovision limit. The pool's kind is checked separately
    /// ([`PoolKind::allows`]).
    pub fn fits(&self, size: u64, thin: bool) -> bool {
        if thin {
            let limit = self.capacity_bytes as f64 * self.overprovision_ratio;
            (self.provisioned_bytes.saturating_add(size)) as f64 <= limit
        } else {
            size <= self.free_bytes
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pool_kinds() {
        assert!(PoolKind::Any.allows(true) && PoolKind::Any.allows(false));
        assert!(PoolKind::Thin.allows(true) && !PoolKind::Thin.allows(false));
        assert!(!PoolKind::Thick.allows(true) && PoolKind::Thick.allows(false));
    }
}
