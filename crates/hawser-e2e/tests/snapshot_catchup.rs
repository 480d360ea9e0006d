//! Issue 20: a snapshot "survives the loss of any one replica's node like the volume itself,
//! and follows the volume when a replica is rebuilt". A 2-replica volume is snapshotted, more
//! is written, and one replica's agent is killed for good; self-healing builds a replacement
//! on the third node and syncs it; then the replacement gets the snapshot from the surviving
//! holder (only the blocks that differ from its own data cross). Its copy is the holder's,
//! byte for byte, holds what was written before the snapshot, and the snapshot's record names
//! it, so losing the other holder now would not lose the snapshot.

use std::time::Duration;

use hawser_api::controller::ReplicaState;
use hawser_e2e::cluster::ClusterOptions;
use hawser_e2e::{assert_same_contents, qemu_io, wait_until, Cluster};

const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn a_rebuilt_replica_gets_the_snapshots_of_the_one_it_replaces() {
    let args = [
        "--node-timeout-secs",
        "4",
        "--replace-after-secs",
        "2",
        "--heal-check-secs",
        "1",
    ];
    let opts = ClusterOptions {
        controller_args: args.iter().map(|a| a.to_string()).collect(),
        ..ClusterOptions::default()
    };
    let mut c = Cluster::start_with("catchup", 3, opts);
    let uri = c.attached_volume("cu", "64MiB", 2, "n1");
    qemu_io(
        &uri,
        &["write -P 0x11 0 8M", "write -P 0x22 32M 1M", "flush"],
    );
    c.cli_ok(&["snapshot", "create", "keep", "--volume", "cu"]);
    let s = c.snapshot("keep");
    qemu_io(&uri, &["write -P 0x33 0 4M", "flush"]);
    let r1 = c.replica_on("cu", "n1").id;
    let gone = c.replica_on("cu", "n2").id;
    assert_eq!(s.replicas.len(), 2, "{s:?}");

    c.kill_agent("n2");
    let mut r3 = String::new();
    wait_until("a replacement on n3 in sync", TIMEOUT, || {
        let v = c.volume("cu");
        match v.replicas.iter().find(|r| r.node == "n3") {
            Some(r) if r.state == ReplicaState::InSync && !r.blank => {
                r3 = r.id.clone();
                true
            }
            _ => false,
        }
    });
    wait_until("the snapshot copied to the replacement", TIMEOUT, || {
        c.snapshot("keep").replicas.contains(&r3)
    });
    let after = c.snapshot("keep");
    assert!(after.replicas.contains(&r1), "{after:?}");
    println!(
        "snapshot keep: held by {:?} (the killed node's {gone} retired)",
        after.replicas
    );
    let copy = |r: &str| {
        c.replica_path(r)
            .with_extension("snaps")
            .join(format!("{}.snap", s.id))
    };
    assert_same_contents(&copy(&r1), &copy(&r3), 64 << 20);
    let out = qemu_io(
        &copy(&r3).display().to_string(),
        &[
            "read -P 0x11 0 8M",
            "read -P 0x22 32M 1M",
            "read -P 0 40M 1M",
        ],
    );
    assert!(!out.contains("verification failed"), "{out}");
    let events = c.cli_ok(&["events", "--volume", "cu"]);
    assert!(events.contains("SnapshotCopied"), "{events}");
}
