//! Engine tests: one per rule. The seeded random runs (network, disks, crashes) are in the
//! `hawser-sim` crate.

// Offsets and lengths here are below 64 KiB and replica counts below 4, by construction.
#![allow(clippy::cast_possible_truncation)]

use crate::engine::{Engine, EngineConfig, Initial, Membership, NoQuorum, ReplicaSpec};
use crate::io_error::IoError;
use crate::types::{ClientOp, Command, ReplicaFailure, ReplicaIdx, SubId, Tag};
use bytes::Bytes;

/// What an in-memory replica disk `d` answers to `op` (and what it does to `d`); also the
/// replicas of `grow_tests.rs`.
pub(crate) fn answer(d: &mut [u8], op: &ClientOp) -> Option<Bytes> {
    match op {
        ClientOp::Write { offset, data, .. } => {
            let o = *offset as usize;
            d[o..o + data.len()].copy_from_slice(data);
            None
        }
        ClientOp::Trim { offset, len } | ClientOp::WriteZeroes { offset, len, .. } => {
            let o = *offset as usize;
            d[o..o + *len as usize].fill(0);
            None
        }
        ClientOp::Read { offset, len } => {
            let o = *offset as usize;
            Some(Bytes::copy_from_slice(&d[o..o + *len as usize]))
        }
        ClientOp::Flush => None,
    }
}

const R0: ReplicaIdx = ReplicaIdx(0);
const R1: ReplicaIdx = ReplicaIdx(1);

const R2: ReplicaIdx = ReplicaIdx(2);

fn engine(n: usize) -> Engine {
    let mut local = vec![false; n];
    local[0] = true;
    Engine::new(1 << 20, &local)
}

fn write(offset: u64, byte: u8, len: usize) -> ClientOp {
    ClientOp::Write {
        offset,
        data: Bytes::from(vec![byte; len]),
        fua: false,
    }
}

fn outdate(replica: ReplicaIdx, failed: bool) -> Command {
    Command::Outdate { replica, failed }
}

fn sends(out: &[Command]) -> Vec<(ReplicaIdx, SubId)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Send { replica, sub, .. } => Some((*replica, *sub)),
            _ => None,
        })
        .collect()
}

fn completions(out: &[Command]) -> Vec<(Tag, Result<Option<Bytes>, IoError>)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Complete { tag, result } => Some((*tag, result.clone())),
            _ => None,
        })
        .collect()
}

/// A 2-replica engine with write tag 1 sent to both replicas; returns the engine and sends.
fn one_write_on_two_replicas() -> (Engine, Vec<(ReplicaIdx, SubId)>) {
    let mut e = engine(2);
    let mut out = vec![];
    e.submit(1, write(0, 1, 4096), &mut out);
    let s = sends(&out);
    assert_eq!(s.len(), 2, "the write did not go to both replicas");
    (e, s)
}

#[test]
fn write_acked_only_when_every_replica_has_it() {
    let mut e = engine(2);
    let mut out = vec![];
    e.submit(1, write(0, 1, 4096), &mut out);
    let s = sends(&out);
    assert_eq!(s.len(), 2);
    out.clear();
    e.on_reply(s[0].1, Ok(None), &mut out);
    assert!(
        completions(&out).is_empty(),
        "acked with one replica of two"
    );
    e.on_reply(s[1].1, Ok(None), &mut out);
    assert_eq!(completions(&out), vec![(1, Ok(None))]);
}

#[test]
fn failed_replica_is_outdated_before_the_ack() {
    let (mut e, s) = one_write_on_two_replicas();
    let mut out = vec![];
    e.on_reply(s[0].1, Ok(None), &mut out);
    e.on_reply(s[1].1, Err(ReplicaFailure::Io), &mut out);
    assert_eq!(
        out,
        vec![outdate(R1, true), Command::Disconnect { replica: R1 }]
    );
    out.clear();
    // A second write meanwhile goes only to R0, and also waits for the outdate.
    e.submit(2, write(8192, 2, 4096), &mut out);
    let s2 = sends(&out);
    assert_eq!(s2, vec![(R0, s2[0].1)]);
    out.clear();
    e.on_reply(s2[0].1, Ok(None), &mut out);
    assert!(
        completions(&out).is_empty(),
        "acked a write the outdating replica missed"
    );
    e.on_outdate_done(R1, &mut out);
    let mut done = completions(&out);
    done.sort_by_key(|c| c.0);
    assert_eq!(done, vec![(1, Ok(None)), (2, Ok(None))]);
    assert_eq!(
        e.membership(R1),
        Membership::Failed,
        "a disk error fails the replica"
    );
    assert!(
        !e.wants_connection(R1),
        "a failed replica is never resynced"
    );
}

