//! Block checksums on real files: reads that meet a block the disk changed fail with the
//! block and the count; writes, zeroes, trims, grows, clones and restores keep the sums right;
//! what a crash may leave apart is summed again at open, and nothing else is.

#![allow(clippy::cast_possible_truncation)]

use std::os::unix::fs::FileExt;

use hawser_wire::journal::{Journal, ACTIVITY_EXTENT_BYTES};

use crate::error::ReplicaIoError;
use crate::replica::NewReplica;
use crate::tests::{new, pool, TempDir};

const MIB: u64 = 1 << 20;

fn summed(id: &str, size: u64, thin: bool) -> NewReplica {
    NewReplica {
        checksums: true,
        wrapped_key: None,
        volume_uid: None,
        ..new(id, size, thin)
    }
}

/// Change bytes of the data file behind the replica's back (what a failing disk does).
fn rot(dir: &TempDir, id: &str, offset: u64, bytes: &[u8]) {
    let path = dir.0.join("replicas").join(format!("{id}.data"));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open data file");
    f.write_all_at(bytes, offset).expect("rot");
    f.sync_all().expect("sync");
}

fn journal(epoch: u64, size: u64, active: Vec<(u64, u64)>) -> Vec<u8> {
    Journal {
        epoch,
        seq: 1,
        size,
        extent_bytes: ACTIVITY_EXTENT_BYTES,
        chunk_bytes: 64 * 1024,
        active,
        out: Vec::new(),
    }
    .encode()
    .expect("encode journal")
}

#[test]
fn a_changed_block_fails_its_read_with_its_offset_and_count_until_rewritten() {
    let dir = TempDir::new("sums-rot");
    let p = pool(&dir, 1.0, None);
    let r = p
        .create_replica(&summed("r1", 2 * MIB, true))
        .expect("create");
    assert!(r.checksums());
    r.raise_epoch(1).expect("epoch");
    r.write(1, 0, &vec![0x11; 64 * 1024], false).expect("write");
    assert_eq!(
        r.read(1, 0, 65536).expect("read")[..],
        vec![0x11; 65536][..]
    );
    // Two blocks rot, one byte each, and a third in a hole (a thin replica's unwritten space).
    rot(&dir, "r1", 8192 + 17, &[0x12]);
    rot(&dir, "r1", 40960, &[0x12]);
    rot(&dir, "r1", MIB + 4096, &[1]);
    match r.read(1, 0, 65536) {
        Err(ReplicaIoError::Corrupt { offset, blocks }) => assert_eq!((offset, blocks), (8192, 2)),
        other => panic!("rotted read answered {other:?}"),
    }
    // A read of part of a bad block is checked whole; a read beside them passes.
    assert!(matches!(
        r.read(1, 8192 + 512, 512),
        Err(ReplicaIoError::Corrupt {
            offset: 8192,
            blocks: 1
        })
    ));
    assert_eq!(
        r.read(1, 12288, 4096).expect("good block")[..],
        [0x11; 4096][..]
    );
    assert!(matches!(
        r.read(1, MIB, 8192),
        Err(ReplicaIoError::Corrupt { offset, blocks: 1 }) if offset == MIB + 4096
    ));
    // A write into part of a bad block does not make its rotted bytes look right: the block
    // keeps failing (so the engine rewrites it whole from a good replica), and so does a
    // partial zeroing.
    r.write(1, 8192, &[0x11; 512], false).expect("sector write");
    assert!(matches!(
        r.read(1, 8192 + 1024, 512),
        Err(ReplicaIoError::Corrupt {
            offset: 8192,
            blocks: 1
        })
    ));
    r.write_zeroes(1, 40960 + 512, 512, false, false)
        .expect("partial zero");
    assert!(matches!(
        r.read(1, 40960, 4096),
        Err(ReplicaIoError::Corrupt {
            offset: 40960,
            blocks: 1
        })
    ));
    r.write(1, 40960 + 512, &[0x11; 512], false)
        .expect("sector write");
    // Rewriting a bad block whole makes it good again, as a repair does.
    r.write(1, 8192, &[0x11; 4096], true).expect("repair");
    r.write(1, 40960, &[0x11; 4096], true).expect("repair");
    r.write_zeroes(1, MIB, 8192, true, false).expect("zero");
    assert_eq!(
        r.read(1, 0, 65536).expect("read")[..],
        vec![0x11; 65536][..]
    );
    assert_eq!(r.read(1, MIB, 8192).expect("read")[..], [0; 8192][..]);
    // A replica without checksums reads whatever the disk returns.
    let plain = p.create_replica(&new("r2", MIB, true)).expect("create");
    plain.raise_epoch(1).expect("epoch");
    plain.write(1, 0, &[5; 4096], false).expect("write");
    rot(&dir, "r2", 0, &[6]);
    assert_eq!(plain.read(1, 0, 4096).expect("read")[0], 6);
}

