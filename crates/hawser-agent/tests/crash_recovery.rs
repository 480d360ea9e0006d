//! Crash recovery of the engine, without the control plane: two nodes' storage in one process
//! (a local replica and one behind a real replica server). An engine writes and is abandoned
//! without stopping (its crash); the replicas are made to differ inside and outside its
//! activity log; the next engine must make them equal inside the log before serving I/O, and
//! compare nothing else. A cleanly stopped engine leaves an empty log. An engine that dies in
//! the middle of a resync leaves a journal from which the next engine resumes it.

// Test sizes and patterns: small values, truncation intended.
#![allow(clippy::cast_possible_truncation)]

use std::time::{Duration, Instant};

use crate::node_support::{node, reopen, TempDir};
use bytes::Bytes;
use hawser_agent::engine::rate_limit::ResyncRates;
use hawser_agent::engine::volume::VolumeEngine;
use hawser_agent::frontends::block::BlockDevice;
use hawser_agent::replica;
use hawser_api::agent::EngineReplicaStatus;
use hawser_api::agent::{EngineReplica, StartEngine};
use hawser_api::controller::ReplicaState;
use hawser_storage::{Replica, StoredJournal};
use tokio::net::TcpListener;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 128 * MIB;
const EXTENT: u64 = 4 * MIB;

fn request(epoch: u64, raddr: &str) -> StartEngine {
    StartEngine {
        volume: "vol".into(),
        size_bytes: SIZE,
        epoch,
        replicas: vec![
            EngineReplica {
                replica_id: "vol-a".into(),
                node: "a".into(),
                replica_addr: String::new(),
                state: ReplicaState::InSync,
                blank: false,
            },
            EngineReplica {
                replica_id: "vol-b".into(),
                node: "b".into(),
                replica_addr: raddr.into(),
                state: ReplicaState::InSync,
                blank: false,
            },
        ],
        controller_url: "http://127.0.0.1:1".into(),
        on_quorum_loss: Default::default(),
        export: true,
        grant: None,
        qos: Default::default(),
        data_key: None,
        uid: None,
    }
}

fn pattern(seed: u8, len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| seed ^ (i as u8)).collect::<Vec<u8>>())
}

/// A replica server for `b` on a free loopback port: its address, and the sender that stops
/// it.
async fn replica_server(
    b: &std::sync::Arc<hawser_agent::storage::pools::NodeStorage>,
) -> (String, tokio::sync::watch::Sender<bool>) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let rl = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let raddr = rl.local_addr().expect("addr").to_string();
    let serve = replica::server::serve(rl, b.clone(), None, Default::default(), stop_rx);
    tokio::spawn(serve);
    (raddr, stop_tx)
}