#[test]
fn a_corrupt_frame_fails_the_replica() {
    let (mut e, s) = one_write_on_two_replicas();
    let mut out = vec![];
    e.on_reply(s[0].1, Ok(None), &mut out);
    e.on_replica_corrupt(R1, &mut out);
    assert!(out.contains(&outdate(R1, true)), "{out:?}");
    assert!(
        completions(&out).is_empty(),
        "acked before the replica is out of the store's in-sync set"
    );
    out.clear();
    e.on_outdate_done(R1, &mut out);
    assert_eq!(completions(&out), vec![(1, Ok(None))]);
    assert_eq!(e.membership(R1), Membership::Failed);
    assert!(!e.wants_connection(R1), "never reconnected automatically");
}

#[test]
fn a_disk_error_while_rejoining_fails_the_outdated_replica_for_good() {
    let (mut e, s) = one_write_on_two_replicas();
    let mut out = vec![];
    e.on_reply(s[0].1, Ok(None), &mut out);
    e.on_replica_lost(R1, &mut out);
    e.on_outdate_done(R1, &mut out);
    assert_eq!(e.membership(R1), Membership::Outdated);
    assert!(e.wants_connection(R1));
    out.clear();
    e.on_replica_disk_error(R1, &mut out);
    assert_eq!(out, vec![outdate(R1, true)], "reported failed to the store");
    out.clear();
    e.on_outdate_done(R1, &mut out);
    assert_eq!(e.membership(R1), Membership::Failed);
    assert!(!e.wants_connection(R1), "never reconnected automatically");
    e.on_replica_disk_error(R1, &mut out);
    assert!(out.is_empty(), "a repeat changes nothing: {out:?}");
}

#[test]
fn all_replicas_failing_fails_the_write_and_outdates_nobody() {
    let (mut e, s) = one_write_on_two_replicas();
    let mut out = vec![];
    e.on_reply(s[0].1, Err(ReplicaFailure::NoSpace), &mut out);
    e.on_reply(s[1].1, Err(ReplicaFailure::NoSpace), &mut out);
    assert_eq!(
        out,
        vec![Command::Complete {
            tag: 1,
            result: Err(IoError::NoSpace)
        }]
    );
    assert_eq!(e.in_sync(), vec![R0, R1]);
}

#[test]
fn crossed_failures_never_hang_and_never_outdate_the_last_copy() {
    let mut e = engine(2);
    let mut out = vec![];
    e.submit(1, write(0, 1, 4096), &mut out);
    e.submit(2, write(8192, 2, 4096), &mut out);
    let s = sends(&out);
    out.clear();
    e.on_reply(s[0].1, Err(ReplicaFailure::NoSpace), &mut out); // w1 fails on R0
    e.on_reply(s[1].1, Ok(None), &mut out); // w1 ok on R1 -> outdate R0
    e.on_reply(s[2].1, Ok(None), &mut out); // w2 ok on R0
    e.on_reply(s[3].1, Err(ReplicaFailure::NoSpace), &mut out); // w2 fails on R1, the last copy
    assert!(out.contains(&outdate(R0, false)), "{out:?}");
    assert!(!out.contains(&outdate(R1, false)), "outdated the last copy");
    assert_eq!(e.membership(R1), Membership::Down);
    e.on_outdate_done(R0, &mut out);
    // w1 is acknowledged (R0 is out); w2 waits for R1, which R0 cannot stand in for.
    assert_eq!(completions(&out), vec![(1, Ok(None))]);
    assert_eq!(e.in_sync(), vec![]);
}

#[test]
fn reads_prefer_local_and_retry_elsewhere() {
    let mut e = Engine::new(1 << 20, &[false, true]);
    let mut out = vec![];
    e.submit(
        1,
        ClientOp::Read {
            offset: 0,
            len: 4096,
        },
        &mut out,
    );
    let s = sends(&out);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].0, R1, "read did not go to the local replica");
    out.clear();
    e.on_reply(s[0].1, Err(ReplicaFailure::Io), &mut out);
    let s2 = sends(&out);
    assert_eq!(s2.len(), 1);
    assert_eq!(s2[0].0, R0);
    assert!(out.contains(&outdate(R1, true)));
    out.clear();
    e.on_reply(s2[0].1, Ok(Some(Bytes::from_static(&[7; 4]))), &mut out);
    assert_eq!(
        completions(&out),
        vec![(1, Ok(Some(Bytes::from_static(&[7; 4]))))]
    );
}

#[test]
fn stale_epoch_fences_the_engine() {
    let (mut e, s) = one_write_on_two_replicas();
    let mut out = vec![];
    e.on_reply(s[0].1, Err(ReplicaFailure::StaleEpoch), &mut out);
    assert_eq!(out[0], Command::Fenced);
    assert_eq!(completions(&out), vec![(1, Err(IoError::ShutDown))]);
    out.clear();
    e.on_reply(s[1].1, Ok(None), &mut out);
    assert!(out.is_empty(), "a reply after fencing must change nothing");
    e.submit(2, ClientOp::Flush, &mut out);
    assert_eq!(completions(&out), vec![(2, Err(IoError::ShutDown))]);
}

