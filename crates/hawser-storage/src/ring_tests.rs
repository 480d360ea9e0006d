//! The ring against a real file with O_DIRECT: writes and reads that round-trip, FUA and
//! fdatasync, a full ring that refuses a reservation until a completion frees a slot, and the
//! completion arithmetic for short reads and writes, errors and zero-byte completions.

#![allow(clippy::cast_possible_truncation)] // test patterns wrap by design

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::mpsc;
use std::sync::Arc;

use super::*;
use crate::gate::EpochGate;

const BLOCK: usize = 4096;

#[test]
fn a_short_completion_asks_for_the_rest_and_a_full_one_ends() {
    let mut done = 0;
    assert!(matches!(advance(&mut done, 8192, 4096), Step::More));
    assert_eq!(done, 4096);
    assert!(matches!(advance(&mut done, 8192, 4096), Step::Done));
    assert_eq!(done, 8192);
}

#[test]
fn an_error_or_a_zero_byte_completion_fails_the_operation() {
    let mut done = 0;
    match advance(&mut done, 4096, -libc::EIO) {
        Step::Failed(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(advance(&mut done, 4096, 0), Step::Failed(_)));
    // A sync moves no bytes and is done.
    assert!(matches!(advance(&mut done, 0, 0), Step::Done));
}

/// A file opened for O_DIRECT in the target directory (tmpfs would refuse O_DIRECT).
fn direct_file(name: &str) -> (Arc<std::fs::File>, std::path::PathBuf) {
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("ring-{name}-{}", std::process::id()));
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("open O_DIRECT");
    f.set_len(1 << 20).expect("size");
    (Arc::new(f), path)
}

fn op(
    file: &Arc<std::fs::File>,
    gate: &Arc<EpochGate>,
    offset: u64,
    kind: Kind,
    tx: mpsc::Sender<Outcome>,
) -> Op {
    Op {
        fd: file.as_raw_fd(),
        offset,
        kind,
        keep: file.clone(),
        ticket: gate.enter(),
        finish: Box::new(move |o| tx.send(o).expect("test waits")),
    }
}

fn pattern(seed: u8) -> Bytes {
    let mut b = AlignedBuf::for_overwrite(BLOCK);
    b.as_mut_slice()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i as u8).wrapping_mul(7) ^ seed);
    b.into_bytes()
}

#[test]
fn writes_reads_and_syncs_round_trip_through_a_ring() {
    let Ok(ring) = Ring::start(8) else {
        eprintln!("SKIP: no io_uring on this kernel");
        return;
    };
    let (file, path) = direct_file("roundtrip");
    let gate = Arc::new(EpochGate::default());
    let (tx, rx) = mpsc::channel();
    for i in 0..4u8 {
        let kind = Kind::Write {
            data: pattern(i),
            dsync: i == 3,
        };
        let offset = u64::from(i) * BLOCK as u64 * 3;
        ring.reserve()
            .expect("room")
            .submit(op(&file, &gate, offset, kind, tx.clone()));
    }
    for _ in 0..4 {
        assert!(rx.recv().expect("completion").expect("write").is_none());
    }
    ring.reserve()
        .expect("room")
        .submit(op(&file, &gate, 0, Kind::SyncData, tx.clone()));
    assert!(rx.recv().expect("completion").expect("sync").is_none());
    for i in 0..4u8 {
        let offset = u64::from(i) * BLOCK as u64 * 3;
        let kind = Kind::Read(AlignedBuf::for_overwrite(BLOCK));
        ring.reserve()
            .expect("room")
            .submit(op(&file, &gate, offset, kind, tx.clone()));
        let buf = rx
            .recv()
            .expect("completion")
            .expect("read")
            .expect("a buffer");
        assert!(
            buf.as_slice() == &pattern(i)[..],
            "block {i} read back wrong"
        );
    }
    // Every ticket came back: an epoch change goes ahead.
    drop(gate.raise());
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_full_ring_refuses_until_a_completion_frees_a_slot() {
    let Ok(ring) = Ring::start(1) else {
        eprintln!("SKIP: no io_uring on this kernel");
        return;
    };
    let held = ring.reserve().expect("one slot");
    assert!(ring.reserve().is_none(), "a ring of one took two");
    let (file, path) = direct_file("full");
    let gate = Arc::new(EpochGate::default());
    let (tx, rx) = mpsc::channel();
    held.submit(op(&file, &gate, 0, Kind::SyncData, tx));
    rx.recv().expect("completion").expect("sync");
    // The slot is free again once the operation finished (it is freed before `finish`).
    assert!(ring.reserve().is_some());
    // A reservation dropped unused gives its slot back too.
    drop(ring.reserve().expect("free"));
    assert!(ring.reserve().is_some());
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_failed_operation_reports_the_error_and_frees_its_ticket() {
    let Ok(ring) = Ring::start(2) else {
        eprintln!("SKIP: no io_uring on this kernel");
        return;
    };
    let (file, path) = direct_file("error");
    let gate = Arc::new(EpochGate::default());
    let (tx, rx) = mpsc::channel();
    // O_DIRECT wants aligned offsets: 1 is refused by the kernel with EINVAL.
    let kind = Kind::Write {
        data: pattern(1),
        dsync: false,
    };
    ring.reserve()
        .expect("room")
        .submit(op(&file, &gate, 1, kind, tx));
    let Err(err) = rx.recv().expect("completion") else {
        panic!("a misaligned O_DIRECT write succeeded");
    };
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    drop(gate.raise());
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_panicking_callback_does_not_stop_the_completion_thread() {
    let Ok(ring) = Ring::start(2) else {
        eprintln!("SKIP: no io_uring on this kernel");
        return;
    };
    let (file, path) = direct_file("panic");
    let gate = Arc::new(EpochGate::default());
    let mut first = op(&file, &gate, 0, Kind::SyncData, mpsc::channel().0);
    first.finish = Box::new(|_| panic!("a callback that panics"));
    ring.reserve().expect("room").submit(first);
    let (tx, rx) = mpsc::channel();
    ring.reserve()
        .expect("room")
        .submit(op(&file, &gate, 0, Kind::SyncData, tx));
    rx.recv().expect("the second completion").expect("sync");
    drop(gate.raise());
    let _ = std::fs::remove_file(path);
}
