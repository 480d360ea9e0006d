//! Backups on real targets (issue 43): a real S3 server (SeaweedFS) and a directory. What a
//! second backup stores after 1% of the blocks changed, restores that come back byte for
//! byte, a backup killed midway (no manifest, its blocks reused by the next run), missing and
//! corrupt blocks named at restore, the server down, and wrong credentials.

#![allow(clippy::cast_possible_truncation)] // sizes of a test image, on 64-bit machines

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hawser_backup::{
    back_up, list_backups, read_manifest, restore, BackupError, BackupPlan, Dest, Manifest,
    Progress, S3Credentials, Target, TargetSpec,
};
use hawser_e2e::{S3Server, TempDir};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 192 * MIB;

/// A volume image: every block different and half compressible, with some blocks zero.
fn make_image(path: &Path) {
    let mut data = vec![0u8; SIZE as usize];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for (i, block) in data.chunks_mut(MIB as usize).enumerate() {
        if i % 16 == 5 {
            continue; // never written: stays zeros, stored nowhere
        }
        for word in block.chunks_mut(16) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word[..8].copy_from_slice(&x.to_le_bytes());
        }
    }
    std::fs::write(path, data).expect("write image");
}

/// Changes `blocks` blocks (4 KiB in each), as a database's scattered writes would.
fn change_blocks(path: &Path, blocks: &[u64], seed: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open image");
    for &b in blocks {
        f.write_all_at(&[seed; 4096], b * MIB + 8192)
            .expect("change a block");
    }
    f.sync_all().expect("sync image");
}

fn sha(path: &Path) -> String {
    hawser_backup::block::hash(&std::fs::read(path).expect("read"))
}

fn plan(backup: &str, previous: Option<Manifest>) -> BackupPlan {
    BackupPlan {
        backup: backup.into(),
        volume: "db".into(),
        cluster: None,
        snapshot: None,
        taken_ms: 0,
        size_bytes: SIZE,
        block_bytes: MIB,
        encryption: None,
        previous,
        bytes_per_sec: 0,
    }
}