#[test]
fn invalid_requests_are_refused() {
    let mut e = engine(1);
    let mut out = vec![];
    e.submit(1, write(100, 1, 512), &mut out);
    e.submit(2, write((1 << 20) - 512, 1, 1024), &mut out);
    e.submit(
        3,
        ClientOp::Read {
            offset: u64::MAX - 511,
            len: 512,
        },
        &mut out,
    );
    e.submit(4, ClientOp::Trim { offset: 0, len: 0 }, &mut out);
    let done = completions(&out);
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|(_, r)| *r == Err(IoError::Invalid)));
    assert!(sends(&out).is_empty());
}

#[test]
fn lost_connection_fails_its_requests_over() {
    let (mut e, s) = one_write_on_two_replicas();
    let mut out = vec![];
    e.on_reply(s[0].1, Ok(None), &mut out);
    e.on_replica_lost(R1, &mut out);
    assert_eq!(out, vec![outdate(R1, false)]);
    out.clear();
    e.on_outdate_done(R1, &mut out);
    assert_eq!(completions(&out), vec![(1, Ok(None))]);
}

// ---- resync, quorum and reboots, on a rig that executes sends against byte arrays ----

/// Executes the engine's sends in order on in-memory disks. Replicas marked `down` hold their
/// sends until `lose` answers them as lost.
struct Rig {
    e: Engine,
    disks: Vec<Vec<u8>>,
    queue: std::collections::VecDeque<(ReplicaIdx, SubId, ClientOp)>,
    done: Vec<(Tag, Result<Option<Bytes>, IoError>)>,
    outdates: Vec<(ReplicaIdx, bool)>,
    marks: Vec<ReplicaIdx>,
    down: Vec<bool>,
    /// Bytes written by background (resync) sends, per replica.
    resync_written: Vec<u64>,
    /// Bytes zeroed by background (resync) sends, per replica.
    resync_zeroed: Vec<u64>,
}

const RIG_SIZE: u64 = 1 << 20;
const CHUNK: u64 = 64 * 1024;

impl Rig {
    fn new(n: usize, no_quorum: NoQuorum) -> Rig {
        let cfg = EngineConfig {
            no_quorum,
            ..EngineConfig::default()
        };
        let specs: Vec<ReplicaSpec> = (0..n).map(|i| ReplicaSpec::in_sync(i == 0)).collect();
        Rig {
            e: Engine::with_config(RIG_SIZE, &specs, cfg),
            disks: vec![vec![0; RIG_SIZE as usize]; n],
            queue: Default::default(),
            done: vec![],
            outdates: vec![],
            marks: vec![],
            down: vec![false; n],
            resync_written: vec![0; n],
            resync_zeroed: vec![0; n],
        }
    }

    fn apply(&mut self, out: Vec<Command>) {
        for c in out {
            match c {
                Command::Send {
                    replica,
                    sub,
                    op,
                    background,
                } => {
                    if background {
                        let r = usize::from(replica.0);
                        match &op {
                            ClientOp::Write { data, .. } => {
                                self.resync_written[r] += data.len() as u64;
                            }
                            ClientOp::WriteZeroes { len, .. } => {
                                self.resync_zeroed[r] += u64::from(*len);
                            }
                            _ => {}
                        }
                    }
                    self.queue.push_back((replica, sub, op));
                }
                Command::Complete { tag, result } => self.done.push((tag, result)),
                Command::Outdate { replica, failed } => self.outdates.push((replica, failed)),
                Command::MarkInSync { replica } => self.marks.push(replica),
                Command::Disconnect { .. } => {}
                Command::Fenced => panic!("fenced"),
                Command::Corruption { .. } => panic!("no replica of the rig rots"),
                Command::ScrubDone { .. } => panic!("the rig starts no scrub"),
            }
        }
    }

    fn with(&mut self, f: impl FnOnce(&mut Engine, &mut Vec<Command>)) {
        let mut out = vec![];
        f(&mut self.e, &mut out);
        self.apply(out);
    }

    fn submit(&mut self, tag: Tag, op: ClientOp) {
        self.with(|e, out| e.submit(tag, op, out));
    }

    /// Deliver every send to a replica that is up, until nothing moves.
    fn run(&mut self) {
        while self.step() {}
    }

