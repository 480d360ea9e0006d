//! Corrupt reads and their repair: blocks whose bytes rotted on one replica's medium.
//!
//! A replica keeps a checksum per `ORDER_BLOCK_BYTES` block and answers a read whose range
//! holds a block that fails it with `ReplicaFailure::Corrupt`. Such a replica still has every
//! write it acknowledged (only bytes at rest changed), so it stays in sync; the rules:
//!
//! 1. A client read answered `Corrupt` is retried on the next in-sync replica, as after any
//!    read failure, but the corrupt one does not leave. As soon as one replica serves it, the
//!    read completes with that data, then a repair of its range is queued for each replica
//!    that answered `Corrupt`.
//! 2. Reads take no range lock, and a replica writes a block's data before its checksum, so a
//!    read racing a write may see a mismatch that is not rot. When every replica tried
//!    answered `Corrupt`, the read runs once more holding the lock of its blocks
//!    (`Work::LockedRead`), where a mismatch is genuine: a replica that serves it then
//!    completes it (the others are repaired); if none does, it fails with EIO and each
//!    corrupt replica is reported unrecoverable.
//! 3. A repair (`Engine::repair`) holds the lock of its blocks, like a resync copy, so no
//!    client write to them is in flight: (a) it reads the range from the corrupt replica; a
//!    success means the first answer was a race, and nothing is counted; (b) it reads the
//!    range from another in-sync replica; (c) it writes that data to the corrupt replica with
//!    FUA, which makes the blocks and their checksums durable. Success is
//!    `Command::Corruption { repaired: true }`; no good source is `repaired: false`: that data
//!    is lost. A source also corrupt gets a repair of its own once this one is over, unless
//!    none was good: then every in-sync replica failed the range under this lock, and a repair
//!    of a source would only find this target still corrupt and queue one of it again, round
//!    and round (a source's rot is counted by its own repair if one is queued, e.g. by the
//!    scrub, or found again by its next read).
//! 4. Blocks confirmed corrupt under the lock (3, or the locked read of 2) are counted per
//!    replica (`Engine::integrity`). A replica whose count passes `EngineConfig::corrupt_limit`
//!    leaves as failed, like after a disk error: it is rebuilt elsewhere.
//! 5. A repair step that fails otherwise is handled as a resync copy's would be: a replica
//!    that fails a read or the write leaves (failed on a disk error); a lost session drops
//!    the repair (the replica left; what it lacks is resynced when it returns).

use crate::constants::{MAX_REPAIRS, ORDER_BLOCK_BYTES};
// One part of `Engine`'s impl, a child module of engine.rs (which holds the engine's state
// and calls this part), split by concern as the engine grew.
use crate::engine::{failure_to_io, Engine, Membership, Set, Work};
use crate::range_lock::block_span;
use crate::types::{ClientOp, Command, ReplicaFailure, ReplicaIdx, ReplicaResult, Tag};

/// Corrupt blocks confirmed on one replica in this engine's life (`Engine::integrity`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Integrity {
    /// Blocks found corrupt under the range lock.
    pub found: u64,
    /// Of those, rewritten from another replica.
    pub repaired: u64,
    /// Of those, corrupt on every in-sync replica: lost.
    pub unrecoverable: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Waiting for the range lock.
    Locking,
    /// Reading the range back from the corrupt replica.
    Verifying,
    Reading(ReplicaIdx),
    Writing,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Repair {
    pub target: ReplicaIdx,
    /// The blocks repaired: whole blocks, clipped to the volume's end.
    pub offset: u64,
    pub len: u32,
    pub stage: Stage,
    /// Replicas asked for a good copy so far (and the target).
    pub tried: Set,
    /// What the verify read found: first bad offset and bad blocks.
    pub found: (u64, u32),
    /// Sources that answered `Corrupt`: repaired in turn when this repair ends, unless no
    /// source was good (3).
    pub corrupt_sources: Set,
}

impl Engine {
    /// Corrupt blocks confirmed on `r` so far.
    pub fn integrity(&self, r: ReplicaIdx) -> Integrity {
        self.slot(r).integrity
    }

