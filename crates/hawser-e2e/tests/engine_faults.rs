//! "Failures without losing an acknowledged write", engine side: faults of the node that runs
//! the volume's engine, on hosts made of network namespaces, with a verifying writer.
//!
//! c. kill -9 of the engine's agent mid-write, attach on another node: crash recovery compares
//!    only the dead engine's activity log; every acknowledged write reads back; when the dead
//!    node returns its replica copies only what it may lack; all replicas identical.
//! d. partition of the engine's node, attach elsewhere, heal: the old engine's writes are
//!    refused (its client gets errors) and change nothing.
//! f. every agent SIGKILLed during writes (a replica host first, then the rest), all
//!    restarted: the volume comes back by itself (the controller restarts its engine) with no
//!    full resync and no lost acknowledged write.
//!
//! Needs root, `ip netns` and iptables (else SKIP, or failure under `HAWSER_REQUIRE_NETNS`).
//! `cargo test --release -p hawser-e2e --test engine_faults -- --test-threads=1 --nocapture`.

use std::time::Duration;

use hawser_api::controller::{ReplicaState, Volume};
use hawser_e2e::{
    assert_same_contents, verify_file, verify_nbd, wait_until, NbdConn, NbdTarget, NetCluster,
    WriteLog, Writer, WriterOptions,
};

const SIZE: &str = "256MiB";
const SIZE_BYTES: u64 = 256 << 20;
const ACKS: u64 = 4000;
const ACK_TIMEOUT: Duration = Duration::from_secs(60);
/// The controller calls a node offline after 15 s without a heartbeat; a detach of a volume
/// whose engine's node does not answer goes ahead only then.
const OFFLINE_TIMEOUT: Duration = Duration::from_secs(60);
const STATE_TIMEOUT: Duration = Duration::from_secs(90);
/// Bytes the writer touches (its blocks), and the engine's dirty-tracking granularity.
const AREA: u64 = 4096 * 4096;
const AREA_USIZE: usize = 4096 * 4096;
const CHUNK: u64 = 64 * 1024;

fn target(c: &NetCluster, volume: &str) -> NbdTarget {
    let uri = c
        .volume(volume)
        .nbd_unix_uri
        .expect("attached volume has a unix URI");
    NbdTarget::from_unix_uri(&uri)
}

fn create(c: &NetCluster, volume: &str, replicas: u32) -> Volume {
    let n = replicas.to_string();
    c.cli_ok(&["volume", "create", volume, "--size", SIZE, "--replicas", &n]);
    c.volume(volume)
}

/// Write until `ACKS` more writes are acknowledged.
fn writer(c: &NetCluster, volume: &str, seed: u64) -> Writer {
    let opts = WriterOptions {
        seed,
        ..WriterOptions::default()
    };
    let w = Writer::start(target(c, volume), opts);
    w.wait_acks(ACKS, ACK_TIMEOUT);
    w
}

/// Detach a volume whose engine's node is gone (accepted once the node is offline).
fn detach_when_offline(c: &NetCluster, volume: &str) {
    wait_until("the detach to be accepted", OFFLINE_TIMEOUT, || {
        c.cli(&["volume", "detach", volume]).status.success()
    });
}

fn wait_state(c: &NetCluster, volume: &str, id: &str, want: ReplicaState) {
    wait_until(
        &format!("replica {id} to be {want:?}"),
        STATE_TIMEOUT,
        || c.replica_state(volume, id) == want,
    );
}

/// What recovery did at the last attach: (replicas compared, bytes compared, bytes copied).
fn recovery(c: &NetCluster, volume: &str) -> (u32, u64, u64) {
    let v = c.volume(volume);
    let r = v
        .engine
        .as_ref()
        .and_then(|e| e.recovery)
        .unwrap_or_else(|| panic!("no recovery report: {v:?}"));
    eprintln!(
        "recovery at attach: {} in-sync replicas compared over {} bytes, {} bytes copied, {} ms",
        r.replicas, r.compared_bytes, r.copied_bytes, r.millis
    );
    (r.replicas, r.compared_bytes, r.copied_bytes)
}