    /// Deliver the first send to a replica that is up; false if there is none.
    fn step(&mut self) -> bool {
        {
            let Some(i) = self
                .queue
                .iter()
                .position(|(r, _, _)| !self.down[usize::from(r.0)])
            else {
                return false;
            };
            let (r, sub, op) = self.queue.remove(i).expect("index from position");
            let result = answer(&mut self.disks[usize::from(r.0)], &op);
            self.with(|e, out| e.on_reply(sub, Ok(result), out));
        }
        true
    }

    fn lose(&mut self, r: ReplicaIdx) {
        self.down[usize::from(r.0)] = true;
        self.queue.retain(|(q, _, _)| *q != r);
        self.with(|e, out| e.on_replica_lost(r, out));
    }

    fn reconnect(&mut self, r: ReplicaIdx, rebooted: bool) {
        self.down[usize::from(r.0)] = false;
        self.with(|e, out| e.on_replica_connected(r, rebooted, out));
    }

    /// Confirm every outdate and mark the control plane was asked for.
    fn confirm(&mut self) {
        while !self.outdates.is_empty() || !self.marks.is_empty() {
            for (r, _) in std::mem::take(&mut self.outdates) {
                self.with(|e, out| e.on_outdate_done(r, out));
            }
            for r in std::mem::take(&mut self.marks) {
                self.with(|e, out| e.on_mark_in_sync_done(r, true, out));
            }
            self.run();
        }
    }

    fn take_done(&mut self) -> Vec<(Tag, Result<Option<Bytes>, IoError>)> {
        let mut d = std::mem::take(&mut self.done);
        d.sort_by_key(|c| c.0);
        d
    }
}

#[test]
fn returning_replica_copies_only_its_dirty_chunks_then_rejoins() {
    let mut g = Rig::new(2, NoQuorum::Suspend);
    g.submit(1, write(0, 1, 4096));
    g.run();
    g.lose(R1);
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::Outdated);
    g.submit(2, write(3 * CHUNK, 2, 4096));
    g.submit(3, write(5 * CHUNK + 8192, 3, 4096));
    g.run();
    assert_eq!(g.take_done().len(), 3);
    assert_eq!(g.e.dirty(R1).runs(), vec![(3, 4), (5, 6)]);
    g.reconnect(R1, false);
    assert_eq!(g.e.membership(R1), Membership::Syncing);
    g.run();
    assert_eq!(g.marks, vec![R1], "resynced replica not proposed in-sync");
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::InSync);
    assert_eq!(
        g.resync_written[1],
        2 * CHUNK,
        "copied more than the dirty chunks"
    );
    assert_eq!(g.e.replica_view(R1).copied_bytes, 2 * CHUNK);
    assert!(g.disks[0] == g.disks[1], "replicas differ after resync");
}

/// Dirty chunks that read back as zeroes on the source are zeroed on the target (a hole on a
/// thin one), not sent as data.
#[test]
fn a_dirty_range_of_zeroes_is_resynced_as_write_zeroes() {
    let mut g = Rig::new(2, NoQuorum::Suspend);
    g.submit(1, write(5 * CHUNK, 9, CHUNK as usize));
    g.run();
    g.lose(R1);
    g.confirm();
    g.submit(2, write(3 * CHUNK, 2, 4096));
    g.submit(3, write(5 * CHUNK, 0, CHUNK as usize));
    g.run();
    assert_eq!(g.e.dirty(R1).runs(), vec![(3, 4), (5, 6)]);
    g.reconnect(R1, false);
    g.run();
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::InSync);
    assert_eq!(g.resync_written[1], CHUNK, "zeroes were sent as data");
    assert_eq!(g.resync_zeroed[1], CHUNK);
    assert_eq!(g.e.replica_view(R1).copied_bytes, 2 * CHUNK);
    assert!(g.disks[0] == g.disks[1], "replicas differ after resync");
}

#[test]
fn a_rebooted_replica_also_recopies_what_was_not_yet_flushed() {
    for (flushed, rebooted, expect) in [
        (false, true, vec![(7, 8), (9, 10)]),
        (false, false, vec![(9, 10)]),
        (true, true, vec![(9, 10)]),
    ] {
        let mut g = Rig::new(2, NoQuorum::Suspend);
        g.submit(1, write(7 * CHUNK, 1, 4096));
        g.run();
        if flushed {
            // After the write completed: a flush sent while it was in flight would not
            // cover it.
            g.submit(2, ClientOp::Flush);
            g.run();
        }
        g.lose(R1);
        g.confirm();
        g.submit(3, write(9 * CHUNK, 2, 4096));
        g.run();
        g.with(|e, out| e.on_replica_connected(R1, rebooted, out));
        g.down[1] = false;
        assert_eq!(
            g.e.dirty(R1).runs(),
            expect,
            "flushed={flushed} rebooted={rebooted}"
        );
    }
}

