//! The journal keeper's rules, one test each. The seeded runs of the simulator drive the same
//! keeper through crashes and partitions.

use bytes::Bytes;
use hawser_wire::journal::Journal;

use super::journal::{Act, Keeper, OpId, Params};
use super::recovery::{self, Decision, Found, Member, Refusal, Stored};
use crate::{
    ChunkMap, ClientOp, Command, Engine, EngineConfig, Initial, Membership, ReplicaFailure,
    ReplicaIdx, ReplicaSpec,
};

const SIZE: u64 = 8 << 20;
const CHUNK: u64 = 64 << 10;
const R0: ReplicaIdx = ReplicaIdx(0);
const R1: ReplicaIdx = ReplicaIdx(1);

fn params() -> Params {
    Params {
        extent_bytes: CHUNK,
        max_extents: 1024,
        idle_ticks: 1,
        save_ticks: 2,
        in_sync_commit: true,
    }
}

/// Replica 0 local and in sync; replica 1 in sync, or out of date lacking `r1_lacks`.
fn setup(r1_lacks: Option<ChunkMap>) -> (Engine, Keeper) {
    let cfg = EngineConfig {
        chunk_bytes: CHUNK,
        resync_unit_bytes: CHUNK,
        resync_parallel: 1,
        ..EngineConfig::default()
    };
    let r1 = match r1_lacks {
        None => Initial::InSync,
        Some(m) => Initial::Outdated { dirty: Some(m) },
    };
    let specs = [
        ReplicaSpec::in_sync(true),
        ReplicaSpec {
            local: false,
            initial: r1,
        },
    ];
    let e = Engine::with_config(SIZE, &specs, cfg);
    let k = Keeper::new(params(), 5, SIZE, CHUNK, vec!["a".into(), "b".into()], 1);
    (e, k)
}

fn write(offset: u64) -> ClientOp {
    ClientOp::Write {
        offset,
        data: Bytes::from(vec![7u8; 4096]),
        fua: false,
    }
}

fn puts(acts: &[Act]) -> Vec<(OpId, ReplicaIdx, Journal)> {
    acts.iter()
        .filter_map(|a| match a {
            Act::PutJournal {
                op,
                replica,
                journal,
            } => Some((*op, *replica, journal.clone())),
            _ => None,
        })
        .collect()
}

fn sends(acts: &[Act]) -> usize {
    acts.iter()
        .filter(|a| matches!(a, Act::Engine(Command::Send { .. })))
        .count()
}

/// Answer every put of `acts` with success; returns the acts that follows.
fn store_all(k: &mut Keeper, e: &mut Engine, acts: &[Act]) -> Vec<Act> {
    let mut out = Vec::new();
    for (op, r, _) in puts(acts) {
        k.stored(e, op, r, Ok(()), &mut out);
    }
    out
}

/// Answer up to `limit` engine sends found in `acts` (and in what they lead to) with success,
/// feeding completions to the keeper; returns the other acts seen.
fn answer_sends(k: &mut Keeper, e: &mut Engine, acts: Vec<Act>, limit: usize) -> Vec<Act> {
    let mut queue = std::collections::VecDeque::from(acts);
    let (mut rest, mut answered) = (Vec::new(), 0);
    while let Some(a) = queue.pop_front() {
        match a {
            Act::Engine(Command::Send { sub, op, .. }) if answered < limit => {
                answered += 1;
                let result = match op {
                    ClientOp::Read { len, .. } => Ok(Some(Bytes::from(vec![0; len as usize]))),
                    _ => Ok(None),
                };
                let mut cmds = Vec::new();
                e.on_reply(sub, result, &mut cmds);
                queue.extend(cmds.into_iter().map(Act::Engine));
            }
            Act::Engine(Command::Complete { tag, result }) => k.completed(tag, result.is_ok()),
            other => rest.push(other),
        }
    }
    rest
}

/// A journal of an older engine (epoch 4) with log `active` and entries `out`.
fn older(active: Vec<(u64, u64)>, out: Vec<hawser_wire::journal::OutReplica>) -> Journal {
    Journal {
        epoch: 4,
        seq: 2,
        size: SIZE,
        extent_bytes: CHUNK,
        chunk_bytes: CHUNK,
        active,
        out,
    }
}

