//! Resync: copying a returning replica's dirty chunks from an in-sync one.
//!
//! A syncing replica receives every new write, so its dirty set only shrinks (unless one fails
//! on it, or another replica is promoted). Each copy takes
//! the range lock of the chunks it copies (like a client write), reads them from an in-sync
//! replica (the local one first) and writes them to the syncing one, then clears their bits.
//! Holding the lock orders the copy against client writes to the same chunks: a write either
//! finished before the copy read (so the copy carries it) or starts after the copy wrote (so
//! it lands on top, on every replica). When no bit is left the replica is flushed and then
//! made in-sync: directly if the store never stopped calling it in-sync (it was `Down`), else
//! through the control plane (`Command::MarkInSync`). With no in-sync replica to copy from,
//! one that the store still calls in-sync is promoted to reference instead (`promote`).
//!
//! A source whose read answers `Corrupt` (rotted blocks, `repair.rs`) still has every
//! acknowledged write, so it is not failed for it: the copy reads from another in-sync replica
//! if one is left, and the source's range is repaired (queued behind the copy, whose lock it
//! needs). With no other source the copy fails as after any failed read (the source leaves and
//! the chunks stay dirty), but as outdated, never as failed: rot is not a disk error. This is
//! the least change to the copy's rules: a copy still only ever writes data an in-sync replica
//! served, and a rotted source is never read past its checksum.
//!
//! A copied range that reads back as zeroes (a hole on a thin source, or zeroed data) is sent
//! as a WriteZeroes that may deallocate: nothing crosses the network, and a thin target keeps
//! the hole instead of allocating it ("unallocated regions are not copied").

use bytes::Bytes;

use crate::bitmap::ChunkMap;
// One part of `Engine`'s impl, a child module of engine.rs (which holds the engine's state
// and calls this part), split by concern as the engine grew.
use crate::engine::{Engine, Membership, Set, Work};
use crate::io_error::IoError;
use crate::types::{ClientOp, Command, ReplicaFailure, ReplicaIdx, ReplicaResult, Tag};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Waiting for the range lock.
    Locking,
    Reading(ReplicaIdx),
    Writing,
    /// The final flush of a fully copied replica (no range).
    Flushing,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Copy {
    pub target: ReplicaIdx,
    /// Chunk range `[first, end)`; the copy holds the range lock of these whole chunks.
    pub first: u64,
    pub end: u64,
    /// The bytes its read asked for (the chunks, clipped to the volume's end when it was
    /// sent): its answer and write are this range even if the volume grew since.
    pub bytes: (u64, u64),
    pub stage: Stage,
    /// `Engine::promotions` when its data was read.
    pub promotions: u64,
    /// Sources asked so far (another is tried when one answers `Corrupt`).
    pub tried: Set,
}

/// Where the resync of one replica stands (`Engine::resync_point`), for a driver that saves
/// what the replica still lacks while the resync runs, so that a restarted engine resumes
/// instead of copying the whole map again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResyncPoint {
    /// Chunks the replica may still lack: its dirty chunks and those of every copy to it in
    /// flight (not yet acknowledged). Every other chunk it holds as written or copied (its
    /// copy acknowledged before the point; after a reboot of its node, copies it may have
    /// lost are dirty again, `unflushed_at_loss`), so a flush of the replica sent after the
    /// point was taken makes it durable there.
    pub lacks: ChunkMap,
    session: u64,
    marks: u64,
}

impl Engine {
    /// The resync point of `r` while it is connected and `Syncing` or `Marking` (`None`
    /// otherwise). Saving `lacks` as the replica's dirty map is safe once a flush of `r` sent
    /// after this call succeeded and `resync_point_holds` is still true.
    pub fn resync_point(&self, r: ReplicaIdx) -> Option<ResyncPoint> {
        let s = self.slot(r);
        if !s.connected || !matches!(s.membership, Membership::Syncing | Membership::Marking) {
            return None;
        }
        let mut lacks = s.dirty.clone();
        // Their bits are still set until they are acknowledged; kept explicit so the point
        // stays right whatever clears bits.
        for c in self.copies.values() {
            if c.target == r && c.stage != Stage::Flushing {
                lacks.set_chunks(c.first, c.end);
            }
        }
        Some(ResyncPoint {
            lacks,
            session: s.session,
            marks: s.dirty_marks,
        })
    }

