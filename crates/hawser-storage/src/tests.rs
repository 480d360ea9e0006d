//! Pool and replica tests on real files (in the cargo target directory, which supports
//! O_DIRECT, punch-hole and zero-range on ext4/xfs/btrfs).

// Test sizes are a few MiB, well inside u32.
#![allow(clippy::cast_possible_truncation)]

use std::path::PathBuf;

use crate::error::{ReplicaIoError, StorageError};
use crate::pool::{Pool, PoolConfig, PoolKind};
use crate::replica::NewReplica;

pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("hawser-storage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn pool(dir: &TempDir, ratio: f64, limit: Option<u64>) -> Pool {
    Pool::open(PoolConfig {
        name: "p".into(),
        path: dir.0.clone(),
        overprovision_ratio: ratio,
        capacity_limit: limit,
        kind: PoolKind::Any,
        boot_id: 1,
    })
    .expect("open pool")
}

pub(crate) fn new(id: &str, size: u64, thin: bool) -> NewReplica {
    NewReplica {
        key_check: None,
        checksums: false,
        wrapped_key: None,
        volume_uid: None,
        id: id.into(),
        volume: "vol".into(),
        size,
        thin,
        cluster: None,
    }
}

#[test]
fn write_read_persist_across_reopen() {
    let dir = TempDir::new("rw");
    {
        let p = pool(&dir, 1.0, None);
        let r = p.create_replica(&new("r1", 1 << 20, true)).expect("create");
        r.raise_epoch(3).expect("epoch");
        r.write(3, 4096, &[0x5a; 8192], false).expect("write");
        r.write(3, 512, &[1; 512], true)
            .expect("fua write of one sector");
        r.flush(3).expect("flush");
    }
    let p = pool(&dir, 1.0, None);
    let r = p.get("r1").expect("reopened");
    assert_eq!(r.epoch(), 3);
    assert_eq!(&r.read(3, 4096, 8192).expect("read")[..], &[0x5a; 8192][..]);
    assert_eq!(&r.read(3, 512, 512).expect("read")[..], &[1; 512][..]);
    assert_eq!(&r.read(3, 0, 512).expect("read")[..], &[0; 512][..]);
}

#[test]
fn stale_epochs_are_refused() {
    let dir = TempDir::new("epoch");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&new("r1", 1 << 20, true)).expect("create");
    r.raise_epoch(5).expect("raise");
    assert_eq!(
        r.write(4, 0, &[1; 4096], false),
        Err(ReplicaIoError::StaleEpoch {
            request: 4,
            replica: 5
        })
    );
    assert!(r.raise_epoch(4).is_err(), "epochs never go down");
    assert_eq!(
        &r.read(5, 0, 4096).expect("read")[..],
        &[0; 4096][..],
        "refused write landed"
    );
}

#[test]
fn range_and_alignment_checked() {
    let dir = TempDir::new("range");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&new("r1", 1 << 20, true)).expect("create");
    assert_eq!(
        r.write(0, (1 << 20) - 512, &[0; 1024], false),
        Err(ReplicaIoError::OutOfRange)
    );
    assert_eq!(
        r.write(0, 100, &[0; 512], false),
        Err(ReplicaIoError::OutOfRange)
    );
    assert_eq!(
        r.read(0, u64::MAX - 511, 512),
        Err(ReplicaIoError::OutOfRange)
    );
    assert_eq!(
        r.write(0, 0, &[0; 100], false),
        Err(ReplicaIoError::OutOfRange)
    );
}

#[test]
fn trim_and_write_zeroes_read_back_zero_and_free_space() {
    let dir = TempDir::new("trim");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&new("r1", 4 << 20, true)).expect("create");
    r.write(0, 0, &vec![9u8; 4 << 20], false).expect("fill");
    r.flush(0).expect("flush");
    let before = r.allocated_bytes();
    r.trim(0, 1 << 20, 1 << 20).expect("trim");
    r.write_zeroes(0, 2 << 20, 4096, true, false).expect("zero");
    assert!(r
        .read(0, 1 << 20, 1 << 20)
        .expect("read")
        .iter()
        .all(|&b| b == 0));
    assert!(r
        .read(0, 2 << 20, 4096)
        .expect("read")
        .iter()
        .all(|&b| b == 0));
    assert!(r.read(0, 0, 4096).expect("read").iter().all(|&b| b == 9));
    assert!(
        r.allocated_bytes() < before,
        "punch hole gave no space back"
    );
}

