//! Tests of online growth (`grow.rs`), named after the failure each guards against.

// Offsets and lengths here are below 1 MiB, by construction.
#![allow(clippy::cast_possible_truncation)]

use std::collections::VecDeque;

use bytes::Bytes;

use crate::engine::grow::GrowError;
use crate::engine::{Engine, EngineConfig, Initial, Membership, ReplicaSpec};
use crate::io_error::IoError;
use crate::types::{ClientOp, Command, ReplicaIdx, SubId, Tag};

const R0: ReplicaIdx = ReplicaIdx(0);
const R1: ReplicaIdx = ReplicaIdx(1);
const CHUNK: u64 = 64 * 1024;
/// 4.5 chunks: the last one partial, so growth must keep its bit.
const OLD: u64 = 4 * CHUNK + CHUNK / 2;
const NEW: u64 = 8 * CHUNK;

/// Replicas whose disks grow with the volume (zeroes, as the controller grows them); sends
/// are queued and answered in order on demand.
struct Rig {
    e: Engine,
    disks: Vec<Vec<u8>>,
    queue: VecDeque<(ReplicaIdx, SubId, ClientOp)>,
    done: Vec<(Tag, Result<Option<Bytes>, IoError>)>,
    outdates: Vec<ReplicaIdx>,
    marks: Vec<ReplicaIdx>,
    /// Bytes resync (background sends that modify) put on each replica.
    resynced: Vec<u64>,
    scrub_reads: Vec<(u64, u32)>,
}

impl Rig {
    fn new(r1: Initial) -> Rig {
        let cfg = EngineConfig {
            chunk_bytes: CHUNK,
            resync_unit_bytes: CHUNK,
            scrub_unit_bytes: CHUNK,
            ..EngineConfig::default()
        };
        let specs = [
            ReplicaSpec::in_sync(true),
            ReplicaSpec {
                local: false,
                initial: r1,
            },
        ];
        Rig {
            e: Engine::with_config(OLD, &specs, cfg),
            disks: vec![vec![0; OLD as usize]; 2],
            queue: VecDeque::new(),
            done: vec![],
            outdates: vec![],
            marks: vec![],
            resynced: vec![0; 2],
            scrub_reads: vec![],
        }
    }