/// Bytes resync copied to replica `id` in the current engine's life.
fn copied_to(c: &NetCluster, volume: &str, id: &str) -> u64 {
    let v = c.volume(volume);
    v.replicas
        .iter()
        .find(|r| r.id == id)
        .and_then(|r| r.engine.as_ref())
        .map(|e| e.copied_bytes)
        .unwrap_or_else(|| panic!("no engine view of {id}: {v:?}"))
}

/// Detached: every replica is in sync, holds every acknowledged write, and all are identical.
fn verify_replicas(c: &NetCluster, volume: &str, logs: &[&WriteLog]) {
    c.cli_ok(&["volume", "detach", volume]);
    let v = c.volume(volume);
    assert!(
        v.replicas.iter().all(|r| r.state == ReplicaState::InSync),
        "not every replica is in sync: {v:?}"
    );
    let files: Vec<_> = v.replicas.iter().map(|r| c.replica_file(r)).collect();
    for f in &files {
        for log in logs {
            verify_file(f, log)
                .expect("read a replica file")
                .assert_ok();
        }
    }
    for pair in files.windows(2) {
        assert_same_contents(&pair[0], &pair[1], v.size_bytes);
    }
}

/// c. The engine's node dies mid-write; the volume is attached on another node.
#[test]
fn kill9_of_the_engine_agent_then_attach_elsewhere_recovers_every_acknowledged_write() {
    if NetCluster::skip() {
        return;
    }
    let mut c = NetCluster::start("engine-kill9", 3);
    let v = create(&c, "ek", 3);
    let (dead, next) = (v.replicas[0].clone(), v.replicas[1].clone());
    c.cli_ok(&["volume", "attach", "ek", "--node", &dead.node]);
    let w = writer(&c, "ek", 0xe9c);
    c.kill9(&dead.node);
    let (log, stats) = w.stop();
    eprintln!(
        "engine host {} killed: {} writes acknowledged, {} in flight (unknown)",
        dead.node, stats.acked_writes, stats.unknown_writes
    );
    detach_when_offline(&c, "ek");
    c.cli_ok(&["volume", "attach", "ek", "--node", &next.node]);
    let (replicas, compared, _) = recovery(&c, "ek");
    assert_eq!(replicas, 2, "the two live replicas were compared");
    assert!(
        compared > 0 && compared <= AREA,
        "recovery compared {compared} bytes: more than the writer's area {AREA}"
    );
    verify_nbd(&target(&c, "ek"), &log)
        .expect("read back")
        .assert_ok();
    wait_state(&c, "ek", &dead.id, ReplicaState::Outdated);
    c.restart_agent(&dead.node);
    wait_state(&c, "ek", &dead.id, ReplicaState::InSync);
    let copied = copied_to(&c, "ek", &dead.id);
    eprintln!("the dead engine's replica copied {copied} bytes to come back in sync");
    assert!(
        copied <= AREA + CHUNK,
        "copied {copied} bytes: more than it can lack"
    );
    verify_replicas(&c, "ek", &[&log]);
}

/// The writer's area as one buffer, read through NBD.
fn read_area(t: &NbdTarget) -> Vec<u8> {
    let mut conn = NbdConn::connect(t).expect("connect");
    let mut buf = vec![0u8; AREA_USIZE];
    for (i, piece) in buf.chunks_mut(1 << 20).enumerate() {
        conn.read_at(i as u64 * (1 << 20), piece).expect("read");
    }
    conn.disconnect();
    buf
}

