//! "Failures without losing an acknowledged write": real processes on hosts made of network
//! namespaces, a verifying writer running throughout, a fault on a replica's host (kill -9 of
//! its agent, or an iptables partition). Each test checks that the writer sees no error, that
//! I/O resumes (the longest gap without an acknowledgement, measured by the writer, is printed
//! and bounded), that the lost replica becomes `outdated`, and at the end that every
//! acknowledged write reads back, through NBD and from every in-sync replica file, and that the
//! in-sync replicas are identical.
//!
//! Needs root, `ip netns` and iptables; otherwise each test prints SKIP and passes, unless
//! `HAWSER_REQUIRE_NETNS` is set (then it fails). Run with `--nocapture` to see the timings:
//! `cargo test --release -p hawser-e2e --test netns_faults -- --test-threads=1 --nocapture`.

use std::time::{Duration, Instant};

use hawser_api::controller::{Replica, ReplicaState};
use hawser_e2e::{
    assert_same_contents, verify_file, verify_nbd, wait_until, NbdTarget, NetCluster, Writer,
    WriterOptions,
};

/// Bound on the longest pause of acknowledgements across a fault. A dead process is noticed at
/// once (the connection breaks); a partition after 1.5 s without any answer to requests or
/// pings, then the outdate CAS: about 2 s. The bound leaves room for a noisy machine.
const MAX_GAP: Duration = Duration::from_secs(4);
/// Acknowledged writes before the fault, and after the replica is known outdated.
const ACKS_BEFORE: u64 = 5000;
const ACKS_AFTER: u64 = 5000;
const ACK_TIMEOUT: Duration = Duration::from_secs(60);
const OUTDATE_TIMEOUT: Duration = Duration::from_secs(30);
/// A returning replica is reconnected (backoff at most 10 s) and resynced within this.
const RESYNC_TIMEOUT: Duration = Duration::from_secs(90);
/// Dirty-tracking granularity of the engine.
const CHUNK: u64 = 64 * 1024;

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill9,
    Partition,
}

/// A volume attached on the host of one of its replicas, and the replica the fault will hit.
struct Setup {
    volume: String,
    target: NbdTarget,
    engine_host: String,
    victim: Replica,
}

fn attach_on_a_replica_host(c: &NetCluster, volume: &str, replicas: u32) -> Setup {
    let n = replicas.to_string();
    c.cli_ok(&[
        "volume",
        "create",
        volume,
        "--size",
        "256MiB",
        "--replicas",
        &n,
    ]);
    let v = c.volume(volume);
    let engine_host = v.replicas[0].node.clone();
    let victim = v.replicas.last().expect("replicas").clone();
    assert_ne!(
        victim.node, engine_host,
        "replicas on distinct hosts: {v:?}"
    );
    c.cli_ok(&["volume", "attach", volume, "--node", &engine_host]);
    let uri = c
        .volume(volume)
        .nbd_unix_uri
        .expect("attached volume has a unix URI");
    Setup {
        volume: volume.into(),
        target: NbdTarget::from_unix_uri(&uri),
        engine_host,
        victim,
    }
}

/// Run the writer across `fault` on the victim's host; returns the log and prints timings.
fn write_across_fault(
    c: &mut NetCluster,
    s: &Setup,
    fault: Fault,
    seed: u64,
) -> hawser_e2e::WriteLog {
    let opts = WriterOptions {
        seed,
        ..WriterOptions::default()
    };
    eprintln!(
        "writer seed {seed}, engine on {}, fault {fault:?} on {}",
        s.engine_host, s.victim.node
    );
    let writer = Writer::start(s.target.clone(), opts);
    writer.wait_acks(ACKS_BEFORE, ACK_TIMEOUT);
    let at_fault = writer.stats();
    let t0 = Instant::now();
    match fault {
        Fault::Kill9 => c.kill9(&s.victim.node),
        Fault::Partition => c.partition(&s.victim.node),
    }
    wait_until("the lost replica to be outdated", OUTDATE_TIMEOUT, || {
        c.replica_state(&s.volume, &s.victim.id) == ReplicaState::Outdated
    });
    let outdated_after = t0.elapsed();
    writer.wait_acks(ACKS_AFTER, ACK_TIMEOUT);
    let (log, stats) = writer.stop();
    eprintln!(
        "{fault:?}: outdated after {outdated_after:.2?}; longest gap without an ack {:.2?} \
         (ended {:.2?} after the writer started, fault at {:.2?}); {} writes and {} flushes \
         acknowledged in {:.2?}",
        stats.longest_gap,
        stats.longest_gap_ended_at,
        at_fault.elapsed,
        stats.acked_writes,
        stats.acked_flushes,
        stats.elapsed
    );
    assert_eq!(stats.errors, 0, "the writer saw errors: {stats:?}");
    assert_eq!(
        stats.unknown_writes, 0,
        "writes with unknown outcome: {stats:?}"
    );
    assert_eq!(
        stats.disconnects, 0,
        "the NBD connection dropped: {stats:?}"
    );
    assert!(
        stats.longest_gap < MAX_GAP,
        "I/O paused {:.2?} (bound {MAX_GAP:?}): {stats:?}",
        stats.longest_gap
    );
    log
}

