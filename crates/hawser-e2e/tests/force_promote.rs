//! Issue 17, item 4: a stuck attachment is recoverable. Crash recovery refuses to attach a
//! volume when no reachable replica is sure to hold every acknowledged write while an in-sync
//! replica cannot be reached (here: the reachable replica's journal is gone, so it may lack
//! anything, and the other node is dead). `hawser volume force-promote` refuses without
//! `--accept-data-loss`, changing nothing; with it, the unreachable replica is outdated as
//! blank and the volume attaches from the remaining one. When the dead node returns, its
//! replica is copied in full and is in sync again.

use std::time::Duration;

use hawser_api::controller::{NodeState, ReplicaState};
use hawser_e2e::{have, qemu_io, wait_until, Cluster};

#[test]
fn a_refused_attach_is_forced_up_from_the_remaining_replica_only_when_the_loss_is_accepted() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing (make test installs it)");
        return;
    }
    let mut c = Cluster::start("force", 2);
    let uri = c.attached_volume("vol", "64MiB", 2, "n1");
    qemu_io(&uri, &["write -P 0x5a 0 4M", "flush"]);
    c.cli_ok(&["volume", "detach", "vol"]);
    let keep = c.replica_on("vol", "n1").id;
    let gone = c.replica_on("vol", "n2").id;
    let journal = c.replica_path(&keep).with_extension("journal");
    assert!(journal.exists(), "{}", journal.display());

    // n2 dies; n1's replica loses its journal (unreadable: it may lack anything).
    c.kill_agent("n2");
    std::fs::write(&journal, vec![0u8; 8192]).expect("wipe the journal");
    let out = c.cli(&["volume", "attach", "vol", "--node", "n1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "attached without the replica it may need"
    );
    assert!(
        err.contains(&gone) && err.contains("may hold them"),
        "crash recovery's refusal names the replica it waits for: {err}"
    );
    let v = c.volume("vol");
    assert!(v.attached_node.is_none(), "{v:?}");

    // Not without accepting the loss: refused, nothing changed.
    let before = c.volume("vol");
    let out = c.cli(&["volume", "force-promote", "vol"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--accept-data-loss"), "{err}");
    let after = c.volume("vol");
    assert_eq!(
        (after.epoch, &after.replicas),
        (before.epoch, &before.replicas)
    );

    // Accepted: the replicas on offline nodes are outdated (once n2 counts as offline).
    wait_until("n2 offline", Duration::from_secs(40), || {
        c.nodes()
            .iter()
            .any(|n| n.name == "n2" && n.state == NodeState::Offline)
    });
    c.cli_ok(&["volume", "force-promote", "vol", "--accept-data-loss"]);
    let v = c.volume("vol");
    let r = |id: &str| v.replicas.iter().find(|r| r.id == id).expect("replica");
    assert_eq!(
        (r(&keep).state, r(&keep).blank),
        (ReplicaState::InSync, false)
    );
    assert_eq!(
        (r(&gone).state, r(&gone).blank),
        (ReplicaState::Outdated, true)
    );
    assert!(v.epoch > before.epoch, "the epoch fences anything older");

    // It attaches from the kept replica, with the data.
    c.cli_ok(&["volume", "attach", "vol", "--node", "n1"]);
    let uri = c.volume("vol").nbd_unix_uri.expect("unix URI");
    qemu_io(&uri, &["read -P 0x5a 0 4M", "write -P 0x6b 4M 1M", "flush"]);

    // n2 returns: its replica is copied in full and in sync again.
    c.restart_agent("n2");
    wait_until("both replicas in sync", Duration::from_secs(60), || {
        c.volume("vol")
            .replicas
            .iter()
            .all(|r| r.state == ReplicaState::InSync && !r.blank)
    });
    qemu_io(&uri, &["read -P 0x5a 0 4M", "read -P 0x6b 4M 1M"]);
    c.cli_ok(&["volume", "detach", "vol"]);
}
