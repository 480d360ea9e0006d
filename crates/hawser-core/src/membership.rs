//! Replica membership changes: losing a replica, the quorum rule, outdating, reconnecting,
//! and re-admission after resync. Each change that the cluster store must agree to goes out
//! as a command (`Outdate`, `MarkInSync`) and comes back as `on_outdate_done` /
//! `on_mark_in_sync_done`; the engine never assumes the answer.

use crate::engine::unflushed::compact;
use crate::engine::{Engine, Membership, Quorum};
use crate::types::{Command, ReplicaFailure, ReplicaIdx, ReplicaResult, SubId};

impl Engine {
    /// The session with replica `r` is gone: every request in flight on it fails, and it
    /// leaves the set that receives writes (outdated, or `Down` if the quorum forbids).
    pub fn on_replica_lost(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        if !self.slot(r).connected {
            return; // a repeated report: that session is already gone
        }
        let mut lost: Vec<SubId> = self
            .subs
            .iter()
            .filter(|(_, &(_, sr))| sr == r)
            .map(|(&s, _)| s)
            .collect();
        lost.sort_unstable();
        let s = self.slot_mut(r);
        s.connected = false;
        s.disconnecting = false;
        for sub in lost {
            let failed: ReplicaResult = Err(ReplicaFailure::Lost);
            self.on_reply(sub, failed, out);
        }
        if !self.fenced {
            self.leave(r, false, out);
        }
    }

    /// The session with `r` delivered a corrupt frame (bad checksum or malformed): as lost,
    /// and `r` is marked failed. Corruption on the way from a replica is not retried silently:
    /// the replica leaves for good and an operator sees it failed in `hawser volume show`.
    pub fn on_replica_corrupt(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        if !self.slot(r).connected {
            return;
        }
        self.slot_mut(r).failed = true;
        self.on_replica_lost(r, out);
    }

    /// The driver got a disk error from `r`'s journal while bringing it back (it is not
    /// connected yet): `r` is failed for good, as after a disk error on a request. An outdated
    /// replica is reported failed to the store at once; otherwise the flag goes with its
    /// next outdate. Without this a replica whose journal cannot be read would be retried
    /// forever and never shown failed.
    pub fn on_replica_disk_error(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        if self.slot(r).connected {
            return self.on_replica_corrupt(r, out);
        }
        let fenced = self.fenced;
        let s = self.slot_mut(r);
        if s.failed {
            return;
        }
        s.failed = true;
        if s.membership == Membership::Outdated && !fenced {
            s.membership = Membership::Outdating;
            out.push(Command::Outdate {
                replica: r,
                failed: true,
            });
        }
    }

    /// Whether `r` may leave the in-sync set: enough other in-sync replicas remain.
    pub(crate) fn can_leave(&self, r: ReplicaIdx) -> bool {
        let n = self.slots.len();
        let k = self
            .indices()
            .filter(|&o| o != r && self.membership(o) == Membership::InSync && !self.slot(o).failed)
            .count();
        match self.cfg.quorum {
            Quorum::Majority => k >= 1 && 2 * k >= n,
            Quorum::Any => k >= 1,
        }
    }

    /// `r` stops receiving writes: it failed a request others succeeded on, lost its
    /// session, or failed a read. `failed`: a disk error (it leaves for good).
    pub(crate) fn leave(&mut self, r: ReplicaIdx, failed: bool, out: &mut Vec<Command>) {
        if self.fenced {
            return;
        }
        if self.receives(r) {
            // What it may not have made durable yet; flushes from now on do not reach it.
            let snapshot = self.unflushed.snapshot();
            let s = self.slot_mut(r);
            s.unflushed_at_loss.extend(snapshot);
            compact(&mut s.unflushed_at_loss);
        }
        let can_leave = self.can_leave(r);
        let s = self.slot_mut(r);
        s.failed |= failed;
        // Once per session: a driver may answer each `Disconnect` with `on_replica_lost`.
        let disconnect = s.connected && !s.disconnecting;
        s.disconnecting |= disconnect;
        // A syncing replica the store never stopped calling in-sync leaves like an in-sync one.
        let in_sync_in_store = s.membership == Membership::InSync
            || (s.membership == Membership::Syncing && s.store_in_sync);
        match s.membership {
            _ if in_sync_in_store => {
                if can_leave {
                    s.membership = Membership::Outdating;
                    out.push(Command::Outdate {
                        replica: r,
                        failed: s.failed,
                    });
                } else {
                    s.membership = Membership::Down;
                }
            }
            Membership::Syncing => {
                if s.failed {
                    s.membership = Membership::Outdating;
                    out.push(Command::Outdate {
                        replica: r,
                        failed: true,
                    });
                } else {
                    s.membership = Membership::Outdated;
                }
            }
            Membership::Marking => s.lost_while_marking = true,
            Membership::InSync
            | Membership::Down
            | Membership::Outdating
            | Membership::Outdated
            | Membership::Failed => {}
        }
        if disconnect {
            out.push(Command::Disconnect { replica: r });
        }
        // Under the fail policy, requests parked on a replica that just went down fail now.
        self.recheck_parked(out);
        // If that was the last in-sync replica, another may have to become the source.
        self.pump_resync(out);
    }