#[test]
fn three_replicas_two_lost_suspend_writes_until_one_returns() {
    let mut g = Rig::new(3, NoQuorum::Suspend);
    g.lose(R1);
    assert_eq!(
        g.outdates,
        vec![(R1, false)],
        "two of three remain: R1 may go"
    );
    g.confirm();
    g.lose(R2);
    assert!(
        g.outdates.is_empty(),
        "one of three must not carry on alone"
    );
    assert_eq!(g.e.membership(R2), Membership::Down);
    g.submit(1, write(2 * CHUNK, 9, 4096));
    g.run();
    assert!(g.take_done().is_empty(), "acknowledged without a quorum");
    // Reads still work from the in-sync replica.
    g.submit(
        2,
        ClientOp::Read {
            offset: 0,
            len: 512,
        },
    );
    g.run();
    assert_eq!(g.take_done().len(), 1);
    // R2 comes back: the store never stopped calling it in-sync, but after its resync it is
    // still marked (so the driver commits a journal saying it lacks nothing first), and the
    // suspended write completes only then.
    g.reconnect(R2, false);
    g.run();
    assert_eq!(g.marks, vec![R2]);
    assert_eq!(
        g.take_done(),
        vec![],
        "acknowledged before the mark was confirmed"
    );
    g.confirm();
    assert_eq!(g.e.membership(R2), Membership::InSync);
    assert_eq!(g.take_done(), vec![(1, Ok(None))]);
    assert!(g.disks[0] == g.disks[2]);
    // R1 returns too and goes through the control plane.
    g.reconnect(R1, false);
    g.run();
    assert_eq!(g.marks, vec![R1]);
    g.confirm();
    assert_eq!(g.e.in_sync(), vec![R0, R1, R2]);
    assert!(g.disks[0] == g.disks[1]);
}

#[test]
fn fail_policy_fails_writes_without_quorum_and_never_diverges() {
    let mut g = Rig::new(3, NoQuorum::Fail);
    g.lose(R1);
    g.confirm();
    g.lose(R2);
    g.submit(1, write(0, 5, 8192));
    g.run();
    assert_eq!(g.take_done(), vec![(1, Err(IoError::Io))]);
    assert!(
        g.e.dirty(R2).is_set(0),
        "the failed write's range must be resynced"
    );
    g.reconnect(R2, false);
    g.run();
    g.confirm();
    assert_eq!(g.e.membership(R2), Membership::InSync);
    assert!(g.disks[0] == g.disks[2], "in-sync replicas diverged");
}

#[test]
fn a_resync_copy_and_a_client_write_to_its_chunk_are_ordered() {
    let mut g = Rig::new(2, NoQuorum::Suspend);
    g.lose(R1);
    g.confirm();
    g.submit(1, write(0, 1, 4096));
    g.run();
    g.take_done();
    g.reconnect(R1, false);
    // The copy's read of chunk 0 is queued; a client write to the same chunk must wait.
    assert_eq!(g.queue.len(), 1);
    g.submit(2, write(0, 2, 4096));
    assert_eq!(g.queue.len(), 1, "client write overtook the resync copy");
    g.run();
    g.confirm();
    assert_eq!(g.take_done(), vec![(2, Ok(None))]);
    assert_eq!(g.disks[1][0], 2);
    assert!(g.disks[0] == g.disks[1]);
    assert_eq!(g.e.membership(R1), Membership::InSync);
}

#[test]
fn an_outdated_replica_at_start_is_copied_in_full_or_by_its_bitmap() {
    let mut dirty = crate::ChunkMap::new(RIG_SIZE, CHUNK);
    dirty.set_chunks(2, 3);
    for (initial, copied) in [
        (Initial::Outdated { dirty: None }, RIG_SIZE),
        (Initial::Outdated { dirty: Some(dirty) }, CHUNK),
    ] {
        let specs = vec![
            ReplicaSpec::in_sync(true),
            ReplicaSpec {
                local: false,
                initial,
            },
        ];
        let mut g = Rig::new(2, NoQuorum::Suspend);
        g.e = Engine::with_config(RIG_SIZE, &specs, EngineConfig::default());
        assert!(g.e.wants_connection(R1));
        g.reconnect(R1, true);
        g.run();
        g.confirm();
        assert_eq!(g.e.membership(R1), Membership::InSync);
        // The rig's disks are all zeroes: every copy is a WriteZeroes.
        assert_eq!(g.resync_written[1] + g.resync_zeroed[1], copied);
    }
}

// ---- regressions found by hawser-sim ----