#[test]
fn partial_writes_zeroes_and_trims_keep_sums_right_across_a_reopen() {
    let dir = TempDir::new("sums-partial");
    {
        let p = pool(&dir, 1.0, None);
        let r = p
            .create_replica(&summed("r1", 2 * MIB, false))
            .expect("create");
        r.raise_epoch(1).expect("epoch");
        r.write(1, 0, &vec![7; 32768], false).expect("write");
        r.write(1, 512, &[8; 1024], false).expect("sector write");
        r.write(1, 6144, &vec![9; 8192], false)
            .expect("unaligned write across blocks");
        r.write_zeroes(1, 20480 + 512, 4096, false, false)
            .expect("partial zero");
        r.trim(1, 24576, 4096).expect("trim");
        let mut want = vec![7u8; 32768];
        want[512..1536].fill(8);
        want[6144..14336].fill(9);
        want[20992..25088].fill(0);
        want[24576..28672].fill(0);
        assert_eq!(r.read(1, 0, 32768).expect("read")[..], want[..]);
        // What the journal covers is what a crash leaves unknown: nothing here (put an empty
        // one), so the sums must be durable for the reopen to check them.
        r.put_journal(1, &journal(1, 2 * MIB, Vec::new()))
            .expect("journal");
        drop(r);
        drop(p);
        let p = pool(&dir, 1.0, None);
        let r = p.get("r1").expect("reopened");
        assert_eq!(
            r.read(1, 0, 32768).expect("read after reopen")[..],
            want[..]
        );
    }
}

/// What a crash can leave apart: a block whose data landed and whose sum did not. Inside the
/// journal's activity log it is summed again at open; outside it, a block and sum that
/// disagree is rot, found by the next read.
#[test]
fn open_sums_again_what_the_journal_covers_and_nothing_else() {
    let dir = TempDir::new("sums-cover");
    {
        let p = pool(&dir, 1.0, None);
        let r = p
            .create_replica(&summed("r1", 12 * MIB, true))
            .expect("create");
        r.raise_epoch(1).expect("epoch");
        r.write(1, 0, &[1; 4096], false).expect("write");
        r.write(1, 8 * MIB, &[1; 4096], false).expect("write");
        // The first extent is active; the third is not.
        r.put_journal(1, &journal(1, 12 * MIB, vec![(0, 1)]))
            .expect("journal");
    }
    // "A crash": both blocks change with no sum written.
    rot(&dir, "r1", 0, &[2; 4096]);
    rot(&dir, "r1", 8 * MIB, &[2; 4096]);
    let p = pool(&dir, 1.0, None);
    let r = p.get("r1").expect("reopened");
    assert_eq!(
        r.read(1, 0, 4096).expect("covered: summed again")[..],
        [2; 4096][..]
    );
    assert!(matches!(
        r.read(1, 8 * MIB, 4096),
        Err(ReplicaIoError::Corrupt { blocks: 1, .. })
    ));
}