    /// Whether `p` (taken for `r`) still bounds what `r` may lack together with its dirty
    /// map now, given that a flush of `r` sent after `p` was taken succeeded: `r` has had no
    /// new session since (the flush reached the replica as it was at the point, not one
    /// that came back, perhaps rebooted, in between), and nothing was added to its dirty map
    /// (a chunk marked and copied again after `p` would be in neither, with its copy not
    /// flushed). It must also still be connected: a driver opens a new session only after
    /// the engine heard of the old one's loss, so a flush that went out on a later session
    /// than the point's is caught here or by the session number.
    pub fn resync_point_holds(&self, r: ReplicaIdx, p: &ResyncPoint) -> bool {
        let s = self.slot(r);
        s.connected && s.session == p.session && s.dirty_marks == p.marks
    }

    /// `r` is connected again and starts receiving writes while its dirty chunks are copied.
    pub(crate) fn begin_sync(
        &mut self,
        r: ReplicaIdx,
        store_in_sync: bool,
        out: &mut Vec<Command>,
    ) {
        let s = self.slot_mut(r);
        s.membership = Membership::Syncing;
        s.store_in_sync = store_in_sync;
        s.cursor = 0;
        self.pump_resync(out);
    }

    /// Start copies up to the configured parallelism for every syncing replica, and finish
    /// those with nothing left to copy.
    pub(crate) fn pump_resync(&mut self, out: &mut Vec<Command>) {
        if self.fenced {
            return;
        }
        if self.pick_reader(Default::default()).is_none() {
            // No source: wait for an in-sync replica, or make one.
            self.promote(out);
            return;
        }
        let unit = (self.cfg.resync_unit_bytes / self.cfg.chunk_bytes).max(1);
        for r in self.indices().collect::<Vec<_>>() {
            loop {
                let s = self.slot(r);
                if s.membership != Membership::Syncing
                    || !s.connected
                    || s.sync_flushing
                    || s.copies >= self.cfg.resync_parallel
                {
                    break;
                }
                let Some((first, end)) = s.dirty.next_run(s.cursor, unit) else {
                    break;
                };
                let busy = self
                    .copies
                    .values()
                    .any(|c| c.target == r && c.first < end && first < c.end);
                if busy {
                    break; // wrapped around onto copies still in flight
                }
                let s = self.slot_mut(r);
                s.cursor = end;
                s.copies += 1;
                let tag = self.new_copy(r, first, end, Stage::Locking);
                let range = Some(self.chunk_lock(first, end));
                if let Some(Work::Copy) = self.locks.acquire(tag, range, Work::Copy) {
                    self.copy_locked(tag, out);
                }
            }
            self.maybe_finish_sync(r, out);
        }
    }

    /// No replica is in sync (the last one was lost while the others were out), so nothing
    /// can be resynced, and writes parked on the lost ones would wait forever. A syncing
    /// replica that the store still calls in-sync (it was `Down`, never outdated) has every
    /// acknowledged write (it held up the acknowledgement of every write it lacks), unless
    /// its node rebooted and lost unflushed ones. Such a replica becomes the reference: the
    /// requests it lacks fail with EIO (never acknowledged, so that is allowed), their chunks
    /// become dirty on every other replica instead, and it is flushed and made in-sync; the
    /// others are then resynced from it. Not while a replica is `Marking` (it becomes the
    /// source when the store answers).
    fn promote(&mut self, out: &mut Vec<Command>) {
        let settling = |m| matches!(m, Membership::InSync | Membership::Marking);
        if self.indices().any(|r| settling(self.membership(r))) {
            return;
        }
        let candidate = self
            .indices()
            .filter(|&r| {
                let s = self.slot(r);
                s.membership == Membership::Syncing
                    && s.store_in_sync
                    && s.connected
                    && !s.reboot_lost
                    && !s.failed
            })
            .min_by_key(|&r| (self.slot(r).dirty.bytes(), r));
        let Some(r) = candidate else {
            return;
        };
        self.promotions += 1;
        let (size, chunk) = (self.size, self.cfg.chunk_bytes);
        let lacks = std::mem::replace(&mut self.slot_mut(r).dirty, ChunkMap::new(size, chunk));
        if !lacks.is_empty() {
            for o in self.indices().collect::<Vec<_>>() {
                let s = self.slot_mut(o);
                if o != r && s.membership != Membership::Failed {
                    s.mark_dirty(|d| d.union(&lacks));
                    s.cursor = 0;
                }
            }
        }
        self.fail_missed_by(r, out);
        self.maybe_finish_sync(r, out);
    }