/// Sim bug 8: a replica that rejoins without a reboot keeps the chunks it had not made
/// durable until a flush sent to it after the rejoin succeeds; a power loss before that must
/// still recopy them, although a flush that did not reach it has completed meanwhile.
#[test]
fn unflushed_chunks_survive_a_rejoin_until_a_flush_reaches_the_replica() {
    let mut g = Rig::new(2, NoQuorum::Suspend);
    g.submit(1, write(7 * CHUNK, 1, 4096));
    g.run();
    g.lose(R1);
    g.confirm();
    // A flush that does not reach R1 retires chunk 7 everywhere else.
    g.submit(2, ClientOp::Flush);
    g.run();
    assert_eq!(g.take_done(), vec![(1, Ok(None)), (2, Ok(None))]);
    // R1 comes back (same boot) but is lost again before its resync flush is answered.
    g.with(|e, out| e.on_replica_connected(R1, false, out));
    assert_eq!(g.e.membership(R1), Membership::Syncing);
    g.lose(R1);
    g.confirm();
    // Its node had rebooted meanwhile: chunk 7 may be gone from it.
    g.reconnect(R1, true);
    assert_eq!(
        g.e.dirty(R1).runs(),
        vec![(7, 8)],
        "unflushed chunk forgotten"
    );
    g.run();
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::InSync);
    // Its resync flush covered chunk 7: another reboot recopies nothing of it.
    g.submit(3, ClientOp::Flush);
    g.run();
    g.lose(R1);
    g.confirm();
    g.reconnect(R1, true);
    assert!(g.e.dirty(R1).is_empty(), "{:?}", g.e.dirty(R1).runs());
}

/// Sim bug 8, second half: a write a replica answers after it left is not covered by later
/// flushes (they no longer go to it), so it stays owed to that replica.
#[test]
fn a_write_answered_after_the_replica_left_is_recopied_after_a_reboot() {
    let mut e = engine(2);
    let mut out = vec![];
    e.submit(1, write(0, 1, 4096), &mut out);
    e.submit(2, write(2 * CHUNK, 2, 4096), &mut out);
    let s = sends(&out);
    assert_eq!(s.len(), 4);
    out.clear();
    e.on_reply(s[2].1, Ok(None), &mut out); // w2 ok on R0
    e.on_reply(s[3].1, Err(ReplicaFailure::NoSpace), &mut out); // w2 fails on R1: R1 leaves
    assert!(out.contains(&outdate(R1, false)), "{out:?}");
    e.on_reply(s[1].1, Ok(None), &mut out); // w1 ok on R1, after it left
    e.on_reply(s[0].1, Ok(None), &mut out); // w1 ok on R0
    e.on_replica_lost(R1, &mut out); // the driver closed the session
    e.on_outdate_done(R1, &mut out);
    assert_eq!(completions(&out), vec![(1, Ok(None)), (2, Ok(None))]);
    out.clear();
    e.submit(3, ClientOp::Flush, &mut out);
    let f = sends(&out);
    assert_eq!(f.len(), 1, "the flush goes to R0 only");
    e.on_reply(f[0].1, Ok(None), &mut out);
    assert!(completions(&out).contains(&(3, Ok(None))));
    e.on_replica_connected(R1, true, &mut out);
    assert_eq!(e.dirty(R1).runs(), vec![(0, 1), (2, 3)]);
}

/// Sim bug 5: a write's failure on a replica is acted on when it is reported, and not again
/// at the write's completion if the replica was lost and came back meanwhile: it is being
/// resynced (with the write's range dirty) and must not be thrown out again.
#[test]
fn a_failure_from_an_older_session_does_not_evict_the_resyncing_replica() {
    let mut g = Rig::new(2, NoQuorum::Suspend);
    g.down[0] = true; // hold R0's answers
    g.submit(1, write(3 * CHUNK, 4, 4096));
    g.lose(R1);
    assert_eq!(
        g.e.dirty(R1).runs(),
        vec![(3, 4)],
        "dirty only at completion"
    );
    g.confirm();
    g.reconnect(R1, false);
    assert_eq!(g.e.membership(R1), Membership::Syncing);
    g.down[0] = false;
    g.run();
    assert_eq!(g.take_done(), vec![(1, Ok(None))]);
    assert_eq!(
        g.e.membership(R1),
        Membership::Marking,
        "the old failure evicted the resyncing replica"
    );
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::InSync);
    assert!(g.disks[0] == g.disks[1]);
}

/// Sim: a flush that failed on a replica (lost) which came back on a new session and was
/// resynced to in-sync before the flush completed: the resync ended with a flush of that
/// replica, so the flush must not wait for it forever.
#[test]
fn a_flush_is_not_parked_on_a_replica_resynced_through_a_new_session() {
    let mut g = Rig::new(3, NoQuorum::Suspend);
    g.lose(R2);
    g.confirm();
    g.down[0] = true; // hold R0's answers
    g.submit(1, ClientOp::Flush);
    g.lose(R1);
    assert_eq!(g.e.membership(R1), Membership::Down);
    g.reconnect(R1, false);
    g.run();
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::InSync);
    g.down[0] = false;
    g.run();
    assert_eq!(g.take_done(), vec![(1, Ok(None))], "flush parked forever");
}

