//! "Secure by default", acceptance c: a controller that comes back on an empty store (its
//! store file lost) while the agents hold replicas deletes nothing: it refuses the nodes as of
//! another cluster until `hawser cluster recover` adopts them, and then every volume is back
//! with its data. An orphan replica goes to its pool's trash, not to unlink.

use std::time::Duration;

use hawser_api::controller::{ClusterInfo, OrphanReplica, RecoverReport, ReplicaState};
use hawser_e2e::{have, qemu_io, wait_until, Cluster};
use sha2::{Digest, Sha256};

/// The first `len` bytes of replica `id`'s data file, hashed.
fn digest(c: &Cluster, id: &str, len: usize) -> Vec<u8> {
    let data = std::fs::read(c.replica_path(id)).expect("read replica");
    Sha256::digest(&data[..len]).to_vec()
}

#[test]
fn a_lost_store_deletes_nothing_and_recover_brings_every_volume_back() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing (make test installs it)");
        return;
    }
    let mut c = Cluster::start("recover", 2);
    let first: ClusterInfo =
        serde_json::from_str(&c.cli_ok(&["cluster", "show", "-o", "json"])).expect("cluster JSON");
    assert!(first.waiting.is_empty());
    let mut before = Vec::new();
    for (name, pattern) in [("alpha", "0x11"), ("beta", "0x22")] {
        let uri = c.attached_volume(name, "64MiB", 2, "n1");
        let write = format!("write -P {pattern} 0 8M");
        qemu_io(&uri, &[&write, "flush"]);
        c.cli_ok(&["volume", "detach", name]);
        let v = c.volume(name);
        for r in &v.replicas {
            before.push((
                name,
                r.id.clone(),
                c.replica_path(&r.id),
                digest(&c, &r.id, 64 << 20),
            ));
        }
    }

    c.restart_controller_with_empty_store();
    // Both agents are refused as of another cluster; the new store has no volume.
    wait_until("both nodes waiting", Duration::from_secs(30), || {
        c.cli(&["cluster", "show", "-o", "json"])
            .status
            .success()
            .then(|| c.cli_ok(&["cluster", "show", "-o", "json"]))
            .and_then(|out| serde_json::from_str::<ClusterInfo>(&out).ok())
            .is_some_and(|i| {
                i.waiting.len() == 2 && i.waiting.iter().all(|w| w.cluster_id == first.id)
            })
    });
    let shown = c.cli_ok(&["cluster", "show"]);
    assert!(shown.contains("hawser cluster recover"), "{shown}");
    assert!(c.volumes().is_empty());
    assert!(c.nodes().is_empty(), "a refused node is not registered");
    let log = c.log("controller");
    assert!(log.contains("refused a node of another cluster"), "{log}");
    for (_, id, path, _) in &before {
        assert!(path.exists(), "replica {id} still on disk");
    }

    let out = c.cli_ok(&["cluster", "recover", "-o", "json"]);
    let report: RecoverReport = serde_json::from_str(&out).expect("recover JSON");
    assert!(report.adopted, "{report:?}");
    assert_eq!(report.cluster_id, first.id);
    let mut names: Vec<&str> = report.volumes.iter().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["alpha", "beta"], "{report:?}");
    for v in &report.volumes {
        assert_eq!(v.size_bytes, 64 << 20);
        assert!(
            v.replicas.iter().all(|r| r.state == ReplicaState::InSync),
            "{v:?}"
        );
    }
    for (_, id, _, sum) in &before {
        assert_eq!(&digest(&c, id, 64 << 20), sum, "replica {id} unchanged");
    }
    // Usable again, with its data: attach elsewhere, read the pattern, write more.
    let uri = {
        c.cli_ok(&["volume", "attach", "alpha", "--node", "n2"]);
        c.volume("alpha").nbd_unix_uri.expect("unix URI")
    };
    qemu_io(&uri, &["read -P 0x11 0 8M", "write -P 0x33 8M 1M"]);
    c.cli_ok(&["volume", "detach", "alpha"]);

    // An orphan (a replica no volume names) goes to its pool's trash.
    let stray = hawser_api::agent::CreateReplica {
        replica_id: "stray-r0-0000aa".into(),
        volume: "stray".into(),
        size_bytes: 1 << 20,
        pool: "default".into(),
        thin: true,
        cluster_id: Some(first.id.clone()),
        from: None,
        key_check: None,
        checksums: false,
        wrapped_key: None,
    };
    let resp = c
        .agent_request(reqwest::Method::POST, "n1", "/v1/replicas")
        .json(&stray)
        .send()
        .expect("create a stray replica");
    assert_eq!(resp.status(), 201);
    let stray_data = c.replica_path("stray-r0-0000aa");
    wait_until(
        "the stray replica in the trash",
        Duration::from_secs(30),
        || {
            let out = c.cli_ok(&["replica", "list", "--orphans", "-o", "json"]);
            serde_json::from_str::<Vec<OrphanReplica>>(&out)
                .expect("orphans JSON")
                .iter()
                .any(|o| o.replica.replica_id == "stray-r0-0000aa" && o.node == "n1")
        },
    );
    assert!(!stray_data.exists());
    let trash = stray_data
        .parent()
        .and_then(|p| p.parent())
        .expect("pool")
        .join("trash");
    let kept = std::fs::read_dir(&trash)
        .expect("trash dir")
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("stray-r0-0000aa.")
                && e.path().extension().is_some_and(|x| x == "data")
        });
    assert!(kept, "the data file is in {}", trash.display());
}