#[test]
fn thick_is_allocated_thin_is_sparse() {
    let dir = TempDir::new("alloc");
    let p = pool(&dir, 1.0, None);
    let thin = p
        .create_replica(&new("thin", 16 << 20, true))
        .expect("thin");
    let thick = p
        .create_replica(&new("thick", 16 << 20, false))
        .expect("thick");
    assert!(thin.allocated_bytes() < 1 << 20);
    assert!(thick.allocated_bytes() >= 16 << 20);
}

#[test]
fn capacity_is_accounted() {
    let dir = TempDir::new("cap");
    let p = pool(&dir, 2.0, Some(64 << 20));
    p.create_replica(&new("a", 100 << 20, true))
        .expect("within 2x overprovision");
    let err = p
        .create_replica(&new("b", 64 << 20, true))
        .expect_err("over the limit");
    assert!(
        matches!(err, StorageError::NoRoom { need, available, .. } if need == 64 << 20 && available == 28 << 20),
        "{err}"
    );
    let err = p
        .create_replica(&new("c", 128 << 20, false))
        .expect_err("thick needs real space");
    assert!(
        matches!(err, StorageError::NoRoom { kind: "thick", .. }),
        "{err}"
    );
    assert!(matches!(
        p.create_replica(&new("a", 4096, true)),
        Err(StorageError::ReplicaExists { .. })
    ));
    assert!(matches!(
        p.create_replica(&new("z", 1000, true)),
        Err(StorageError::InvalidSize { .. })
    ));
    assert!(matches!(
        p.create_replica(&new("../x", 4096, true)),
        Err(StorageError::InvalidId { .. })
    ));
    assert_eq!(p.list().len(), 1, "failed creates left something behind");
    p.delete_replica("a").expect("delete");
    assert!(p.list().is_empty());
    assert!(std::fs::read_dir(dir.0.join("replicas"))
        .expect("ls")
        .next()
        .is_none());
}

#[test]
fn capacity_limit_counts_the_pools_own_replicas() {
    // The filesystem has far more free space than the limit; thick replicas must still stop
    // at the limit.
    let dir = TempDir::new("limit");
    let p = pool(&dir, 1.0, Some(64 << 20));
    p.create_replica(&new("a", 40 << 20, false))
        .expect("first fits");
    let usage = p.usage().expect("usage");
    assert!(usage.free_bytes <= 24 << 20, "{usage:?}");
    let err = p
        .create_replica(&new("b", 40 << 20, false))
        .expect_err("past the limit");
    assert!(
        matches!(err, StorageError::NoRoom { kind: "thick", .. }),
        "{err}"
    );
    p.delete_replica("a").expect("delete");
    assert_eq!(p.usage().expect("usage").free_bytes, 64 << 20);
}

#[test]
fn pool_kind_is_enforced() {
    let dir = TempDir::new("kind");
    let open = |kind| {
        Pool::open(PoolConfig {
            name: "p".into(),
            path: dir.0.clone(),
            overprovision_ratio: 2.0,
            capacity_limit: None,
            kind,
            boot_id: 1,
        })
        .expect("open pool")
    };
    let thin_only = open(PoolKind::Thin);
    let err = thin_only
        .create_replica(&new("a", 1 << 20, false))
        .expect_err("thick in a thin pool");
    assert_eq!(err.to_string(), "pool \"p\" does not take thick replicas");
    thin_only
        .create_replica(&new("b", 1 << 20, true))
        .expect("thin in a thin pool");
    drop(thin_only);
    let thick_only = open(PoolKind::Thick);
    assert!(matches!(
        thick_only.create_replica(&new("c", 1 << 20, true)),
        Err(StorageError::WrongKind { kind: "thin", .. })
    ));
    thick_only
        .create_replica(&new("d", 1 << 20, false))
        .expect("thick in a thick pool");
}

