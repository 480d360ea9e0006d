//! Growing a replica (`Pool::grow_replica`): the data is kept, the new range reads as zeroes,
//! the size is durable, and a grow cut short by a crash is undone at open.

// Test sizes are a few MiB, well inside u32.
#![allow(clippy::cast_possible_truncation)]

use crate::error::{ReplicaIoError, StorageError};
use crate::tests::{new, pool, TempDir};

#[test]
fn grow_keeps_data_reads_zeros_past_the_old_end_and_persists() {
    let dir = TempDir::new("grow");
    {
        let p = pool(&dir, 1.0, None);
        for (id, thin) in [("thin", true), ("thick", false)] {
            let r = p.create_replica(&new(id, 1 << 20, thin)).expect("create");
            r.raise_epoch(1).expect("epoch");
            r.write(1, (1 << 20) - 4096, &[0x77; 4096], true)
                .expect("write at the end");
            drop(r);
            let g = p.grow_replica(id, 3 << 20).expect("grow");
            assert_eq!(g.size(), 3 << 20);
            assert_eq!(
                &g.read(1, (1 << 20) - 4096, 4096).expect("read")[..],
                &[0x77; 4096][..]
            );
            assert_eq!(
                &g.read(1, 1 << 20, 8192).expect("read new range")[..],
                &[0; 8192][..]
            );
            g.write(1, (3 << 20) - 4096, &[0x11; 4096], true)
                .expect("write in the new range");
            if !thin {
                assert!(
                    g.allocated_bytes() >= 3 << 20,
                    "a thick replica stays thick"
                );
            }
            assert_eq!(
                p.grow_replica(id, 3 << 20).expect("same size").size(),
                3 << 20
            );
            // Smaller than the replica: nothing changes (the volume record refuses shrinks).
            assert_eq!(p.grow_replica(id, 1 << 20).expect("no-op").size(), 3 << 20);
            assert!(matches!(
                p.grow_replica(id, (4 << 20) + 1),
                Err(StorageError::InvalidSize { .. })
            ));
        }
        assert!(matches!(
            p.grow_replica("nosuch", 4 << 20),
            Err(StorageError::ReplicaNotFound { .. })
        ));
    }
    let p = pool(&dir, 1.0, None);
    for id in ["thin", "thick"] {
        let r = p.get(id).expect("reopened");
        assert_eq!(r.size(), 3 << 20, "{id}: the new size is durable");
        assert_eq!(
            &r.read(1, (3 << 20) - 4096, 4096).expect("read")[..],
            &[0x11; 4096][..]
        );
    }
}

#[test]
fn grow_refuses_a_replica_in_use_and_past_the_pools_room() {
    let dir = TempDir::new("growbusy");
    let p = pool(&dir, 1.0, Some(8 << 20));
    let held = p.create_replica(&new("a", 1 << 20, true)).expect("create");
    let err = p
        .grow_replica("a", 2 << 20)
        .expect_err("an engine holds it");
    assert!(matches!(err, StorageError::InUse { .. }), "{err}");
    assert_eq!(held.size(), 1 << 20);
    drop(held);
    let err = p
        .grow_replica("a", 16 << 20)
        .expect_err("over the pool's limit");
    assert!(
        matches!(err, StorageError::NoRoom { need, .. } if need == 15 << 20),
        "{err}"
    );
    assert_eq!(
        p.get("a").expect("a").size(),
        1 << 20,
        "a refused grow changed the size"
    );
}

#[test]
fn a_grow_cut_short_before_its_metadata_is_undone_at_open() {
    let dir = TempDir::new("growcrash");
    {
        let p = pool(&dir, 1.0, None);
        p.create_replica(&new("a", 1 << 20, true)).expect("create");
    }
    // The data file grew, the metadata did not: what a crash between the two leaves.
    let data = dir.0.join("replicas").join("a.data");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .expect("open data");
    f.set_len(2 << 20).expect("grow data file");
    drop(f);
    let p = pool(&dir, 1.0, None);
    assert_eq!(p.get("a").expect("opens").size(), 1 << 20);
    assert_eq!(std::fs::metadata(&data).expect("stat").len(), 1 << 20);
}

/// A replica grown by an expand that stopped before the volume record keeps taking the
/// journals of the volume's (smaller) engines; a journal larger than the replica is refused.
#[test]
fn a_grown_replica_accepts_journals_of_the_smaller_volume() {
    use hawser_wire::frame::CHECKSUM_BLOCK_BYTES;
    use hawser_wire::journal::{Journal, ACTIVITY_EXTENT_BYTES};
    let dir = TempDir::new("growjournal");
    let p = pool(&dir, 1.0, None);
    p.create_replica(&new("a", 1 << 20, true)).expect("create");
    let r = p.grow_replica("a", 2 << 20).expect("grow");
    r.raise_epoch(2).expect("epoch");
    let journal = |size: u64| {
        Journal {
            epoch: 2,
            seq: 1,
            size,
            extent_bytes: ACTIVITY_EXTENT_BYTES,
            chunk_bytes: CHECKSUM_BLOCK_BYTES,
            active: Vec::new(),
            out: Vec::new(),
        }
        .encode()
        .expect("encode")
    };
    r.put_journal(2, &journal(1 << 20))
        .expect("the volume's size");
    r.put_journal(2, &journal(2 << 20))
        .expect("the replica's size");
    assert_eq!(
        r.put_journal(2, &journal(4 << 20)),
        Err(ReplicaIoError::OutOfRange)
    );
}
