//! "Control plane: self-healing" on hosts made of network namespaces, with verifying writers
//! running throughout:
//! d. a replica's host is killed and stays down: after the configured delay a new replica is
//!    placed on another host and synced while the writer and fio verify run; the volume has its replicas
//!    in sync again; when the old host returns its stale replica file is deleted.
//! e. evacuating a host that holds a replica of each of 5 attached volumes under load (and of
//!    a detached one): every replica moves off it, the in-sync count never drops below the replica count (sampled
//!    throughout), the writers see no error, and everything verifies.
//!
//! Needs root, `ip netns` and iptables; otherwise each test prints SKIP and passes, unless
//! `HAWSER_REQUIRE_NETNS` is set. `cargo test --release -p hawser-e2e --test self_healing --
//! --test-threads=1 --nocapture` shows the timings.

use std::time::{Duration, Instant};

use hawser_api::controller::{ClusterStatus, ReplicaInfo, ReplicaState, Volume};
use hawser_e2e::{
    assert_same_contents, verify_file, verify_nbd, wait_until, NbdTarget, NetCluster, WriteLog,
    Writer, WriterOptions,
};

const ACKS: u64 = 3000;
const ACK_TIMEOUT: Duration = Duration::from_secs(60);
/// Offline detection (6 s) + the replacement delay (20 s) + a heal round, with room to spare.
const REPLACE_TIMEOUT: Duration = Duration::from_secs(90);
/// A blank replica copies the whole volume (at the default resync rate) then is marked.
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// The engine swap after a membership change pauses I/O (drain, stop, start); it must not
/// take anywhere near the drain timeout (10 s).
const MAX_GAP: Duration = Duration::from_secs(8);

const CONTROLLER_ARGS: &[&str] = &[
    "--node-timeout-secs",
    "6",
    "--replace-after-secs",
    "20",
    "--heal-check-secs",
    "1",
];

fn in_sync(v: &Volume) -> usize {
    v.replicas
        .iter()
        .filter(|r| r.state == ReplicaState::InSync)
        .count()
}

