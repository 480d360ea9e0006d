//! Tests of the scrub pass (`scrub.rs`), named after what each rule guards against.

// Offsets and lengths here are below 8 MiB, by construction.
#![allow(clippy::cast_possible_truncation)]

use std::collections::{BTreeSet, VecDeque};

use bytes::Bytes;

use crate::constants::{MAX_REPAIRS, ORDER_BLOCK_BYTES};
use crate::engine::repair::Integrity;
use crate::engine::scrub::ScrubView;
use crate::engine::{Engine, EngineConfig, Membership, ReplicaSpec};
use crate::types::{ClientOp, Command, ReplicaFailure, ReplicaIdx, ReplicaResult, SubId};

const R0: ReplicaIdx = ReplicaIdx(0);
const R1: ReplicaIdx = ReplicaIdx(1);
const R2: ReplicaIdx = ReplicaIdx(2);
const UNIT: u64 = 64 * 1024;
const SIZE: u64 = 4 * UNIT;
const BLOCK: u64 = ORDER_BLOCK_BYTES;

/// `n` in-sync replicas of a `size`-byte volume, R0 local, scrubbed in 64 KiB units.
fn engine(n: usize, size: u64) -> Engine {
    let specs: Vec<ReplicaSpec> = (0..n).map(|i| ReplicaSpec::in_sync(i == 0)).collect();
    let cfg = EngineConfig {
        scrub_unit_bytes: UNIT,
        ..EngineConfig::default()
    };
    Engine::with_config(size, &specs, cfg)
}

/// Replicas whose rotted blocks (block indices) answer reads with `Corrupt`; a write heals
/// the blocks it covers. Every `Send` is answered in order; every command is kept.
struct Rig {
    e: Engine,
    rot: Vec<BTreeSet<u64>>,
    log: Vec<Command>,
}

impl Rig {
    fn new(n: usize) -> Rig {
        Rig {
            e: engine(n, SIZE),
            rot: vec![BTreeSet::new(); n],
            log: Vec::new(),
        }
    }

    fn answer(&mut self, r: ReplicaIdx, op: &ClientOp) -> ReplicaResult {
        let rot = &mut self.rot[usize::from(r.0)];
        match op {
            ClientOp::Read { offset, len } => {
                let blocks = offset / BLOCK..(offset + u64::from(*len)).div_ceil(BLOCK);
                let bad: Vec<u64> = rot.range(blocks).copied().collect();
                match bad.first() {
                    Some(&first) => Err(ReplicaFailure::Corrupt {
                        first: first * BLOCK,
                        blocks: bad.len() as u32,
                    }),
                    None => Ok(Some(Bytes::from(vec![0; *len as usize]))),
                }
            }
            other => {
                if let Some((offset, len)) = other.write_range() {
                    let blocks: Vec<u64> = rot
                        .range(offset / BLOCK..(offset + len).div_ceil(BLOCK))
                        .copied()
                        .collect();
                    for b in blocks {
                        rot.remove(&b);
                    }
                }
                Ok(None)
            }
        }
    }

    /// Answer every send in `out`, and those they lead to, until none is left.
    fn drive(&mut self, out: Vec<Command>) {
        let mut queue: VecDeque<Command> = out.into_iter().collect();
        while let Some(c) = queue.pop_front() {
            self.log.push(c.clone());
            if let Command::Send {
                replica, sub, op, ..
            } = c
            {
                let result = self.answer(replica, &op);
                let mut out = vec![];
                self.e.on_reply(sub, result, &mut out);
                queue.extend(out);
            }
        }
    }

    fn scrub(&mut self) {
        let mut out = vec![];
        assert!(self.e.start_scrub(&mut out), "the pass did not start");
        self.drive(out);
    }

    fn done(&self) -> Vec<&Command> {
        let done = |c: &&Command| matches!(c, Command::ScrubDone { .. });
        self.log.iter().filter(done).collect()
    }

    fn writes(&self) -> usize {
        let write = |c: &&Command| {
            matches!(
                c,
                Command::Send {
                    op: ClientOp::Write { .. },
                    ..
                }
            )
        };
        self.log.iter().filter(write).count()
    }
}

