//! Backups through the real binary (issue 43): `hawser backup target add` checks an S3 target
//! (a real SeaweedFS with an access key) and refuses a wrong key or a missing directory;
//! `hawser backup create` backs an attached volume up from a node holding its snapshot,
//! a second backup sends only the changed block, the target's content restores to the
//! volume's bytes, the snapshot a backup took is dropped, and the S3 server down fails a
//! backup with a clear status while the volume keeps serving.

use std::process::Output;

use hawser_api::backup::{Backup, BackupState, BackupTarget};
use hawser_backup::{S3Credentials, Target, TargetSpec};
use hawser_e2e::cluster::{Cluster, ClusterOptions};
use hawser_e2e::run::qemu_io;
use hawser_e2e::{assert_same_contents, S3Server, TempDir};

const MIB: u64 = 1 << 20;

fn backup(c: &Cluster, volume: &str, target: &str) -> Backup {
    let out = c.cli_ok(&[
        "backup", "create", volume, "--target", target, "--wait", "-o", "json",
    ]);
    serde_json::from_str(&out).expect("backup JSON")
}

/// `hawser backup target add NAME --s3 ...`: bucket `backups`, prefix `cluster-1`.
fn add_s3_target(c: &Cluster, name: &str, endpoint: &str, credentials: &str) -> Output {
    c.cli(&[
        "backup",
        "target",
        "add",
        name,
        "--s3",
        endpoint,
        "--bucket",
        "backups",
        "--prefix",
        "cluster-1",
        "--credentials-file",
        credentials,
    ])
}

/// Waits until `volume` is no longer restoring.
fn wait_restored(c: &Cluster, volume: &str) {
    hawser_e2e::wait_until("the restore", std::time::Duration::from_secs(120), || {
        c.volume(volume).restoring.is_none()
    });
}