#[test]
fn unfinished_create_is_cleaned_and_bad_replicas_do_not_stop_the_pool() {
    let dir = TempDir::new("crash");
    {
        let p = pool(&dir, 1.0, None);
        for id in ["good", "corrupt", "short"] {
            p.create_replica(&new(id, 1 << 20, true)).expect("create");
        }
    }
    let replicas = dir.0.join("replicas");
    std::fs::write(replicas.join("orphan.data"), b"x").expect("orphan");
    let meta = replicas.join("corrupt.meta");
    let mut raw = std::fs::read(&meta).expect("read meta");
    raw[30] ^= 0xff;
    std::fs::write(&meta, raw).expect("corrupt");
    std::fs::OpenOptions::new()
        .write(true)
        .open(replicas.join("short.data"))
        .and_then(|f| f.set_len(4096))
        .expect("truncate");

    let p = pool(&dir, 1.0, None);
    assert!(!replicas.join("orphan.data").exists());
    assert!(p.get("good").is_some());
    assert!(p.get("corrupt").is_none() && p.get("short").is_none());
    let broken = p.broken();
    let ids: Vec<&str> = broken.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(ids, ["corrupt", "short"]);
    assert!(broken[0].reason.contains("checksum"), "{:?}", broken[0]);
    assert_eq!(broken[0].volume, "", "unreadable metadata names no volume");
    assert!(broken[1].reason.contains("4096 bytes"), "{:?}", broken[1]);
    assert_eq!(broken[1].volume, "vol");
    // Left on disk, and their ids stay taken.
    assert!(meta.exists() && replicas.join("short.data").exists());
    assert!(matches!(
        p.create_replica(&new("short", 1 << 20, true)),
        Err(StorageError::ReplicaExists { .. })
    ));
}

