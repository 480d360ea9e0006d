//! Snapshots, clones and restores of replicas on real files (the target directory's
//! filesystem: reflinks where it has them, the copy otherwise; both must give the same
//! bytes). The reflink path on XFS is also covered end to end (hawser-e2e).

// Test sizes are a few MiB, well inside usize.
#![allow(clippy::cast_possible_truncation)]

use crate::error::StorageError;
use crate::tests::{new, pool, TempDir};

const MIB: u64 = 1 << 20;

fn read(r: &crate::Replica, epoch: u64, offset: u64, len: u32) -> Vec<u8> {
    r.read(epoch, offset, len).expect("read").to_vec()
}

#[test]
fn a_snapshot_keeps_the_data_of_its_moment_while_the_replica_changes() {
    let dir = TempDir::new("snap");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&new("r1", 4 * MIB, true)).expect("create");
    r.raise_epoch(2).expect("epoch");
    r.write(2, 0, &[1; 8192], false).expect("write");
    r.write(2, 2 * MIB, &[2; 4096], false).expect("write");
    let t = r.take_snapshot(2, "s1").expect("snapshot");
    assert!(t.kind.is_some(), "taken now");
    assert_eq!((t.file.id.as_str(), t.file.size), ("s1", 4 * MIB));
    // Later writes change the replica, not the snapshot.
    r.write(2, 0, &[9; 4096], false).expect("write");
    let snap = std::fs::read(r.snapshot_file("s1").expect("file")).expect("read snapshot");
    assert!(snap[..8192].iter().all(|&b| b == 1));
    assert!(snap[2 * MIB as usize..2 * MIB as usize + 4096]
        .iter()
        .all(|&b| b == 2));
    assert!(snap[8192..2 * MIB as usize].iter().all(|&b| b == 0));
    assert_eq!(read(&r, 2, 0, 4096), vec![9; 4096]);
    // A retry returns it unchanged; a second one is listed beside it.
    let again = r.take_snapshot(2, "s1").expect("retry");
    assert_eq!((again.kind, &again.file), (None, &t.file));
    r.take_snapshot(2, "s2").expect("snapshot");
    let ids: Vec<String> = r.snapshots().into_iter().map(|s| s.id).collect();
    assert_eq!(ids, ["s1", "s2"]);
    // The pool counts them and their space: at least the 12 KiB written, per copy.
    let u = p.usage().expect("usage");
    assert_eq!(u.snapshots, 2);
    assert!(u.snapshot_bytes >= 2 * 12288, "{u:?}");
    // Deleting one leaves the other; deleting it again is fine.
    r.delete_snapshot("s1").expect("delete");
    r.delete_snapshot("s1").expect("delete again");
    assert!(matches!(
        r.snapshot_file("s1"),
        Err(StorageError::SnapshotNotFound { .. })
    ));
    assert_eq!(r.snapshots().len(), 1);
    assert_eq!(p.usage().expect("usage").snapshots, 1);
}

#[test]
fn snapshots_are_refused_to_a_fenced_engine_and_bad_names() {
    let dir = TempDir::new("snap-refuse");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&new("r1", MIB, true)).expect("create");
    r.raise_epoch(5).expect("epoch");
    assert!(matches!(
        r.take_snapshot(4, "s"),
        Err(StorageError::StaleEpoch {
            epoch: 4,
            current: 5,
            ..
        })
    ));
    for bad in ["", "../x", ".hidden", "a/b", "x y"] {
        assert!(
            matches!(r.take_snapshot(5, bad), Err(StorageError::InvalidId { .. })),
            "{bad:?}"
        );
        assert!(matches!(
            r.delete_snapshot(bad),
            Err(StorageError::InvalidId { .. })
        ));
    }
    assert!(r.snapshots().is_empty(), "nothing was made");
}

#[test]
fn a_clone_from_a_snapshot_is_a_new_replica_with_its_data_and_outlives_the_snapshot() {
    let dir = TempDir::new("clone");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&new("r1", 2 * MIB, true)).expect("create");
    r.raise_epoch(1).expect("epoch");
    r.write(1, MIB, &[7; 4096], false).expect("write");
    r.take_snapshot(1, "s").expect("snapshot");
    let src = r.snapshot_file("s").expect("file");
    // A clone may be bigger than its source (zeros past its end), never smaller.
    let c = p
        .create_replica_from(&new("c1", 3 * MIB, true), Some(&src))
        .expect("clone");
    assert_eq!(c.size(), 3 * MIB);
    assert_eq!(read(&c, 0, MIB, 4096), vec![7; 4096]);
    assert_eq!(read(&c, 0, 2 * MIB, 4096), vec![0; 4096]);
    assert!(p
        .create_replica_from(&new("c2", MIB, true), Some(&src))
        .is_err());
    assert!(p.get("c2").is_none());
    // Thick clones too.
    let t = p
        .create_replica_from(&new("c3", 2 * MIB, false), Some(&src))
        .expect("thick clone");
    assert_eq!(read(&t, 0, MIB, 4096), vec![7; 4096]);
    // Deleting the snapshot and its replica leaves the clone readable, and after a reopen.
    r.delete_snapshot("s").expect("delete snapshot");
    drop(r);
    p.delete_replica("r1").expect("delete source");
    c.raise_epoch(1).expect("epoch");
    c.write(1, 0, &[3; 4096], false).expect("write clone");
    drop((c, t, p));
    let p = pool(&dir, 1.0, None);
    let c = p.get("c1").expect("clone reopened");
    assert_eq!(read(&c, 1, MIB, 4096), vec![7; 4096]);
    assert_eq!(read(&c, 1, 0, 4096), vec![3; 4096]);
}

