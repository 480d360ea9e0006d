//! Pruning a directory target: what no manifest names goes, what one names stays and restores,
//! and a prune and a backup never overlap (the target's locks).
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hawser_backup::locks::{Lock, LockBody, LockKind};
use hawser_backup::prune::prune;
use hawser_backup::{back_up, read_manifest, restore, BackupError, BackupPlan, Dest, Progress};
use hawser_backup::{names, Target, TargetSpec};

const MIB: u64 = 1 << 20;
const STALE: u64 = hawser_backup::constants::LOCK_STALE_SECS;

struct Fixture {
    _dir: tempfile::TempDir,
    store: PathBuf,
    image: PathBuf,
    target: Target,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("target");
    std::fs::create_dir(&store).unwrap();
    let image = dir.path().join("image");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    let spec = TargetSpec::Dir {
        path: store.display().to_string(),
    };
    let target = Target::open("t", &spec, None).unwrap();
    Fixture {
        _dir: dir,
        store,
        image,
        target,
    }
}

fn write(image: &Path, at: u64, byte: u8) {
    let f = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    f.write_all_at(&vec![byte; 1 << 20], at).unwrap();
}

fn plan(backup: &str, previous: Option<hawser_backup::Manifest>) -> BackupPlan {
    BackupPlan {
        backup: backup.into(),
        volume: "v".into(),
        cluster: None,
        snapshot: None,
        taken_ms: 1,
        size_bytes: 4 * MIB,
        block_bytes: MIB,
        encryption: None,
        previous,
        bytes_per_sec: 0,
    }
}

/// Makes every object under `dir` look written an hour ago, as the target's clock tells.
fn age(dir: &Path) {
    let old = SystemTime::now() - Duration::from_secs(3600);
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            age(&p);
        } else {
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_modified(old).unwrap();
        }
    }
}

fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                let p = e.unwrap().path();
                if p.is_dir() {
                    files_under(&p)
                } else {
                    1
                }
            })
            .sum()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn prune_deletes_only_unnamed_old_blocks() {
    let f = fixture();
    write(&f.image, 0, 1);
    write(&f.image, MIB, 2);
    let p = Arc::new(Progress::new(0));
    let one = back_up(&f.target, &f.image, plan("v-1", None), p.clone())
        .await
        .unwrap();
    write(&f.image, MIB, 3);
    write(&f.image, 2 * MIB, 4);
    let two = back_up(&f.target, &f.image, plan("v-2", Some(one)), p.clone())
        .await
        .unwrap();
    assert_eq!(files_under(&f.store.join("blocks")), 4);
    // No lock is left behind by a backup.
    assert_eq!(files_under(&f.store.join("locks")), 0);

    // With every manifest in place, nothing goes.
    let s = prune(&f.target, "p1", None, STALE).await.unwrap();
    assert_eq!((s.backups, s.blocks, s.deleted_blocks), (2, 4, 0), "{s:?}");

    f.target.delete(&names::manifest("v-1")).await.unwrap();
    // v-1's own block (2s) is unnamed now, but young: kept.
    let s = prune(&f.target, "p2", None, STALE).await.unwrap();
    assert_eq!(
        (s.backups, s.deleted_blocks, s.young_blocks),
        (1, 0, 1),
        "{s:?}"
    );
    age(&f.store);
    let s = prune(&f.target, "p3", None, STALE).await.unwrap();
    assert_eq!((s.backups, s.blocks, s.deleted_blocks), (1, 4, 1), "{s:?}");
    assert!(s.freed_bytes > 0);
    assert_eq!(files_under(&f.store.join("blocks")), 3);

    // v-2 restores byte for byte.
    let out = f.store.parent().unwrap().join("restored");
    std::fs::File::create(&out)
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    let m = read_manifest(&f.target, "v-2").await.unwrap();
    assert_eq!(m, two);
    restore(&f.target, &m, Dest::Blank(&out), p, 0)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&f.image).unwrap()
    );
}

#[tokio::test]
async fn a_running_backup_stops_a_prune_until_its_lock_is_stale() {
    let f = fixture();
    let body = |kind, holder: &str| LockBody {
        kind,
        holder: holder.into(),
        cluster: None,
        host: None,
        started_ms: 0,
    };
    let held = Lock::take(&f.target, body(LockKind::Backup, "v-9"))
        .await
        .unwrap();
    let e = prune(&f.target, "p1", None, STALE).await.unwrap_err();
    assert!(matches!(e, BackupError::Busy { .. }), "{e}");
    assert!(e.to_string().contains("backup v-9"), "{e}");
    // The prune took its own lock away.
    assert_eq!(files_under(&f.store.join("locks")), 1);
    // A holder killed with its lock in place: stale after the stale time.
    drop(held);
    age(&f.store.join("locks"));
    prune(&f.target, "p2", None, STALE).await.unwrap();
    // The stale lock is left alone (its holder may still delete it).
    assert_eq!(files_under(&f.store.join("locks")), 1);
}

#[tokio::test]
async fn a_backup_waits_for_a_running_prune() {
    let f = fixture();
    write(&f.image, 0, 7);
    let prune_lock = Lock::take(
        &f.target,
        LockBody {
            kind: LockKind::Prune,
            holder: "p".into(),
            cluster: None,
            host: None,
            started_ms: 0,
        },
    )
    .await
    .unwrap();
    let (target, image) = (f.target.clone(), f.image.clone());
    let backup = tokio::spawn(async move {
        back_up(
            &target,
            &image,
            plan("v-1", None),
            Arc::new(Progress::new(0)),
        )
        .await
    });
    // Until the backup's lock shows, then while the prune's is held, nothing is written.
    let seen = loop {
        let others = prune_lock.others().await.unwrap();
        if let Some(h) = others.into_iter().find(|h| h.kind == LockKind::Backup) {
            break h;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(seen.holder, "v-1");
    assert!(!backup.is_finished());
    assert_eq!(files_under(&f.store.join("blocks")), 0);
    assert_eq!(f.target.size(&names::manifest("v-1")).await.unwrap(), None);
    prune_lock.release().await;
    let m = backup.await.unwrap().unwrap();
    assert_eq!(m.stats.new_blocks, 1);
    assert_eq!(files_under(&f.store.join("locks")), 0);
}
