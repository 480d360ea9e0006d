//! Scrub: a background pass over the whole volume that finds blocks rotted where no client
//! read looks, and has them repaired (`repair.rs`) while a good copy still exists.
//!
//! 1. A pass (`Engine::start_scrub`) walks the volume from offset 0 in units of
//!    `EngineConfig::scrub_unit_bytes`. For the current unit it reads the unit on every
//!    in-sync, connected replica, as background sends (the driver's resync rate limit delays
//!    them), then moves to the next unit once all of them are answered: one unit in flight at
//!    a time bounds the pass's share of the disks, and client I/O never waits for it.
//! 2. The reads take no range lock: a read racing a client write may answer `Corrupt` for a
//!    block that did not rot (a replica writes a block's data before its checksum). That is
//!    harmless, because the scrub does not act on an answer itself: a `Corrupt` answer queues
//!    a repair of the first bad block (`Engine::repair`), which takes the lock and reads the
//!    block again before it counts or rewrites anything. A race counts nothing.
//! 3. After a `Corrupt` answer the replica's read goes on past that block, to the unit's end,
//!    so each bad block gets its own one-block repair: rot on two replicas at different
//!    blocks of one unit is repaired from each other, block by block. A block bad on every
//!    in-sync replica is reported unrecoverable by its repair, never served as data.
//! 4. A read that fails otherwise is treated as a failed client read on that replica: it
//!    leaves (a disk error marks it failed; a lost session is its loss, already handled),
//!    and the pass goes on without it. "Stale epoch" fences the engine, as everywhere.
//! 5. With `MAX_REPAIRS` queued, the pass waits for repairs to drain before queueing more
//!    (nothing found is dropped); with no in-sync replica connected it waits for one.
//! 6. The pass is over when its cursor reached the volume's end and no repair is pending:
//!    `Command::ScrubDone` carries its findings (the growth of `Engine::integrity`, summed
//!    over replicas, since it started). `stop_scrub` ends it where it is, without
//!    `ScrubDone`; fencing and shutdown do too. Answers to a stopped pass's reads are ignored.

use crate::constants::{MAX_REPAIRS, MAX_REPLICAS, ORDER_BLOCK_BYTES};
// One part of `Engine`'s impl, a child module of engine.rs (which holds the engine's state
// and calls this part), split by concern as the engine grew.
use crate::engine::repair::Integrity;
use crate::engine::Engine;
use crate::types::{ClientOp, Command, ReplicaFailure, ReplicaIdx, ReplicaResult, Tag};

/// What `Engine::scrub_view` reports about the scrub pass running, or the last one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubView {
    /// A pass is under way.
    pub running: bool,
    /// Bytes of the volume the pass has read on every in-sync replica so far.
    pub scrubbed_bytes: u64,
    pub size_bytes: u64,
    /// Blocks confirmed corrupt (summed over replicas) since the pass started, and of those
    /// the repaired and the unrecoverable ones (rule 6).
    pub found_blocks: u64,
    pub repaired_blocks: u64,
    pub unrecoverable_blocks: u64,
    /// Passes completed (`Command::ScrubDone`) in this engine's life.
    pub passes: u64,
}