fn out_of(j: &Journal, id: &str) -> Option<Option<Vec<(u64, u64)>>> {
    j.out
        .iter()
        .find(|o| o.replica == id)
        .map(|o| o.dirty.clone())
}

#[test]
fn a_write_reaches_the_engine_only_once_its_extent_is_committed_everywhere() {
    let (mut e, mut k) = setup(None);
    let mut acts = Vec::new();
    k.submit(&mut e, 1, write(3 * CHUNK), &mut acts);
    let p = puts(&acts);
    assert_eq!(p.len(), 2, "the journal goes to both replicas");
    assert_eq!(
        p[0].2.active,
        vec![(3, 4)],
        "the log names the write's extent"
    );
    assert_eq!(
        sends(&acts),
        0,
        "the write went out before its log was durable"
    );
    let mut after = Vec::new();
    k.stored(&mut e, p[0].0, p[0].1, Ok(()), &mut after);
    assert_eq!(
        sends(&after),
        0,
        "the write went out with the log on one replica of two"
    );
    k.stored(&mut e, p[1].0, p[1].1, Ok(()), &mut after);
    assert!(after.contains(&Act::Committed { seq: 1 }));
    assert_eq!(sends(&after), 2, "the write did not go out once committed");
    // Another write into the same extent needs no commit.
    let mut more = Vec::new();
    k.submit(&mut e, 2, write(3 * CHUNK + 4096), &mut more);
    assert!(puts(&more).is_empty());
    assert_eq!(sends(&more), 2);
}

#[test]
fn a_failed_journal_put_drops_that_replica_and_the_commit_completes() {
    let (mut e, mut k) = setup(None);
    let mut acts = Vec::new();
    k.submit(&mut e, 1, write(0), &mut acts);
    let p = puts(&acts);
    let mut after = Vec::new();
    k.stored(&mut e, p[1].0, R1, Err(ReplicaFailure::Lost), &mut after);
    assert_eq!(after, vec![Act::Disconnect { replica: R1 }]);
    assert_eq!(
        k.commits(),
        0,
        "not done while a replica may still store it"
    );
    after.clear();
    k.stored(&mut e, p[0].0, R0, Ok(()), &mut after);
    assert!(after.contains(&Act::Committed { seq: 1 }));
    assert_eq!(k.commits(), 1);
    // A late or duplicate answer changes nothing.
    let mut late = Vec::new();
    k.stored(&mut e, p[1].0, R1, Ok(()), &mut late);
    assert!(late.is_empty());
}

#[test]
fn a_returning_replica_takes_on_its_old_log_and_gets_the_journal_before_the_engine_hears() {
    let (mut e, mut k) = setup(Some(ChunkMap::new(SIZE, CHUNK)));
    let mut acts = Vec::new();
    k.commit(&mut e, 0, &mut acts);
    assert_eq!(
        puts(&acts).len(),
        1,
        "only the in-sync replica gets requests"
    );
    store_all(&mut k, &mut e, &acts);
    let mut acts = Vec::new();
    k.join(&mut e, R1, Some(false), &mut acts);
    let [Act::GetJournal { op, replica: R1 }] = acts[..] else {
        panic!("a join starts by reading the replica's journal: {acts:?}")
    };
    // Its own journal, of an older engine, logged extent 9: it may hold a write there that
    // the others lack.
    let old = older(vec![(9, 10)], vec![]);
    let mut acts = Vec::new();
    k.read(&mut e, op, R1, Ok(Some((old, false))), &mut acts);
    assert!(
        e.dirty(R1).is_set(9),
        "what its old log covers must be recopied"
    );
    let p = puts(&acts);
    assert_eq!(p.len(), 1);
    assert_eq!(
        out_of(&p[0].2, "b"),
        Some(Some(vec![(9, 10)])),
        "the journal it is given must keep what its own said"
    );
    assert!(
        !acts
            .iter()
            .any(|a| matches!(a, Act::Joined { .. } | Act::Engine(_))),
        "the engine heard of it before it had the journal"
    );
    let after = store_all(&mut k, &mut e, &acts);
    assert_eq!(
        after.first(),
        Some(&Act::Joined {
            replica: R1,
            ok: true
        })
    );
    assert_eq!(e.membership(R1), Membership::Syncing);
}