    /// The control plane confirmed `r` is out of the in-sync set (outdated, or failed).
    pub fn on_outdate_done(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let s = self.slot_mut(r);
        assert_eq!(s.membership, Membership::Outdating, "unexpected outdate");
        s.store_in_sync = false;
        s.membership = if s.failed {
            Membership::Failed
        } else {
            Membership::Outdated
        };
        let resume = s.connected && !s.failed;
        self.resolve(r, out);
        if resume {
            self.begin_sync(r, false, out);
        }
    }

    /// The driver opened a new session with `r` (its Hello was answered). `rebooted`: its
    /// node restarted since this engine last talked to it (or that is unknown), so writes it
    /// had not yet made durable may be gone.
    pub fn on_replica_connected(&mut self, r: ReplicaIdx, rebooted: bool, out: &mut Vec<Command>) {
        if self.fenced {
            return;
        }
        let s = self.slot_mut(r);
        if s.failed || s.connected {
            return;
        }
        s.connected = true;
        s.session += 1;
        // Flushes to its old session were all answered when it was lost.
        debug_assert!(s.unflushed_flushing.is_empty());
        if rebooted {
            self.note_rebooted(r);
        }
        // Otherwise the chunks it had not made durable stay pending until a flush sent to it
        // from now on succeeds.
        let s = self.slot_mut(r);
        match s.membership {
            Membership::Down => self.begin_sync(r, true, out),
            Membership::Outdated => self.begin_sync(r, false, out),
            // Resync starts once the outdate is confirmed.
            Membership::Outdating => {}
            Membership::InSync | Membership::Syncing | Membership::Marking | Membership::Failed => {
            }
        }
    }

    /// `r`'s node restarted since this engine last had it (known from a new session's boot
    /// id, or from its journal before it is connected): what it had not made durable is
    /// gone and is copied again, and until a resync has copied it back it may lack
    /// acknowledged writes, whatever the sessions after this one.
    pub fn note_rebooted(&mut self, r: ReplicaIdx) {
        let s = self.slot_mut(r);
        s.reboot_lost |= !s.unflushed_at_loss.is_empty() || s.journal_lacks;
        for (first, end) in std::mem::take(&mut s.unflushed_at_loss) {
            s.mark_dirty(|d| d.set_chunks(first, end));
        }
    }

    /// The control plane answered `MarkInSync` for `r`: `accepted`, or refused (the store
    /// no longer allows it, e.g. the replica was marked failed); a refused replica is left
    /// alone for the rest of this engine's life.
    pub fn on_mark_in_sync_done(&mut self, r: ReplicaIdx, accepted: bool, out: &mut Vec<Command>) {
        let s = self.slot_mut(r);
        assert_eq!(s.membership, Membership::Marking, "unexpected mark");
        if !accepted {
            s.membership = Membership::Outdated;
            s.failed = true;
            if s.connected && !s.disconnecting {
                s.disconnecting = true;
                out.push(Command::Disconnect { replica: r });
            }
            // The store does not call it in-sync: it holds up nothing.
            self.resolve(r, out);
            self.pump_resync(out);
            return;
        }
        s.membership = Membership::InSync;
        s.store_in_sync = true;
        s.reboot_lost = false;
        s.journal_lacks = false;
        if std::mem::take(&mut s.lost_while_marking) {
            // It missed something after the mark was sent: out again, by the usual rule.
            let failed = s.failed;
            self.leave(r, failed, out);
            return;
        }
        self.became_in_sync(r, out);
    }

    /// The driver will not ask the store to mark `r` in sync after all: `r` was lost before
    /// a journal saying it lacks nothing was committed (the keeper's in-sync commit). The
    /// store still says what it said before the resync; `r` leaves by the usual rule and is
    /// resynced when it returns.
    pub fn on_mark_abandoned(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let s = self.slot_mut(r);
        if s.membership != Membership::Marking {
            return;
        }
        s.membership = Membership::Syncing;
        s.lost_while_marking = false;
        let failed = s.failed;
        self.leave(r, failed, out);
        if matches!(
            self.membership(r),
            Membership::Outdated | Membership::Failed
        ) {
            // The store does not call it in-sync: it holds up nothing.
            self.resolve(r, out);
        }
    }

    /// `r` is in sync again (resynced): requests parked on it finish, and replicas that were
    /// `Down` for want of a quorum may now be outdated.
    pub(crate) fn became_in_sync(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        self.slot_mut(r).reboot_lost = false;
        self.slot_mut(r).journal_lacks = false;
        self.resolve(r, out);
        for d in self.indices().collect::<Vec<_>>() {
            if self.membership(d) == Membership::Down && self.can_leave(d) {
                let s = self.slot_mut(d);
                s.membership = Membership::Outdating;
                out.push(Command::Outdate {
                    replica: d,
                    failed: s.failed,
                });
            }
        }
        // A new source may unblock resyncs that had none, and a scrub waiting for a reader.
        self.pump_resync(out);
        self.pump_scrub(out);
    }
}