/// The engine's view of the victim: (dirty bytes, bytes copied by resync).
fn victim_progress(c: &NetCluster, s: &Setup) -> (u64, u64) {
    let v = c.volume(&s.volume);
    let r = v
        .replicas
        .iter()
        .find(|r| r.id == s.victim.id)
        .expect("victim replica");
    let e = r
        .engine
        .as_ref()
        .unwrap_or_else(|| panic!("no engine view of the victim: {v:?}"));
    (e.dirty_bytes, e.copied_bytes)
}

/// The victim is back: wait until the engine has resynced it and the store calls it in-sync;
/// check it copied only what it missed. `dirty_before` is its dirty set while it was away;
/// `area` the bytes the writer touches (an upper bound on what it can have missed).
fn wait_resynced(c: &NetCluster, s: &Setup, dirty_before: u64, area: u64, written_down: u64) {
    let t0 = Instant::now();
    wait_until(
        "the returning replica to be resynced",
        RESYNC_TIMEOUT,
        || c.replica_state(&s.volume, &s.victim.id) == ReplicaState::InSync,
    );
    let (dirty, copied) = victim_progress(c, s);
    eprintln!(
        "resync: in-sync after {:.2?}; written while away {written_down} bytes in at most {area} bytes of chunks; dirty when it returned {dirty_before}; copied {copied}; dirty now {dirty}",
        t0.elapsed()
    );
    assert_eq!(dirty, 0, "in-sync with dirty chunks left");
    // Only what it missed is copied: at most the chunks written while it was away (1.1x for
    // the writes in flight when it left), never the whole volume.
    let bound = dirty_before.min(area + area / 10);
    assert!(
        copied <= bound + CHUNK,
        "copied {copied} bytes, more than the {bound} it missed"
    );
    assert!(copied > 0, "nothing copied although writes were missed");
}

/// After the writer: every acknowledged write reads back through NBD; then, detached, from
/// every in-sync replica file, and the in-sync replicas are identical. Returns them.
/// `victim_in_sync`: whether the faulted replica is expected back in the in-sync set.
fn verify_everywhere(
    c: &NetCluster,
    s: &Setup,
    log: &hawser_e2e::WriteLog,
    victim_in_sync: bool,
) -> Vec<Replica> {
    let report = verify_nbd(&s.target, log).expect("read the volume back");
    report.assert_ok();
    eprintln!("{} written blocks read back through NBD", report.checked);
    c.cli_ok(&["volume", "detach", &s.volume]);
    let v = c.volume(&s.volume);
    let in_sync: Vec<Replica> = v
        .replicas
        .iter()
        .filter(|r| r.state == ReplicaState::InSync)
        .cloned()
        .collect();
    assert!(
        in_sync.iter().any(|r| r.node == s.engine_host),
        "the engine's local replica is not in sync: {v:?}"
    );
    assert_eq!(
        in_sync.iter().any(|r| r.id == s.victim.id),
        victim_in_sync,
        "the faulted replica's state: {v:?}"
    );
    let files: Vec<_> = in_sync.iter().map(|r| c.replica_file(r)).collect();
    for f in &files {
        verify_file(f, log)
            .expect("read a replica file")
            .assert_ok();
    }
    for pair in files.windows(2) {
        assert_same_contents(&pair[0], &pair[1], v.size_bytes);
    }
    in_sync
}

/// a. kill -9 of the agent holding the other replica: the engine loses the connection at
/// once, outdates that replica and carries on; restarted, the replica copies only the chunks
/// written while it was down and is in-sync again.
#[test]
fn kill9_of_a_replica_agent_loses_no_acknowledged_write_and_resyncs_incrementally() {
    if NetCluster::skip() {
        return;
    }
    let mut c = NetCluster::start("kill9", 3);
    let s = attach_on_a_replica_host(&c, "k9", 2);
    let log = write_across_fault(&mut c, &s, Fault::Kill9, 0x6b39);
    assert!(!c.agent_alive(&s.victim.node));
    let (dirty_before, _) = victim_progress(&c, &s);
    c.restart_agent(&s.victim.node);
    assert!(c.agent_alive(&s.victim.node));
    let area = WriterOptions::default().blocks * 4096;
    wait_resynced(&c, &s, dirty_before, area, ACKS_AFTER * 4096);
    verify_everywhere(&c, &s, &log, true);
}

