//! The prunes this process runs, by the holder named in their lock.
//!
//! `retention::prune` notes a prune here before it writes its lock, and `prune_locks`
//! deletes at start only the prune locks of its cluster that no prune here holds. It is a
//! file of its own so that `BackupSettings` can hold it without importing the sweep.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// The prunes this process runs, by lock holder.
#[derive(Debug, Default)]
pub struct Running {
    holders: Mutex<BTreeSet<String>>,
}

impl Running {
    /// Notes `holder` as running until the guard drops; before its lock is written, so a
    /// sweep that lists the lock finds the holder here.
    pub fn start(self: &Arc<Self>, holder: &str) -> RunningGuard {
        if let Ok(mut h) = self.holders.lock() {
            h.insert(holder.to_owned());
        }
        RunningGuard {
            running: self.clone(),
            holder: holder.to_owned(),
        }
    }

    /// Whether `holder` is a prune of this process. A poisoned list answers yes, so the
    /// sweep keeps a lock rather than delete one on a guess.
    pub(crate) fn runs(&self, holder: &str) -> bool {
        self.holders.lock().map_or(true, |h| h.contains(holder))
    }
}

/// A running prune; dropped when it ends.
pub struct RunningGuard {
    running: Arc<Running>,
    holder: String,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        if let Ok(mut h) = self.running.holders.lock() {
            h.remove(&self.holder);
        }
    }
}