    fn with(&mut self, f: impl FnOnce(&mut Engine, &mut Vec<Command>)) {
        let mut out = vec![];
        f(&mut self.e, &mut out);
        for c in out {
            match c {
                Command::Send {
                    replica,
                    sub,
                    op,
                    background,
                } => {
                    if background {
                        if let Some((_, len)) = op.write_range() {
                            self.resynced[usize::from(replica.0)] += len;
                        }
                        if let ClientOp::Read { offset, len } = op {
                            self.scrub_reads.push((offset, len));
                        }
                    }
                    self.queue.push_back((replica, sub, op));
                }
                Command::Complete { tag, result } => self.done.push((tag, result)),
                Command::Outdate { replica, .. } => self.outdates.push(replica),
                Command::MarkInSync { replica } => self.marks.push(replica),
                Command::Disconnect { .. } | Command::ScrubDone { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn submit(&mut self, tag: Tag, op: ClientOp) {
        self.with(|e, out| e.submit(tag, op, out));
    }

    /// The controller's step 1, then the engine's: every disk holds zeroes past the old end.
    fn grow(&mut self, size: u64) {
        for d in &mut self.disks {
            d.resize(size as usize, 0);
        }
        self.e.grow(size).expect("a larger, aligned size");
    }

    /// Answer the first queued send; false if none.
    fn step(&mut self) -> bool {
        let Some((r, sub, op)) = self.queue.pop_front() else {
            return false;
        };
        let result = crate::engine_tests::answer(&mut self.disks[usize::from(r.0)], &op);
        self.with(|e, out| e.on_reply(sub, Ok(result), out));
        true
    }

    fn run(&mut self) {
        while self.step() {}
    }

    fn confirm(&mut self) {
        while !self.outdates.is_empty() || !self.marks.is_empty() {
            for r in std::mem::take(&mut self.outdates) {
                self.with(|e, out| e.on_outdate_done(r, out));
            }
            for r in std::mem::take(&mut self.marks) {
                self.with(|e, out| e.on_mark_in_sync_done(r, true, out));
            }
            self.run();
        }
    }

    /// Replica 1 leaves and is outdated.
    fn outdate_r1(&mut self) {
        self.with(|e, out| e.on_replica_lost(R1, out));
        self.confirm();
        assert_eq!(self.e.membership(R1), Membership::Outdated);
    }

    fn take_done(&mut self) -> Vec<(Tag, Result<Option<Bytes>, IoError>)> {
        let mut d = std::mem::take(&mut self.done);
        d.sort_by_key(|c| c.0);
        d
    }
}

fn write(offset: u64, byte: u8, len: u64) -> ClientOp {
    ClientOp::Write {
        offset,
        data: Bytes::from(vec![byte; len as usize]),
        fua: false,
    }
}

#[test]
fn a_smaller_or_misaligned_size_is_refused_and_the_same_size_changes_nothing() {
    let mut g = Rig::new(Initial::InSync);
    assert_eq!(
        g.e.grow(OLD - 512),
        Err(GrowError::Shrink {
            size: OLD,
            requested: OLD - 512
        })
    );
    assert_eq!(
        g.e.grow(NEW + 100),
        Err(GrowError::Misaligned {
            requested: NEW + 100,
            align: 512
        })
    );
    assert_eq!(g.e.size(), OLD, "a refused grow changed the size");
    assert_eq!(g.e.dirty(R0).chunks(), 5);
    assert_eq!(g.e.grow(OLD), Ok(()));
    assert_eq!((g.e.size(), g.e.dirty(R1).chunks()), (OLD, 5));
}

#[test]
fn a_write_into_the_new_range_is_refused_before_the_grow_and_accepted_after() {
    let mut g = Rig::new(Initial::InSync);
    g.submit(1, write(6 * CHUNK, 1, 4096));
    assert_eq!(g.take_done(), vec![(1, Err(IoError::Invalid))]);
    assert!(g.queue.is_empty(), "an out-of-range write was sent");
    g.grow(NEW);
    g.submit(2, write(6 * CHUNK, 2, 4096));
    // The new part of the old partial chunk, and across the old end.
    g.submit(3, write(OLD - 4096, 3, 8192));
    g.run();
    assert_eq!(g.take_done(), vec![(2, Ok(None)), (3, Ok(None))]);
    assert!(g.disks[0] == g.disks[1]);
    assert_eq!(g.disks[1][6 * CHUNK as usize], 2);
    assert_eq!(g.disks[1][OLD as usize + 4095], 3);
    g.submit(4, write(NEW - 512, 4, 1024));
    assert_eq!(
        g.take_done(),
        vec![(4, Err(IoError::Invalid))],
        "past the new end"
    );
}

#[test]
fn a_write_in_flight_across_the_grow_completes() {
    let mut g = Rig::new(Initial::InSync);
    g.submit(1, write(OLD - 4096, 1, 4096));
    assert_eq!(g.queue.len(), 2);
    // One replica answered before the grow, the other after.
    assert!(g.step());
    g.grow(NEW);
    g.run();
    assert_eq!(g.take_done(), vec![(1, Ok(None))]);
    assert!(g.outdates.is_empty(), "a replica left over a grow");
    assert_eq!(g.e.in_flight(), 0);
}

#[test]
fn an_outdated_replicas_full_map_stays_full_in_the_old_range_and_clean_in_the_new() {
    let mut g = Rig::new(Initial::Outdated { dirty: None });
    assert_eq!(g.e.dirty(R1).runs(), vec![(0, 5)]);
    g.grow(NEW);
    assert_eq!(
        g.e.dirty(R1).runs(),
        vec![(0, 5)],
        "the unknown old range must stay dirty, the new range clean"
    );
    assert!(
        g.e.dirty(R0).is_empty(),
        "growth dirtied an in-sync replica"
    );
    // A write it misses in the new range is dirty on it like any other.
    g.submit(1, write(7 * CHUNK, 7, 4096));
    g.run();
    assert_eq!(g.e.dirty(R1).runs(), vec![(0, 5), (7, 8)]);
    g.with(|e, out| e.on_replica_connected(R1, false, out));
    g.run();
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::InSync);
    // Chunk 4 is copied whole (its new part is zeroes everywhere).
    assert_eq!(
        g.resynced[1],
        6 * CHUNK,
        "copied other than the dirty chunks"
    );
    assert!(g.disks[0] == g.disks[1], "replicas differ after the resync");
}

#[test]
fn resync_after_a_grow_copies_only_whats_dirty_and_keeps_the_partial_chunk_bit() {
    let mut g = Rig::new(Initial::InSync);
    g.outdate_r1();
    g.submit(1, write(CHUNK, 1, 4096));
    // Into the old partial last chunk: its bit must survive the grow.
    g.submit(2, write(OLD - 512, 2, 512));
    g.run();
    assert_eq!(g.e.dirty(R1).runs(), vec![(1, 2), (4, 5)]);
    g.grow(NEW);
    assert_eq!(g.e.dirty(R1).runs(), vec![(1, 2), (4, 5)]);
    g.submit(3, write(6 * CHUNK, 3, 4096));
    g.run();
    assert_eq!(g.e.dirty(R1).runs(), vec![(1, 2), (4, 5), (6, 7)]);
    g.with(|e, out| e.on_replica_connected(R1, false, out));
    g.run();
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::InSync);
    assert_eq!(g.resynced[1], 3 * CHUNK);
    assert!(g.disks[0] == g.disks[1], "replicas differ after the resync");
}

/// A copy of the old partial last chunk reads only its old part; the volume grows while it is
/// in flight. Its answer must still be taken (its length is the range it asked for), and a
/// client write into the chunk's new part must wait for it: the copy clears the whole chunk's
/// bit when it lands, which is right only if nothing was written there meanwhile.
#[test]
fn a_copy_of_the_partial_last_chunk_in_flight_across_the_grow_lands_and_keeps_writes_out() {
    let mut g = Rig::new(Initial::InSync);
    g.outdate_r1();
    g.submit(1, write(OLD - 512, 1, 512));
    g.run();
    g.take_done();
    g.with(|e, out| e.on_replica_connected(R1, false, out));
    assert_eq!(g.queue.len(), 1, "the copy's read");
    g.grow(NEW);
    g.submit(2, write(OLD, 2, 4096));
    assert_eq!(
        g.queue.len(),
        1,
        "a write into the copy's chunk did not wait for it"
    );
    g.run();
    g.confirm();
    assert_eq!(g.take_done(), vec![(2, Ok(None))]);
    assert_eq!(g.e.membership(R1), Membership::InSync);
    assert!(g.outdates.is_empty());
    assert!(g.disks[0] == g.disks[1], "replicas differ after the resync");
    assert_eq!(g.disks[1][OLD as usize], 2);
}

#[test]
fn a_scrub_pass_under_way_reads_the_new_range_too() {
    let mut g = Rig::new(Initial::InSync);
    let mut started = false;
    g.with(|e, out| started = e.start_scrub(out));
    assert!(started);
    // Units are chunks, read on both replicas: answer the first four, so the fifth (the old
    // partial one) is under way when the volume grows.
    for _ in 0..8 {
        assert!(g.step());
    }
    g.grow(NEW);
    g.run();
    let v = g.e.scrub_view().expect("a pass");
    assert!(!v.running && v.passes == 1);
    assert_eq!((v.scrubbed_bytes, v.size_bytes), (NEW, NEW));
    let reads: Vec<(u64, u32)> = g.scrub_reads.iter().copied().step_by(2).collect();
    let mut expect: Vec<(u64, u32)> = (0..4).map(|u| (u * CHUNK, CHUNK as u32)).collect();
    // The unit under way when it grew ends at the old end; the pass goes on from there, a
    // unit at a time, to the new end.
    expect.push((4 * CHUNK, (CHUNK / 2) as u32));
    let mut at = OLD;
    while at < NEW {
        let len = CHUNK.min(NEW - at);
        expect.push((at, len as u32));
        at += len;
    }
    assert_eq!(reads, expect);
    // The next pass covers the whole new size from the start.
    g.scrub_reads.clear();
    g.with(|e, out| started = e.start_scrub(out));
    assert!(started);
    g.run();
    let last = g.scrub_reads.last().copied().expect("reads");
    assert_eq!(u64::from(last.1) + last.0, NEW);
}