    /// Queue a repair of `[offset, offset + len)`, widened to whole blocks, on `r`. At most
    /// one per (replica, range) at a time, and at most `MAX_REPAIRS` in all (a range not
    /// queued is found again by its next read).
    pub fn repair(&mut self, r: ReplicaIdx, offset: u64, len: u32, out: &mut Vec<Command>) {
        if self.fenced || len == 0 {
            return;
        }
        let (start, end) = block_span(offset, u64::from(len));
        let end = end.min(self.size);
        assert!(start < end, "a repair of nothing");
        let len = u32::try_from(end - start).expect("a read's range widened by a block");
        let queued = self
            .repairs
            .values()
            .any(|q| q.target == r && q.offset == start && q.len == len);
        if queued || self.repairs.len() >= MAX_REPAIRS {
            return;
        }
        let tag = self.next_internal;
        self.next_internal += 1;
        let mut tried = Set::default();
        tried.add(r);
        self.repairs.insert(
            tag,
            Repair {
                target: r,
                offset: start,
                len,
                stage: Stage::Locking,
                tried,
                found: (0, 0),
                corrupt_sources: Set::default(),
            },
        );
        if let Some(Work::Repair) = self.locks.acquire(tag, Some((start, end)), Work::Repair) {
            self.repair_locked(tag, out);
        }
    }

    /// The repair holds its blocks: read them back from the corrupt replica (3a).
    pub(crate) fn repair_locked(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let Some(q) = self.repairs.get(&tag).copied() else {
            // Cancelled while waiting (shutdown): just give the range back.
            self.release(tag, out);
            return;
        };
        if self.fenced || !self.readable(q.target) {
            return self.end_repair(tag, out);
        }
        self.repair_send(tag, q.target, Stage::Verifying, read_op(&q), out);
    }

    /// An answer to one of a repair's requests.
    pub(crate) fn on_repair_reply(
        &mut self,
        tag: Tag,
        from: ReplicaIdx,
        result: ReplicaResult,
        out: &mut Vec<Command>,
    ) {
        let Some(q) = self.repairs.get(&tag).copied() else {
            return;
        };
        match (q.stage, result) {
            // The first `Corrupt` raced a write: nothing rotted.
            (Stage::Verifying, Ok(_)) => self.end_repair(tag, out),
            (Stage::Verifying, Err(ReplicaFailure::Corrupt { first, blocks })) => {
                self.repairs.get_mut(&tag).expect("checked").found = (first, blocks);
                self.repair_next_source(tag, out);
            }
            (Stage::Reading(_), Ok(Some(data))) if data.len() == q.len as usize => {
                if !self.readable(q.target) {
                    return self.end_repair(tag, out);
                }
                let op = ClientOp::Write {
                    offset: q.offset,
                    data,
                    fua: true,
                };
                self.repair_send(tag, q.target, Stage::Writing, op, out);
            }
            (Stage::Reading(_), Err(ReplicaFailure::Corrupt { .. })) => {
                // Rotted there too: it gets its own repair when this one ends (3).
                let q = self.repairs.get_mut(&tag).expect("checked");
                q.corrupt_sources.add(from);
                self.repair_next_source(tag, out);
            }
            (Stage::Reading(_) | Stage::Verifying, other) => {
                // Failed (or answered garbage): it leaves, as after a copy's failed read.
                let disk = !matches!(other, Err(ReplicaFailure::Lost | ReplicaFailure::NoSpace));
                self.leave(from, disk, out);
                if q.stage == Stage::Verifying {
                    self.end_repair(tag, out);
                } else {
                    self.repair_next_source(tag, out);
                }
            }
            (Stage::Writing, Ok(_)) => {
                let (first, blocks) = q.found;
                self.corruption(q.target, first, blocks, true, out);
                self.end_repair(tag, out);
            }
            (Stage::Writing, Err(f)) => {
                // A failed write is a failed write: it leaves, and resyncs the range when it
                // returns (the write may have reached part of it).
                let (offset, len) = (q.offset, u64::from(q.len));
                self.slot_mut(q.target)
                    .mark_dirty(|d| d.set_bytes(offset, len));
                self.leave(q.target, f == ReplicaFailure::Io, out);
                self.end_repair(tag, out);
            }
            (Stage::Locking, _) => unreachable!("no request is sent before the lock is held"),
        }
    }

