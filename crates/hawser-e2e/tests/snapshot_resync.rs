//! Issue 20, acceptance c: snapshot, then kill the node of one replica, write more, bring it
//! back: after resync the snapshot and the volume are identical on both replicas.
//!
//! A 2-replica volume is attached on n1 (its replicas on n1 and n2) and written with known
//! patterns; a snapshot is taken; n2's agent is killed (-9) and more is written, mostly over
//! regions the snapshot holds (patterns, zeroes, unaligned ranges), so the engine goes on with
//! n1 alone and n2's replica is outdated. When n2 returns, resync copies what it missed into its
//! replica's data file, which must leave the snapshot's copy beside it untouched. Once it is in
//! sync: both snapshot copies equal the volume as it was before the snapshot, both replica data
//! files equal the volume as it is now (compared with a model of every write, byte for byte),
//! and the snapshot is still `ready` on both replicas.
//!
//! Run twice: on the default pool (ext4 here: the snapshot is a copy) and on an XFS pool with
//! reflinks, where the snapshot shares its extents with the data file that resync writes into.

use std::path::PathBuf;
use std::time::Duration;

use hawser_api::controller::{ReplicaState, SnapshotState};
use hawser_e2e::cluster::ClusterOptions;
use hawser_e2e::mounts::SmallFs;
use hawser_e2e::{assert_file_is, qemu_io, wait_until, Cluster, TempDir};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const SIZE: usize = 64 * MIB;
const STATE_TIMEOUT: Duration = Duration::from_secs(60);

/// One qemu-io write of `len` bytes of `byte` at `at` (`byte` 0: `write -z`, zeroes).
#[derive(Clone, Copy)]
struct Fill {
    at: usize,
    len: usize,
    byte: u8,
}

const fn fill(at: usize, len: usize, byte: u8) -> Fill {
    Fill { at, len, byte }
}

/// Written with both replicas up, before the snapshot.
const BEFORE: [Fill; 4] = [
    fill(0, 8 * MIB, 0x11),
    fill(16 * MIB, 4 * MIB, 0x22),
    fill(40 * MIB + 12 * KIB, MIB, 0x33),
    fill(63 * MIB, MIB, 0x3a),
];

/// Written while n2 is down: mostly into what the snapshot holds.
const DEGRADED: [Fill; 6] = [
    fill(MIB, 2 * MIB, 0x44),
    fill(18 * MIB - 4 * KIB, 8 * KIB, 0x55),
    fill(40 * MIB + 64 * KIB, 256 * KIB, 0),
    fill(30 * MIB, 2 * MIB, 0x66),
    fill(63 * MIB + 512 * KIB, 512 * KIB, 0x77),
    fill(7 * MIB + 4 * KIB, 4 * KIB, 0x88),
];

/// Writes `fills` through `uri` (then flushes) and into `model`.
fn write(uri: &str, model: &mut [u8], fills: &[Fill]) {
    let mut cmds: Vec<String> = fills
        .iter()
        .map(|f| match f.byte {
            0 => format!("write -z {} {}", f.at, f.len),
            b => format!("write -P 0x{b:02x} {} {}", f.at, f.len),
        })
        .collect();
    cmds.push("flush".into());
    let out = qemu_io(uri, &cmds.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.matches("wrote ").count(), fills.len(), "{out}");
    for f in fills {
        model[f.at..f.at + f.len].fill(f.byte);
    }
}

fn wait_state(c: &Cluster, node: &str, want: ReplicaState) {
    wait_until(
        &format!("{node}'s replica to be {want:?}"),
        STATE_TIMEOUT,
        || {
            let r = c.replica_on("sr", node);
            r.state == want && !r.blank
        },
    );
}

/// The scenario, on cluster `c` whose pools make snapshots by `how` ("copy" or "reflink").
fn snapshot_survives_the_resync_of_a_returning_replica(mut c: Cluster, how: &str) {
    let uri = c.attached_volume("sr", "64MiB", 2, "n1");
    let (r1, r2) = (c.replica_on("sr", "n1").id, c.replica_on("sr", "n2").id);
    let mut model = vec![0u8; SIZE];
    write(&uri, &mut model, &BEFORE);
    let at_snapshot = model.clone();
    c.cli_ok(&["snapshot", "create", "snap", "--volume", "sr"]);
    let s = c.snapshot("snap");
    assert_eq!(s.state, SnapshotState::Ready, "{s:?}");
    assert_eq!(s.how.as_deref(), Some(how), "{s:?}");
    // Paths while both agents answer: the files stay where they are.
    let data: Vec<PathBuf> = [&r1, &r2].iter().map(|r| c.replica_path(r)).collect();
    let copies: Vec<PathBuf> = data
        .iter()
        .map(|d| d.with_extension("snaps").join(format!("{}.snap", s.id)))
        .collect();

    c.kill_agent("n2");
    write(&uri, &mut model, &DEGRADED);
    wait_state(&c, "n2", ReplicaState::Outdated);
    assert_file_is(&copies[1], &at_snapshot, "n2's copy while n2 is down");

    c.restart_agent("n2");
    wait_state(&c, "n2", ReplicaState::InSync);
    let copied = c
        .replica_on("sr", "n2")
        .engine
        .map(|e| e.copied_bytes)
        .unwrap_or_default();
    println!("{how}: the returning replica copied {copied} bytes to come back in sync");
    assert!(
        copied > 0,
        "n2's replica came back in sync without a resync"
    );
    // Served from n1, with n2 back in the set: what was written meanwhile reads back.
    let reads: Vec<String> = DEGRADED
        .iter()
        .map(|f| format!("read -P 0x{:02x} {} {}", f.byte, f.at, f.len))
        .collect();
    let now = qemu_io(&uri, &reads.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!now.contains("verification failed"), "{now}");

    c.cli_ok(&["volume", "detach", "sr"]);
    let v = c.volume("sr");
    assert!(
        v.replicas.iter().all(|r| r.state == ReplicaState::InSync),
        "{v:?}"
    );
    for (node, (d, copy)) in ["n1", "n2"].iter().zip(data.iter().zip(&copies)) {
        assert_file_is(
            copy,
            &at_snapshot,
            &format!("the snapshot's copy on {node}"),
        );
        assert_file_is(d, &model, &format!("the volume's replica on {node}"));
    }
    let after = c.snapshot("snap");
    assert_eq!(after.state, SnapshotState::Ready, "{after:?}");
    let mut holders = after.replicas.clone();
    holders.sort();
    let mut want = vec![r1, r2];
    want.sort();
    assert_eq!(holders, want, "the snapshot's holders: {after:?}");
    assert_eq!(after, s, "the snapshot's record changed");
}

#[test]
fn a_snapshot_copied_and_the_volume_are_whole_on_a_replica_resynced_after_kill9() {
    let c = Cluster::start("snap-resync", 2);
    snapshot_survives_the_resync_of_a_returning_replica(c, "copy");
}

#[test]
fn a_reflinked_snapshot_and_the_volume_are_whole_on_a_replica_resynced_after_kill9() {
    let work = TempDir::new("snap-resync-xfs");
    let fs = SmallFs::xfs(work.path(), 1024);
    let pools = ["a", "b"]
        .iter()
        .map(|n| vec![format!("default={}", fs.mount.dir.join(n).display())])
        .collect();
    let opts = ClusterOptions {
        pools,
        ..ClusterOptions::default()
    };
    let c = Cluster::start_with("snap-resync-xfs", 2, opts);
    snapshot_survives_the_resync_of_a_returning_replica(c, "reflink");
}
