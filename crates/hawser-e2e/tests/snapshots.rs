//! Snapshots through the CLI on a real 2-node cluster: of an attached volume (the engine
//! holds writes while every in-sync replica copies) and of a detached one; both replicas'
//! copies identical and holding exactly the writes made before; deleting a volume with
//! snapshots refused unless asked; names unique in the cluster and validated; deleting a
//! snapshot removes its copies.

use std::path::PathBuf;

use hawser_api::controller::{Snapshot, SnapshotState};
use hawser_e2e::cluster::Cluster;
use hawser_e2e::run::qemu_io;

const MIB: usize = 1 << 20;

/// The copy of snapshot `s` on replica `replica`.
fn copy_path(c: &Cluster, replica: &str, s: &Snapshot) -> PathBuf {
    c.replica_path(replica)
        .with_extension("snaps")
        .join(format!("{}.snap", s.id))
}

#[test]
fn snapshots_hold_the_writes_before_them_on_every_replica_and_guard_their_volume() {
    let c = Cluster::start("snapshots", 2);
    let uri = c.attached_volume("db", "64MiB", 2, "n1");
    qemu_io(&uri, &["write -P 0x11 0 8M", "write -P 0x22 32M 1M"]);
    let out = c.cli_ok(&["snapshot", "create", "before", "--volume", "db"]);
    assert!(out.contains("snapshot before of volume db taken"), "{out}");
    // Written after: in the volume, not in the snapshot.
    qemu_io(&uri, &["write -P 0x33 0 4M", "flush"]);

    let s = c.snapshot("before");
    assert_eq!(s.state, SnapshotState::Ready);
    assert_eq!((s.volume.as_str(), s.size_bytes), ("db", 64 * MIB as u64));
    assert_eq!(s.replicas.len(), 2, "every in-sync replica holds it: {s:?}");
    assert!(
        s.pause_micros.is_some(),
        "an attached volume is paused: {s:?}"
    );
    eprintln!(
        "snapshot of an attached volume: writes held {:?} µs, {:?}",
        s.pause_micros, s.how
    );
    let copies: Vec<Vec<u8>> = s
        .replicas
        .iter()
        .map(|r| std::fs::read(copy_path(&c, r, &s)).expect("read a copy"))
        .collect();
    assert!(copies[0] == copies[1], "the replicas' copies differ");
    let copy = &copies[0];
    assert_eq!(copy.len(), 64 * MIB);
    assert!(
        copy[..8 * MIB].iter().all(|&b| b == 0x11),
        "the first write"
    );
    assert!(copy[32 * MIB..33 * MIB].iter().all(|&b| b == 0x22));
    assert!(copy[8 * MIB..32 * MIB].iter().all(|&b| b == 0));
    let now = qemu_io(&uri, &["read -P 0x33 0 4M", "read -P 0x11 4M 4M"]);
    assert!(!now.contains("Pattern verification failed"), "{now}");

    // Names: unique in the cluster, and checked.
    c.cli_ok(&[
        "volume",
        "create",
        "web",
        "--size",
        "16MiB",
        "--replicas",
        "1",
    ]);
    c.cli_fails(
        &["snapshot", "create", "before", "--volume", "web"],
        "already exists",
    );
    c.cli_fails(
        &["snapshot", "create", "Bad_Name", "--volume", "web"],
        "invalid snapshot name",
    );
    c.cli_fails(
        &["snapshot", "create", "x", "--volume", "nope"],
        "not found",
    );
    // The same request again is the same snapshot.
    c.cli_ok(&["snapshot", "create", "before", "--volume", "db"]);
    assert_eq!(c.snapshot("before"), s);

    // A detached volume: nothing to pause.
    c.cli_ok(&["volume", "detach", "db"]);
    c.cli_fails(&["volume", "delete", "db"], "snapshot");
    c.cli_ok(&["snapshot", "create", "after", "--volume", "db"]);
    let a = c.snapshot("after");
    assert_eq!(
        (a.state, a.pause_micros, a.replicas.len()),
        (SnapshotState::Ready, None, 2)
    );
    let after = std::fs::read(copy_path(&c, &a.replicas[0], &a)).expect("read");
    assert!(after[..4 * MIB].iter().all(|&b| b == 0x33));
    let list = c.cli_ok(&["snapshot", "list", "--volume", "db"]);
    assert!(list.contains("before") && list.contains("after"), "{list}");

    // Deleting a snapshot removes its copies; the volume goes with the rest when asked.
    c.cli_ok(&["snapshot", "delete", "before"]);
    for r in &s.replicas {
        assert!(!copy_path(&c, r, &s).exists(), "copy on {r} left");
    }
    c.cli_fails(&["snapshot", "show", "before"], "not found");
    c.cli_ok(&["volume", "delete", "db", "--with-snapshots"]);
    let left = c.cli_ok(&["snapshot", "list", "-o", "json"]);
    let left: Vec<Snapshot> = serde_json::from_str(&left).expect("JSON");
    assert!(left.is_empty(), "{left:?}");
    let events = c.cli_ok(&["events", "--volume", "db"]);
    assert!(
        events.contains("SnapshotTaken") && events.contains("SnapshotDeleted"),
        "{events}"
    );
}
