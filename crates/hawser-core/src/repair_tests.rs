//! Tests of corrupt reads and repair (`repair.rs`), one per rule of its module doc.

// Offsets and lengths here are below 1 MiB, by construction.
#![allow(clippy::cast_possible_truncation)]

use bytes::Bytes;

use crate::bitmap::ChunkMap;
use crate::engine::repair::Integrity;
use crate::engine::{Engine, EngineConfig, Initial, Membership, ReplicaSpec};
use crate::io_error::IoError;
use crate::types::{ClientOp, Command, ReplicaFailure, ReplicaIdx, SubId};

const R0: ReplicaIdx = ReplicaIdx(0);
const R1: ReplicaIdx = ReplicaIdx(1);
const R2: ReplicaIdx = ReplicaIdx(2);
const SIZE: u64 = 1 << 20;

/// `n` in-sync replicas, R0 local.
fn engine(n: usize, cfg: EngineConfig) -> Engine {
    let specs: Vec<ReplicaSpec> = (0..n).map(|i| ReplicaSpec::in_sync(i == 0)).collect();
    Engine::with_config(SIZE, &specs, cfg)
}

/// Every `Send`: (replica, sub, op, background).
fn sends(out: &[Command]) -> Vec<(ReplicaIdx, SubId, ClientOp, bool)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Send {
                replica,
                sub,
                op,
                background,
            } => Some((*replica, *sub, op.clone(), *background)),
            _ => None,
        })
        .collect()
}

/// The only `Send` of `out`.
fn one_send(out: &[Command]) -> (ReplicaIdx, SubId, ClientOp, bool) {
    let s = sends(out);
    assert_eq!(s.len(), 1, "expected one send: {out:?}");
    s[0].clone()
}

/// Answer `sub` with `result`: the one request the engine sends next (`out` is left empty).
fn answer(
    e: &mut Engine,
    sub: SubId,
    result: Result<Option<Bytes>, ReplicaFailure>,
    out: &mut Vec<Command>,
) -> SubId {
    e.on_reply(sub, result, out);
    let next = one_send(out).1;
    out.clear();
    next
}

fn read(offset: u64, len: u32) -> ClientOp {
    ClientOp::Read { offset, len }
}

fn corrupt(first: u64, blocks: u32) -> Result<Option<Bytes>, ReplicaFailure> {
    Err(ReplicaFailure::Corrupt { first, blocks })
}

fn data(len: usize, byte: u8) -> Option<Bytes> {
    Some(Bytes::from(vec![byte; len]))
}

fn leaves(out: &[Command]) -> bool {
    out.iter()
        .any(|c| matches!(c, Command::Outdate { .. } | Command::Disconnect { .. }))
}

/// Drive a repair of R0's block 0 through its verify read (answered `Corrupt`) and its read
/// of R1's copy, up to the FUA write to R0; returns that write's sub.
fn repair_up_to_the_write(e: &mut Engine, verify: SubId, out: &mut Vec<Command>) -> SubId {
    out.clear();
    e.on_reply(verify, corrupt(0, 1), out);
    let (r, sub, op, background) = one_send(out);
    assert_eq!((r, op, background), (R1, read(0, 4096), true));
    out.clear();
    e.on_reply(sub, Ok(data(4096, 7)), out);
    let (r, sub, op, background) = one_send(out);
    let good = ClientOp::Write {
        offset: 0,
        data: Bytes::from(vec![7; 4096]),
        fua: true,
    };
    assert_eq!(
        (r, op, background),
        (R0, good, true),
        "not the good copy, with FUA"
    );
    sub
}

