//! "Secure by default", acceptance d: an agent whose pool holds a replica with corrupt
//! metadata and one whose data file was cut short starts anyway, reports both failed (with
//! why), keeps serving its other replicas, and the controller records the two as failed so
//! that self-healing can replace them. Nothing is removed from disk.

use std::time::Duration;

use hawser_api::controller::ReplicaState;
use hawser_e2e::{have, qemu_io, wait_until, Cluster};

#[test]
fn an_agent_with_broken_replicas_starts_reports_them_and_serves_the_rest() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing (make test installs it)");
        return;
    }
    let mut c = Cluster::start("broken", 2);
    for v in ["meta", "short", "good"] {
        c.cli_ok(&["volume", "create", v, "--size", "64MiB", "--replicas", "2"]);
    }
    let uri = {
        c.cli_ok(&["volume", "attach", "good", "--node", "n1"]);
        c.volume("good").nbd_unix_uri.expect("unix URI")
    };
    qemu_io(&uri, &["write -P 0x5a 0 4M", "flush"]);
    c.cli_ok(&["volume", "detach", "good"]);

    let (meta_id, short_id) = (
        c.replica_on("meta", "n2").id,
        c.replica_on("short", "n2").id,
    );
    let meta_file = c.replica_path(&meta_id).with_extension("meta");
    let short_data = c.replica_path(&short_id);
    let mut raw = std::fs::read(&meta_file).expect("read metadata");
    raw[30] ^= 0xff;
    std::fs::write(&meta_file, &raw).expect("corrupt metadata");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&short_data)
        .and_then(|f| f.set_len(1 << 20))
        .expect("truncate data file");
    c.restart_agent("n2");

    // The agent is up and says what is wrong with each.
    let status = c.agent_status("n2");
    let find = |id: &str| {
        status
            .replicas
            .iter()
            .find(|r| r.replica_id == id)
            .unwrap_or_else(|| panic!("n2 does not report {id}: {:?}", status.replicas))
    };
    let (m, s) = (find(&meta_id), find(&short_id));
    assert!(m.failed && s.failed, "{m:?} {s:?}");
    let why = |r: &hawser_api::agent::ReplicaStatus| r.error.clone().unwrap_or_default();
    assert!(why(m).contains("checksum"), "{m:?}");
    assert!(why(s).contains("1048576 bytes"), "{s:?}");
    let good_id = c.replica_on("good", "n2").id;
    assert!(!find(&good_id).failed);

    // The controller records them failed (its reconcile round, every 5 s).
    wait_until(
        "both broken replicas recorded failed",
        Duration::from_secs(30),
        || {
            [("meta", &meta_id), ("short", &short_id)]
                .iter()
                .all(|(v, id)| {
                    c.volume(v)
                        .replicas
                        .iter()
                        .any(|r| &r.id == *id && r.state == ReplicaState::Failed)
                })
        },
    );
    assert_eq!(
        c.volume("good")
            .replicas
            .iter()
            .filter(|r| r.state == ReplicaState::InSync)
            .count(),
        2
    );

    // The other replica on n2 is served: attached on n1 with both replicas in sync, reads
    // the data back, and a new write reaches n2's file.
    c.cli_ok(&["volume", "attach", "good", "--node", "n1"]);
    qemu_io(&uri, &["read -P 0x5a 0 4M", "write -P 0x6b 4M 1M", "flush"]);
    let engine_in_sync = c
        .volume("good")
        .replicas
        .iter()
        .all(|r| r.state == ReplicaState::InSync);
    assert!(engine_in_sync, "{:?}", c.volume("good").replicas);
    c.cli_ok(&["volume", "detach", "good"]);
    let n2_file = std::fs::read(c.replica_path(&good_id)).expect("read n2's replica");
    assert!(n2_file[4 << 20..5 << 20].iter().all(|&b| b == 0x6b));

    // Left on disk for an operator.
    assert!(meta_file.exists() && short_data.exists());
}