/// Every `Send` of `out`: (replica, sub, op).
fn sends(out: &[Command]) -> Vec<(ReplicaIdx, SubId, ClientOp)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Send {
                replica, sub, op, ..
            } => Some((*replica, *sub, op.clone())),
            _ => None,
        })
        .collect()
}

fn done(found: u64, repaired: u64, unrecoverable: u64) -> Command {
    Command::ScrubDone {
        found_blocks: found,
        repaired_blocks: repaired,
        unrecoverable_blocks: unrecoverable,
    }
}

fn finished(found: u64, repaired: u64, unrecoverable: u64) -> ScrubView {
    ScrubView {
        running: false,
        scrubbed_bytes: SIZE,
        size_bytes: SIZE,
        found_blocks: found,
        repaired_blocks: repaired,
        unrecoverable_blocks: unrecoverable,
        passes: 1,
    }
}

fn repaired(blocks: u64) -> Integrity {
    Integrity {
        found: blocks,
        repaired: blocks,
        unrecoverable: 0,
    }
}

#[test]
fn a_pass_repairs_rot_on_each_replica_at_offsets_in_different_units() {
    let mut rig = Rig::new(2);
    rig.rot[0].insert(2); // unit 0
    rig.rot[1].insert((3 * UNIT + 4096) / BLOCK); // unit 3
    rig.scrub();
    assert!(
        rig.rot.iter().all(BTreeSet::is_empty),
        "rot left: {:?}",
        rig.rot
    );
    assert_eq!(rig.done(), vec![&done(2, 2, 0)]);
    assert_eq!(rig.e.scrub_view(), Some(finished(2, 2, 0)));
    assert_eq!(
        (rig.e.integrity(R0), rig.e.integrity(R1)),
        (repaired(1), repaired(1))
    );
    assert_eq!(rig.e.in_flight(), 0);
}

#[test]
fn rot_on_both_replicas_at_different_blocks_of_one_unit_is_repaired_block_by_block() {
    let mut rig = Rig::new(2);
    rig.rot[0].insert(1);
    rig.rot[1].insert(5);
    rig.rot[1].insert(9);
    rig.scrub();
    assert!(
        rig.rot.iter().all(BTreeSet::is_empty),
        "rot left: {:?}",
        rig.rot
    );
    assert_eq!(rig.done(), vec![&done(3, 3, 0)]);
    assert_eq!(
        (rig.e.integrity(R0), rig.e.integrity(R1)),
        (repaired(1), repaired(2))
    );
    for r in [R0, R1] {
        assert_eq!(rig.e.membership(r), Membership::InSync);
    }
}

#[test]
fn a_block_rotted_on_every_replica_is_unrecoverable_and_never_served_as_data() {
    let mut rig = Rig::new(2);
    rig.rot[0].insert(3);
    rig.rot[1].insert(3);
    rig.scrub();
    let lost = Integrity {
        found: 1,
        repaired: 0,
        unrecoverable: 1,
    };
    assert_eq!((rig.e.integrity(R0), rig.e.integrity(R1)), (lost, lost));
    assert_eq!(rig.done(), vec![&done(2, 0, 2)], "not done exactly once");
    assert_eq!(rig.writes(), 0, "data written from a rotted copy");
    assert!(
        !rig.log
            .iter()
            .any(|c| matches!(c, Command::Complete { .. })),
        "a completion without a client request"
    );
    assert_eq!(rig.rot[0].len() + rig.rot[1].len(), 2);
    for r in [R0, R1] {
        assert_eq!(
            rig.e.membership(r),
            Membership::InSync,
            "rot made {r:?} leave"
        );
    }
    assert_eq!(rig.e.in_flight(), 0);
}