/// What a returning replica's own journal (of an older engine) added to what it lacks is
/// given to it again at its next join, even if no commit carried it yet: its journal is then
/// this engine's and says nothing new, so the journal it is given is all that keeps it
/// (seed 40815: the second join overwrote it with the last commit's, which knew less).
#[test]
fn what_a_join_learnt_is_given_again_at_the_next_join_before_any_commit() {
    let (mut e, mut k) = setup(Some(ChunkMap::new(SIZE, CHUNK)));
    let op = commit_and_join_r1(&mut k, &mut e);
    let old = older(vec![(9, 10)], vec![]);
    let mut acts = Vec::new();
    k.read(&mut e, op, R1, Ok(Some((old, false))), &mut acts);
    let (_, _, given) = puts(&acts).pop().expect("the join gives it a journal");
    assert_eq!(out_of(&given, "b"), Some(Some(vec![(9, 10)])));
    let after = store_all(&mut k, &mut e, &acts);
    assert!(after.contains(&Act::Joined {
        replica: R1,
        ok: true
    }));
    // Its session ends before the next commit, and it comes back.
    let mut acts = Vec::new();
    let mut cmds = Vec::new();
    e.on_replica_lost(R1, &mut cmds);
    k.replica_gone(&mut e, R1, &mut acts);
    assert_eq!(e.membership(R1), Membership::Outdated);
    let mut acts = Vec::new();
    k.join(&mut e, R1, Some(false), &mut acts);
    let [Act::GetJournal { op, .. }] = acts[..] else {
        panic!("{acts:?}")
    };
    let mut acts = Vec::new();
    k.read(&mut e, op, R1, Ok(Some((given, false))), &mut acts);
    let (_, _, again) = puts(&acts).pop().expect("the join gives it a journal");
    assert_eq!(
        out_of(&again, "b"),
        Some(Some(vec![(9, 10)])),
        "the second join forgot what the first learnt: {again:?}"
    );
}

#[test]
fn a_join_whose_journal_read_hits_a_disk_error_fails_the_replica() {
    let (mut e, mut k) = setup(Some(ChunkMap::new(SIZE, CHUNK)));
    let mut acts = Vec::new();
    k.join(&mut e, R1, Some(false), &mut acts);
    let [Act::GetJournal { op, .. }] = acts[..] else {
        panic!("{acts:?}")
    };
    let mut acts = Vec::new();
    k.read(&mut e, op, R1, Err(ReplicaFailure::Io), &mut acts);
    assert!(acts.contains(&Act::Joined {
        replica: R1,
        ok: false
    }));
    assert!(
        acts.contains(&Act::Engine(Command::Outdate {
            replica: R1,
            failed: true
        })),
        "a disk error must fail the replica for good: {acts:?}"
    );
    assert!(k.quiet());
}

/// Commits, then starts the join of replica 1: returns the op of its journal read.
fn commit_and_join_r1(k: &mut Keeper, e: &mut Engine) -> OpId {
    let mut acts = Vec::new();
    k.commit(e, 0, &mut acts);
    store_all(k, e, &acts);
    let mut acts = Vec::new();
    k.join(e, R1, Some(false), &mut acts);
    let [Act::GetJournal { op, .. }] = acts[..] else {
        panic!("{acts:?}")
    };
    op
}