/// A replica that fails several requests leaves once and gets one `Disconnect`; a repeated
/// loss report changes nothing.
#[test]
fn a_replica_is_disconnected_once_per_session() {
    let mut e = engine(3);
    let mut out = vec![];
    e.submit(1, write(0, 1, 4096), &mut out);
    e.submit(2, write(2 * CHUNK, 2, 4096), &mut out);
    let s = sends(&out);
    out.clear();
    for (r, sub) in s {
        let result = if r == R0 {
            Err(ReplicaFailure::NoSpace)
        } else {
            Ok(None)
        };
        e.on_reply(sub, result, &mut out);
    }
    let disconnects = out
        .iter()
        .filter(|c| **c == Command::Disconnect { replica: R0 })
        .count();
    assert_eq!(disconnects, 1, "{out:?}");
    e.on_replica_lost(R0, &mut out);
    out.clear();
    e.on_replica_lost(R0, &mut out);
    assert!(
        out.is_empty(),
        "a repeated loss report did something: {out:?}"
    );
}

/// Sim bug 1: once no replica is in sync, a returning replica that the store still calls
/// in-sync (it was `Down`) becomes the resync source: the parked write it lacks fails with
/// EIO, its range is recopied to the others from it, and everything converges.
#[test]
fn with_no_replica_in_sync_a_returning_down_replica_becomes_the_source() {
    let mut g = Rig::new(3, NoQuorum::Suspend);
    g.lose(R1);
    g.confirm();
    g.submit(1, write(2 * CHUNK, 1, 4096));
    g.run();
    g.lose(R2);
    assert_eq!(g.e.membership(R2), Membership::Down);
    g.submit(2, write(4 * CHUNK, 2, 4096));
    g.run();
    g.lose(R0);
    assert_eq!(g.e.in_sync(), vec![], "the last in-sync replica went down");
    assert_eq!(g.take_done(), vec![(1, Ok(None))], "w2 waits for R2");
    g.reconnect(R2, false);
    g.run();
    g.confirm();
    assert_eq!(
        g.e.membership(R2),
        Membership::InSync,
        "no resync source: stuck"
    );
    assert_eq!(g.take_done(), vec![(2, Err(IoError::Io))]);
    assert!(g.e.dirty(R0).is_set(4), "R0 must take R2's chunk 4");
    g.reconnect(R0, false);
    g.reconnect(R1, false);
    g.run();
    g.confirm();
    assert_eq!(g.e.in_sync(), vec![R0, R1, R2]);
    assert!(g.disks[0] == g.disks[2] && g.disks[1] == g.disks[2]);
    assert_eq!(g.disks[0][(2 * CHUNK) as usize], 1);
}

/// Sim bug 1: a replica whose node rebooted and lost writes it had not flushed may lack
/// acknowledged writes, so it is never promoted; a replica that lost nothing is.
#[test]
fn a_replica_that_lost_unflushed_writes_is_not_promoted() {
    let mut g = Rig::new(3, NoQuorum::Suspend);
    g.lose(R1);
    g.confirm();
    g.submit(1, write(2 * CHUNK, 1, 4096)); // acknowledged, never flushed
    g.run();
    g.lose(R2);
    g.submit(2, write(4 * CHUNK, 2, 4096));
    g.run();
    g.lose(R0);
    g.reconnect(R2, true);
    g.run();
    assert_eq!(
        g.e.membership(R2),
        Membership::Syncing,
        "promoted a replica that lost w1"
    );
    assert!(g.take_done().contains(&(1, Ok(None))));
    // R0 lost nothing: it becomes the source, and w2 (which it has) completes once R2 is
    // resynced from it.
    g.reconnect(R0, false);
    g.run();
    g.confirm();
    assert_eq!(g.e.membership(R0), Membership::InSync);
    assert_eq!(g.e.membership(R2), Membership::InSync);
    assert_eq!(g.take_done(), vec![(2, Ok(None))]);
    assert!(g.disks[0] == g.disks[2]);
}

/// What a previous engine's journals say a replica may lack can include acknowledged writes
/// it had not made durable: if its node rebooted, it is not promoted either (found by the
/// simulator).
#[test]
fn a_replica_given_chunks_by_the_journals_is_not_promoted() {
    let mut g = Rig::new(3, NoQuorum::Suspend);
    g.lose(R1);
    g.confirm();
    g.lose(R2);
    g.lose(R0);
    assert_eq!(g.e.membership(R2), Membership::Down);
    let mut suspect = crate::ChunkMap::new(1 << 20, CHUNK);
    suspect.set_chunks(2, 3);
    g.e.add_dirty(R2, &suspect);
    g.reconnect(R2, true);
    g.run();
    assert_eq!(
        g.e.membership(R2),
        Membership::Syncing,
        "promoted a replica the journals said may lack chunk 2"
    );
    g.reconnect(R0, false);
    g.run();
    g.confirm();
    assert_eq!(g.e.membership(R0), Membership::InSync);
    assert_eq!(g.e.membership(R2), Membership::InSync);
}