#[test]
fn a_corrupt_answer_racing_a_client_write_counts_nothing() {
    let mut rig = Rig::new(2);
    let mut out = vec![];
    let write = ClientOp::Write {
        offset: 4096,
        data: Bytes::from(vec![9; 4096]),
        fua: false,
    };
    rig.e.submit(1, write, &mut out);
    let writes = sends(&out);
    assert_eq!(writes.len(), 2);
    out.clear();
    assert!(rig.e.start_scrub(&mut out));
    let reads = sends(&out);
    assert_eq!(reads.len(), 2, "the scrub waited for a lock: {out:?}");
    // R0's read met the block half written (data before checksum): `Corrupt`.
    out.clear();
    let raced = Err(ReplicaFailure::Corrupt {
        first: 4096,
        blocks: 1,
    });
    rig.e.on_reply(reads[0].1, raced, &mut out);
    rig.e.on_reply(reads[1].1, Ok(None), &mut out);
    let verify = |out: &[Command]| {
        sends(out).iter().any(|(r, _, op)| {
            *r == R0
                && *op
                    == ClientOp::Read {
                        offset: 4096,
                        len: 4096,
                    }
        })
    };
    assert!(
        !verify(&out),
        "the repair read the block under a write in flight"
    );
    // The write completes, the repair's verify read finds the block whole.
    for (_, sub, _) in writes {
        rig.e.on_reply(sub, Ok(None), &mut out);
    }
    assert!(verify(&out), "no verify read after the write: {out:?}");
    rig.drive(out);
    assert_eq!(rig.e.integrity(R0), Integrity::default());
    assert_eq!(rig.done(), vec![&done(0, 0, 0)]);
    assert!(!rig
        .log
        .iter()
        .any(|c| matches!(c, Command::Corruption { .. })));
}

#[test]
fn a_second_start_while_a_pass_runs_or_once_fenced_does_nothing() {
    let mut rig = Rig::new(2);
    let mut out = vec![];
    assert!(rig.e.start_scrub(&mut out));
    let mut again = vec![];
    assert!(!rig.e.start_scrub(&mut again), "two passes at once");
    assert!(again.is_empty());
    rig.drive(out);
    assert_eq!(rig.done().len(), 1);
    // A finished pass may be followed by another.
    let mut out = vec![];
    assert!(rig.e.start_scrub(&mut out));
    rig.drive(out);
    assert_eq!(rig.e.scrub_view().map(|v| v.passes), Some(2));
    let mut out = vec![];
    rig.e.on_fenced(&mut out);
    assert!(!rig.e.start_scrub(&mut out), "a fenced engine scrubbed");
}

#[test]
fn fencing_mid_pass_clears_it_without_scrub_done() {
    let mut rig = Rig::new(2);
    let mut out = vec![];
    assert!(rig.e.start_scrub(&mut out));
    let reads = sends(&out);
    out.clear();
    rig.e.on_fenced(&mut out);
    for (_, sub, _) in reads {
        rig.e.on_reply(sub, Ok(None), &mut out);
    }
    assert!(!out
        .iter()
        .any(|c| matches!(c, Command::ScrubDone { .. } | Command::Send { .. })));
    assert_eq!(rig.e.scrub_view().map(|v| v.running), Some(false));
    assert_eq!(rig.e.in_flight(), 0);
}

#[test]
fn stop_scrub_ends_the_pass_where_it_is_and_ignores_its_reads() {
    let mut rig = Rig::new(2);
    rig.rot[0].insert(1);
    let mut out = vec![];
    assert!(rig.e.start_scrub(&mut out));
    let reads = sends(&out);
    rig.e.stop_scrub();
    rig.drive(out);
    assert!(rig.done().is_empty(), "a stopped pass reported done");
    assert_eq!(
        rig.e.integrity(R0),
        Integrity::default(),
        "a stopped pass repaired"
    );
    assert_eq!(
        rig.log.len(),
        reads.len(),
        "a stopped pass went on: {:?}",
        rig.log
    );
    let v = rig.e.scrub_view().expect("a pass ran");
    assert_eq!((v.running, v.scrubbed_bytes, v.passes), (false, 0, 0));
    // A new pass starts from offset 0 and finds the rot.
    rig.scrub();
    assert_eq!(rig.done(), vec![&done(1, 1, 0)]);
}

#[test]
fn a_replica_lost_mid_pass_is_skipped_and_the_pass_finishes() {
    let mut rig = Rig::new(3);
    rig.rot[2].insert((2 * UNIT) / BLOCK);
    let mut out = vec![];
    assert!(rig.e.start_scrub(&mut out));
    assert_eq!(sends(&out).len(), 3);
    let mut lost = vec![];
    rig.e.on_replica_lost(R1, &mut lost);
    out.extend(lost);
    rig.drive(out);
    assert_eq!(rig.done(), vec![&done(1, 1, 0)]);
    assert_eq!(rig.e.scrub_view().map(|v| v.scrubbed_bytes), Some(SIZE));
    let after_loss = rig
        .log
        .iter()
        .skip(3)
        .any(|c| matches!(c, Command::Send { replica: R1, .. }));
    assert!(!after_loss, "a read went to the lost replica");
    assert_eq!(rig.e.integrity(R2), repaired(1));
}