#[test]
fn restore_puts_a_snapshots_data_back_and_refuses_a_replica_in_use() {
    let dir = TempDir::new("restore");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&new("r1", MIB, true)).expect("create");
    r.raise_epoch(1).expect("epoch");
    r.write(1, 0, &[1; 4096], false).expect("write");
    r.take_snapshot(1, "s").expect("snapshot");
    r.write(1, 0, &[2; 4096], false).expect("write");
    r.write(1, 8192, &[2; 4096], false).expect("write");
    assert!(matches!(
        p.restore_replica("r1", "s"),
        Err(StorageError::InUse { .. })
    ));
    drop(r);
    assert!(matches!(
        p.restore_replica("r1", "nope"),
        Err(StorageError::SnapshotNotFound { .. })
    ));
    let r = p.restore_replica("r1", "s").expect("restore");
    assert_eq!(read(&r, 1, 0, 4096), vec![1; 4096]);
    assert_eq!(read(&r, 1, 8192, 4096), vec![0; 4096]);
    assert_eq!(r.epoch(), 1, "the metadata is the replica's own");
    assert_eq!(r.snapshots().len(), 1, "the snapshot stays");
}

#[test]
fn snapshots_go_with_their_replica_to_the_trash_or_away_and_temporaries_are_cleaned() {
    let dir = TempDir::new("snap-trash");
    let p = pool(&dir, 1.0, None);
    for id in ["r1", "r2"] {
        let r = p.create_replica(&new(id, MIB, true)).expect("create");
        r.take_snapshot(0, "s").expect("snapshot");
    }
    let snaps = dir.0.join("replicas/r1.snaps");
    std::fs::write(snaps.join("half.clonetmp"), b"x").expect("leftover");
    drop(p);
    let p = pool(&dir, 1.0, None);
    assert!(!snaps.join("half.clonetmp").exists(), "cleaned at open");
    assert_eq!(p.get("r1").expect("r1").snapshots().len(), 1);
    p.delete_replica("r1").expect("delete");
    assert!(!snaps.exists(), "deleted with the replica");
    p.trash_replica("r2", 100).expect("trash");
    assert!(!dir.0.join("replicas/r2.snaps").exists());
    assert_eq!(p.trash().len(), 1);
    assert_eq!(p.purge_trash(200, 10), 1);
    let left: Vec<_> = std::fs::read_dir(dir.0.join("trash"))
        .expect("trash")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A replica that lacks a snapshot fetches it from a holder: its own data as the base, then
/// the blocks whose digests differ; the result is the holder's copy, byte for byte, and a
/// fetch that is dropped leaves nothing.
#[test]
fn a_snapshot_is_fetched_from_a_holder_by_its_differing_blocks() {
    use hawser_wire::frame::CHECKSUM_BLOCK_BYTES;
    let dir = TempDir::new("snapfetch");
    let p = pool(&dir, 1.0, None);
    let holder = p.create_replica(&new("h", 4 * MIB, true)).expect("create");
    let lacking = p.create_replica(&new("l", 4 * MIB, true)).expect("create");
    for r in [&holder, &lacking] {
        r.raise_epoch(2).expect("epoch");
        r.write(2, 0, &[1; 65536], false).expect("write");
    }
    holder.write(2, MIB, &[2; 4096], false).expect("write");
    holder.take_snapshot(2, "s1").expect("snapshot");
    // Written after the snapshot on the lacking replica (it came back in sync since).
    lacking.write(2, 0, &[3; 4096], false).expect("write");

    let src = holder.open_snapshot("s1").expect("open");
    let dropped = lacking
        .begin_snapshot_fetch("s1", src.size())
        .expect("begin");
    drop(dropped);
    assert!(
        lacking.snapshots().is_empty(),
        "a dropped fetch leaves nothing"
    );

    let fetch = lacking
        .begin_snapshot_fetch("s1", src.size())
        .expect("begin");
    let len = 4 * MIB as u32;
    let theirs = src.checksum(0, len).expect("checksum");
    let mine = fetch.digests(0, len).expect("digests");
    let mut fetched = 0;
    for (i, (a, b)) in theirs.chunks(16).zip(mine.chunks(16)).enumerate() {
        if a != b {
            let at = i as u64 * CHECKSUM_BLOCK_BYTES;
            let data = src.read(at, CHECKSUM_BLOCK_BYTES as u32).expect("read");
            fetch.write_at(at, &data).expect("write");
            fetched += 1;
        }
    }
    assert_eq!(
        fetched, 2,
        "the block written since and the block it lacked"
    );
    fetch.commit().expect("commit");
    let a = std::fs::read(holder.snapshot_file("s1").expect("file")).expect("read");
    let b = std::fs::read(lacking.snapshot_file("s1").expect("file")).expect("read");
    assert!(a == b, "the fetched copy is the holder's");
    assert!(matches!(
        lacking.begin_snapshot_fetch("s1", src.size()),
        Err(StorageError::SnapshotExists { .. })
    ));
    assert!(matches!(
        src.read(4 * MIB, 1),
        Err(crate::error::ReplicaIoError::OutOfRange)
    ));
}
