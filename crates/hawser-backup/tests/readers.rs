//! Readers and the prune on a directory target (readers.rs): a restore holds the backup it
//! reads, so a prune, even with no grace, deletes none of its blocks while it runs, also once
//! the backup is deleted; the blocks go at the first prune after it ends.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hawser_backup::locks::{Lock, LockKind};
use hawser_backup::prune::prune;
use hawser_backup::{back_up, names, read_held_manifest, read_manifest, restore, retire};
use hawser_backup::{BackupError, Dest, Progress, ReadHold};

mod common;
use common::{age, files_under, fixture, lock_body, plan, write, Fixture, MIB};

/// `v-1`, four distinct blocks, backed up, and the target aged so that nothing is young.
async fn one_backup() -> Fixture {
    let f = fixture();
    for (i, byte) in (0..4).zip(0x40u8..) {
        write(&f.image, i * MIB, byte);
    }
    let p = Arc::new(Progress::new(0));
    back_up(&f.target, &f.image, plan("v-1", None), p)
        .await
        .unwrap();
    age(&f.store);
    f
}

fn blank(f: &Fixture, name: &str) -> std::path::PathBuf {
    let out = f.store.parent().unwrap().join(name);
    std::fs::File::create(&out)
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    out
}

/// Waits (30 s at most) until `lock`'s holder sees a reader's lock on the target.
async fn until_a_reader_shows(lock: &Lock) {
    let seen = async {
        while !lock
            .others()
            .await
            .unwrap()
            .iter()
            .any(|h| h.kind == LockKind::Read)
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), seen)
        .await
        .expect("no reader's lock showed on the target");
}

#[tokio::test]
async fn a_prune_during_a_restore_of_a_deleted_backup_deletes_its_blocks_only_after_it_ends() {
    let f = one_backup().await;
    let m = read_manifest(&f.target, "v-1").await.unwrap();
    // A restore at 512 KiB/s: eight seconds of reading, during which the backup is deleted and
    // the target pruned with no grace at all.
    let (target, out, m2) = (f.target.clone(), blank(&f, "restored"), m.clone());
    let out2 = out.clone();
    let restoring = tokio::spawn(async move {
        let p = Arc::new(Progress::new(0));
        restore(&target, &m2, Dest::Blank(&out2), p, MIB / 2).await
    });
    // Once the restore's lock shows on the target.
    let probe = Lock::take(&f.target, lock_body(LockKind::Backup, "probe"))
        .await
        .unwrap();
    until_a_reader_shows(&probe).await;
    probe.release().await;
    assert!(retire(&f.target, "v-1").await.unwrap());
    assert_eq!(
        read_manifest(&f.target, "v-1")
            .await
            .unwrap_err()
            .to_string(),
        "backup v-1 not found on target t"
    );
    let s = prune(&f.target, "p1", None, 0).await.unwrap();
    assert_eq!(
        (s.backups, s.held_backups, s.deleted_blocks),
        (0, 1, 0),
        "{s:?}"
    );
    assert!(
        !restoring.is_finished(),
        "the restore was meant to outlast the prune"
    );
    restoring.await.unwrap().unwrap();
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&f.image).unwrap()
    );
    assert_eq!(
        files_under(&f.store.join("locks")),
        0,
        "the restore let its lock go"
    );
    // Now nobody reads v-1: its manifest and blocks go.
    let s = prune(&f.target, "p2", None, 0).await.unwrap();
    assert_eq!(
        (s.held_backups, s.retired_deleted, s.deleted_blocks),
        (0, 1, 4),
        "{s:?}"
    );
    assert_eq!(files_under(&f.store.join("blocks")), 0);
    assert_eq!(files_under(&f.store.join("retired")), 0);
}