/// Nodes a and b of `SIZE` replicas under `dir`, b behind a replica server: its address and
/// the sender that stops it.
async fn two_nodes(
    dir: &TempDir,
) -> (
    std::sync::Arc<hawser_agent::storage::pools::NodeStorage>,
    std::sync::Arc<hawser_agent::storage::pools::NodeStorage>,
    String,
    tokio::sync::watch::Sender<bool>,
) {
    let a = node(&dir.0, "a", SIZE);
    let b = node(&dir.0, "b", SIZE);
    let (raddr, stop_tx) = replica_server(&b).await;
    (a, b, raddr, stop_tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_engine_reconciles_exactly_the_activity_log() {
    let dir = TempDir::new("recovery");
    let (a, b, raddr, _stop_tx) = two_nodes(&dir).await;

    // Engine 1 writes into extents 2 and 7, and is never stopped.
    let e1 = VolumeEngine::start(&request(1, &raddr), "a", &a, ResyncRates::default())
        .await
        .expect("start engine 1");
    e1.write(2 * EXTENT, pattern(1, 65536), false)
        .await
        .expect("write");
    e1.write(7 * EXTENT + 8192, pattern(2, 4096), false)
        .await
        .expect("write");
    assert_eq!(e1.status().active_extents, 2, "both extents are in the log");
    // Its crash mid-write: a write reached replica b only, inside the log (extent 7)...
    let rb = b.replica("vol-b").expect("b");
    rb.write(1, 7 * EXTENT + 65536, &pattern(3, 65536), false)
        .expect("direct write");
    // ... and, to prove recovery looks only at the log, a difference outside it (extent 20),
    // which no engine could have caused.
    rb.write(1, 20 * EXTENT, &pattern(4, 4096), false)
        .expect("direct write");
    std::mem::forget(e1);

    let e2 = VolumeEngine::start(&request(2, &raddr), "a", &a, ResyncRates::default())
        .await
        .expect("start engine 2");
    let report = e2.status().recovery.expect("recovery ran");
    assert_eq!(report.replicas, 2);
    assert_eq!(
        report.compared_bytes,
        2 * EXTENT,
        "only the two logged extents"
    );
    assert_eq!(report.copied_bytes, 65536, "one 64 KiB block differed");
    let ra = a.replica("vol-a").expect("a");
    for off in [2 * EXTENT, 7 * EXTENT] {
        let x = ra.read(2, off, EXTENT as u32).expect("read a");
        let y = rb.read(2, off, EXTENT as u32).expect("read b");
        assert!(x == y, "extent at {off} differs after recovery");
    }
    // The source was the local replica, which never got the stray write.
    let x = ra.read(2, 7 * EXTENT + 65536, 65536).expect("read a");
    assert!(x.iter().all(|&v| v == 0), "the source's value won");
    // Reads through the engine agree with what was acknowledged.
    let got = e2.read(2 * EXTENT, 65536).await.expect("read");
    assert_eq!(got, pattern(1, 65536));

    // A clean stop empties the log: the next engine compares nothing.
    e2.stop().await;
    let e3 = VolumeEngine::start(&request(3, &raddr), "a", &a, ResyncRates::default())
        .await
        .expect("start engine 3");
    let report = e3.status().recovery.expect("recovery ran");
    assert_eq!(
        report.compared_bytes, 0,
        "a clean stop leaves nothing to compare"
    );
    e3.stop().await;
}

/// The engine's node lost power: its local replica lost a write it had acknowledged but not
/// flushed, which the other replica holds. The next engine, on the same node, must not
/// recover from the rebooted replica alone while the other is unreachable, and once it is
/// back must take it as the source, though the local one is cheaper to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_node_rebooted_is_not_the_recovery_source() {
    let dir = TempDir::new("reboot-source");
    let (a, _b, raddr, _stop_tx) = two_nodes(&dir).await;

    let e1 = VolumeEngine::start(&request(1, &raddr), "a", &a, ResyncRates::default())
        .await
        .expect("start engine 1");
    e1.write(2 * EXTENT, pattern(5, 65536), false)
        .await
        .expect("write");
    std::mem::forget(e1);
    // Node a loses power: the unflushed write is gone from its disk, and it boots anew.
    let ra = a.replica("vol-a").expect("a");
    ra.write(1, 2 * EXTENT, &vec![0u8; 65536], false)
        .expect("direct write");
    let a = reopen(&dir.0, "a", hawser_storage::node_boot_id().wrapping_add(1));

    // While b is unreachable no replica known to be whole is: the attach waits for it.
    let refused = VolumeEngine::start(&request(2, "127.0.0.1:1"), "a", &a, ResyncRates::default())
        .await
        .err()
        .expect("recovery from the rebooted replica alone must be refused");
    let msg = format!("{refused:#}");
    assert!(
        msg.contains("vol-b") && msg.contains("cannot be reached"),
        "{msg}"
    );

    let e2 = VolumeEngine::start(&request(3, &raddr), "a", &a, ResyncRates::default())
        .await
        .expect("start engine 3");
    let report = e2.status().recovery.expect("recovery ran");
    assert_eq!(report.copied_bytes, 65536, "one 64 KiB block differed");
    let got = e2.read(2 * EXTENT, 65536).await.expect("read");
    assert!(
        got == pattern(5, 65536),
        "the acknowledged write was lost: the rebooted replica was the source"
    );
    e2.stop().await;
}

/// Bytes of replica `id`'s dirty map in the journal stored on `r` (`None`: not there, or
/// unknown).
fn journal_map_bytes(r: &Replica, id: &str) -> Option<u64> {
    let StoredJournal::Found { journal: j, .. } = r.get_journal(u64::MAX).expect("read journal")
    else {
        return None;
    };
    let out = j.out.iter().find(|o| o.replica == id)?;
    let runs = out.dirty.as_ref()?;
    Some(runs.iter().map(|(a, b)| b - a).sum::<u64>() * j.chunk_bytes)
}

/// Poll `cond` until it holds (`Some`), failing the test after `limit`.
async fn wait_for<T>(what: &str, limit: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn replica_b(e: &VolumeEngine) -> EngineReplicaStatus {
    e.status()
        .replicas
        .into_iter()
        .find(|r| r.replica_id == "vol-b")
        .expect("vol-b in status")
}

const VOL: u64 = 192 * MIB;
const DIRTY: u64 = 128 * MIB;
/// Slow enough that a resync of `DIRTY` takes 16 s: the first save (after 5 s) comes midway.
const SLOW: ResyncRates = ResyncRates {
    max: 8 * MIB,
    busy: 0,
};

/// Two nodes whose replica b lacks `DIRTY` bytes that a has (b outdated, a in sync).
struct Lacking {
    _dir: TempDir,
    a: std::sync::Arc<hawser_agent::storage::pools::NodeStorage>,
    b: std::sync::Arc<hawser_agent::storage::pools::NodeStorage>,
    raddr: String,
    stop_tx: tokio::sync::watch::Sender<bool>,
}

/// Start request of epoch `epoch` for a `VOL` volume whose replica b (at `baddr`) is
/// outdated.
fn outdated_b(epoch: u64, baddr: &str) -> StartEngine {
    let mut req = request(epoch, baddr);
    req.size_bytes = VOL;
    req.replicas[1].state = ReplicaState::Outdated;
    req
}

/// An engine of epoch 1 runs while b is out (and unreachable) and writes `DIRTY` bytes to a
/// only, then stops; b's replica server is up afterwards.
async fn lacking(label: &str) -> Lacking {
    lacking_as(label, false).await
}

/// `lacking`, with b blank from the start with `blank` (as a replica self-healing placed).
async fn lacking_as(label: &str, blank: bool) -> Lacking {
    let dir = TempDir::new(label);
    let a = node(&dir.0, "a", VOL);
    let b = node(&dir.0, "b", VOL);
    let (raddr, stop_tx) = replica_server(&b).await;
    let e1 = VolumeEngine::start(
        &lacking_b(1, "127.0.0.1:1", blank),
        "a",
        &a,
        ResyncRates::default(),
    )
    .await
    .expect("start engine 1");
    for i in 0..DIRTY / EXTENT {
        e1.write(i * EXTENT, pattern(i as u8 + 1, EXTENT as usize), false)
            .await
            .expect("write");
    }
    e1.stop().await;
    let ra = a.replica("vol-a").expect("a");
    assert_eq!(
        journal_map_bytes(&ra, "vol-b"),
        Some(if blank { VOL } else { DIRTY }),
        "b lacks what was written (blank: everything)"
    );
    Lacking {
        _dir: dir,
        a,
        b,
        raddr,
        stop_tx,
    }
}

/// Finish the resync of b with `e` and check the replicas end byte-identical; returns the
/// bytes `e` copied.
async fn finish_resync(f: &Lacking, e: &VolumeEngine) -> u64 {
    // Resynced and flushed; the in-sync mark waits for a controller this test does not run.
    wait_for("the resync of b", Duration::from_secs(60), || {
        (replica_b(e).state == "marking").then_some(())
    })
    .await;
    let copied = replica_b(e).copied_bytes;
    e.stop().await;
    let _ = f.stop_tx.send(true);
    let (ra, rb) = (
        f.a.replica("vol-a").expect("a"),
        f.b.replica("vol-b").expect("b"),
    );
    assert_same_files(ra.data_path(), rb.data_path());
    let got = ra.read(u64::MAX, DIRTY - EXTENT, 4096).expect("read a");
    assert_eq!(
        got,
        pattern((DIRTY / EXTENT) as u8, 4096),
        "the data was written"
    );
    copied
}

/// An engine killed in the middle of a long resync (its agent killed, as a crash: no final
/// flush, no last commit): the next engine copies only what the last resync save left, not
/// the replica's whole dirty map again, and the replicas end byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_killed_midway_resumes_where_it_was_saved() {
    killed_midway("resume-kill", false).await;
}

/// The same for a blank replica (a new replica built from nothing, as self-healing places
/// one): its build resumes from the last save instead of starting over with every engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blank_replicas_build_killed_midway_resumes_where_it_was_saved() {
    killed_midway("build-kill", true).await;
}