fn du(dir: &Path) -> u64 {
    let out = hawser_e2e::run_ok("du", &["-sb", &dir.display().to_string()]);
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Back up, change 1% of the blocks, back up again: the second backup stores those blocks
/// alone (and the server's disk grows by about that much); both restore byte for byte.
fn incremental_and_restores(target: &Target, dir: &Path, store_dir: Option<&Path>) {
    let rt = rt();
    let image = dir.join("image");
    make_image(&image);
    let first_sha = sha(&image);
    let full = rt
        .block_on(back_up(
            target,
            &image,
            plan("db-1", None),
            Arc::new(Progress::new(SIZE)),
        ))
        .expect("first backup");
    assert_eq!(full.stats.zero_blocks, 12, "{:?}", full.stats);
    assert_eq!(full.stats.new_blocks, 180, "{:?}", full.stats);
    let before = store_dir.map(du);
    // 1% of 192 blocks, rounded up.
    change_blocks(&image, &[3, 77, 150], 0xa1);
    let second_sha = sha(&image);
    let progress = Arc::new(Progress::new(SIZE));
    let inc = rt
        .block_on(back_up(
            target,
            &image,
            plan("db-2", Some(full.clone())),
            progress.clone(),
        ))
        .expect("second backup");
    assert_eq!(
        (inc.stats.new_blocks, inc.stats.reused_blocks),
        (3, 177),
        "{:?}",
        inc.stats
    );
    assert!(
        inc.stats.stored_bytes <= SIZE / 50,
        "stored {} bytes",
        inc.stats.stored_bytes
    );
    assert_eq!(progress.view().done_bytes, SIZE);
    assert_eq!(progress.view().transferred_bytes, inc.stats.stored_bytes);
    if let (Some(before), Some(d)) = (before, store_dir) {
        let grew = du(d).saturating_sub(before);
        println!(
            "backup: incremental stored {} B; server's disk grew {grew} B",
            inc.stats.stored_bytes
        );
        assert!(
            grew <= SIZE / 50,
            "the server's disk grew {grew} bytes for a 1% change"
        );
    }
    assert_eq!(
        rt.block_on(list_backups(target)).expect("list"),
        ["db-1", "db-2"]
    );

    // Into a blank file (a new replica), then back to the first backup over it.
    let out = dir.join("restored");
    std::fs::File::create(&out)
        .and_then(|f| f.set_len(SIZE))
        .expect("blank file");
    let m2 = rt
        .block_on(read_manifest(target, "db-2"))
        .expect("manifest 2");
    assert_eq!(m2, inc);
    rt.block_on(restore(
        target,
        &m2,
        Dest::Blank(&out),
        Arc::new(Progress::new(SIZE)),
        0,
    ))
    .expect("restore db-2");
    assert_eq!(sha(&out), second_sha, "db-2 restored");
    let m1 = rt
        .block_on(read_manifest(target, "db-1"))
        .expect("manifest 1");
    rt.block_on(restore(
        target,
        &m1,
        Dest::Overwrite(&out),
        Arc::new(Progress::new(SIZE)),
        0,
    ))
    .expect("restore db-1 over db-2");
    assert_eq!(sha(&out), first_sha, "db-1 restored");
    let again = rt.block_on(back_up(
        target,
        &image,
        plan("db-2", None),
        Arc::new(Progress::new(SIZE)),
    ));
    assert!(
        matches!(again, Err(BackupError::Exists { .. })),
        "{again:?}"
    );
    let none = rt.block_on(read_manifest(target, "db-9"));
    assert!(
        matches!(none, Err(BackupError::NotFound { .. })),
        "{none:?}"
    );
}

/// A backup dropped midway (its process killed) leaves no manifest, and the next run stores
/// only the blocks the first did not get to.
fn interrupted_then_reused(target: &Target, dir: &Path) {
    let rt = rt();
    let image = dir.join("image");
    let m2 = rt
        .block_on(read_manifest(target, "db-2"))
        .expect("manifest 2");
    let changed: Vec<u64> = (0..192).filter(|b| b % 16 != 5).step_by(2).collect();
    change_blocks(&image, &changed, 0xb2);
    let progress = Arc::new(Progress::new(SIZE));
    let p2 = progress.clone();
    let cut = rt.block_on(async {
        tokio::select! {
            r = back_up(target, &image, plan("db-3", Some(m2.clone())), progress) => Some(r),
            _ = async {
                while p2.view().done_bytes < SIZE / 2 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            } => None,
        }
    });
    assert!(cut.is_none(), "the backup finished before it could be cut");
    assert_eq!(
        rt.block_on(list_backups(target)).expect("list"),
        ["db-1", "db-2"]
    );
    let done = rt
        .block_on(back_up(
            target,
            &image,
            plan("db-3", Some(m2)),
            Arc::new(Progress::new(SIZE)),
        ))
        .expect("backup after the cut");
    let n = changed.len() as u64;
    assert!(
        done.stats.new_blocks < n,
        "all {n} changed blocks sent again: {:?}",
        done.stats
    );
    assert!(done.stats.new_blocks > 0, "{:?}", done.stats);
    let out = dir.join("restored3");
    std::fs::File::create(&out)
        .and_then(|f| f.set_len(SIZE))
        .expect("blank file");
    rt.block_on(restore(
        target,
        &done,
        Dest::Blank(&out),
        Arc::new(Progress::new(SIZE)),
        0,
    ))
    .expect("restore db-3");
    assert_eq!(sha(&out), sha(&image));
}

/// A block deleted, or replaced by other bytes, stops the restore, naming the block.
fn missing_and_corrupt_blocks(target: &Target) {
    let rt = rt();
    let m = rt
        .block_on(read_manifest(target, "db-2"))
        .expect("manifest");
    let (&i, h) = m.blocks.iter().nth(7).expect("a block");
    let object = hawser_backup::names::block(h);
    let saved = rt
        .block_on(target.get(&object, 4 * MIB))
        .expect("get")
        .expect("block there");
    let verify = || {
        rt.block_on(restore(
            target,
            &m,
            Dest::Verify,
            Arc::new(Progress::new(SIZE)),
            0,
        ))
    };
    verify().expect("verify a whole backup");

    rt.block_on(target.delete(&object)).expect("delete a block");
    let err = verify().expect_err("a missing block must fail");
    assert!(
        matches!(err, BackupError::MissingBlock { index, .. } if index == i),
        "{err}"
    );
    assert!(err.to_string().contains(&object), "{err}");

    let mut bad = saved.to_vec();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    rt.block_on(target.put(&object, bad.into()))
        .expect("corrupt a block");
    let err = verify().expect_err("a corrupt block must fail");
    assert!(
        matches!(err, BackupError::CorruptBlock { index, .. } if index == i),
        "{err}"
    );
    println!("backup: corrupt block refused: {err}");
    rt.block_on(target.put(&object, saved))
        .expect("put the block back");
    verify().expect("verify after the block is back");
}

#[test]
fn s3_target_incremental_restore_and_faults() {
    let dir = TempDir::new("backup-s3");
    let mut s3 = S3Server::start(dir.path(), "backups");
    let spec = TargetSpec::S3 {
        endpoint: s3.endpoint(),
        bucket: "backups".into(),
        prefix: "cluster-a".into(),
        region: None,
    };
    let text = std::fs::read_to_string(s3.credentials_file()).expect("credentials");
    let creds = S3Credentials::parse(&text).expect("parse credentials");
    let target = Target::open("offsite", &spec, Some(&creds)).expect("open target");
    rt().block_on(target.check()).expect("connection check");

    // A wrong secret is refused by the server, and the check says so.
    let wrong = S3Credentials {
        secret_access_key: "nope".into(),
        ..creds.clone()
    };
    let bad = Target::open("offsite", &spec, Some(&wrong)).expect("open");
    let err = rt()
        .block_on(bad.check())
        .expect_err("a wrong secret must be refused");
    assert!(err.to_string().contains("offsite"), "{err}");
    println!("backup: wrong secret refused: {err}");

    incremental_and_restores(&target, dir.path(), Some(&s3.data_dir()));
    interrupted_then_reused(&target, dir.path());
    missing_and_corrupt_blocks(&target);

    // The server down: retried with backoff for the retry time (5 s here, as a controller's
    // --backup-retry-secs sets it; 120 s by default), then a failure that names the target.
    s3.kill();
    let down = Target::open_with("offsite", &spec, Some(&creds), 5).expect("open target");
    let t = std::time::Instant::now();
    let err = rt()
        .block_on(back_up(
            &down,
            &dir.path().join("image"),
            plan("db-4", None),
            Arc::new(Progress::new(SIZE)),
        ))
        .expect_err("no server, no backup");
    assert!(matches!(err, BackupError::Target { .. }), "{err}");
    assert!(
        t.elapsed() >= std::time::Duration::from_secs(5),
        "gave up early: {err}"
    );
    assert!(down.retries() > 0, "{err}");
    println!("backup: server down failed after {:?}: {err}", t.elapsed());
}

#[test]
fn dir_target_incremental_restore_and_faults() {
    let dir = TempDir::new("backup-dir");
    let store = dir.path().join("target");
    std::fs::create_dir_all(&store).expect("target dir");
    let spec = TargetSpec::Dir {
        path: store.display().to_string(),
    };
    let target = Target::open("nfs", &spec, None).expect("open target");
    rt().block_on(target.check()).expect("connection check");
    assert!(store.join("hawser-backup.json").exists());
    incremental_and_restores(&target, dir.path(), Some(&store));
    interrupted_then_reused(&target, dir.path());
    missing_and_corrupt_blocks(&target);
}