#[tokio::test]
async fn a_reader_waits_out_a_running_prune_and_finds_the_backup_it_took_gone() {
    let f = one_backup().await;
    let prune_lock = Lock::take(&f.target, lock_body(LockKind::Prune, "p"))
        .await
        .unwrap();
    let target = f.target.clone();
    let hold = tokio::spawn(async move { ReadHold::take(&target, "v-1").await });
    until_a_reader_shows(&prune_lock).await;
    // The prune that did not see the reader deletes the retired backup, then lets go.
    retire(&f.target, "v-1").await.unwrap();
    f.target.delete(&names::retired("v-1")).await.unwrap();
    prune_lock.release().await;
    let e = hold.await.unwrap().unwrap_err();
    assert!(matches!(e, BackupError::NotFound { .. }), "{e}");
    assert_eq!(
        files_under(&f.store.join("locks")),
        0,
        "the failed hold let its lock go"
    );
}

#[tokio::test]
async fn a_held_retired_backup_is_read_by_a_resumed_reader_and_a_new_one_is_refused() {
    let f = one_backup().await;
    let hold = ReadHold::take(&f.target, "v-1").await.unwrap();
    assert!(
        hold.object().starts_with("locks/read-v-1-"),
        "{}",
        hold.object()
    );
    retire(&f.target, "v-1").await.unwrap();
    // Retiring twice is a no-op that still reports the backup.
    assert!(retire(&f.target, "v-1").await.unwrap());
    prune(&f.target, "p1", None, 0).await.unwrap();
    // A job re-run after a restart reads the retired manifest and every block is there.
    let m = read_held_manifest(&f.target, "v-1").await.unwrap();
    let out = blank(&f, "again");
    restore(
        &f.target,
        &m,
        Dest::Blank(&out),
        Arc::new(Progress::new(0)),
        0,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&f.image).unwrap()
    );
    hold.release().await;
    prune(&f.target, "p2", None, 0).await.unwrap();
    let e = read_held_manifest(&f.target, "v-1").await.unwrap_err();
    assert!(matches!(e, BackupError::NotFound { .. }), "{e}");
    assert!(!retire(&f.target, "v-1").await.unwrap());
}

#[tokio::test]
async fn a_reader_lock_that_does_not_decode_stops_the_prune() {
    let f = one_backup().await;
    retire(&f.target, "v-1").await.unwrap();
    let junk = hawser_backup::locks::object(LockKind::Read, "x-1");
    f.target
        .put(&junk, bytes::Bytes::from_static(b"{not json"))
        .await
        .unwrap();
    let e = prune(&f.target, "p1", None, 0).await.unwrap_err();
    assert!(matches!(e, BackupError::Busy { .. }), "{e}");
    assert!(e.to_string().contains("does not decode"), "{e}");
    assert_eq!(files_under(&f.store.join("blocks")), 4);
    // A stale one is a dead reader's: ignored.
    age(&f.store.join("locks"));
    let s = prune(&f.target, "p2", None, 0).await.unwrap();
    assert_eq!(s.deleted_blocks, 4, "{s:?}");
}

/// A controller's new hold of a restore deletes the holds its dead predecessors left under
/// the same prefix, and nobody else's.
#[tokio::test]
async fn a_confirmed_hold_supersedes_older_holds_of_the_same_reader_only() {
    let f = one_backup().await;
    let old = ReadHold::write_as(&f.target, "v-1", "restore-u1-1")
        .await
        .unwrap();
    let other = ReadHold::take(&f.target, "v-1").await.unwrap();
    let namesake = ReadHold::write_as(&f.target, "v-1", "restore-u2-1")
        .await
        .unwrap();
    let new = ReadHold::write_as(&f.target, "v-1", "restore-u1-2")
        .await
        .unwrap();
    new.confirm().await.unwrap();
    assert_eq!(new.supersede("restore-u1-").await.unwrap(), 1);
    let mut locks = f.target.list("locks").await.unwrap();
    locks.sort();
    let mut want = vec![
        new.object().to_owned(),
        other.object().to_owned(),
        namesake.object().to_owned(),
    ];
    want.sort();
    assert_eq!(locks, want);
    drop(old);
}