/// Under the suspend policy, a write that no replica can receive (none is connected) fails at
/// once rather than waiting: nobody has it, so nothing is owed to a returning replica except
/// its range, which is dirty on all of them.
#[test]
fn a_write_sent_to_no_replica_fails_at_once() {
    let mut g = Rig::new(2, NoQuorum::Suspend);
    g.lose(R1);
    g.lose(R0);
    assert_eq!(g.e.membership(R0), Membership::Down);
    g.submit(1, write(0, 1, 4096));
    assert_eq!(g.take_done(), vec![(1, Err(IoError::Io))]);
    assert!(g.e.dirty(R0).is_set(0) && g.e.dirty(R1).is_set(0));
}

/// What a driver may save as a resyncing replica's dirty map: its dirty chunks and those of
/// copies in flight; it shrinks as copies are acknowledged, and stops holding once the map
/// grows again or the replica gets a new session.
#[test]
fn a_resync_point_covers_what_is_not_yet_copied() {
    let mut g = Rig::new(2, NoQuorum::Suspend);
    assert!(
        g.e.resync_point(R1).is_none(),
        "an in-sync replica has no resync point"
    );
    g.lose(R1);
    g.confirm();
    for (tag, chunk) in [(1, 2), (2, 5), (3, 9)] {
        g.submit(tag, write(chunk * CHUNK, tag as u8, 4096));
    }
    g.run();
    assert!(g.e.resync_point(R1).is_none(), "not while it is out");
    g.reconnect(R1, false);
    let p = g.e.resync_point(R1).expect("syncing");
    assert_eq!(p.lacks.runs(), vec![(2, 3), (5, 6), (9, 10)]);
    // The three copies' reads are answered; their writes to R1 are in flight.
    for _ in 0..3 {
        assert!(g.step());
    }
    let q = g.e.resync_point(R1).expect("syncing");
    assert_eq!(q.lacks, p.lacks, "a copy in flight counts as lacking");
    assert!(g.step(), "the first copy's write is answered");
    let q = g.e.resync_point(R1).expect("syncing");
    assert_eq!(q.lacks.runs(), vec![(5, 6), (9, 10)]);
    assert!(g.e.resync_point_holds(R1, &p));
    // A write that fails everywhere leaves R1 syncing, with its chunk dirty: a point taken
    // before no longer holds (that chunk could be copied again and not yet flushed).
    g.submit(4, write(12 * CHUNK, 4, 4096));
    let mine: Vec<SubId> = g
        .queue
        .iter()
        .filter(|(_, _, op)| matches!(op, ClientOp::Write { offset, .. } if *offset == 12 * CHUNK))
        .map(|&(_, sub, _)| sub)
        .collect();
    assert_eq!(mine.len(), 2, "the write goes to both replicas");
    g.queue.retain(|(_, sub, _)| !mine.contains(sub));
    for sub in mine {
        g.with(|e, out| e.on_reply(sub, Err(ReplicaFailure::Io), out));
    }
    assert_eq!(
        g.take_done(),
        vec![
            (1, Ok(None)),
            (2, Ok(None)),
            (3, Ok(None)),
            (4, Err(IoError::Io))
        ]
    );
    assert_eq!(g.e.membership(R1), Membership::Syncing);
    assert!(!g.e.resync_point_holds(R1, &q), "the dirty map grew");
    let r = g.e.resync_point(R1).expect("syncing");
    assert!(r.lacks.is_set(12));
    assert!(g.e.resync_point_holds(R1, &r));
    // A new session: nothing acknowledged on the old one is known to be flushed.
    g.lose(R1);
    g.confirm();
    assert!(g.e.resync_point(R1).is_none(), "not while it is out");
    g.reconnect(R1, false);
    assert!(!g.e.resync_point_holds(R1, &r), "new session");
    // Copied and flushed: `Marking` has a point with nothing lacking, in-sync has none.
    g.run();
    assert_eq!(g.e.membership(R1), Membership::Marking);
    let m = g.e.resync_point(R1).expect("marking");
    assert!(m.lacks.is_empty(), "{:?}", m.lacks.runs());
    g.confirm();
    assert_eq!(g.e.membership(R1), Membership::InSync);
    assert!(g.e.resync_point(R1).is_none());
    assert!(g.disks[0] == g.disks[1], "replicas differ after resync");
}
