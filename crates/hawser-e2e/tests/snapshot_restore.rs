//! `hawser volume restore` on a real 2-node cluster (issue 20, "restore a volume to a
//! snapshot (detached)"). The snapshot is taken while one replica's node is down, so only the
//! other replica holds it; that node comes back and resyncs; more is written. The restore is
//! refused while the volume is attached; once detached, the holder is restored and becomes the
//! in-sync set, the replica without the snapshot turns blank and is copied in full by the
//! detached volume's sync engine. At the end both replicas' data files are exactly the volume
//! at the snapshot, and an NBD client reads it.

use std::time::Duration;

use hawser_api::controller::{ReplicaState, Snapshot};
use hawser_e2e::{assert_file_is, qemu_io, wait_until, Cluster};

const MIB: usize = 1 << 20;
const SIZE: usize = 64 * MIB;
const STATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Writes `byte` over `len` bytes at `at` through qemu-io, flushed, and into the model.
fn write(uri: &str, model: &mut [u8], at: usize, len: usize, byte: u8) {
    let cmd = format!("write -P 0x{byte:02x} {at} {len}");
    let out = qemu_io(uri, &[cmd.as_str(), "flush"]);
    assert!(out.contains("wrote "), "{out}");
    model[at..at + len].fill(byte);
}

fn wait_replica(c: &Cluster, node: &str, state: ReplicaState, blank: bool) {
    wait_until(
        &format!("{node}'s replica to be {state:?} (blank {blank})"),
        STATE_TIMEOUT,
        || {
            let r = c.replica_on("rv", node);
            r.state == state && r.blank == blank
        },
    );
}

#[test]
fn restore_makes_the_holders_in_sync_and_copies_the_others_in_full() {
    let mut c = Cluster::start("restore", 2);
    let uri = c.attached_volume("rv", "64MiB", 2, "n1");
    let (r1, r2) = (c.replica_on("rv", "n1").id, c.replica_on("rv", "n2").id);
    let mut model = vec![0u8; SIZE];
    write(&uri, &mut model, 0, 8 * MIB, 0x11);

    // n2 down: the snapshot is taken on n1's replica only.
    c.kill_agent("n2");
    write(&uri, &mut model, 8 * MIB, 4 * MIB, 0x22);
    wait_replica(&c, "n2", ReplicaState::Outdated, false);
    c.cli_ok(&["snapshot", "create", "s", "--volume", "rv"]);
    let s: Snapshot =
        serde_json::from_str(&c.cli_ok(&["snapshot", "show", "s", "-o", "json"])).expect("JSON");
    assert_eq!(
        s.replicas,
        vec![r1.clone()],
        "only the in-sync replica holds it"
    );
    let at_snapshot = model.clone();

    // n2 returns and resyncs; then more is written on both.
    c.restart_agent("n2");
    wait_replica(&c, "n2", ReplicaState::InSync, false);
    write(&uri, &mut model, 0, 4 * MIB, 0x33);
    write(&uri, &mut model, 40 * MIB, 2 * MIB, 0x44);

    c.cli_fails(&["volume", "restore", "rv", "--snapshot", "s"], "detach");
    c.cli_ok(&["volume", "detach", "rv"]);
    c.cli_fails(
        &["volume", "restore", "rv", "--snapshot", "nope"],
        "not found",
    );
    let out = c.cli_ok(&["volume", "restore", "rv", "--snapshot", "s"]);
    assert!(out.contains("restored to snapshot s"), "{out}");
    let v = c.volume("rv");
    assert!(v.restoring.is_none(), "{v:?}");
    let r = |id: &str| v.replicas.iter().find(|r| r.id == id).expect("replica");
    assert_eq!((r(&r1).state, r(&r1).blank), (ReplicaState::InSync, false));
    assert!(
        r(&r2).blank,
        "the replica without the snapshot is blank: {v:?}"
    );

    // The detached volume's sync engine copies it in full from the restored one.
    wait_replica(&c, "n2", ReplicaState::InSync, false);
    wait_until("the sync engine to stop", STATE_TIMEOUT, || {
        c.volume("rv").sync_node.is_none()
    });
    for (node, id) in [("n1", &r1), ("n2", &r2)] {
        assert_file_is(
            &c.replica_path(id),
            &at_snapshot,
            &format!("the restored volume's replica on {node}"),
        );
    }
    let uri = {
        c.cli_ok(&["volume", "attach", "rv", "--node", "n2"]);
        c.volume("rv").nbd_unix_uri.expect("attached on n2")
    };
    let out = qemu_io(
        &uri,
        &[
            "read -P 0x11 0 8M",
            "read -P 0x22 8M 4M",
            "read -P 0x00 40M 2M",
        ],
    );
    assert!(!out.contains("verification failed"), "{out}");
    c.cli_ok(&["volume", "detach", "rv"]);
    c.cli_ok(&["volume", "delete", "rv", "--with-snapshots"]);
}