/// Joins replica 1 (lacking all of `lacks`), lets the resync copy `copies` units, and ticks
/// until a resync save asks for a flush.
fn resync_until_a_save(lacks: &ChunkMap, copies: usize) -> (Engine, Keeper, OpId) {
    let (mut e, mut k) = setup(Some(lacks.clone()));
    let op = commit_and_join_r1(&mut k, &mut e);
    let mut acts = Vec::new();
    let own = Journal {
        epoch: 5,
        seq: 1,
        size: SIZE,
        extent_bytes: CHUNK,
        chunk_bytes: CHUNK,
        active: vec![],
        out: vec![],
    };
    k.read(&mut e, op, R1, Ok(Some((own, false))), &mut acts);
    let acts = store_all(&mut k, &mut e, &acts);
    // The first tick of its resync is where saves count from.
    let mut ticked = Vec::new();
    k.tick(&mut e, &mut ticked);
    assert!(!ticked.iter().any(|a| matches!(a, Act::SaveFlush { .. })));
    store_all(&mut k, &mut e, &ticked);
    let rest = answer_sends(&mut k, &mut e, acts, copies);
    assert!(rest
        .iter()
        .any(|a| matches!(a, Act::Joined { ok: true, .. })));
    assert!(e.replica_view(R1).copied_bytes > 0, "nothing was copied");
    for _ in 0..params().save_ticks + 1 {
        let mut acts = Vec::new();
        k.tick(&mut e, &mut acts);
        let stored = store_all(&mut k, &mut e, &acts);
        assert!(!stored.iter().any(|a| matches!(a, Act::PutJournal { .. })));
        if let Some(op) = acts.iter().find_map(|a| match a {
            Act::SaveFlush { op, replica: R1 } => Some(*op),
            _ => None,
        }) {
            return (e, k, op);
        }
    }
    panic!("no resync save fell due")
}

#[test]
fn a_resync_save_shrinks_the_persisted_map_after_its_flush() {
    let mut lacks = ChunkMap::new(SIZE, CHUNK);
    lacks.set_chunks(0, 8);
    let (mut e, mut k, op) = resync_until_a_save(&lacks, 6);
    let mut acts = Vec::new();
    k.save_flushed(&mut e, op, R1, Ok(()), &mut acts);
    let p = puts(&acts);
    assert!(!p.is_empty(), "a flushed save must be committed");
    let saved = out_of(&p[0].2, "b")
        .expect("an entry")
        .expect("a known map");
    let saved_chunks: u64 = saved.iter().map(|(a, b)| b - a).sum();
    assert!(
        saved_chunks < 8,
        "the save kept everything: {saved:?} (copied {} bytes)",
        e.replica_view(R1).copied_bytes
    );
    store_all(&mut k, &mut e, &acts);
    assert!(k.quiet());
}

#[test]
fn a_save_whose_replica_was_lost_before_the_commit_keeps_the_old_map() {
    let mut lacks = ChunkMap::new(SIZE, CHUNK);
    lacks.set_chunks(0, 8);
    let (mut e, mut k, op) = resync_until_a_save(&lacks, 6);
    // The session ends (its node may have rebooted); the flush answer came on it anyway.
    let mut cmds = Vec::new();
    e.on_replica_lost(R1, &mut cmds);
    let mut acts = Vec::new();
    k.save_flushed(&mut e, op, R1, Ok(()), &mut acts);
    for (_, _, j) in puts(&acts) {
        let kept = out_of(&j, "b").expect("an entry").expect("a known map");
        let kept_chunks: u64 = kept.iter().map(|(a, b)| b - a).sum();
        assert_eq!(
            kept_chunks, 8,
            "a save of a lost session shrank the map: {kept:?}"
        );
    }
}

#[test]
fn finish_commits_an_empty_log_once_everything_is_flushed() {
    let (mut e, mut k) = setup(None);
    let mut acts = Vec::new();
    k.submit(&mut e, 1, write(0), &mut acts);
    let after = store_all(&mut k, &mut e, &acts);
    let rest = answer_sends(&mut k, &mut e, after, usize::MAX);
    assert!(rest.iter().all(|a| !matches!(a, Act::Engine(_))));
    let mut acts = Vec::new();
    k.submit(&mut e, 2, ClientOp::Flush, &mut acts);
    answer_sends(&mut k, &mut e, acts, usize::MAX);
    let mut acts = Vec::new();
    k.finish(&mut e, &mut acts);
    let p = puts(&acts);
    assert_eq!(p.len(), 2);
    assert!(
        p[0].2.active.is_empty(),
        "a flushed, idle volume keeps a log"
    );
    assert!(!acts.contains(&Act::Finished));
    let after = store_all(&mut k, &mut e, &acts);
    assert!(after.contains(&Act::Finished));
}

