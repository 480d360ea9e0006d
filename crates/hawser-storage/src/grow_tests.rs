//! Growing a replica in place (`Pool::grow_replica`, `Replica::grow`) while sessions hold it:
//! through the object they hold, the new range is refused before the grow and served after
//! (zeroes that pass their checksums), writes running meanwhile all land, the size is durable,
//! and a grow the pool has no room for changes nothing.

// Test sizes are a few MiB, well inside u32.
#![allow(clippy::cast_possible_truncation)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};

use bytes::Bytes;

use crate::error::{ReplicaIoError, StorageError};
use crate::replica::{NewReplica, Replica, THIN_ALLOC_CHUNK_BYTES};
use crate::tests::{new, pool, TempDir};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;

fn summed(id: &str, size: u64, thin: bool) -> NewReplica {
    NewReplica {
        checksums: true,
        wrapped_key: None,
        volume_uid: None,
        ..new(id, size, thin)
    }
}

fn journal(epoch: u64, size: u64) -> Vec<u8> {
    use hawser_wire::frame::CHECKSUM_BLOCK_BYTES;
    use hawser_wire::journal::{Journal, ACTIVITY_EXTENT_BYTES};
    Journal {
        epoch,
        seq: 1,
        size,
        extent_bytes: ACTIVITY_EXTENT_BYTES,
        chunk_bytes: CHECKSUM_BLOCK_BYTES,
        active: Vec::new(),
        out: Vec::new(),
    }
    .encode()
    .expect("encode")
}

/// A write as the replica server runs it: on the io_uring, or on this thread when the ring
/// cannot take it (no ring, a chunk to allocate, part of a block).
fn ring_write(
    r: &Arc<Replica>,
    epoch: u64,
    offset: u64,
    data: &[u8],
) -> Result<(), ReplicaIoError> {
    let (tx, rx) = mpsc::channel();
    let data = Bytes::copy_from_slice(data);
    let done = move |res| tx.send(res).expect("test waits");
    if let Err(done) = r.start_write(epoch, offset, data.clone(), false, done) {
        done(r.write(epoch, offset, &data, false));
    }
    rx.recv().expect("answer")
}

/// A read as the replica server runs it (see `ring_write`).
fn ring_read(r: &Arc<Replica>, epoch: u64, offset: u64, len: u32) -> Result<Bytes, ReplicaIoError> {
    let (tx, rx) = mpsc::channel();
    let done = move |res| tx.send(res).expect("test waits");
    if let Err(done) = r.start_read(epoch, offset, len, done) {
        done(r.read(epoch, offset, len));
    }
    rx.recv().expect("answer")
}

/// What an attached volume's session does: it holds the replica's `Arc` for its whole life.
/// A grow used to refuse such a replica (`InUse`); now the held object itself grows, and a
/// session that is already open writes into the new range without a new Hello.
#[test]
fn a_replica_held_by_a_session_grows_in_place_and_serves_the_new_range_through_it() {
    let dir = TempDir::new("growheld");
    let p = pool(&dir, 1.0, None);
    for (id, thin) in [("thin", true), ("thick", false)] {
        let held = p.create_replica(&summed(id, MIB, thin)).expect("create");
        held.raise_epoch(1).expect("epoch");
        held.write(1, MIB - BLOCK, &[0x77; 4096], false)
            .expect("write at the old end");
        let refused = Err(ReplicaIoError::OutOfRange);
        assert_eq!(held.write(1, MIB, &[1; 4096], false), refused, "{id}");
        assert_eq!(ring_write(&held, 1, 2 * MIB, &[2; 8192]), refused, "{id}");
        assert_eq!(held.read(1, MIB, 4096), Err(ReplicaIoError::OutOfRange));
        assert_eq!(held.put_journal(1, &journal(1, 3 * MIB)), refused, "{id}");

        let grown = p.grow_replica(id, 3 * MIB).expect("grow a held replica");
        assert!(
            Arc::ptr_eq(&grown, &held),
            "{id}: the pool swapped the object"
        );
        assert!(
            Arc::ptr_eq(&p.get(id).expect("in the pool"), &held),
            "{id}: the pool serves the object the session holds"
        );
        assert_eq!(held.size(), 3 * MIB, "{id}");
        held.put_journal(1, &journal(1, 3 * MIB))
            .expect("a journal of the grown size");
        held.write(1, MIB, &[1; 4096], false)
            .expect("a write into the new range");
        ring_write(&held, 1, 3 * MIB - 8192, &[2; 8192]).expect("a ring write at the new end");
        assert_eq!(held.read(1, MIB, 4096).expect("read")[..], [1; 4096][..]);
        // The allocation bitmap covers the new range: a write into a chunk of it already
        // allocated runs on the io_uring, not on the I/O pool.
        if crate::ring::global().is_some() {
            let (tx, rx) = mpsc::channel();
            let done = move |res| tx.send(res).expect("test waits");
            let data = Bytes::from(vec![4; 4096]);
            let on_ring = held.start_write(1, MIB + BLOCK, data, false, done).is_ok();
            assert!(
                on_ring,
                "{id}: a write into an allocated chunk left the ring"
            );
            rx.recv().expect("answer").expect("ring write");
        }
        let end = ring_read(&held, 1, 3 * MIB - 8192, 8192).expect("ring read at the new end");
        assert_eq!(end[..], [2; 8192][..], "{id}");
        assert_eq!(
            held.read(1, MIB - BLOCK, 4096).expect("read the old end")[..],
            [0x77; 4096][..]
        );
        // Never written: zeroes, whose sums (a hole in the sums file) pass the check.
        let untouched = held
            .read(1, MIB + 2 * BLOCK, 64 * 1024)
            .expect("checked read");
        assert!(untouched.iter().all(|&b| b == 0), "{id}");
        let untouched = ring_read(&held, 1, 2 * MIB, 64 * 1024).expect("checked ring read");
        assert!(untouched.iter().all(|&b| b == 0), "{id}");
        held.checksum(1, 2 * MIB, 64 * 1024)
            .expect("digests of the new range");
        assert_eq!(
            held.write(1, 3 * MIB, &[3; 4096], false),
            refused,
            "{id}: past the new end"
        );
        if !thin {
            assert!(
                held.allocated_bytes() >= 3 * MIB,
                "a thick replica stays thick"
            );
        }
    }
}

