//! "Secure by default", acceptance c: a controller that comes back on an empty store (its
//! store file lost) while the agents hold replicas deletes nothing: it refuses the nodes as of
//! another cluster until `hawser cluster recover` adopts them, and then every volume is back
//! with its data. An orphan replica goes to its pool's trash, not to unlink.
//!
//! A recovery that adopted the cluster but timed out waiting for a node trashes nothing
//! either: the store says so until a recovery finishes.
//!
//! An encrypted volume comes back too (issue 43, item 8): its replicas keep its wrapped data
//! key, a key rotation updates their copies (so the old key-encryption key can be deleted
//! first), and after the recovery it reads back byte for byte what was written to it.

use std::time::Duration;

use hawser_api::agent::ReplicaInventory;
use hawser_api::controller::{
    ClusterInfo, OrphanReplica, RecoverReport, ReplicaState, VolumeKeyRotated,
};
use hawser_e2e::cluster::hawser_bin;
use hawser_e2e::nbd_client::{NbdConn, NbdTarget};
use hawser_e2e::{have, qemu_io, wait_until, Cluster};
use sha2::{Digest, Sha256};

/// Apart, and one of them sector- but not page-aligned.
const SECRET_AT: [u64; 3] = [0, (5 << 20) + 512, 40 << 20];

/// 1 MiB of data no two offsets share (a counter hashed), so a read of the wrong place, or
/// with the wrong key, does not match.
fn known(at: u64) -> Vec<u8> {
    (0..(1u64 << 15))
        .flat_map(|i| Sha256::digest([at.to_le_bytes(), i.to_le_bytes()].concat()))
        .collect()
}

fn nbd(c: &Cluster, volume: &str) -> NbdConn {
    let uri = c.volume(volume).nbd_unix_uri.expect("attached");
    NbdConn::connect(&NbdTarget::from_unix_uri(&uri)).expect("connect")
}

/// The KEK ids of the copies of `volume`'s wrapped key that node `node`'s replicas keep.
fn copies_on(c: &Cluster, node: &str, volume: &str) -> Vec<Option<u32>> {
    let resp = c
        .agent_request(reqwest::Method::GET, node, "/v1/replicas/inventory")
        .send()
        .expect("inventory");
    assert_eq!(resp.status(), 200);
    let list: Vec<ReplicaInventory> = resp.json().expect("inventory JSON");
    list.iter()
        .filter(|r| r.status.volume == volume)
        .map(|r| r.status.wrapped_key.as_ref().map(|w| w.kek))
        .collect()
}

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

    // An encrypted volume, written through NBD, its data key then re-wrapped under key 2:
    // every replica's copy follows, so key 1 can go before the store does.
    c.cli_ok(&[
        "volume",
        "create",
        "gamma",
        "--size",
        "64MiB",
        "--replicas",
        "2",
        "--encrypted",
    ]);
    c.cli_ok(&["volume", "attach", "gamma", "--node", "n1"]);
    let mut conn = nbd(&c, "gamma");
    for at in SECRET_AT {
        conn.write_at(at, &known(at)).expect("write");
    }
    conn.disconnect();
    c.cli_ok(&["volume", "detach", "gamma"]);
    let copies = |c: &Cluster| {
        let mut all = copies_on(c, "n1", "gamma");
        all.extend(copies_on(c, "n2", "gamma"));
        all
    };
    assert_eq!(copies(&c), [Some(1), Some(1)], "each replica keeps a copy");
    let out = c.cli_ok(&["cluster", "rotate-volume-key", "-o", "json"]);
    let rotated: VolumeKeyRotated = serde_json::from_str(&out).expect("a rotation report");
    assert_eq!(rotated.kek, 2);
    assert!(rotated.behind.is_empty(), "{rotated:?}");
    assert_eq!(rotated.wrapping, [(2, 1)].into_iter().collect());
    assert_eq!(
        copies(&c),
        [Some(2), Some(2)],
        "the rotation updated the copies"
    );
    let kek1 = c.dir.path().join("controller/volume-keys/kek-1.key");
    std::fs::remove_file(&kek1).expect("delete key 1, which wraps nothing now");
    for r in &c.volume("gamma").replicas {
        before.push((
            "gamma",
            r.id.clone(),
            c.replica_path(&r.id),
            digest(&c, &r.id, 64 << 20),
        ));
    }

    // Each volume's identity, which the recovered records must keep (certificates and
    // devices name it).
    let uids: Vec<(String, Option<String>)> =
        c.volumes().into_iter().map(|v| (v.name, v.uid)).collect();
    assert!(uids.iter().all(|(_, u)| u.is_some()), "{uids:?}");

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

    // A recovery that adopts the cluster but times out waiting for a node (n2 is down)
    // leaves the store without volume records while n1 registers with all its replicas:
    // until a recovery finishes, none of them is an orphan, and nothing goes to the trash.
    c.kill_agent("n2");
    let failed = c.cli(&["cluster", "recover", "--wait-secs", "3"]);
    let why = String::from_utf8_lossy(&failed.stderr);
    assert!(
        !failed.status.success() && why.contains("did not register"),
        "{why}"
    );
    wait_until("n1 registered", Duration::from_secs(30), || {
        c.nodes().iter().any(|n| n.name == "n1")
    });
    let unfinished = |c: &Cluster| {
        c.log("controller")
            .matches("recovery is unfinished")
            .count()
    };
    let seen = unfinished(&c);
    wait_until(
        "two reconcile rounds with n1 registered",
        Duration::from_secs(30),
        || unfinished(&c) >= seen + 2,
    );
    for (_, id, path, _) in &before {
        assert!(
            path.exists(),
            "replica {id} kept while the recovery is unfinished"
        );
    }
    c.restart_agent_from("n2", &hawser_bin(), false);

    let out = c.cli_ok(&["cluster", "recover", "-o", "json"]);
    let report: RecoverReport = serde_json::from_str(&out).expect("recover JSON");
    assert!(!report.adopted, "the first recovery adopted it: {report:?}");
    assert_eq!(report.cluster_id, first.id);
    let mut names: Vec<&str> = report.volumes.iter().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["alpha", "beta", "gamma"], "{report:?}");
    assert!(report.skipped.is_empty(), "{report:?}");
    for v in &report.volumes {
        let kept = uids.iter().find(|(n, _)| *n == v.name).map(|(_, u)| u);
        assert_eq!(kept, Some(&v.uid), "{} keeps its uid", v.name);
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

    // The encrypted volume: encrypted again, and its data reads back byte for byte, on the
    // node that did not write it, with key 2 (key 1 is gone).
    assert!(c.volume("gamma").encrypted, "recovered with its key");
    c.cli_ok(&["volume", "attach", "gamma", "--node", "n2"]);
    let mut conn = nbd(&c, "gamma");
    for at in SECRET_AT {
        let want = known(at);
        let mut got = vec![0u8; want.len()];
        conn.read_at(at, &mut got).expect("read");
        let first = got.iter().zip(&want).position(|(g, w)| g != w);
        assert_eq!(first, None, "gamma at {at}: the first byte that differs");
    }
    conn.disconnect();
    c.cli_ok(&["volume", "detach", "gamma"]);

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
        volume_uid: None,
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