/// Start request for b outdated, or blank (lacking everything) with `blank`.
fn lacking_b(epoch: u64, baddr: &str, blank: bool) -> StartEngine {
    let mut req = outdated_b(epoch, baddr);
    req.replicas[1].blank = blank;
    req
}

async fn killed_midway(label: &str, blank: bool) {
    let f = lacking_as(label, blank).await;
    let (a, raddr) = (f.a.clone(), f.raddr.clone());
    let ra = a.replica("vol-a").expect("a");

    // Engine 2 resyncs b slowly, in a runtime of its own: shutting that down kills it
    // mid-resync like a killed agent (its tasks and connections just stop).
    let rt2 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (req2, a2) = (lacking_b(2, &raddr, blank), a.clone());
    let e2 = rt2
        .spawn(async move { VolumeEngine::start(&req2, "a", &a2, SLOW).await })
        .await
        .expect("engine 2 task")
        .expect("start engine 2");
    let dirty_total = replica_b(&e2).dirty_bytes;
    assert_eq!(dirty_total, if blank { VOL } else { DIRTY });
    // A resync save shows in the journal: b's map there is smaller than what it lacked.
    let saved = wait_for("a resync save", Duration::from_secs(60), || {
        journal_map_bytes(&ra, "vol-b").filter(|&m| m < dirty_total)
    })
    .await;
    let copied_first = replica_b(&e2).copied_bytes;
    rt2.shutdown_background();
    drop(e2);
    assert!(
        copied_first < dirty_total,
        "engine 2 finished before it was killed"
    );
    assert!(
        saved + copied_first >= dirty_total,
        "the saved map forgot chunks that were not copied"
    );

    // Engine 3 starts from the saved map and finishes the resync.
    let unlimited = ResyncRates { max: 0, busy: 0 };
    let e3 = VolumeEngine::start(&lacking_b(3, &raddr, blank), "a", &a, unlimited)
        .await
        .expect("start engine 3");
    let start_dirty = replica_b(&e3).dirty_bytes;
    let copied_second = finish_resync(&f, &e3).await;
    eprintln!(
        "killed (blank: {blank}): dirty_total {dirty_total}, copied_first {copied_first}, saved map {saved}, \
         next engine's map {start_dirty}, copied_second {copied_second}"
    );
    assert!(
        start_dirty <= saved,
        "the next engine starts from the saved map"
    );
    assert!(
        copied_second < dirty_total,
        "the whole dirty map was copied again"
    );
    assert!(copied_second <= saved, "copied more than the saved map");
}