/// `hawser status -o json`.
fn status(c: &NetCluster) -> ClusterStatus {
    let out = c.cli_ok(&["status", "-o", "json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("status JSON: {e}: {out}"))
}

/// `hawser replica list -o json`.
fn replicas(c: &NetCluster) -> Vec<ReplicaInfo> {
    let out = c.cli_ok(&["replica", "list", "-o", "json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("replica list JSON: {e}: {out}"))
}

fn attach(c: &NetCluster, volume: &str, node: &str) -> NbdTarget {
    NbdTarget::from_unix_uri(&attach_uri(c, volume, node))
}

fn attach_uri(c: &NetCluster, volume: &str, node: &str) -> String {
    c.cli_ok(&["volume", "attach", volume, "--node", node]);
    c.volume(volume)
        .nbd_unix_uri
        .expect("attached volume has a unix URI")
}

fn writer(target: &NbdTarget, seed: u64) -> Writer {
    let w = Writer::start(
        target.clone(),
        WriterOptions {
            seed,
            ..WriterOptions::default()
        },
    );
    w.wait_acks(ACKS, ACK_TIMEOUT);
    w
}

/// Stops the writer and checks it saw nothing wrong; returns its log.
fn stop_clean(w: Writer, what: &str) -> WriteLog {
    let (log, stats) = w.stop();
    eprintln!(
        "{what}: {} writes, {} flushes acknowledged; longest gap {:.2?}",
        stats.acked_writes, stats.acked_flushes, stats.longest_gap
    );
    assert_eq!(stats.errors, 0, "{what}: the writer saw errors: {stats:?}");
    assert_eq!(stats.unknown_writes, 0, "{what}: {stats:?}");
    assert_eq!(stats.disconnects, 0, "{what}: NBD dropped: {stats:?}");
    assert!(
        stats.longest_gap < MAX_GAP,
        "{what}: I/O paused {:.2?}: {stats:?}",
        stats.longest_gap
    );
    log
}

/// Every acknowledged write reads back through NBD; detached, from every replica file, and
/// the replicas (all in sync) are identical.
fn verify(c: &NetCluster, volume: &str, target: &NbdTarget, log: &WriteLog) {
    verify_nbd(target, log)
        .expect("read the volume back")
        .assert_ok();
    c.cli_ok(&["volume", "detach", volume]);
    let v = c.volume(volume);
    assert_eq!(in_sync(&v), v.replicas.len(), "all in sync: {v:?}");
    let files: Vec<_> = v.replicas.iter().map(|r| c.replica_file(r)).collect();
    for f in &files {
        verify_file(f, log)
            .expect("read a replica file")
            .assert_ok();
    }
    for pair in files.windows(2) {
        assert_same_contents(&pair[0], &pair[1], v.size_bytes);
    }
}

#[test]
fn a_replica_host_that_stays_down_is_replaced_and_its_stale_replica_removed_on_return() {
    if NetCluster::skip() {
        return;
    }
    let mut c = NetCluster::start_with("heal", 4, CONTROLLER_ARGS);
    c.cli_ok(&[
        "volume",
        "create",
        "hv",
        "--size",
        "128MiB",
        "--replicas",
        "2",
    ]);
    let v = c.volume("hv");
    let (engine_host, victim) = (v.replicas[0].node.clone(), v.replicas[1].clone());
    let uri = attach_uri(&c, "hv", &engine_host);
    let target = NbdTarget::from_unix_uri(&uri);
    // fio verify (past the writer's 16 MiB) and the write-log writer run throughout.
    let fio = hawser_e2e::fio::verify("heal-verify", &uri, "64M", "32M", 45);
    let w = writer(&target, 0x4ea1);
    c.kill9(&victim.node);
    let t0 = Instant::now();
    // `hawser status` tells: the node is down, the volume degraded (1 of 2 in sync).
    wait_until("status to show the node down", REPLACE_TIMEOUT, || {
        status(&c).nodes_offline == vec![victim.node.clone()]
    });
    let s = status(&c);
    assert!(
        s.degraded.len() == 1 && s.degraded[0].name == "hv" && s.degraded[0].in_sync == 1,
        "{s:?}"
    );
    wait_until("a replacement replica", REPLACE_TIMEOUT, || {
        !c.volume("hv").replicas.iter().any(|r| r.id == victim.id)
    });
    let placed_after = t0.elapsed();
    let v = c.volume("hv");
    let new = v
        .replicas
        .iter()
        .find(|r| r.node != engine_host)
        .expect("a second replica")
        .clone();
    assert!(
        new.node != victim.node && new.blank,
        "the replacement is a blank replica on another host: {v:?}"
    );
    wait_until("the replacement to be in sync", SYNC_TIMEOUT, || {
        let v = c.volume("hv");
        in_sync(&v) == 2 && v.replicas.iter().all(|r| !r.blank)
    });
    eprintln!(
        "replacement placed on {} {placed_after:.2?} after the kill, in sync after {:.2?}",
        new.node,
        t0.elapsed()
    );
    // `hawser events` tells the story: the host silent, the replica outdated, its
    // replacement added (and named), then resynced.
    let events: Vec<hawser_api::controller::ClusterEvent> =
        serde_json::from_str(&c.cli_ok(&["events", "-o", "json", "--limit", "256"]))
            .expect("events JSON");
    let find = |reason: &str| {
        events
            .iter()
            .position(|e| e.reason == reason)
            .unwrap_or_else(|| panic!("no {reason} event in {events:#?}"))
    };
    let replaced = &events[find("ReplicaReplaced")];
    assert!(
        replaced.volume.as_deref() == Some("hv") && replaced.message.contains(&new.id),
        "{replaced:?}"
    );
    assert!(replaced.message.contains(&victim.id), "{replaced:?}");
    assert!(events[find("NodeSilent")].node.as_deref() == Some(victim.node.as_str()));
    assert!(find("Resynced") < find("ReplicaReplaced"), "newest first");
    assert!(find("ReplicaReplaced") < find("Degraded"), "newest first");
    w.wait_acks(ACKS, ACK_TIMEOUT);
    // The old host returns: its stale replica is deleted, nothing else changes.
    assert!(c.find_replica_file(&victim).is_some(), "stale file present");
    let retired: Vec<String> = replicas(&c)
        .into_iter()
        .filter(|r| r.retired)
        .map(|r| r.replica.id)
        .collect();
    assert_eq!(
        retired,
        vec![victim.id.clone()],
        "`replica list` shows it retired"
    );
    c.restart_agent(&victim.node);
    wait_until("the stale replica to be deleted", REPLACE_TIMEOUT, || {
        c.find_replica_file(&victim).is_none()
    });
    let log = stop_clean(w, "replacement");
    hawser_e2e::fio::passed(fio);
    wait_until("status to be healthy again", REPLACE_TIMEOUT, || {
        let s = status(&c);
        s.nodes_offline.is_empty() && s.degraded.is_empty() && s.resyncs.is_empty()
    });
    assert!(
        replicas(&c).iter().all(|r| !r.retired),
        "no retired replica left once deleted"
    );
    let v = c.volume("hv");
    assert_eq!(v.replicas.len(), 2, "{v:?}");
    assert!(v.replicas.iter().all(|r| r.node != victim.node), "{v:?}");
    verify(&c, "hv", &target, &log);
}

#[test]
fn evacuating_a_host_moves_every_replica_without_dropping_redundancy() {
    if NetCluster::skip() {
        return;
    }
    let c = NetCluster::start_with("evac", 4, CONTROLLER_ARGS);
    let leaving = "n2";
    let names: Vec<String> = (0..5).map(|i| format!("ev{i}")).collect();
    let mut runs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        c.cli_ok(&[
            "volume",
            "create",
            name,
            "--size",
            "64MiB",
            "--replicas",
            "2",
            "--prefer-node",
            leaving,
        ]);
        let v = c.volume(name);
        assert!(v.replicas.iter().any(|r| r.node == leaving), "{v:?}");
        let other = v
            .replicas
            .iter()
            .find(|r| r.node != leaving)
            .expect("other");
        let target = attach(&c, name, &other.node.clone());
        let w = writer(&target, 0xe0 + i as u64);
        runs.push((name.clone(), target, w));
    }
    // A sixth volume, written and detached: its replica moves too (synced by an engine the
    // controller runs without exporting it).
    c.cli_ok(&[
        "volume",
        "create",
        "evd",
        "--size",
        "64MiB",
        "--replicas",
        "2",
        "--prefer-node",
        leaving,
    ]);
    let other = c
        .volume("evd")
        .replicas
        .into_iter()
        .find(|r| r.node != leaving)
        .expect("other");
    let detached_target = attach(&c, "evd", &other.node);
    let detached_log = stop_clean(writer(&detached_target, 0xed), "evd before detach");
    c.cli_ok(&["volume", "detach", "evd"]);
    let mut names = names;
    names.push("evd".into());
    let before: Vec<_> = names
        .iter()
        .flat_map(|n| c.volume(n).replicas)
        .filter(|r| r.node == leaving)
        .collect();
    c.cli_ok(&["node", "evacuate", leaving]);
    let t0 = Instant::now();
    let mut samples = 0u64;
    wait_until(
        "every replica to move off the node",
        SYNC_TIMEOUT * 2,
        || {
            let vols: Vec<Volume> = names.iter().map(|n| c.volume(n)).collect();
            for v in &vols {
                assert!(
                    in_sync(v) >= 2,
                    "redundancy dropped below 2 during the move: {v:?}"
                );
            }
            samples += 1;
            vols.iter().all(|v| {
                v.replicas.len() == 2
                    && in_sync(v) == 2
                    && v.replicas.iter().all(|r| r.node != leaving)
            })
        },
    );
    eprintln!(
        "evacuation of 6 volumes (one detached) done in {:.2?} ({samples} samples, in-sync >= 2 in each)",
        t0.elapsed()
    );
    let node = c
        .nodes()
        .into_iter()
        .find(|n| n.name == leaving)
        .expect("node");
    assert!(node.evacuating, "{node:?}");
    assert_eq!(status(&c).nodes_evacuating, vec![leaving.to_string()]);
    wait_until(
        "the moved replicas' files to be deleted",
        REPLACE_TIMEOUT,
        || before.iter().all(|r| c.find_replica_file(r).is_none()),
    );
    for (name, target, w) in runs {
        let log = stop_clean(w, &name);
        verify(&c, &name, &target, &log);
    }
    wait_until(
        "the detached volume's sync engine to stop",
        SYNC_TIMEOUT,
        || c.volume("evd").sync_node.is_none(),
    );
    let v = c.volume("evd");
    assert!(
        v.attached_node.is_none() && v.nbd_uri.is_none(),
        "still detached: {v:?}"
    );
    let files: Vec<_> = v.replicas.iter().map(|r| c.replica_file(r)).collect();
    for f in &files {
        verify_file(f, &detached_log)
            .expect("read a replica file")
            .assert_ok();
    }
    assert_same_contents(&files[0], &files[1], v.size_bytes);
    // Restored, it takes replicas again.
    c.cli_ok(&["node", "restore", leaving]);
    let node = c
        .nodes()
        .into_iter()
        .find(|n| n.name == leaving)
        .expect("node");
    assert!(!node.evacuating, "{node:?}");
}