/// Where one replica's read of the current unit stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// Answered to the unit's end (or left, or was never read).
    Done,
    /// Reading `[offset, unit end)` under internal tag `tag`.
    Reading { tag: Tag, offset: u64 },
    /// Found the block at `block` bad; its repair waits for room (rule 5).
    Found { block: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Unit {
    end: u64,
    parts: [Part; MAX_REPLICAS],
}

/// The scrub pass running or last run (`Engine::scrub`).
#[derive(Clone, Debug)]
pub(crate) struct Scrub {
    running: bool,
    /// Start of the unit being read, or of the next one.
    cursor: u64,
    unit: Option<Unit>,
    /// `Engine::integrity` summed over replicas when the pass started.
    base: Integrity,
    /// The findings of a pass that ended (fixed then).
    ended: Option<Integrity>,
    passes: u64,
}

impl Scrub {
    /// Reads of the current unit in flight.
    pub(crate) fn reads_in_flight(&self) -> usize {
        self.unit.as_ref().map_or(0, |u| {
            let reading = |p: &&Part| matches!(p, Part::Reading { .. });
            u.parts.iter().filter(reading).count()
        })
    }
}

impl Engine {
    /// Start a scrub pass from offset 0. False, and nothing done, if one is running or the
    /// engine is fenced.
    pub fn start_scrub(&mut self, out: &mut Vec<Command>) -> bool {
        if self.fenced || self.scrub.as_ref().is_some_and(|s| s.running) {
            return false;
        }
        let passes = self.scrub.as_ref().map_or(0, |s| s.passes);
        self.scrub = Some(Scrub {
            running: true,
            cursor: 0,
            unit: None,
            base: self.integrity_sum(),
            ended: None,
            passes,
        });
        self.pump_scrub(out);
        true
    }

    /// End the pass where it is (no `ScrubDone`); answers to its reads in flight are ignored.
    /// Repairs it queued go on.
    pub fn stop_scrub(&mut self) {
        self.scrub_stopped();
    }

    /// The pass running or the last one; `None` before the first.
    pub fn scrub_view(&self) -> Option<ScrubView> {
        let s = self.scrub.as_ref()?;
        let found = s
            .ended
            .unwrap_or_else(|| since(self.integrity_sum(), s.base));
        Some(ScrubView {
            running: s.running,
            scrubbed_bytes: s.cursor.min(self.size),
            size_bytes: self.size,
            found_blocks: found.found,
            repaired_blocks: found.repaired,
            unrecoverable_blocks: found.unrecoverable,
            passes: s.passes,
        })
    }

    /// Stop the pass without `ScrubDone` (`stop_scrub`, fencing, shutdown).
    pub(crate) fn scrub_stopped(&mut self) {
        let now = self.integrity_sum();
        if let Some(s) = self.scrub.as_mut().filter(|s| s.running) {
            s.running = false;
            s.unit = None;
            s.ended = Some(since(now, s.base));
        }
    }

    /// Whether internal tag `tag` is a read of the running pass.
    pub(crate) fn scrub_owns(&self, tag: Tag) -> bool {
        let Some(unit) = self.scrub.as_ref().and_then(|s| s.unit.as_ref()) else {
            return false;
        };
        let ours = |p: &Part| matches!(*p, Part::Reading { tag: t, .. } if t == tag);
        unit.parts.iter().any(ours)
    }

    /// An answer to one of the pass's reads (rules 2-4).
    pub(crate) fn on_scrub_reply(
        &mut self,
        tag: Tag,
        from: ReplicaIdx,
        result: ReplicaResult,
        out: &mut Vec<Command>,
    ) {
        let readable = self.readable(from);
        let Some(unit) = self.scrub.as_mut().and_then(|s| s.unit.as_mut()) else {
            return;
        };
        let i = usize::from(from.0);
        let Part::Reading { tag: t, offset } = unit.parts[i] else {
            unreachable!("scrub_owns found the read on another replica");
        };
        assert_eq!(t, tag, "one read per replica in flight");
        let end = unit.end;
        unit.parts[i] = Part::Done;
        match result {
            Ok(_) => {}
            Err(ReplicaFailure::Corrupt { first, .. }) => {
                if readable {
                    // The replica's word: a first block outside the range read is taken as
                    // the range's first block, so the read still makes progress.
                    let block = first - first % ORDER_BLOCK_BYTES;
                    let block = if (offset..end).contains(&block) {
                        block
                    } else {
                        offset
                    };
                    unit.parts[i] = Part::Found { block };
                }
            }
            Err(f) => {
                // As after a failed client read: it leaves, failed on a disk error.
                self.leave(from, f == ReplicaFailure::Io, out);
            }
        }
        self.pump_scrub(out);
    }

    /// Move the pass on as far as it can go now: repairs waiting for room, the next unit,
    /// the end of the pass (rules 1, 5, 6).
    pub(crate) fn pump_scrub(&mut self, out: &mut Vec<Command>) {
        loop {
            let Some(s) = self.scrub.as_ref().filter(|s| s.running) else {
                return;
            };
            if self.fenced {
                return;
            }
            let (cursor, unit) = (s.cursor, s.unit);
            let Some(unit) = unit else {
                if !self.scrub_next_unit(cursor, out) {
                    return;
                }
                continue;
            };
            let found = self
                .indices()
                .find_map(|r| match unit.parts[usize::from(r.0)] {
                    Part::Found { block } => Some((r, block)),
                    _ => None,
                });
            if let Some((r, block)) = found {
                if self.readable(r) && self.repairs.len() >= MAX_REPAIRS {
                    return;
                }
                self.scrub_read(r, block + ORDER_BLOCK_BYTES, out);
                if self.readable(r) {
                    let len = u32::try_from(ORDER_BLOCK_BYTES).expect("a block fits in u32");
                    self.repair(r, block, len, out);
                }
                continue;
            }
            if unit.parts.iter().any(|p| matches!(p, Part::Reading { .. })) {
                return;
            }
            let s = self.scrub.as_mut().expect("checked");
            s.cursor = unit.end;
            s.unit = None;
        }
    }

    /// Start reading the unit at `cursor`, or end the pass at the volume's end. False when
    /// nothing can be done now (rule 5, or the pass ended).
    fn scrub_next_unit(&mut self, cursor: u64, out: &mut Vec<Command>) -> bool {
        if cursor >= self.size {
            if self.repairs.is_empty() {
                self.scrub_done(out);
            }
            return false;
        }
        let readers: Vec<ReplicaIdx> = self.indices().filter(|&r| self.readable(r)).collect();
        if readers.is_empty() || self.repairs.len() >= MAX_REPAIRS {
            return false;
        }
        let end = (cursor + self.cfg.scrub_unit_bytes).min(self.size);
        let s = self.scrub.as_mut().expect("a running pass");
        s.unit = Some(Unit {
            end,
            parts: [Part::Done; MAX_REPLICAS],
        });
        for r in readers {
            self.scrub_read(r, cursor, out);
        }
        true
    }

    /// Read `[offset, unit end)` on `r`, or mark `r` done with the unit if that is empty or
    /// `r` no longer serves reads.
    fn scrub_read(&mut self, r: ReplicaIdx, offset: u64, out: &mut Vec<Command>) {
        let readable = self.readable(r);
        let Some(unit) = self.scrub.as_mut().and_then(|s| s.unit.as_mut()) else {
            unreachable!("a scrub read outside a unit");
        };
        let i = usize::from(r.0);
        if offset >= unit.end || !readable {
            unit.parts[i] = Part::Done;
            return;
        }
        let len = u32::try_from(unit.end - offset).expect("scrub unit fits in u32");
        let tag = self.next_internal;
        self.next_internal += 1;
        unit.parts[i] = Part::Reading { tag, offset };
        let sub = self.new_sub(tag, r);
        out.push(Command::Send {
            replica: r,
            sub,
            op: ClientOp::Read { offset, len },
            background: true,
        });
    }

    fn scrub_done(&mut self, out: &mut Vec<Command>) {
        let now = self.integrity_sum();
        let s = self.scrub.as_mut().expect("a running pass");
        debug_assert!(s.unit.is_none() && s.cursor >= self.size);
        let found = since(now, s.base);
        s.running = false;
        s.ended = Some(found);
        s.passes += 1;
        out.push(Command::ScrubDone {
            found_blocks: found.found,
            repaired_blocks: found.repaired,
            unrecoverable_blocks: found.unrecoverable,
        });
    }

    fn integrity_sum(&self) -> Integrity {
        self.indices()
            .map(|r| self.integrity(r))
            .fold(Integrity::default(), |a, b| Integrity {
                found: a.found + b.found,
                repaired: a.repaired + b.repaired,
                unrecoverable: a.unrecoverable + b.unrecoverable,
            })
    }
}

/// What was counted between `base` and `now`.
fn since(now: Integrity, base: Integrity) -> Integrity {
    Integrity {
        found: now.found - base.found,
        repaired: now.repaired - base.repaired,
        unrecoverable: now.unrecoverable - base.unrecoverable,
    }
}