#[test]
fn a_replica_whose_own_journal_says_it_lost_writes_stays_lost_in_the_next_journals() {
    let (mut e, mut k) = setup(Some(ChunkMap::new(SIZE, CHUNK)));
    let mut acts = Vec::new();
    k.commit(&mut e, 0, &mut acts);
    store_all(&mut k, &mut e, &acts);
    let mut acts = Vec::new();
    k.join(&mut e, R1, Some(false), &mut acts);
    let [Act::GetJournal { op, .. }] = acts[..] else {
        panic!("{acts:?}")
    };
    // An earlier engine knew its node had lost power before it copied chunk 4 back.
    let old = older(
        vec![],
        vec![hawser_wire::journal::OutReplica {
            replica: "b".into(),
            dirty: Some(vec![(4, 5)]),
            lost: true,
        }],
    );
    let mut acts = Vec::new();
    k.read(&mut e, op, R1, Ok(Some((old, false))), &mut acts);
    assert!(
        e.may_lack_acknowledged(R1),
        "the engine must not promote it"
    );
    let p = puts(&acts);
    let entry = p[0].2.out.iter().find(|o| o.replica == "b").expect("named");
    assert!(
        entry.lost,
        "the journal it is given forgot it may lack acknowledged writes"
    );
    store_all(&mut k, &mut e, &acts);
    let mut acts = Vec::new();
    k.commit(&mut e, 0, &mut acts);
    let p = puts(&acts);
    let entry = p[0].2.out.iter().find(|o| o.replica == "b").expect("named");
    assert!(entry.lost && entry.dirty.is_some());
}

#[test]
fn a_first_join_takes_the_reboot_from_the_journal_read() {
    for since_boot in [false, true] {
        let (mut e, mut k) = setup(Some(ChunkMap::new(SIZE, CHUNK)));
        let mut acts = Vec::new();
        k.join(&mut e, R1, None, &mut acts);
        let [Act::GetJournal { op, .. }] = acts[..] else {
            panic!("{acts:?}")
        };
        // Its own journal, of an older engine, logged extent 2.
        let old = older(vec![(2, 3)], vec![]);
        let mut acts = Vec::new();
        k.read(&mut e, op, R1, Ok(Some((old, since_boot))), &mut acts);
        assert!(acts.contains(&Act::Joined {
            replica: R1,
            ok: true
        }));
        assert_eq!(
            e.may_lack_acknowledged(R1),
            since_boot,
            "a node that rebooted after its journal may have lost the writes of its log"
        );
    }
}

/// Joins replica 1 (lacking chunks 0..4) and runs its resync to the end: returns the acts
/// that followed, among them the engine's `MarkInSync`.
fn resync_to_the_end() -> (Engine, Keeper, Vec<Act>) {
    let (e, k, rest, _) = resync_to_the_end_with(params());
    (e, k, rest)
}

/// As `resync_to_the_end` with keeper `p`; also returns the last journal replica 1 stored.
fn resync_to_the_end_with(p: Params) -> (Engine, Keeper, Vec<Act>, Journal) {
    let mut lacks = ChunkMap::new(SIZE, CHUNK);
    lacks.set_chunks(0, 4);
    let (mut e, _) = setup(Some(lacks));
    let mut k = Keeper::new(p, 5, SIZE, CHUNK, vec!["a".into(), "b".into()], 1);
    let op = commit_and_join_r1(&mut k, &mut e);
    let mut acts = Vec::new();
    // No journal of its own: it lacks everything, and may lack acknowledged writes.
    k.read(&mut e, op, R1, Ok(None), &mut acts);
    let on_r1 = puts(&acts)
        .into_iter()
        .find(|p| p.1 == R1)
        .expect("the join gives it the journal")
        .2;
    let acts = store_all(&mut k, &mut e, &acts);
    let rest = answer_sends(&mut k, &mut e, acts, usize::MAX);
    assert_eq!(e.membership(R1), Membership::Marking, "{rest:?}");
    assert!(rest.contains(&Act::Engine(Command::MarkInSync { replica: R1 })));
    (e, k, rest, on_r1)
}