#[test]
fn a_scrub_read_failing_on_the_disk_makes_the_replica_leave_as_failed() {
    let mut rig = Rig::new(3);
    let mut out = vec![];
    assert!(rig.e.start_scrub(&mut out));
    let reads = sends(&out);
    out.clear();
    rig.e
        .on_reply(reads[1].1, Err(ReplicaFailure::Io), &mut out);
    assert!(out.contains(&Command::Outdate {
        replica: R1,
        failed: true
    }));
    rig.e.on_reply(reads[0].1, Ok(None), &mut out);
    rig.e.on_reply(reads[2].1, Ok(None), &mut out);
    rig.drive(out);
    assert_eq!(rig.done(), vec![&done(0, 0, 0)]);
}

#[test]
fn only_one_units_reads_are_in_flight_at_a_time() {
    let mut rig = Rig::new(2);
    let mut out = vec![];
    assert!(rig.e.start_scrub(&mut out));
    let first = sends(&out);
    let unit0 = ClientOp::Read {
        offset: 0,
        len: UNIT as u32,
    };
    assert_eq!(
        first.iter().map(|s| (s.0, s.2.clone())).collect::<Vec<_>>(),
        vec![(R0, unit0.clone()), (R1, unit0)]
    );
    assert!(out.iter().all(|c| matches!(
        c,
        Command::Send {
            background: true,
            ..
        }
    )));
    out.clear();
    rig.e.on_reply(first[0].1, Ok(None), &mut out);
    assert!(
        out.is_empty(),
        "the next unit started before R1 answered: {out:?}"
    );
    rig.e.on_reply(first[1].1, Ok(None), &mut out);
    let next: Vec<ClientOp> = sends(&out).into_iter().map(|s| s.2).collect();
    let unit1 = ClientOp::Read {
        offset: UNIT,
        len: UNIT as u32,
    };
    assert_eq!(next, vec![unit1.clone(), unit1]);
    assert_eq!(rig.e.scrub_view().map(|v| v.scrubbed_bytes), Some(UNIT));
}

#[test]
fn the_pass_waits_while_max_repairs_are_queued_and_drops_nothing_it_found() {
    let size = 8 << 20;
    let mut e = engine(2, size);
    let mut out = vec![];
    assert!(e.start_scrub(&mut out));
    let reads = sends(&out);
    // Client reads fill the repair queue meanwhile (ranges past the first unit).
    let mut verifies = vec![];
    for i in 0..MAX_REPAIRS as u64 {
        let mut o = vec![];
        e.repair(R1, UNIT + i * BLOCK, 4096, &mut o);
        verifies.extend(sends(&o));
    }
    assert_eq!(verifies.len(), MAX_REPAIRS);
    // R0's read finds block 2 rotted: its repair waits for room, and so does the pass.
    out.clear();
    let rot = Err(ReplicaFailure::Corrupt {
        first: 2 * BLOCK,
        blocks: 1,
    });
    e.on_reply(reads[0].1, rot, &mut out);
    e.on_reply(reads[1].1, Ok(None), &mut out);
    assert!(
        sends(&out).is_empty(),
        "the pass went on with no room: {out:?}"
    );
    // One repair ends (a race): the found block's repair is queued, R0 reads on past it.
    e.on_reply(verifies[0].1, Ok(None), &mut out);
    let s: Vec<(ReplicaIdx, ClientOp)> = sends(&out).into_iter().map(|s| (s.0, s.2)).collect();
    assert!(s.contains(&(
        R0,
        ClientOp::Read {
            offset: 3 * BLOCK,
            len: (UNIT - 3 * BLOCK) as u32
        }
    )));
    assert!(s.contains(&(
        R0,
        ClientOp::Read {
            offset: 2 * BLOCK,
            len: 4096
        }
    )));
    assert_eq!(s.len(), 2, "{out:?}");
    assert_eq!(e.scrub_view().map(|v| v.scrubbed_bytes), Some(0));
}