#[test]
fn a_missing_sums_file_is_made_again_and_grows_clones_and_restores_keep_sums() {
    let dir = TempDir::new("sums-life");
    let sums = |id: &str| dir.0.join("replicas").join(format!("{id}.sums"));
    {
        let p = pool(&dir, 1.0, None);
        let r = p.create_replica(&summed("r1", MIB, true)).expect("create");
        r.raise_epoch(1).expect("epoch");
        r.write(1, 4096, &[3; 4096], false).expect("write");
        r.put_journal(1, &journal(1, MIB, Vec::new()))
            .expect("journal");
    }
    std::fs::remove_file(sums("r1")).expect("remove sums");
    let p = pool(&dir, 1.0, None);
    let r = p.get("r1").expect("reopened");
    assert!(sums("r1").exists(), "made again at open");
    assert_eq!(r.read(1, 0, 8192).expect("read")[4096..], [3; 4096][..]);
    // A snapshot, a clone of it (summed from its data), a restore.
    r.take_snapshot(1, "s").expect("snapshot");
    r.write(1, 4096, &[4; 4096], false).expect("write");
    let src = r.snapshot_file("s").expect("file");
    let c = p
        .create_replica_from(&summed("c1", 2 * MIB, true), Some(&src))
        .expect("clone");
    c.raise_epoch(1).expect("epoch");
    assert_eq!(
        c.read(1, 4096, 4096).expect("clone read")[..],
        [3; 4096][..]
    );
    rot(&dir, "c1", 4096, &[9]);
    assert!(matches!(
        c.read(1, 4096, 4096),
        Err(ReplicaIoError::Corrupt { .. })
    ));
    drop(r);
    let r = p.restore_replica("r1", "s").expect("restore");
    assert_eq!(
        r.read(1, 4096, 4096).expect("restored read")[..],
        [3; 4096][..]
    );
    rot(&dir, "r1", 4096, &[9]);
    assert!(matches!(
        r.read(1, 4096, 4096),
        Err(ReplicaIoError::Corrupt { .. })
    ));
    r.write(1, 4096, &[3; 4096], false).expect("rewrite");
    // A grow: the new space reads as zeroes and is checked.
    drop(r);
    let r = p.grow_replica("r1", 2 * MIB).expect("grow");
    r.write(1, MIB + 8192, &[5; 4096], false)
        .expect("write past the old end");
    assert_eq!(
        r.read(1, MIB, 16384).expect("read")[8192..12288],
        [5; 4096][..]
    );
    rot(&dir, "r1", MIB + 8192, &[6]);
    assert!(matches!(
        r.read(1, MIB, 16384),
        Err(ReplicaIoError::Corrupt { offset, blocks: 1 }) if offset == MIB + 8192
    ));
    // Deleting the replica removes its sums.
    drop(r);
    p.delete_replica("r1").expect("delete");
    assert!(!sums("r1").exists());
}

/// The io_uring forms check and sum too; parts of blocks and FUA writes outside the journal
/// go to the caller's thread (`read`/`write`).
#[test]
fn ring_forms_check_and_sum() {
    use std::sync::mpsc;
    let dir = TempDir::new("sums-ring");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&summed("r1", MIB, false)).expect("create");
    r.raise_epoch(1).expect("epoch");
    let data = bytes::Bytes::from(vec![0x5a; 8192]);
    let (tx, rx) = mpsc::channel();
    let w = {
        let tx = tx.clone();
        move |res| tx.send(res).expect("test waits")
    };
    if r.start_write(1, 4096, data.clone(), false, w).is_err() {
        eprintln!("SKIP: no io_uring on this kernel");
        return;
    }
    rx.recv().expect("answer").expect("ring write");
    let part = {
        let tx = tx.clone();
        move |res| tx.send(res).expect("test waits")
    };
    assert!(r
        .start_write(1, 512, data.slice(..512), false, part)
        .is_err());
    let fua = move |res| tx.send(res).expect("test waits");
    assert!(
        r.start_write(1, 4096, data.clone(), true, fua).is_err(),
        "a FUA write outside the journal syncs its sums on the pool"
    );
    let (rtx, rrx) = mpsc::channel();
    let read = {
        let rtx = rtx.clone();
        move |res| rtx.send(res).expect("test waits")
    };
    assert!(r.start_read(1, 0, 16384, read).is_ok());
    assert_eq!(
        rrx.recv().expect("answer").expect("read")[4096..12288],
        data[..]
    );
    rot(&dir, "r1", 8192, &[0]);
    let read = move |res| rtx.send(res).expect("test waits");
    assert!(r.start_read(1, 0, 16384, read).is_ok());
    assert!(matches!(
        rrx.recv().expect("answer"),
        Err(ReplicaIoError::Corrupt {
            offset: 8192,
            blocks: 1
        })
    ));
}