    /// Ask the next in-sync replica for a good copy (3b), or report the blocks lost.
    fn repair_next_source(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let Some(q) = self.repairs.get(&tag).copied() else {
            return;
        };
        if !self.readable(q.target) {
            return self.end_repair(tag, out);
        }
        match self.pick_reader(q.tried) {
            Some(source) => {
                self.repairs
                    .get_mut(&tag)
                    .expect("checked")
                    .tried
                    .add(source);
                self.repair_send(tag, source, Stage::Reading(source), read_op(&q), out);
            }
            None => {
                let (first, blocks) = q.found;
                self.corruption(q.target, first, blocks, false, out);
                // Every in-sync replica failed the range: repairs of the sources would loop.
                if let Some(q) = self.repairs.get_mut(&tag) {
                    q.corrupt_sources = Set::default();
                }
                self.end_repair(tag, out);
            }
        }
    }

    fn repair_send(
        &mut self,
        tag: Tag,
        r: ReplicaIdx,
        stage: Stage,
        op: ClientOp,
        out: &mut Vec<Command>,
    ) {
        self.repairs.get_mut(&tag).expect("a live repair").stage = stage;
        let sub = self.new_sub(tag, r);
        out.push(Command::Send {
            replica: r,
            sub,
            op,
            background: true,
        });
    }

    /// The repair is over: give its range back, queue the repairs of the sources that were
    /// corrupt too (3), and let a scrub waiting for repairs to drain go on.
    fn end_repair(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let q = self.repairs.remove(&tag);
        self.release(tag, out);
        if let Some(q) = q {
            for r in self.indices().collect::<Vec<_>>() {
                if q.corrupt_sources.has(r) && self.readable(r) {
                    self.repair(r, q.offset, q.len, out);
                }
            }
        }
        self.pump_scrub(out);
    }

    /// Whether `r` is still a replica reads go to (in sync, with a session).
    pub(crate) fn readable(&self, r: ReplicaIdx) -> bool {
        self.membership(r) == Membership::InSync && self.slot(r).connected
    }

    /// Blocks confirmed corrupt on `r` under the range lock: report, count, and past the
    /// limit take `r` out as failed (4).
    pub(crate) fn corruption(
        &mut self,
        r: ReplicaIdx,
        offset: u64,
        blocks: u32,
        repaired: bool,
        out: &mut Vec<Command>,
    ) {
        out.push(Command::Corruption {
            replica: r,
            offset,
            blocks,
            repaired,
        });
        let limit = self.cfg.corrupt_limit;
        let i = &mut self.slot_mut(r).integrity;
        i.found += u64::from(blocks);
        if repaired {
            i.repaired += u64::from(blocks);
        } else {
            i.unrecoverable += u64::from(blocks);
        }
        debug_assert_eq!(i.found, i.repaired + i.unrecoverable);
        if i.found > limit && !self.slot(r).failed {
            self.leave(r, true, out);
        }
    }

    /// Every sub-request of read `tag` is answered (called by `try_finish`): complete it,
    /// then repair the replicas that answered `Corrupt`; or, if none served it and some
    /// answered `Corrupt` without the lock, run it again under the lock (1, 2).
    pub(crate) fn finish_read(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let p = self.pending.remove(&tag).expect("try_finish checked it");
        assert_eq!(p.outstanding, 0);
        let ClientOp::Read { offset, len } = p.op else {
            unreachable!("finish_read of a read");
        };
        let corrupt: Vec<ReplicaIdx> = self.indices().filter(|&r| p.corrupt.has(r)).collect();
        if p.succeeded.is_empty() && !corrupt.is_empty() && !p.locked {
            let range = Some(block_span(offset, u64::from(len)));
            let work = Work::LockedRead { offset, len };
            if let Some(w) = self.locks.acquire(tag, range, work) {
                self.start_work(tag, w, out);
            }
            return;
        }
        let result = if p.succeeded.is_empty() {
            if p.locked {
                for &r in &corrupt {
                    let (first, blocks) = p.corrupt_at[usize::from(r.0)];
                    self.corruption(r, first, blocks, false, out);
                }
            }
            Err(failure_to_io(p.failure))
        } else {
            Ok(Some(p.data.unwrap_or_default()))
        };
        let served = result.is_ok();
        out.push(Command::Complete { tag, result });
        if served {
            for &r in &corrupt {
                self.repair(r, offset, len, out);
            }
        }
        if p.locked {
            self.release(tag, out);
        }
    }
}

fn read_op(q: &Repair) -> ClientOp {
    debug_assert_eq!(q.offset % ORDER_BLOCK_BYTES, 0);
    ClientOp::Read {
        offset: q.offset,
        len: q.len,
    }
}