#[test]
fn a_corrupt_local_read_is_served_by_another_replica_and_repaired_with_fua() {
    let mut e = engine(2, EngineConfig::default());
    let mut out = vec![];
    e.submit(1, read(512, 1024), &mut out);
    let (r, s0, _, _) = one_send(&out);
    assert_eq!(r, R0, "reads go to the local replica first");
    out.clear();
    e.on_reply(s0, corrupt(0, 1), &mut out);
    assert!(!leaves(&out), "a replica with rotted blocks left: {out:?}");
    let (r, s1, _, _) = one_send(&out);
    assert_eq!(r, R1);
    out.clear();
    e.on_reply(s1, Ok(data(1024, 7)), &mut out);
    // The read completes at once with R1's data, then the repair of its block starts.
    assert_eq!(
        out[0],
        Command::Complete {
            tag: 1,
            result: Ok(data(1024, 7))
        }
    );
    let (r, verify, op, background) = one_send(&out);
    assert_eq!((r, op, background), (R0, read(0, 4096), true));
    let write = repair_up_to_the_write(&mut e, verify, &mut out);
    out.clear();
    e.on_reply(write, Ok(None), &mut out);
    let event = Command::Corruption {
        replica: R0,
        offset: 0,
        blocks: 1,
        repaired: true,
    };
    assert_eq!(out, vec![event]);
    let counted = Integrity {
        found: 1,
        repaired: 1,
        unrecoverable: 0,
    };
    assert_eq!(e.integrity(R0), counted);
    assert_eq!(e.integrity(R1), Integrity::default());
    assert_eq!(e.membership(R0), Membership::InSync);
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn a_repair_whose_verify_read_succeeds_was_a_race_and_counts_nothing() {
    let mut e = engine(2, EngineConfig::default());
    let mut out = vec![];
    e.submit(1, read(0, 4096), &mut out);
    let (_, s0, _, _) = one_send(&out);
    out.clear();
    let s1 = answer(&mut e, s0, corrupt(0, 1), &mut out);
    let verify = answer(&mut e, s1, Ok(data(4096, 7)), &mut out);
    e.on_reply(verify, Ok(data(4096, 7)), &mut out);
    assert!(out.is_empty(), "a race was acted on: {out:?}");
    assert_eq!(e.integrity(R0), Integrity::default());
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn a_read_corrupt_everywhere_runs_again_under_the_lock_then_fails_with_eio() {
    let mut e = engine(2, EngineConfig::default());
    let mut out = vec![];
    e.submit(1, read(4096, 4096), &mut out);
    for r in [R0, R1] {
        let (to, sub, _, _) = one_send(&out);
        assert_eq!(to, r);
        out.clear();
        e.on_reply(sub, corrupt(4096, 1), &mut out);
    }
    // Every replica answered `Corrupt` without the lock: the read runs again, holding it.
    let (to, s0, op, background) = one_send(&out);
    assert_eq!((to, op, background), (R0, read(4096, 4096), false));
    assert!(
        !out.iter().any(|c| matches!(c, Command::Complete { .. })),
        "failed before the locked read: {out:?}"
    );
    // A write to its block waits for it.
    out.clear();
    e.submit(
        2,
        ClientOp::Write {
            offset: 4096 + 512,
            data: Bytes::from(vec![9; 512]),
            fua: false,
        },
        &mut out,
    );
    assert!(sends(&out).is_empty(), "a write ran under a locked read");
    let s1 = answer(&mut e, s0, corrupt(4096, 1), &mut out);
    e.on_reply(s1, corrupt(4096, 1), &mut out);
    let lost = |replica| Command::Corruption {
        replica,
        offset: 4096,
        blocks: 1,
        repaired: false,
    };
    assert!(
        out.contains(&lost(R0)) && out.contains(&lost(R1)),
        "{out:?}"
    );
    assert!(out.contains(&Command::Complete {
        tag: 1,
        result: Err(IoError::Io)
    }));
    assert!(!leaves(&out), "rot made a replica leave: {out:?}");
    let counted = Integrity {
        found: 1,
        repaired: 0,
        unrecoverable: 1,
    };
    assert_eq!((e.integrity(R0), e.integrity(R1)), (counted, counted));
    // The lock is released: the write goes to both replicas.
    assert_eq!(sends(&out).len(), 2, "the write did not start: {out:?}");
}

#[test]
fn a_replica_past_the_corrupt_limit_leaves_as_failed() {
    let cfg = EngineConfig {
        corrupt_limit: 1,
        ..EngineConfig::default()
    };
    let mut e = engine(2, cfg);
    let mut out = vec![];
    e.submit(1, read(0, 8192), &mut out);
    let (_, s0, _, _) = one_send(&out);
    out.clear();
    let s1 = answer(&mut e, s0, corrupt(0, 2), &mut out);
    let verify = answer(&mut e, s1, Ok(data(8192, 7)), &mut out);
    let src = answer(&mut e, verify, corrupt(0, 2), &mut out);
    let write = answer(&mut e, src, Ok(data(8192, 7)), &mut out);
    e.on_reply(write, Ok(None), &mut out);
    assert!(
        out.contains(&Command::Outdate {
            replica: R0,
            failed: true
        }),
        "2 corrupt blocks, limit 1, yet R0 stays: {out:?}"
    );
    assert_eq!(e.integrity(R0).found, 2);
}

#[test]
fn a_write_queued_before_the_repair_completes_before_it() {
    let mut e = engine(2, EngineConfig::default());
    let mut out = vec![];
    let w = ClientOp::Write {
        offset: 0,
        data: Bytes::from(vec![9; 4096]),
        fua: false,
    };
    e.submit(2, w, &mut out);
    let writes = sends(&out);
    assert_eq!(writes.len(), 2);
    out.clear();
    // A read (no lock) finds R0's block rotted and is served by R1.
    e.submit(1, read(0, 4096), &mut out);
    let (_, s0, _, _) = one_send(&out);
    out.clear();
    let s1 = answer(&mut e, s0, corrupt(0, 1), &mut out);
    e.on_reply(s1, Ok(data(4096, 9)), &mut out);
    assert!(matches!(out[0], Command::Complete { tag: 1, .. }));
    assert!(
        sends(&out).is_empty(),
        "the repair overtook the write in flight"
    );
    out.clear();
    e.on_reply(writes[0].1, Ok(None), &mut out);
    e.on_reply(writes[1].1, Ok(None), &mut out);
    let done = out
        .iter()
        .position(|c| matches!(c, Command::Complete { tag: 2, .. }))
        .expect("the write completed");
    let verify = out
        .iter()
        .position(|c| matches!(c, Command::Send { .. }))
        .expect("the repair started");
    assert!(
        done < verify,
        "the repair started before the write completed: {out:?}"
    );
}

#[test]
fn a_resync_copy_from_a_corrupt_source_reads_another_and_repairs_the_source() {
    let mut dirty = ChunkMap::new(SIZE, 64 * 1024);
    dirty.set_chunks(0, 1);
    let mut specs: Vec<ReplicaSpec> = (0..2).map(|i| ReplicaSpec::in_sync(i == 0)).collect();
    specs.push(ReplicaSpec {
        local: false,
        initial: Initial::Outdated { dirty: Some(dirty) },
    });
    let mut e = Engine::with_config(SIZE, &specs, EngineConfig::default());
    let mut out = vec![];
    e.on_replica_connected(R2, false, &mut out);
    let (r, s0, op, _) = one_send(&out);
    assert_eq!((r, op), (R0, read(0, 64 * 1024)));
    out.clear();
    e.on_reply(s0, corrupt(8192, 1), &mut out);
    assert!(!leaves(&out), "a corrupt copy source left: {out:?}");
    let (r, s1, _, _) = one_send(&out);
    assert_eq!(r, R1, "the copy did not try another source");
    out.clear();
    e.on_reply(s1, Ok(data(64 * 1024, 5)), &mut out);
    let (r, write, _, _) = one_send(&out);
    assert_eq!(r, R2);
    out.clear();
    e.on_reply(write, Ok(None), &mut out);
    // The copy is done and its range free: R0's repair verifies the range, then the resync
    // flushes R2.
    let s = sends(&out);
    assert!(
        s.iter()
            .any(|(r, _, op, bg)| *r == R0 && *op == read(0, 64 * 1024) && *bg),
        "no repair of the copy's source: {out:?}"
    );
    assert_eq!(e.membership(R0), Membership::InSync);
    assert_eq!(
        e.integrity(R0),
        Integrity::default(),
        "counted before confirmed"
    );
}
