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

/// A ring of `entries`, a file opened for O_DIRECT in the target directory (tmpfs would refuse
/// O_DIRECT), removed on drop, and an epoch gate; `None` (the test skips) without io_uring.
struct Fixture {
    ring: &'static Ring,
    file: Arc<std::fs::File>,
    path: std::path::PathBuf,
    gate: Arc<EpochGate>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn fixture(entries: u32, name: &str) -> Option<Fixture> {
    let Ok(ring) = Ring::start(entries) else {
        eprintln!("SKIP: no io_uring on this kernel");
        return None;
    };
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
    Some(Fixture {
        ring,
        file: Arc::new(f),
        path,
        gate: Arc::new(EpochGate::default()),
    })
}

impl Fixture {
    /// An operation on the file whose outcome goes to `tx`.
    fn op(&self, offset: u64, kind: Kind, tx: mpsc::Sender<Outcome>) -> Op {
        Op {
            fd: self.file.as_raw_fd(),
            offset,
            kind,
            keep: self.file.clone(),
            ticket: self.gate.enter(),
            finish: Box::new(move |o| tx.send(o).expect("test waits")),
        }
    }

    /// Submit `op` in a free slot.
    fn submit(&self, op: Op) {
        self.ring.reserve().expect("room").submit(op);
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
    let Some(f) = fixture(8, "roundtrip") else {
        return;
    };
    let (tx, rx) = mpsc::channel();
    for i in 0..4u8 {
        let kind = Kind::Write {
            data: pattern(i),
            dsync: i == 3,
        };
        f.submit(f.op(u64::from(i) * BLOCK as u64 * 3, kind, tx.clone()));
    }
    for _ in 0..4 {
        assert!(rx.recv().expect("completion").expect("write").is_none());
    }
    f.submit(f.op(0, Kind::SyncData, tx.clone()));
    assert!(rx.recv().expect("completion").expect("sync").is_none());
    for i in 0..4u8 {
        let kind = Kind::Read(AlignedBuf::for_overwrite(BLOCK));
        f.submit(f.op(u64::from(i) * BLOCK as u64 * 3, kind, tx.clone()));
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
    drop(f.gate.raise());
}

#[test]
fn a_full_ring_refuses_until_a_completion_frees_a_slot() {
    let Some(f) = fixture(1, "full") else { return };
    let held = f.ring.reserve().expect("one slot");
    assert!(f.ring.reserve().is_none(), "a ring of one took two");
    let (tx, rx) = mpsc::channel();
    held.submit(f.op(0, Kind::SyncData, tx));
    rx.recv().expect("completion").expect("sync");
    // The slot is free again once the operation finished (it is freed before `finish`).
    assert!(f.ring.reserve().is_some());
    // A reservation dropped unused gives its slot back too.
    drop(f.ring.reserve().expect("free"));
    assert!(f.ring.reserve().is_some());
}

#[test]
fn a_failed_operation_reports_the_error_and_frees_its_ticket() {
    let Some(f) = fixture(2, "error") else { return };
    let (tx, rx) = mpsc::channel();
    // O_DIRECT wants aligned offsets: 1 is refused by the kernel with EINVAL.
    let kind = Kind::Write {
        data: pattern(1),
        dsync: false,
    };
    f.submit(f.op(1, kind, tx));
    let Err(err) = rx.recv().expect("completion") else {
        panic!("a misaligned O_DIRECT write succeeded");
    };
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    drop(f.gate.raise());
}

#[test]
fn a_panicking_callback_does_not_stop_the_completion_thread() {
    let Some(f) = fixture(2, "panic") else { return };
    let mut first = f.op(0, Kind::SyncData, mpsc::channel().0);
    first.finish = Box::new(|_| panic!("a callback that panics"));
    f.submit(first);
    let (tx, rx) = mpsc::channel();
    f.submit(f.op(0, Kind::SyncData, tx));
    rx.recv().expect("the second completion").expect("sync");
    drop(f.gate.raise());
}
