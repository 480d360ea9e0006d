//! Carries out the journal keeper's acts (`hawser_core::driver::journal::Keeper`, the code the
//! simulator runs) with the replicas' journal files and connections, and feeds the answers
//! back. The rules (activity-log admission, commit and join order, resync saves) are the
//! keeper's; this file only does the I/O and maps its errors.

use std::sync::Arc;

use bytes::Bytes;
use hawser_core::driver::journal::Act;
use hawser_core::{ReplicaFailure, ReplicaIdx};
use hawser_wire::journal::Journal;
use tokio::sync::oneshot;

use super::{Handle, VolumeEngine};
use crate::replica::access::{Access, AccessError};

impl VolumeEngine {
    pub(super) fn idx(i: usize) -> ReplicaIdx {
        ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS"))
    }

    /// Direct access to replica `i` while it is connected.
    pub(super) fn access(&self, i: usize) -> Option<Access> {
        match &self.handles[i] {
            Handle::Local(r) => Some(Access::Local(r.clone())),
            Handle::Remote { .. } => self.client(Self::idx(i)).map(|client| Access::Remote {
                id: self.replica_ids[i].clone(),
                client,
            }),
        }
    }

    /// Carry out one of the keeper's acts other than engine commands (`dispatch` does those).
    pub(super) fn journal_act(&self, act: Act) {
        let Some(me) = self.me.upgrade() else { return };
        match act {
            Act::PutJournal {
                op,
                replica,
                journal,
            } => {
                self.rt.spawn(async move {
                    let result = me.put(replica, journal).await;
                    me.drive(|k, e, acts| k.stored(e, op, replica, result, acts));
                });
            }
            Act::GetJournal { op, replica } => {
                self.rt.spawn(async move {
                    let result = match me.access(usize::from(replica.0)) {
                        None => Err(ReplicaFailure::Lost),
                        Some(a) => a
                            .get_journal(me.epoch)
                            .await
                            .map(|s| s.map(|s| (s.journal, s.rebooted)))
                            .map_err(|e| {
                                me.failure("reading the journal of a returning replica", &e)
                            }),
                    };
                    me.drive(|k, e, acts| k.read(e, op, replica, result, acts));
                });
            }
            Act::SaveFlush { op, replica } => {
                self.rt.spawn(async move {
                    let result = match me.access(usize::from(replica.0)) {
                        None => Err(ReplicaFailure::Lost),
                        Some(a) => a
                            .flush(me.epoch)
                            .await
                            .map_err(|e| me.failure("flush for a resync save", &e)),
                    };
                    if result.is_ok() {
                        tracing::debug!(volume = %me.volume, replica = %me.replica_ids[usize::from(replica.0)], "resync save flushed");
                    }
                    me.drive(|k, e, acts| k.save_flushed(e, op, replica, result, acts));
                });
            }
            Act::Disconnect { replica } => {
                tracing::warn!(volume = %self.volume, replica = %self.replica_ids[usize::from(replica.0)], "journal commit failed; dropping the replica");
                self.disconnect(replica);
            }
            Act::Joined { replica, ok } => {
                let waiter = self.joins.lock().unwrap_or_else(|p| p.into_inner())
                    [usize::from(replica.0)]
                .take();
                if let Some(w) = waiter {
                    let _ = w.send(ok);
                }
            }
            Act::MarkInSync { replica } => self.mark_in_sync(replica),
            Act::Committed { seq } => {
                self.commits.send_replace(seq);
            }
            Act::Finished => {
                self.finished.send_replace(true);
            }
            Act::Engine(_) => unreachable!("engine commands are dispatched"),
        }
    }

    /// Store `journal` on `replica`.
    async fn put(&self, replica: ReplicaIdx, journal: Journal) -> Result<(), ReplicaFailure> {
        let Some(a) = self.access(usize::from(replica.0)) else {
            return Err(ReplicaFailure::Lost);
        };
        let encoded = match journal.encode() {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                // Unreachable: the keeper bounds every journal (`driver::journal::bounded`).
                tracing::error!(volume = %self.volume, error = %e, "journal does not encode");
                return Err(ReplicaFailure::Io);
            }
        };
        a.put_journal(self.epoch, encoded)
            .await
            .map_err(|e| self.failure("writing a journal", &e))
    }

    /// The keeper's view of an access error.
    fn failure(&self, what: &str, e: &AccessError) -> ReplicaFailure {
        tracing::warn!(volume = %self.volume, error = %e, "{what} failed");
        if e.is_stale_epoch() {
            ReplicaFailure::StaleEpoch
        } else if e.is_disk_error() {
            ReplicaFailure::Io
        } else {
            ReplicaFailure::Lost
        }
    }

    /// Ask for a commit (extents idle fewer than `min_idle` ticks stay in the log) and wait
    /// until it is done, or the engine stops.
    pub(super) async fn commit(&self, min_idle: u64) {
        let mut done = self.commits.subscribe();
        let mut seq = 0;
        self.drive(|k, e, acts| seq = k.commit(e, min_idle, acts));
        let _ = done.wait_for(|&s| s >= seq).await;
    }

    /// Replica `i` is connected again (a new session): bring it into the set of replicas
    /// requests go to (the keeper's join). False if that failed; the caller retries.
    pub(super) async fn join(&self, i: usize, rebooted: Option<bool>) -> bool {
        let (tx, rx) = oneshot::channel();
        self.joins.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(tx);
        self.drive(|k, e, acts| k.join(e, Self::idx(i), rebooted, acts));
        rx.await.unwrap_or(false)
    }

    /// Before a clean stop, after a successful flush: save every resync under way and commit
    /// the journal with an empty log, so the next engine skips recovery and resumes resyncs.
    pub(super) async fn finish_journal(self: &Arc<Self>) {
        let mut finished = self.finished.subscribe();
        self.drive(|k, e, acts| k.finish(e, acts));
        if tokio::time::timeout(
            crate::constants::ENGINE_STOP_FLUSH_TIMEOUT,
            finished.wait_for(|&f| f),
        )
        .await
        .is_err()
        {
            tracing::warn!(volume = %self.volume, "the last journal commit did not complete; the next attach runs crash recovery");
        }
    }
}

/// Answer a join waiter that will never be answered (the engine stops).
pub(super) fn drop_joins(joins: &mut [Option<oneshot::Sender<bool>>]) {
    for j in joins {
        if let Some(w) = j.take() {
            let _ = w.send(false);
        }
    }
}