#[test]
fn volumes_back_up_incrementally_to_s3_and_restore_byte_for_byte() {
    // The S3 server is killed at the end: its backup fails after 10 s of retries, not 120.
    let opts = ClusterOptions {
        controller_args: vec!["--backup-retry-secs".into(), "10".into()],
        ..Default::default()
    };
    let c = Cluster::start_with("backup-volume", 2, opts);
    let dir = TempDir::new("backup-volume-s3");
    let mut s3 = S3Server::start(dir.path(), "backups");
    let creds = s3.credentials_file();
    let endpoint = s3.endpoint();
    let add = |name: &str, file: &str| add_s3_target(&c, name, &endpoint, file);

    // A wrong secret, a missing directory and an unknown target are refused, saying why.
    let wrong = dir.path().join("wrong-credentials");
    std::fs::write(
        &wrong,
        "access_key_id = AKHAWSERTEST\nsecret_access_key = nope\n",
    )
    .expect("write wrong credentials");
    let out = add("offsite", &wrong.display().to_string());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("connection check failed"),
        "{err}"
    );
    assert!(
        err.contains("SignatureDoesNotMatch") || err.contains("403"),
        "{err}"
    );
    c.cli_fails(
        &["backup", "target", "add", "nfs", "--dir", "/no/such/dir"],
        "not a directory",
    );
    c.cli_fails(
        &["backup", "create", "db", "--target", "nowhere"],
        "not found",
    );

    let out = add("offsite", &creds.display().to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.cli_ok(&["backup", "target", "list", "-o", "json"]);
    let targets: Vec<BackupTarget> = serde_json::from_str(&out).expect("targets JSON");
    assert_eq!(targets.len(), 1);
    assert!(targets[0].credentials, "{targets:?}");

    // Two backups of an attached volume: the second sends the one block that changed.
    let uri = c.attached_volume("db", "64MiB", 2, "n1");
    // Eleven blocks, each different (blocks with the same content are stored once).
    let mut writes: Vec<String> = (0..8)
        .map(|i| format!("write -P {} {i}M 1M", 0x10 + i))
        .collect();
    writes.extend((32..35).map(|i| format!("write -P {} {i}M 1M", 0x20 + i)));
    writes.push("flush".into());
    qemu_io(&uri, &writes.iter().map(String::as_str).collect::<Vec<_>>());
    let first = backup(&c, "db", "offsite");
    assert_eq!(first.state, BackupState::Ready, "{first:?}");
    let st = first.stats.clone().expect("stats");
    assert_eq!((st.new_blocks, st.zero_blocks), (11, 53), "{st:?}");
    assert!(first.node.is_some(), "{first:?}");
    qemu_io(&uri, &["write -P 0x33 40M 4k", "flush"]);
    let second = backup(&c, "db", "offsite");
    let st = second.stats.clone().expect("stats");
    assert_eq!((st.new_blocks, st.reused_blocks), (1, 11), "{st:?}");
    assert!(st.stored_bytes < MIB, "{st:?}");
    assert!(second.taken_ms >= first.taken_ms);
    let shown = c.cli_ok(&["backup", "show", &second.name]);
    assert!(
        shown.contains("Recovery point:") && shown.contains("100% of 64 MiB"),
        "{shown}"
    );
    let listed = c.cli_ok(&["backup", "list", "--volume", "db"]);
    assert!(
        listed.contains(&first.name) && listed.contains(&second.name),
        "{listed}"
    );
    // The snapshots the backups took are gone.
    let snaps = c.cli_ok(&["snapshot", "list", "--volume", "db"]);
    assert!(snaps.contains("No snapshots"), "{snaps}");

    // What is on the target is the volume: restored into a file, byte for byte.
    let text = std::fs::read_to_string(&creds).expect("credentials");
    let key = S3Credentials::parse(&text).expect("credentials");
    let spec = TargetSpec::S3 {
        endpoint: endpoint.clone(),
        bucket: "backups".into(),
        prefix: "cluster-1".into(),
        region: None,
    };
    let target = Target::open("offsite", &spec, Some(&key)).expect("open the target");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let out = dir.path().join("restored");
    let m = hawser_e2e::backups::restore_to_file(&target, &second.name, &out, 64 * MIB);
    assert_eq!(m.previous.as_deref(), Some(first.name.as_str()));
    let replica = c.replica_on("db", "n2");
    assert_same_contents(&out, &c.replica_path(&replica.id), 64 * MIB);

    // A volume made from the backup, in this cluster: restoring (no attach) until every
    // replica holds it, then the same bytes as the volume when it was backed up.
    let from = format!("offsite/{}", second.name);
    c.cli_ok(&[
        "volume",
        "create",
        "copy",
        "--from-backup",
        &from,
        "--replicas",
        "2",
    ]);
    wait_restored(&c, "copy");
    for r in c.volume("copy").replicas {
        assert_same_contents(&out, &c.replica_path(&r.id), 64 * MIB);
    }
    let copy_uri = {
        c.cli_ok(&["volume", "attach", "copy", "--node", "n2"]);
        c.volume("copy").nbd_unix_uri.expect("an NBD URI")
    };
    let io = qemu_io(
        &copy_uri,
        &[
            "read -P 0x13 3M 1M",
            "read -P 0x33 40M 4k",
            "read -P 0 48M 1M",
        ],
    );
    assert!(!io.contains("verification failed"), "{io}");
    c.cli_fails(
        &["volume", "create", "x", "--from-backup", "offsite/nope"],
        "not found",
    );
    c.cli_fails(
        &["volume", "create", "x", "--from-backup", "offsite"],
        "TARGET/BACKUP",
    );

    // A block changed on the target: the restore stops at it, naming it, and the volume
    // stays restoring (it cannot attach).
    let (&i, h) = m.blocks.iter().nth(4).expect("a block");
    let object = hawser_backup::names::block(h);
    let good = rt
        .block_on(target.get(&object, 4 * MIB))
        .expect("get")
        .expect("the block");
    let mut bad = good.to_vec();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x08;
    rt.block_on(target.put(&object, bad.into()))
        .expect("corrupt the block");
    c.cli_ok(&[
        "volume",
        "create",
        "broken",
        "--from-backup",
        &from,
        "--replicas",
        "1",
    ]);
    hawser_e2e::wait_until(
        "the restore to fail",
        std::time::Duration::from_secs(60),
        || c.cli_ok(&["events"]).contains("RestoreFailed"),
    );
    let events = c.cli_ok(&["events"]);
    assert!(
        events.contains(&format!("block {i} ")) && events.contains("corrupt"),
        "{events}"
    );
    assert!(c.volume("broken").restoring.is_some());
    c.cli_fails(&["volume", "attach", "broken", "--node", "n1"], "restor");
    rt.block_on(target.put(&object, good))
        .expect("put the block back");

    // An encrypted volume: its blocks on the target are ciphertext, and a volume restored
    // from them in this cluster (its key unwrapped and wrapped again for the new name) reads
    // back the plaintext.
    let sec_uri = {
        c.cli_ok(&[
            "volume",
            "create",
            "sec",
            "--size",
            "16MiB",
            "--replicas",
            "2",
            "--encrypted",
        ]);
        c.cli_ok(&["volume", "attach", "sec", "--node", "n1"]);
        c.volume("sec").nbd_unix_uri.expect("an NBD URI")
    };
    qemu_io(&sec_uri, &["write -P 0x5a 0 2M", "flush"]);
    let sb = backup(&c, "sec", "offsite");
    assert_eq!(sb.state, BackupState::Ready, "{sb:?}");
    let sm = rt
        .block_on(hawser_backup::read_manifest(&target, &sb.name))
        .expect("manifest");
    assert!(sm.encryption.is_some(), "{sm:?}");
    let (&i0, h0) = sm.blocks.iter().next().expect("a block");
    let obj = rt
        .block_on(target.get(&hawser_backup::names::block(h0), 4 * MIB))
        .expect("get");
    let plain = hawser_backup::block::open(&obj.expect("the block"), sm.block_range(i0).1, h0)
        .expect("a whole block");
    assert!(
        !plain.windows(64).any(|w| w.iter().all(|&b| b == 0x5a)),
        "plaintext on the target"
    );
    c.cli_ok(&[
        "volume",
        "create",
        "sec2",
        "--from-backup",
        &format!("offsite/{}", sb.name),
    ]);
    wait_restored(&c, "sec2");
    assert!(
        c.volume("sec2").encrypted,
        "a restore of an encrypted backup is encrypted"
    );
    c.cli_ok(&["volume", "attach", "sec2", "--node", "n2"]);
    let sec2 = c.volume("sec2").nbd_unix_uri.expect("an NBD URI");
    // (Never-written ranges of an encrypted volume read as noise, here as in the source.)
    let io = qemu_io(&sec2, &["read -P 0x5a 0 2M"]);
    assert!(!io.contains("verification failed"), "{io}");

    // A new cluster given only the target restores the same bytes.
    let c2 = Cluster::start("backup-volume-2", 1);
    let out2 = add_s3_target(&c2, "offsite", &endpoint, &creds.display().to_string());
    assert!(
        out2.status.success(),
        "{}",
        String::from_utf8_lossy(&out2.stderr)
    );
    c2.cli_ok(&[
        "volume",
        "create",
        "db",
        "--from-backup",
        &from,
        "--replicas",
        "1",
    ]);
    wait_restored(&c2, "db");
    let r2 = c2.volume("db").replicas[0].id.clone();
    assert_same_contents(&out, &c2.replica_path(&r2), 64 * MIB);
    drop(c2);

    // The S3 server down: the backup fails with the target's error; the volume serves on.
    s3.kill();
    let out = c.cli(&[
        "backup", "create", "db", "--target", "offsite", "--wait", "-o", "json",
    ]);
    assert!(!out.status.success(), "a backup with no server succeeded");
    let list: Vec<Backup> =
        serde_json::from_str(&c.cli_ok(&["backup", "list", "--volume", "db", "-o", "json"]))
            .expect("list JSON");
    let failed = list
        .iter()
        .find(|b| b.state == BackupState::Failed)
        .expect("a failed backup");
    let why = failed.error.clone().unwrap_or_default();
    assert!(why.contains("offsite"), "{failed:?}");
    eprintln!("backup: with the server down: {why}");
    let events = c.cli_ok(&["events"]);
    assert!(events.contains("BackupFailed"), "{events}");
    let io = qemu_io(&uri, &["write -P 0x44 0 1M", "read -P 0x44 0 1M"]);
    assert!(
        !io.contains("verification failed") && !io.contains("error"),
        "{io}"
    );
}