    /// `r` becomes the reference: requests it did not get fail (parked ones now, the others
    /// when they complete). Their chunks are dirty on `r` from when they missed it.
    fn fail_missed_by(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let session = self.slot(r).session;
        let mut failed: Vec<Tag> = Vec::new();
        for (&tag, p) in &mut self.pending {
            if matches!(p.op, ClientOp::Read { .. }) || p.succeeded.has(r) {
                continue;
            }
            let on_current = p.sent.has(r) && p.sessions[usize::from(r.0)] == session;
            if p.missed.is_some() {
                failed.push(tag);
            } else if !on_current || p.failed.has(r) {
                p.doomed = true;
            }
        }
        failed.sort_unstable();
        for tag in failed {
            let Some(p) = self.pending.remove(&tag) else {
                continue;
            };
            self.parked.remove(&tag);
            if matches!(p.op, ClientOp::Flush) {
                self.unflushed.flush_failed(tag);
            }
            out.push(Command::Complete {
                tag,
                result: Err(IoError::Io),
            });
        }
    }

    /// Register one of the engine's own operations under a fresh internal tag.
    fn new_copy(&mut self, target: ReplicaIdx, first: u64, end: u64, stage: Stage) -> Tag {
        let tag = self.next_internal;
        self.next_internal += 1;
        self.copies.insert(
            tag,
            Copy {
                target,
                first,
                end,
                bytes: (0, 0),
                stage,
                promotions: self.promotions,
                tried: Set::default(),
            },
        );
        tag
    }

    fn byte_range(&self, first: u64, end: u64) -> (u64, u64) {
        let chunk = self.cfg.chunk_bytes;
        (first * chunk, (end * chunk).min(self.size))
    }

    /// The range lock of a copy of chunks `[first, end)`: whole chunks, past the volume's end
    /// for a partial last one. Nothing else ever holds bytes past the end, so this orders the
    /// copy exactly as its byte range would, until the volume grows: then it also keeps
    /// client writes out of the new part of that chunk while the copy runs (`grow.rs`).
    fn chunk_lock(&self, first: u64, end: u64) -> (u64, u64) {
        let chunk = self.cfg.chunk_bytes;
        (first * chunk, end * chunk)
    }

    /// The copy holds its range: read it from an in-sync replica.
    pub(crate) fn copy_locked(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let Some(c) = self.copies.get(&tag).copied() else {
            // Cancelled while waiting (shutdown): just give the range back.
            self.release(tag, out);
            return;
        };
        let t = self.slot(c.target);
        let source = self.pick_reader(Default::default());
        let (Some(source), true) = (source, t.membership == Membership::Syncing && t.connected)
        else {
            self.end_copy(tag, out);
            return;
        };
        self.copy_read(tag, c, source, Set::default(), out);
    }

    /// Read the copy's range from `source`; `tried`: sources that answered `Corrupt`.
    fn copy_read(
        &mut self,
        tag: Tag,
        c: Copy,
        source: ReplicaIdx,
        tried: Set,
        out: &mut Vec<Command>,
    ) {
        let (offset, end) = self.byte_range(c.first, c.end);
        let len = u32::try_from(end - offset).expect("resync unit fits in u32");
        let mut tried = tried;
        tried.add(source);
        self.copies.insert(
            tag,
            Copy {
                bytes: (offset, end),
                stage: Stage::Reading(source),
                promotions: self.promotions,
                tried,
                ..c
            },
        );
        let sub = self.new_sub(tag, source);
        out.push(Command::Send {
            replica: source,
            sub,
            op: ClientOp::Read { offset, len },
            background: true,
        });
    }

    /// An answer to one of the engine's own requests (a copy's read or write, or the final
    /// flush of a resync).
    pub(crate) fn on_copy_reply(
        &mut self,
        tag: Tag,
        from: ReplicaIdx,
        result: ReplicaResult,
        out: &mut Vec<Command>,
    ) {
        let Some(c) = self.copies.get(&tag).copied() else {
            return;
        };
        let (offset, end) = c.bytes;
        match (c.stage, result) {
            (Stage::Reading(_), Ok(Some(data))) if data.len() as u64 == end - offset => {
                let t = self.slot(c.target);
                if t.membership != Membership::Syncing || !t.connected {
                    self.end_copy(tag, out);
                    return;
                }
                self.copies.insert(
                    tag,
                    Copy {
                        stage: Stage::Writing,
                        ..c
                    },
                );
                let sub = self.new_sub(tag, c.target);
                out.push(Command::Send {
                    replica: c.target,
                    sub,
                    op: copy_op(offset, data),
                    background: true,
                });
            }
            (Stage::Reading(_), Err(ReplicaFailure::Corrupt { .. })) => {
                self.copy_source_corrupt(tag, c, from, out);
            }
            (Stage::Reading(_), other) => {
                // The source failed (or answered garbage): it leaves; the chunks stay dirty
                // and are copied from another source later.
                let disk = !matches!(other, Err(ReplicaFailure::Lost | ReplicaFailure::NoSpace));
                self.leave(from, disk, out);
                self.end_copy(tag, out);
            }
            (Stage::Writing, Ok(_)) => {
                let current = c.promotions == self.promotions;
                let s = self.slot_mut(c.target);
                if s.membership == Membership::Syncing && current {
                    // Also a partial last chunk the volume grew past since the read: its new
                    // part is zeroes everywhere, kept so by this copy's lock (`chunk_lock`).
                    s.dirty.clear_chunks(c.first, c.end);
                    s.copied_bytes += end - offset;
                    // Not durable until the resync's final flush: if the node loses power
                    // before, these chunks are recopied (see `unflushed`).
                    self.unflushed.wrote(c.first, c.end);
                }
                self.end_copy(tag, out);
            }
            (Stage::Writing, Err(f)) => {
                self.leave(c.target, f == ReplicaFailure::Io, out);
                self.end_copy(tag, out);
            }
            (Stage::Flushing, Ok(_)) => {
                self.copies.remove(&tag);
                self.slot_mut(c.target).sync_flushing = false;
                self.sync_flushed(c.target, out);
            }
            (Stage::Flushing, Err(f)) => {
                self.copies.remove(&tag);
                self.slot_mut(c.target).sync_flushing = false;
                self.leave(c.target, f == ReplicaFailure::Io, out);
            }
            (Stage::Locking, _) => unreachable!("no request is sent before the lock is held"),
        }
    }