/// d. The engine's node is cut off (alive); the volume is attached elsewhere; on healing the
/// old engine is refused and changes nothing.
#[test]
fn partitioned_engine_is_fenced_by_a_new_attach_and_changes_nothing() {
    if NetCluster::skip() {
        return;
    }
    let mut c = NetCluster::start("engine-part", 3);
    let v = create(&c, "ep", 2);
    let (old, new) = (v.replicas[0].clone(), v.replicas[1].clone());
    c.cli_ok(&["volume", "attach", "ep", "--node", &old.node]);
    let w1 = writer(&c, "ep", 0xd1);
    c.partition(&old.node);
    detach_when_offline(&c, "ep");
    c.cli_ok(&["volume", "attach", "ep", "--node", &new.node]);
    let new_target = target(&c, "ep");
    recovery(&c, "ep");
    // What the new engine serves now: every write the old one acknowledged (the old engine
    // cannot acknowledge more: it cannot reach the other replica nor the controller).
    let acked_before = w1.stats().acked_writes;
    let snapshot = read_area(&new_target);
    wait_state(&c, "ep", &old.id, ReplicaState::Outdated);
    c.heal(&old.node);
    // The old engine's waiting writes meet the new epoch: refused, and it fences itself.
    wait_until(
        "the old engine's client to get errors",
        STATE_TIMEOUT,
        || {
            let s = w1.stats();
            s.errors > 0 || s.ended
        },
    );
    let (log1, s1) = w1.stop();
    eprintln!(
        "old engine: {} writes acknowledged ({} before the new attach), {} errors, first: {:?}",
        s1.acked_writes, acked_before, s1.errors, s1.first_error
    );
    assert_eq!(
        s1.acked_writes, acked_before,
        "the old engine acknowledged writes after the new attach"
    );
    verify_nbd(&new_target, &log1)
        .expect("read back")
        .assert_ok();
    assert!(
        read_area(&new_target) == snapshot,
        "the fenced engine changed the volume"
    );
    // The old node's replica is resynced by the new engine; all replicas agree.
    wait_state(&c, "ep", &old.id, ReplicaState::InSync);
    verify_replicas(&c, "ep", &[&log1]);
    let files: Vec<_> = c
        .volume("ep")
        .replicas
        .iter()
        .map(|r| c.replica_file(r))
        .collect();
    let data = std::fs::read(&files[0]).expect("read replica");
    assert!(
        data[..AREA_USIZE] == snapshot[..],
        "a replica differs from what the new engine served"
    );
}

/// f. Every agent is killed during writes: first a replica host (its replica is outdated and
/// the engine's journal records what it misses), then the engine's host and the rest. All
/// restart; the volume attaches again with recovery over the activity log only, and the
/// outdated replica copies only what it lacks.
#[test]
fn every_agent_killed_then_restarted_needs_no_full_resync() {
    if NetCluster::skip() {
        return;
    }
    let mut c = NetCluster::start("all-kill9", 3);
    let v = create(&c, "ak", 3);
    let (engine, lost) = (v.replicas[0].clone(), v.replicas[2].clone());
    c.cli_ok(&["volume", "attach", "ak", "--node", &engine.node]);
    let w = writer(&c, "ak", 0xa11);
    c.kill9(&lost.node);
    wait_state(&c, "ak", &lost.id, ReplicaState::Outdated);
    w.wait_acks(ACKS, ACK_TIMEOUT);
    let hosts: Vec<String> = c.hosts.iter().map(|h| h.name.clone()).collect();
    for h in hosts.iter().filter(|h| **h != lost.node) {
        c.kill9(h);
    }
    let (log, stats) = w.stop();
    eprintln!(
        "all agents killed: {} writes acknowledged, {} unknown",
        stats.acked_writes, stats.unknown_writes
    );
    for h in &hosts {
        c.restart_agent(h);
    }
    // Nobody attaches again: the controller sees the engine missing on the restarted agent
    // and starts it again (same epoch), which runs crash recovery.
    wait_until("the engine to be back by itself", STATE_TIMEOUT, || {
        c.volume("ak").engine.is_some()
    });
    let (_, compared, _) = recovery(&c, "ak");
    assert!(
        compared <= AREA,
        "recovery compared {compared} bytes: more than the writer's area (a full resync)"
    );
    verify_nbd(&target(&c, "ak"), &log)
        .expect("read back")
        .assert_ok();
    wait_state(&c, "ak", &lost.id, ReplicaState::InSync);
    let copied = copied_to(&c, "ak", &lost.id);
    eprintln!("the replica lost first copied {copied} bytes of a {SIZE_BYTES}-byte volume");
    assert!(
        copied <= AREA + CHUNK,
        "copied {copied} bytes: a full resync would be {SIZE_BYTES}"
    );
    verify_replicas(&c, "ak", &[&log]);
}