/// An engine stopped cleanly in the middle of a resync (detach, attach, an engine swap)
/// saves its progress as it stops: the next engine resumes at once, whenever the last
/// periodic save was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_stopped_midway_resumes_where_it_stopped() {
    let f = lacking("resume-stop").await;
    let e2 = VolumeEngine::start(&outdated_b(2, &f.raddr), "a", &f.a, SLOW)
        .await
        .expect("start engine 2");
    let dirty_total = replica_b(&e2).dirty_bytes;
    assert_eq!(dirty_total, DIRTY);
    // 16 MiB take 2 s at the slow rate: before the first periodic save (5 s) on a machine
    // that is not overloaded, so what the journal says afterwards is the stop's save.
    wait_for("16 MiB copied", Duration::from_secs(60), || {
        (replica_b(&e2).copied_bytes >= 16 * MIB).then_some(())
    })
    .await;
    let ra = f.a.replica("vol-a").expect("a");
    let before_stop = journal_map_bytes(&ra, "vol-b").expect("b's map in the journal");
    e2.stop().await;
    let copied_first = replica_b(&e2).copied_bytes;
    let saved = journal_map_bytes(&ra, "vol-b").expect("b's map in the journal");
    let unlimited = ResyncRates { max: 0, busy: 0 };
    let e3 = VolumeEngine::start(&outdated_b(3, &f.raddr), "a", &f.a, unlimited)
        .await
        .expect("start engine 3");
    let start_dirty = replica_b(&e3).dirty_bytes;
    let copied_second = finish_resync(&f, &e3).await;
    eprintln!(
        "stopped: dirty_total {dirty_total}, map before the stop {before_stop}, \
         copied_first {copied_first}, saved map {saved}, next engine's map {start_dirty}, \
         copied_second {copied_second}"
    );
    assert!(saved < dirty_total, "the stop saved no progress");
    assert!(
        saved + copied_first >= dirty_total,
        "the saved map forgot chunks that were not copied"
    );
    assert_eq!(
        start_dirty, saved,
        "the next engine starts from the saved map"
    );
    assert!(
        copied_second < dirty_total,
        "the whole dirty map was copied again"
    );
}

/// The two files are byte-identical (compared a piece at a time).
fn assert_same_files(x: &std::path::Path, y: &std::path::Path) {
    use std::io::Read;
    let (mut fx, mut fy) = (
        std::fs::File::open(x).expect("open"),
        std::fs::File::open(y).expect("open"),
    );
    assert_eq!(
        fx.metadata().expect("stat").len(),
        fy.metadata().expect("stat").len()
    );
    let (mut bx, mut by) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    let mut at = 0u64;
    loop {
        let n = fx.read(&mut bx).expect("read");
        fy.read_exact(&mut by[..n]).expect("read");
        if n == 0 {
            return;
        }
        assert!(bx[..n] == by[..n], "replicas differ in the 4 MiB at {at}");
        at += n as u64;
    }
}