/// Writes into the old range keep running on two threads while the replica grows four
/// times; each grow waits for a round of writes to have landed since the one before, so
/// grows and writes interleave. Every block then reads back what was last written to it.
#[test]
fn writes_running_while_a_replica_grows_all_read_back() {
    const OLD: u64 = 2 * MIB;
    const BLOCKS: u64 = OLD / BLOCK;
    let dir = TempDir::new("growwhile");
    let p = pool(&dir, 1.0, None);
    for (id, thin) in [("thin", true), ("thick", false)] {
        let r = p.create_replica(&summed(id, OLD, thin)).expect("create");
        r.raise_epoch(1).expect("epoch");
        let start = Arc::new(Barrier::new(3));
        let stop = Arc::new(AtomicBool::new(false));
        let (progress, rounds) = mpsc::channel();
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (r, start, stop, progress) =
                    (r.clone(), start.clone(), stop.clone(), progress.clone());
                std::thread::spawn(move || {
                    let mut last = vec![0u8; BLOCKS as usize];
                    start.wait();
                    let mut round = 0u64;
                    // At least one round after the last grow.
                    while !stop.load(Ordering::Acquire) || round == 0 {
                        for b in (w..BLOCKS).step_by(2) {
                            let v = ((round * 31 + b) % 255 + 1) as u8;
                            let data = [v; 4096];
                            if b % 4 < 2 {
                                r.write(1, b * BLOCK, &data, false)
                            } else {
                                ring_write(&r, 1, b * BLOCK, &data)
                            }
                            .expect("a write into the old range during a grow");
                            last[b as usize] = v;
                        }
                        round += 1;
                        // The receiver may have gone once the grows are done.
                        let _ = progress.send(w);
                    }
                    last
                })
            })
            .collect();
        drop(progress);
        start.wait();
        for step in 1..=4 {
            rounds.recv().expect("a writer finished a round");
            let size = OLD + step * MIB;
            p.grow_replica(id, size).expect("grow while writes run");
            assert_eq!(r.size(), size);
        }
        stop.store(true, Ordering::Release);
        let mut last = vec![0u8; BLOCKS as usize];
        for (w, t) in writers.into_iter().enumerate() {
            let theirs = t.join().expect("writer");
            for b in (w..BLOCKS as usize).step_by(2) {
                last[b] = theirs[b];
            }
        }
        r.flush(1).expect("flush");
        for b in 0..BLOCKS {
            let got = r.read(1, b * BLOCK, 4096).expect("checked read back");
            let want = last[b as usize];
            assert!(
                want != 0 && got.iter().all(|&x| x == want),
                "{id}: block {b}"
            );
        }
        let new = r.read(1, OLD, 64 * 1024).expect("read the grown range");
        assert!(new.iter().all(|&b| b == 0), "{id}");
    }
}

