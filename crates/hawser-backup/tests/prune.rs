//! Pruning a directory target: what no manifest names goes, what one names stays and restores,
//! and a prune and a backup never overlap (the target's locks).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hawser_backup::locks::{Lock, LockKind};
use hawser_backup::names;
use hawser_backup::prune::prune;
use hawser_backup::{back_up, read_manifest, restore, BackupError, Dest, Progress};

mod common;
use common::{age, files_under, fixture, lock_body, plan, write, MIB, STALE};

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
    let held = Lock::take(&f.target, lock_body(LockKind::Backup, "v-9"))
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
    let prune_lock = Lock::take(&f.target, lock_body(LockKind::Prune, "p"))
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