#[test]
fn thin_replicas_allocate_whole_chunks_and_trim_frees_them() {
    use crate::replica::THIN_ALLOC_CHUNK_BYTES as CHUNK;
    let dir = TempDir::new("chunks");
    let p = pool(&dir, 1.0, None);
    let r = p
        .create_replica(&new("r1", 8 * CHUNK, true))
        .expect("create");
    r.write(0, CHUNK + 4096, &[3; 4096], false)
        .expect("write into chunk 1");
    let one = r.allocated_bytes();
    assert!(
        (CHUNK..2 * CHUNK).contains(&one),
        "expected one chunk allocated, got {one}"
    );
    r.write(0, CHUNK + 8192, &[4; 4096], false)
        .expect("second write, same chunk");
    assert_eq!(
        r.allocated_bytes(),
        one,
        "a write into an allocated chunk allocated more"
    );
    r.trim(0, CHUNK, CHUNK as u32).expect("trim chunk 1");
    assert!(r.allocated_bytes() < 4096, "trim did not free the chunk");
    r.write(0, CHUNK, &[5; 4096], false)
        .expect("write after trim");
    assert!(
        r.allocated_bytes() >= CHUNK,
        "chunk not re-allocated after trim"
    );
    assert_eq!(&r.read(0, CHUNK, 4096).expect("read")[..], &[5; 4096][..]);
    assert!(r
        .read(0, CHUNK + 4096, 4096)
        .expect("read")
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn trashed_replicas_leave_the_pool_keep_their_files_and_are_purged_after_the_grace() {
    let dir = TempDir::new("trash");
    let p = pool(&dir, 1.0, None);
    let r = p
        .create_replica(&new("orphan", 1 << 20, true))
        .expect("create");
    r.write(0, 0, &[7u8; 4096], false).expect("write");
    // In use: refused, nothing moved.
    assert!(matches!(
        p.trash_replica("orphan", 1000),
        Err(StorageError::InUse { .. })
    ));
    drop(r);
    p.trash_replica("orphan", 1000).expect("trash");
    assert!(p.get("orphan").is_none());
    assert!(matches!(
        p.trash_replica("nope", 1000),
        Err(StorageError::ReplicaNotFound { .. })
    ));
    let trashed = p.trash();
    assert_eq!(trashed.len(), 1, "{trashed:?}");
    assert_eq!(
        (trashed[0].id.as_str(), trashed[0].volume.as_str()),
        ("orphan", "vol")
    );
    assert_eq!(trashed[0].trashed_at_secs, 1000);
    let data = dir.0.join("trash/orphan.1000.data");
    assert_eq!(
        &std::fs::read(&data).expect("data kept")[..4096],
        &[7u8; 4096][..]
    );
    drop(p);
    let p = pool(&dir, 1.0, None);
    assert!(
        p.get("orphan").is_none() && p.broken().is_empty(),
        "not loaded again"
    );
    assert_eq!(p.purge_trash(1000 + 59, 60), 0, "within the grace");
    assert_eq!(p.trash().len(), 1);
    assert_eq!(p.purge_trash(1000 + 60, 60), 1);
    assert!(p.trash().is_empty() && !data.exists());
}

/// The io_uring forms (`start_read`, `start_write`) check what the synchronous
/// ones check, and their writes are what both forms read.
#[test]
fn ring_forms_check_epoch_and_range_and_round_trip() {
    use std::sync::mpsc;
    let dir = TempDir::new("ring");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&new("r1", 1 << 20, true)).expect("create");
    r.raise_epoch(3).expect("epoch");
    let (tx, rx) = mpsc::channel();
    let send = |tx: &mpsc::Sender<Result<(), ReplicaIoError>>| {
        let tx = tx.clone();
        move |res| tx.send(res).expect("test waits")
    };
    let data = bytes::Bytes::from(vec![0x5a; 8192]); // not page-aligned: copied for O_DIRECT
                                                     // The first write into a chunk of a thin replica allocates it: not on the ring (the
                                                     // caller's thread would wait for the filesystem), so the caller runs it.
    let Err(first) = r.start_write(3, 4096, data.clone(), false, send(&tx)) else {
        panic!("a write into an unallocated chunk went to the ring");
    };
    first(r.write(3, 4096, &data, false));
    rx.recv().expect("answer").expect("first write");
    if r.start_write(2, 4096, data.clone(), false, send(&tx))
        .is_err()
    {
        eprintln!("SKIP: no io_uring on this kernel");
        return;
    }
    assert!(matches!(
        rx.recv().expect("answer"),
        Err(ReplicaIoError::StaleEpoch {
            request: 2,
            replica: 3
        })
    ));
    assert!(r
        .start_write(3, 1 << 20, data.clone(), false, send(&tx))
        .is_ok());
    assert!(matches!(
        rx.recv().expect("answer"),
        Err(ReplicaIoError::OutOfRange)
    ));
    assert!(r
        .start_write(3, 4096, data.clone(), true, send(&tx))
        .is_ok());
    rx.recv().expect("answer").expect("write");
    let (rtx, rrx) = mpsc::channel();
    let read = move |res| rtx.send(res).expect("test waits");
    assert!(r.start_read(3, 0, 16384, read).is_ok());
    let got = rrx.recv().expect("answer").expect("read");
    assert!(got[..4096].iter().all(|&b| b == 0));
    assert!(got[4096..12288] == data[..]);
    assert_eq!(r.read(3, 4096, 8192).expect("sync read"), data);
    // Every ticket is back: the epoch can change.
    r.raise_epoch(4).expect("raise");
}

/// An encrypted volume's replica keeps its wrapped data key through a reopen, an epoch change
/// and a grow; a rotation's newer wrapping replaces it for good, an older one changes nothing, and
/// a plain replica takes none.
#[test]
fn the_wrapped_key_survives_reopen_and_only_moves_to_newer_keks() {
    use hawser_wire::meta::WrappedKey;
    let dir = TempDir::new("wrapped");
    let under = |kek: u32, fill: u8| WrappedKey {
        kek,
        sealed: vec![fill; 92],
    };
    {
        let p = pool(&dir, 1.0, None);
        let keyed = NewReplica {
            key_check: Some([7; 16]),
            wrapped_key: Some(under(1, 0xa1)),
            ..new("r1", 1 << 20, true)
        };
        let r = p.create_replica(&keyed).expect("create");
        assert_eq!(r.wrapped_key(), Some(under(1, 0xa1)));
        let plain = p.create_replica(&new("r2", 1 << 20, true)).expect("create");
        assert!(matches!(
            plain.set_wrapped_key(&under(2, 0xb2)),
            Err(StorageError::NotEncrypted { .. })
        ));
        assert_eq!(plain.wrapped_key(), None);
    }
    {
        let p = pool(&dir, 1.0, None);
        let r = p.get("r1").expect("reopened");
        assert_eq!(r.wrapped_key(), Some(under(1, 0xa1)));
        assert_eq!(r.key_check(), Some([7; 16]));
        r.raise_epoch(4).expect("epoch");
        p.grow_replica("r1", 2 << 20).expect("grow");
        r.set_wrapped_key(&under(3, 0xc3)).expect("rotated");
        r.set_wrapped_key(&under(3, 0xc3)).expect("the same again");
        r.set_wrapped_key(&under(2, 0xb2))
            .expect("an older one: kept as is");
        assert_eq!(r.wrapped_key(), Some(under(3, 0xc3)));
    }
    let p = pool(&dir, 1.0, None);
    let r = p.get("r1").expect("reopened");
    assert_eq!(r.wrapped_key(), Some(under(3, 0xc3)));
    assert_eq!((r.epoch(), r.size()), (4, 2 << 20));
    assert_eq!(p.get("r2").expect("plain").wrapped_key(), None);
}
