//! Which way should a replica's 4k O_DIRECT writes reach the disk? A measurement for issue 18
//! ("use io_uring where it pays; decide by measurement"), run on the machine itself:
//!
//! ```text
//! cargo run --release -p hawser-storage --example disk_paths -- FILE [SECONDS]
//! ```
//!
//! FILE is created (or reused) at 1 GiB and written in full first, so no run pays for block
//! allocation. Then, for queue depths 1, 16 and 128, 4k random writes with O_DIRECT go
//! through each of two paths for SECONDS (default 5):
//!
//! - **pool**: what the agent does today. One submitting thread (a runtime worker) hands each
//!   write to a pool of 16 threads (a mutex and a condition variable), which `pwrite`s it and
//!   hands the completion back the same way.
//! - **uring**: one thread keeps the queue full on an io_uring: it submits, waits for at least
//!   one completion, reaps all there are, and submits their successors, in one system call per
//!   round.
//!
//! For each it prints IOPS, CPU time (user + system, all threads of the process, from
//! getrusage) per write, and context switches per write.
//!
//! With `DISK_PATHS_UNWRITTEN=1` every run starts on a file whose blocks are allocated but
//! never written (punched, then fallocated: unwritten extents, as a replica's first writes
//! into a chunk it just allocated find them).

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hawser_storage::AlignedBuf;
use io_uring::{opcode, types, IoUring};

const FILE_BYTES: u64 = 1 << 30;
const BLOCK: usize = 4096;
const POOL_THREADS: usize = 16;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: disk_paths FILE [SECONDS]");
        std::process::exit(2);
    };
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    prepare(&path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {path} with O_DIRECT: {e}"));
    let file = Arc::new(file);
    let unwritten = std::env::var_os("DISK_PATHS_UNWRITTEN").is_some_and(|v| v == "1");
    println!("path   qd   IOPS     CPU us/write  switches/write");
    for qd in [1usize, 16, 128] {
        for (name, run) in [("pool", pool as Runner), ("uring", uring as Runner)] {
            if unwritten {
                make_unwritten(&file);
            }
            let before = usage();
            let start = Instant::now();
            let writes = run(&file, qd, Duration::from_secs(secs));
            let elapsed = start.elapsed().as_secs_f64();
            let after = usage();
            let n = writes as f64;
            println!(
                "{name:<6} {qd:<4} {:<8.0} {:<13.1} {:.2}",
                n / elapsed,
                (after.0 - before.0) * 1e6 / n,
                (after.1 - before.1) / n,
            );
        }
    }
}

type Runner = fn(&Arc<std::fs::File>, usize, Duration) -> u64;

/// Create FILE at full size and write every block once (no allocation during the runs).
fn prepare(path: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("create {path}: {e}"));
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len == FILE_BYTES {
        return;
    }
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..FILE_BYTES / chunk.len() as u64 {
        f.write_all(&chunk).expect("fill the file");
    }
    f.sync_all().expect("sync the file");
}

/// Deallocate the whole file, then allocate it again without writing it.
fn make_unwritten(file: &std::fs::File) {
    let len = i64::try_from(FILE_BYTES).expect("file size");
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a descriptor `file` owns, with no pointers involved.
    let punched = unsafe { libc::fallocate(file.as_raw_fd(), mode, 0, len) };
    assert_eq!(punched, 0, "punch: {}", std::io::Error::last_os_error());
    // SAFETY: as above.
    let allocated = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, len) };
    assert_eq!(
        allocated,
        0,
        "fallocate: {}",
        std::io::Error::last_os_error()
    );
}

/// Process CPU seconds (user + system) and context switches (voluntary + not) so far.
fn usage() -> (f64, f64) {
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0, "getrusage");
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        secs(u.ru_utime) + secs(u.ru_stime),
        (u.ru_nvcsw + u.ru_nivcsw) as f64,
    )
}

/// A cheap deterministic sequence of block-aligned offsets.
struct Offsets(u64);
impl Offsets {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % (FILE_BYTES / BLOCK as u64)) * BLOCK as u64
    }
}

/// A queue and the condition variable its consumers sleep on.
struct Handoff<T> {
    items: Mutex<(VecDeque<T>, bool)>,
    ready: Condvar,
}