#[test]
fn a_resynced_replica_is_marked_in_sync_only_once_it_stored_a_journal_saying_it_lacks_nothing() {
    let (mut e, mut k, _) = resync_to_the_end();
    let mut acts = Vec::new();
    k.resynced(&mut e, R1, &mut acts);
    assert!(
        !acts.iter().any(|a| matches!(a, Act::MarkInSync { .. })),
        "marked before any journal said it lacks nothing"
    );
    let p = puts(&acts);
    assert_eq!(p.len(), 2, "the commit goes to both replicas");
    let entry = p[0]
        .2
        .out
        .iter()
        .find(|o| o.replica == "b")
        .expect("an entry");
    assert_eq!(entry.dirty, Some(vec![]), "it lacks nothing now");
    assert!(!entry.lost, "resynced and flushed: it lost nothing");
    let mut after = Vec::new();
    let on = |r| p.iter().find(|x| x.1 == r).expect("a put").0;
    k.stored(&mut e, on(R0), R0, Ok(()), &mut after);
    assert!(
        after.is_empty(),
        "marked before it stored the journal: {after:?}"
    );
    k.stored(&mut e, on(R1), R1, Ok(()), &mut after);
    assert!(
        after.contains(&Act::MarkInSync { replica: R1 }),
        "{after:?}"
    );
    let mut cmds = Vec::new();
    e.on_mark_in_sync_done(R1, true, &mut cmds);
    assert_eq!(e.membership(R1), Membership::InSync);
    // The next commit drops its entry.
    let mut acts = Vec::new();
    k.commit(&mut e, 0, &mut acts);
    assert_eq!(out_of(&puts(&acts)[0].2, "b"), None);
}

#[test]
fn a_mark_whose_replica_did_not_store_the_journal_is_abandoned() {
    let (mut e, mut k, _) = resync_to_the_end();
    let mut acts = Vec::new();
    k.resynced(&mut e, R1, &mut acts);
    let p = puts(&acts);
    let on = |r| p.iter().find(|x| x.1 == r).expect("a put").0;
    let mut after = Vec::new();
    k.stored(&mut e, on(R1), R1, Err(ReplicaFailure::Lost), &mut after);
    let mut cmds = Vec::new();
    e.on_replica_lost(R1, &mut cmds);
    k.stored(&mut e, on(R0), R0, Ok(()), &mut after);
    assert!(
        !after.iter().any(|a| matches!(a, Act::MarkInSync { .. })),
        "marked a replica that never stored the journal: {after:?}"
    );
    assert_eq!(e.membership(R1), Membership::Outdated);
    assert!(e.wants_connection(R1), "an abandoned mark must be retried");
    assert!(k.quiet());
}

#[test]
fn without_the_in_sync_commit_the_mark_goes_out_at_once() {
    let (mut e, _, _) = resync_to_the_end();
    let mut k = Keeper::new(
        Params {
            in_sync_commit: false,
            ..params()
        },
        5,
        SIZE,
        CHUNK,
        vec!["a".into(), "b".into()],
        1,
    );
    let mut acts = Vec::new();
    k.resynced(&mut e, R1, &mut acts);
    assert_eq!(acts, vec![Act::MarkInSync { replica: R1 }]);
}

/// The engine crashes right after the store confirmed replica 1's mark, with replica 0 out of
/// reach of the next engine: what recovery decides from the journal replica 1 holds.
fn recovery_right_after_the_mark(in_sync_commit: bool) -> Decision {
    let p = Params {
        in_sync_commit,
        ..params()
    };
    let (mut e, mut k, _, mut on_r1) = resync_to_the_end_with(p);
    let mut acts = Vec::new();
    k.resynced(&mut e, R1, &mut acts);
    while !acts.contains(&Act::MarkInSync { replica: R1 }) {
        if let Some(j) = puts(&acts).into_iter().find(|p| p.1 == R1) {
            on_r1 = j.2;
        }
        acts = store_all(&mut k, &mut e, &acts);
        assert!(!acts.is_empty(), "the mark never went out");
    }
    let mut cmds = Vec::new();
    e.on_mark_in_sync_done(R1, true, &mut cmds);
    assert_eq!(e.membership(R1), Membership::InSync);
    let members = [
        Member {
            id: "a".into(),
            local: true,
            stored: Stored::InSync,
            found: Found::Unreachable,
        },
        Member {
            id: "b".into(),
            local: false,
            stored: Stored::InSync,
            found: Found::Journal {
                journal: Some(on_r1),
                rebooted: false,
            },
        },
    ];
    recovery::decide(6, SIZE, CHUNK, &members)
}