/// A grow past the pool's room (thin: the overprovision limit; thick: the free bytes within
/// the capacity limit) is refused, and leaves the replica, its file and its metadata as they
/// were; one that fits still grows.
#[test]
fn a_grow_the_pool_has_no_room_for_is_refused_and_changes_nothing() {
    let dir = TempDir::new("grownoroom");
    {
        let p = pool(&dir, 1.0, Some(8 * MIB));
        let thin = p.create_replica(&new("thin", MIB, true)).expect("thin");
        let thick = p
            .create_replica(&new("thick", 2 * MIB, false))
            .expect("thick");
        for (r, kind, asked) in [(&thin, "thin", 16 * MIB), (&thick, "thick", 16 * MIB)] {
            let old = r.size();
            let err = p
                .grow_replica(r.id(), asked)
                .expect_err("over the pool's limit");
            assert!(
                matches!(err, StorageError::NoRoom { kind: k, need, .. } if k == kind && need == asked - old),
                "{err}"
            );
            assert_eq!(r.size(), old, "{kind}: a refused grow changed the size");
            let len = std::fs::metadata(r.data_path()).expect("stat").len();
            assert_eq!(len, old, "{kind}: a refused grow changed the data file");
        }
        p.grow_replica("thick", 4 * MIB).expect("a grow that fits");
    }
    let p = pool(&dir, 1.0, Some(8 * MIB));
    assert_eq!(p.get("thin").expect("thin").size(), MIB);
    assert_eq!(p.get("thick").expect("thick").size(), 4 * MIB);
}

/// A thin replica whose old end cut a chunk had that chunk allocated only up to the end; a
/// write past it after a grow allocates the rest of the chunk, as into any other chunk.
#[test]
fn a_grow_from_inside_a_chunk_allocates_the_rest_of_that_chunk_on_the_next_write() {
    let dir = TempDir::new("growchunk");
    let p = pool(&dir, 1.0, None);
    let r = p
        .create_replica(&new("a", THIN_ALLOC_CHUNK_BYTES + BLOCK, true))
        .expect("create");
    r.raise_epoch(1).expect("epoch");
    r.write(1, THIN_ALLOC_CHUNK_BYTES, &[1; 4096], false)
        .expect("the last block");
    p.grow_replica("a", 3 * THIN_ALLOC_CHUNK_BYTES)
        .expect("grow");
    r.write(1, THIN_ALLOC_CHUNK_BYTES + 2 * BLOCK, &[2; 4096], false)
        .expect("past the old end, in the same chunk");
    assert!(
        r.allocated_bytes() >= THIN_ALLOC_CHUNK_BYTES,
        "the chunk the old end cut was not allocated whole: {} bytes",
        r.allocated_bytes()
    );
}

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
            let g = p.grow_replica(id, 3 << 20).expect("grow");
            assert!(Arc::ptr_eq(&g, &r), "grown in place, not opened again");
            assert_eq!(r.size(), 3 << 20);
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
            for bad in [0, (4 << 20) + 1] {
                assert!(matches!(
                    p.grow_replica(id, bad),
                    Err(StorageError::InvalidSize { .. })
                ));
            }
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
    let dir = TempDir::new("growjournal");
    let p = pool(&dir, 1.0, None);
    p.create_replica(&new("a", 1 << 20, true)).expect("create");
    let r = p.grow_replica("a", 2 << 20).expect("grow");
    r.raise_epoch(2).expect("epoch");
    let journal = |size: u64| journal(2, size);
    r.put_journal(2, &journal(1 << 20))
        .expect("the volume's size");
    r.put_journal(2, &journal(2 << 20))
        .expect("the replica's size");
    assert_eq!(
        r.put_journal(2, &journal(4 << 20)),
        Err(ReplicaIoError::OutOfRange)
    );
}

/// The allocation bitmap's first segment covers 4 GiB (`chunk_bits.rs`): a thin replica
/// grown past that gets bits for the new chunks, so a write into a chunk of the new range
/// that is already allocated runs on the io_uring like any other, not on the I/O pool.
#[test]
fn a_thin_replica_grown_past_4_gib_knows_which_new_chunks_are_allocated() {
    const GIB: u64 = 1 << 30;
    let dir = TempDir::new("growbig");
    let p = pool(&dir, 1.0, None);
    let r = p.create_replica(&summed("a", MIB, true)).expect("create");
    r.raise_epoch(1).expect("epoch");
    p.grow_replica("a", 6 * GIB).expect("grow past 4 GiB");
    let at = 5 * GIB;
    r.write(1, at, &[1; 4096], false)
        .expect("allocates its chunk");
    assert!(r.allocated_bytes() >= THIN_ALLOC_CHUNK_BYTES);
    if crate::ring::global().is_none() {
        eprintln!("SKIP: no io_uring on this kernel");
        return;
    }
    let (tx, rx) = mpsc::channel();
    let done = move |res| tx.send(res).expect("test waits");
    let data = Bytes::from(vec![2; 4096]);
    let on_ring = r.start_write(1, at + BLOCK, data, false, done).is_ok();
    assert!(
        on_ring,
        "a write into an allocated chunk past 4 GiB left the ring"
    );
    rx.recv().expect("answer").expect("ring write");
    assert_eq!(r.read(1, at, 8192).expect("read")[4096..], [2; 4096][..]);
}