impl<T> Handoff<T> {
    fn new() -> Arc<Handoff<T>> {
        Arc::new(Handoff {
            items: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
        })
    }
    fn push(&self, item: T) {
        self.items.lock().expect("lock").0.push_back(item);
        self.ready.notify_one();
    }
    fn close(&self) {
        self.items.lock().expect("lock").1 = true;
        self.ready.notify_all();
    }
    /// The next item, or `None` once closed and empty.
    fn pop(&self) -> Option<T> {
        let mut g = self.items.lock().expect("lock");
        loop {
            if let Some(item) = g.0.pop_front() {
                return Some(item);
            }
            if g.1 {
                return None;
            }
            g = self.ready.wait(g).expect("wait");
        }
    }
}

fn pool(file: &Arc<std::fs::File>, qd: usize, run: Duration) -> u64 {
    let jobs = Handoff::<(u64, AlignedBuf)>::new();
    let done = Handoff::<AlignedBuf>::new();
    let threads: Vec<_> = (0..POOL_THREADS)
        .map(|_| {
            let (jobs, done, file) = (jobs.clone(), done.clone(), file.clone());
            std::thread::spawn(move || {
                while let Some((offset, buf)) = jobs.pop() {
                    file.write_all_at(buf.as_slice(), offset).expect("pwrite");
                    done.push(buf);
                }
            })
        })
        .collect();
    let mut offsets = Offsets(0x9e37_79b9_7f4a_7c15);
    for _ in 0..qd {
        jobs.push((offsets.next(), filled_block()));
    }
    let (deadline, mut writes, mut in_flight) = (Instant::now() + run, 0u64, qd);
    while in_flight > 0 {
        let buf = done.pop().expect("completions never close");
        writes += 1;
        in_flight -= 1;
        if Instant::now() < deadline {
            jobs.push((offsets.next(), buf));
            in_flight += 1;
        }
    }
    jobs.close();
    for t in threads {
        t.join().expect("pool thread");
    }
    writes
}

fn uring(file: &Arc<std::fs::File>, qd: usize, run: Duration) -> u64 {
    let entries = u32::try_from(qd.next_power_of_two()).expect("queue depth");
    let mut ring = IoUring::new(entries).expect("io_uring_setup");
    // Buffers live here, indexed by user_data, for as long as the ring may use them.
    let bufs: Vec<AlignedBuf> = (0..qd).map(|_| filled_block()).collect();
    let fd = types::Fd(file.as_raw_fd());
    let mut offsets = Offsets(0x9e37_79b9_7f4a_7c15);
    let push = |ring: &mut IoUring, slot: usize, offset: u64| {
        let buf = &bufs[slot];
        let len = u32::try_from(buf.len()).expect("block length");
        let sqe = opcode::Write::new(fd, buf.as_slice().as_ptr(), len)
            .offset(offset)
            .build()
            .user_data(slot as u64);
        // SAFETY: the buffer is `bufs[slot]`, which outlives the ring's use of it (every
        // submitted write is reaped below before `bufs` is dropped), and slot `slot` has no
        // other write in flight (a slot is reused only after its completion was reaped).
        unsafe { ring.submission().push(&sqe) }.expect("submission queue has room");
    };
    for slot in 0..qd {
        push(&mut ring, slot, offsets.next());
    }
    let (deadline, mut writes, mut in_flight) = (Instant::now() + run, 0u64, qd);
    while in_flight > 0 {
        ring.submit_and_wait(1).expect("io_uring_enter");
        let reaped: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (usize::try_from(c.user_data()).expect("a slot"), c.result()))
            .collect();
        let more = Instant::now() < deadline;
        for (slot, result) in reaped {
            assert_eq!(
                usize::try_from(result).ok(),
                Some(BLOCK),
                "write failed: {result}"
            );
            writes += 1;
            in_flight -= 1;
            if more {
                push(&mut ring, slot, offsets.next());
                in_flight += 1;
            }
        }
    }
    writes
}

fn filled_block() -> AlignedBuf {
    let mut b = AlignedBuf::for_overwrite(BLOCK);
    b.as_mut_slice().fill(0xa5);
    b
}