/// The in-sync commit: a replica the store calls in sync again is not left suspect by the
/// journals. Without it the journal replica 1 holds still says it may lack everything, and a
/// recovery that cannot reach replica 0 waits for it, though replica 1 holds every write.
#[test]
fn a_crash_right_after_a_mark_finds_the_resynced_replica_whole() {
    match recovery_right_after_the_mark(true) {
        Decision::Start(s) => assert!(!s.source_not_whole),
        Decision::Refuse(r) => panic!("refused with the in-sync commit: {r}"),
    }
    match recovery_right_after_the_mark(false) {
        Decision::Refuse(Refusal::WaitFor { waiting_for }) => assert_eq!(waiting_for, ["a"]),
        Decision::Refuse(r) => panic!("{r}"),
        Decision::Start(_) => panic!("the mutation went unnoticed: the scenario misses the rule"),
    }
}

/// A replica that comes back rebooted, holding a journal of this same engine, is given a
/// journal naming the chunks it lost with its power (the engine's dirty map), not an empty
/// map: an empty one with `lost` made it whole to the next recovery (seed 44432).
#[test]
fn a_rebooted_replica_is_given_a_journal_naming_what_it_lost() {
    let (mut e, mut k) = setup(None);
    let mut acts = Vec::new();
    k.submit(&mut e, 1, write(3 * CHUNK), &mut acts);
    let after = store_all(&mut k, &mut e, &acts);
    answer_sends(&mut k, &mut e, after, usize::MAX);
    let own = k_last(&mut k, &mut e);
    // Replica 1 loses its session before any flush: chunk 3 may be gone if its node reboots.
    let mut cmds = Vec::new();
    e.on_replica_lost(R1, &mut cmds);
    e.on_outdate_done(R1, &mut cmds);
    let mut acts = Vec::new();
    k.join(&mut e, R1, Some(true), &mut acts);
    let [Act::GetJournal { op, .. }] = acts[..] else {
        panic!("{acts:?}")
    };
    let mut acts = Vec::new();
    k.read(&mut e, op, R1, Ok(Some((own, false))), &mut acts);
    let given = puts(&acts)
        .into_iter()
        .find(|p| p.1 == R1)
        .expect("the join gives it a journal")
        .2;
    let entry = given
        .out
        .iter()
        .find(|o| o.replica == "b")
        .expect("it is named");
    assert!(entry.lost, "its reboot is forgotten");
    let lacks = entry.dirty.clone().expect("a known map");
    assert!(
        lacks.iter().any(|&(a, b)| a <= 3 && 3 < b),
        "the chunk it lost is not named: {lacks:?}"
    );
}

/// The last journal the keeper committed (a commit now, with everything stored).
fn k_last(k: &mut Keeper, e: &mut Engine) -> Journal {
    let mut acts = Vec::new();
    k.commit(e, 0, &mut acts);
    let j = puts(&acts).first().expect("a commit").2.clone();
    store_all(k, e, &acts);
    j
}

/// Write at `offset` through the keeper, commit and answer everything; returns the journal
/// the commit stored.
fn write_committed(k: &mut Keeper, e: &mut Engine, tag: u64, offset: u64) -> Journal {
    let mut acts = Vec::new();
    k.submit(e, tag, write(offset), &mut acts);
    let j = puts(&acts)
        .first()
        .expect("a commit of the write's extent")
        .2
        .clone();
    let after = store_all(k, e, &acts);
    answer_sends(k, e, after, usize::MAX);
    j
}

/// Crash recovery of a grown volume (`big` bytes) from one journal, replica 0 unreachable.
fn recover_from(j: Journal, big: u64) -> ChunkMap {
    let members = [
        Member {
            id: "a".into(),
            local: true,
            stored: Stored::InSync,
            found: Found::Unreachable,
        },
        Member {
            id: "b".into(),
            local: false,
            stored: Stored::InSync,
            found: Found::Journal {
                journal: Some(j),
                rebooted: false,
            },
        },
    ];
    match recovery::decide(6, big, CHUNK, &members) {
        Decision::Start(s) => s.plan.reconcile,
        Decision::Refuse(r) => panic!("refused: {r}"),
    }
}