    /// The copy's source answered `Corrupt` (module doc): another source if one is left, and a
    /// repair of the source; else the source leaves, as outdated.
    fn copy_source_corrupt(&mut self, tag: Tag, c: Copy, from: ReplicaIdx, out: &mut Vec<Command>) {
        let t = self.slot(c.target);
        if t.membership != Membership::Syncing || !t.connected {
            self.end_copy(tag, out);
            return;
        }
        match self.pick_reader(c.tried) {
            Some(source) => {
                let (offset, end) = c.bytes;
                let len = u32::try_from(end - offset).expect("resync unit fits in u32");
                self.repair(from, offset, len, out);
                self.copy_read(tag, c, source, c.tried, out);
            }
            None => {
                self.leave(from, false, out);
                self.end_copy(tag, out);
            }
        }
    }

    /// A copy is over (done, or abandoned with its chunks still dirty): give back its range
    /// and keep going.
    fn end_copy(&mut self, tag: Tag, out: &mut Vec<Command>) {
        if let Some(c) = self.copies.remove(&tag) {
            let s = self.slot_mut(c.target);
            s.copies = s.copies.saturating_sub(1);
        }
        self.release(tag, out);
        self.pump_resync(out);
    }

    /// Nothing left to copy to `r`: flush it, so what was copied is durable before the store
    /// calls it in-sync.
    fn maybe_finish_sync(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let s = self.slot(r);
        if s.membership != Membership::Syncing
            || !s.connected
            || s.sync_flushing
            || s.copies > 0
            || !s.dirty.is_empty()
        {
            return;
        }
        self.slot_mut(r).sync_flushing = true;
        let tag = self.new_copy(r, 0, 0, Stage::Flushing);
        let sub = self.new_sub(tag, r);
        self.flush_sent(r, sub);
        out.push(Command::Send {
            replica: r,
            sub,
            op: ClientOp::Flush,
            background: false,
        });
    }

    fn sync_flushed(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let s = self.slot(r);
        if s.membership != Membership::Syncing || !s.connected {
            return;
        }
        if !s.dirty.is_empty() {
            self.pump_resync(out);
            return;
        }
        if s.store_in_sync && !self.cfg.mark_every_resync {
            self.slot_mut(r).membership = Membership::InSync;
            self.became_in_sync(r, out);
        } else {
            // Everything it lacked was copied and flushed: it holds every acknowledged write
            // (2. of the safety argument), whatever its node lost before; the journals say
            // so from the in-sync commit on, and keep saying so while it is marking.
            let s = self.slot_mut(r);
            s.reboot_lost = false;
            s.journal_lacks = false;
            s.membership = Membership::Marking;
            out.push(Command::MarkInSync { replica: r });
        }
    }
}

/// The request that puts a copied range `data` at `offset` on the target.
fn copy_op(offset: u64, data: Bytes) -> ClientOp {
    const ZEROES: [u8; 4096] = [0; 4096];
    // Compared a page at a time (memcmp): data that is not zero usually differs in its first
    // page, so this costs almost nothing for it.
    if data.chunks(ZEROES.len()).all(|c| c == &ZEROES[..c.len()]) {
        let len = u32::try_from(data.len()).expect("resync unit fits in u32");
        return ClientOp::WriteZeroes {
            offset,
            len,
            fua: false,
            may_trim: true,
        };
    }
    ClientOp::Write {
        offset,
        data,
        fua: false,
    }
}