/// b. A partition of the other replica's host (iptables DROP inside its namespace): its
/// requests go unanswered until the replica watchdog (5 s) closes the connection; then as a.
/// After healing, the engine reconnects by itself and resyncs it.
#[test]
fn partition_of_a_replica_host_loses_no_acknowledged_write_and_heals() {
    if NetCluster::skip() {
        return;
    }
    let mut c = NetCluster::start("partition", 3);
    let s = attach_on_a_replica_host(&c, "part", 2);
    let log = write_across_fault(&mut c, &s, Fault::Partition, 0x9a27);
    let (dirty_before, _) = victim_progress(&c, &s);
    c.heal(&s.victim.node);
    let area = WriterOptions::default().blocks * 4096;
    wait_resynced(&c, &s, dirty_before, area, ACKS_AFTER * 4096);
    verify_everywhere(&c, &s, &log, true);
}

/// c. Three replicas, kill -9 of one: the two left stay in sync, hold every acknowledged write
/// and are byte-identical.
#[test]
fn kill9_with_three_replicas_leaves_two_identical_in_sync_replicas() {
    if NetCluster::skip() {
        return;
    }
    let mut c = NetCluster::start("kill9x3", 3);
    let s = attach_on_a_replica_host(&c, "k9x3", 3);
    let log = write_across_fault(&mut c, &s, Fault::Kill9, 0x3333);
    let in_sync = verify_everywhere(&c, &s, &log, false);
    assert_eq!(in_sync.len(), 2, "two replicas left in sync: {in_sync:?}");
}

/// e. Three replicas, two replica hosts lost (kill -9). The first loss leaves two of three, a
/// quorum: that replica is outdated. The second would leave one: it stays in-sync in the
/// store, `down` in the engine, and writes suspend (no error, no acknowledgement). When the
/// outdated host returns it is resynced and made in-sync through the control plane; two of
/// three are a quorum again, so the down replica is outdated and the suspended writes
/// complete. When that host returns it is resynced too. No manual action anywhere.
#[test]
fn two_of_three_replicas_lost_suspends_writes_until_one_returns() {
    if NetCluster::skip() {
        return;
    }
    let mut c = NetCluster::start("quorum", 3);
    let s = attach_on_a_replica_host(&c, "q3", 3);
    let v = c.volume(&s.volume);
    let lost: Vec<Replica> = v
        .replicas
        .iter()
        .filter(|r| r.node != s.engine_host)
        .cloned()
        .collect();
    assert_eq!(lost.len(), 2);
    let writer = Writer::start(
        s.target.clone(),
        WriterOptions {
            seed: 0x4e,
            ..WriterOptions::default()
        },
    );
    writer.wait_acks(ACKS_BEFORE, ACK_TIMEOUT);
    c.kill9(&lost[0].node);
    wait_until(
        "the first lost replica to be outdated",
        OUTDATE_TIMEOUT,
        || c.replica_state(&s.volume, &lost[0].id) == ReplicaState::Outdated,
    );
    writer.wait_acks(ACKS_AFTER, ACK_TIMEOUT);
    c.kill9(&lost[1].node);
    wait_until(
        "the second lost replica to be down",
        OUTDATE_TIMEOUT,
        || {
            let v = c.volume(&s.volume);
            v.replicas
                .iter()
                .any(|r| r.id == lost[1].id && r.engine.as_ref().is_some_and(|e| e.state == "down"))
        },
    );
    assert_eq!(
        c.replica_state(&s.volume, &lost[1].id),
        ReplicaState::InSync,
        "one replica of three must not be left alone in sync"
    );
    let suspended = writer.stats();
    // An observation window, not a synchronisation: for 3 s no write may be acknowledged.
    std::thread::sleep(Duration::from_secs(3));
    let still = writer.stats();
    assert_eq!(
        still.acked_writes, suspended.acked_writes,
        "writes were acknowledged by one replica of three"
    );
    assert_eq!(still.errors, 0, "suspend, not fail: {still:?}");
    // The outdated one returns: resynced, in-sync by CAS; then the down one is outdated and
    // the suspended writes complete.
    c.restart_agent(&lost[0].node);
    writer.wait_acks(ACKS_AFTER, RESYNC_TIMEOUT);
    assert_eq!(
        c.replica_state(&s.volume, &lost[0].id),
        ReplicaState::InSync
    );
    wait_until("the down replica to be outdated", OUTDATE_TIMEOUT, || {
        c.replica_state(&s.volume, &lost[1].id) == ReplicaState::Outdated
    });
    // The other returns and is resynced the same way.
    c.restart_agent(&lost[1].node);
    wait_until("the second replica to be resynced", RESYNC_TIMEOUT, || {
        c.replica_state(&s.volume, &lost[1].id) == ReplicaState::InSync
    });
    let (log, stats) = writer.stop();
    eprintln!(
        "quorum: longest gap {:.2?} (the suspension); {} writes acknowledged, {} errors",
        stats.longest_gap, stats.acked_writes, stats.errors
    );
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert_eq!(stats.unknown_writes, 0, "{stats:?}");
    let s3 = Setup {
        victim: lost[1].clone(),
        ..s
    };
    let in_sync = verify_everywhere(&c, &s3, &log, true);
    assert_eq!(
        in_sync.len(),
        3,
        "all three in sync at the end: {in_sync:?}"
    );
}