/// A journal stored before the volume grew (smaller size) and one stored after both recover
/// the grown volume: the old one's maps cover the new chunks as clean, the new one's log
/// names writes in the new range. And one larger than the engine (an engine started with the
/// old size) is read over the engine's size, as before growth existed.
#[test]
fn journals_written_before_and_after_a_grow_both_recover_the_grown_volume() {
    let big = 2 * SIZE;
    let (mut e, mut k) = setup(None);
    let before = write_committed(&mut k, &mut e, 1, 3 * CHUNK);
    assert_eq!((before.size, before.active.clone()), (SIZE, vec![(3, 4)]));
    assert_eq!(k.grow(&mut e, big), Ok(()));
    assert_eq!((e.size(), k.size()), (big, big));
    let new_chunk = SIZE / CHUNK + 5;
    let after = write_committed(&mut k, &mut e, 2, new_chunk * CHUNK);
    assert_eq!(
        after.size, big,
        "journals after the grow must say the new size"
    );
    assert!(after
        .active
        .iter()
        .any(|&(a, b)| a <= new_chunk && new_chunk < b));
    after.encode().expect("a valid journal");
    let old = recover_from(before.clone(), big);
    assert_eq!(old.chunks(), big / CHUNK);
    assert_eq!(old.runs(), vec![(3, 4)]);
    let new = recover_from(after.clone(), big);
    assert!(
        new.is_set(new_chunk),
        "a write in the new range escaped recovery"
    );
    let small = recover_from(after, SIZE);
    assert_eq!(
        small.chunks(),
        SIZE / CHUNK,
        "a larger journal is clipped to the engine"
    );
}

/// An outdated replica that returns after a grow with a journal of before it: what it lacks
/// has the grown geometry (the new chunks clean), and the journal it is given too.
#[test]
fn a_replica_returning_after_a_grow_with_an_older_smaller_journal_joins() {
    let big = 2 * SIZE;
    let mut lacks = ChunkMap::new(SIZE, CHUNK);
    lacks.set_chunks(2, 3);
    let (mut e, mut k) = setup(Some(lacks));
    let mut acts = Vec::new();
    k.commit(&mut e, 0, &mut acts);
    store_all(&mut k, &mut e, &acts);
    k.grow(&mut e, big).expect("grows");
    let mut acts = Vec::new();
    k.join(&mut e, R1, Some(false), &mut acts);
    let [Act::GetJournal { op, .. }] = acts[..] else {
        panic!("{acts:?}")
    };
    let mut acts = Vec::new();
    k.read(
        &mut e,
        op,
        R1,
        Ok(Some((older(vec![(9, 10)], vec![]), false))),
        &mut acts,
    );
    assert_eq!(e.dirty(R1).runs(), vec![(2, 3), (9, 10)]);
    assert_eq!(e.dirty(R1).chunks(), big / CHUNK);
    let (_, _, given) = puts(&acts).pop().expect("the join gives it a journal");
    assert_eq!(given.size, big);
    assert_eq!(out_of(&given, "b"), Some(Some(vec![(2, 3), (9, 10)])));
    given.encode().expect("a valid journal");
}

/// A resync save whose flush is under way when the volume grows is still committed: its
/// point covers the new chunks as clean.
#[test]
fn a_resync_save_under_way_across_a_grow_is_committed() {
    let mut lacks = ChunkMap::new(SIZE, CHUNK);
    lacks.set_chunks(0, 8);
    let (mut e, mut k, op) = resync_until_a_save(&lacks, 6);
    k.grow(&mut e, 2 * SIZE).expect("grows");
    let mut acts = Vec::new();
    k.save_flushed(&mut e, op, R1, Ok(()), &mut acts);
    let p = puts(&acts);
    assert!(!p.is_empty(), "a flushed save must be committed");
    assert_eq!(p[0].2.size, 2 * SIZE);
    let saved = out_of(&p[0].2, "b")
        .expect("an entry")
        .expect("a known map");
    assert!(
        saved.iter().all(|&(_, b)| b <= 8),
        "the new range is not lacking: {saved:?}"
    );
    store_all(&mut k, &mut e, &acts);
    assert!(k.quiet());
}
