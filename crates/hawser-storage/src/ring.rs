//! Replica disk I/O on an io_uring: one ring per process, submissions from any thread, and
//! one completion thread that finishes them.
//!
//! Why: a pool thread that `pwrite`s a 4k O_DIRECT block sleeps until the disk is done and is
//! woken by the completion, two context switches per request on top of the hand-off to the
//! pool and back. `examples/disk_paths.rs` measured 7-8 µs of CPU per 4k write through the
//! pool at queue depth 128 against 2-3 µs through a ring (docs/performance.md). Here the
//! submitting thread (a runtime worker) queues the operation and enters the kernel once; the
//! completion thread wakes once per batch of completions.
//!
//! An operation owns everything the kernel uses until its completion is reaped: its buffer,
//! the replica it is on (whose file the descriptor names), and its epoch-gate ticket. A short
//! read or write is submitted again for the rest. When the ring is missing (no io_uring in
//! the kernel, or forbidden, as Docker's default seccomp profile does), lacks an operation, or
//! is full, callers run the operation synchronously instead (`Replica::read` and friends on
//! the I/O pool): the ring is an optimisation, never a requirement.

use std::io;
use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard, OnceLock};

use bytes::Bytes;
use io_uring::{opcode, types, IoUring, Probe};

use crate::aligned::AlignedBuf;
use crate::gate::Ticket;

/// Submission queue entries, and so operations in flight at most (the completion queue has
/// twice as many entries, so it cannot overflow).
const RING_ENTRIES: u32 = 256;

/// What an operation does.
pub enum Kind {
    /// Fill the buffer from `offset`.
    Read(AlignedBuf),
    /// Write the data at `offset`; `dsync`: durable on completion (FUA).
    Write { data: Bytes, dsync: bool },
    /// fdatasync(2). (The agent runs flushes on its pool: the kernel runs an io_uring fsync on
    /// a worker thread of its own, one more wake-up.)
    SyncData,
}

/// How an operation ended: the read's buffer, or an error.
pub type Outcome = io::Result<Option<AlignedBuf>>;

/// One operation, with everything that must outlive it in the kernel.
pub struct Op {
    pub fd: RawFd,
    pub offset: u64,
    pub kind: Kind,
    /// Keeps the descriptor open (the replica that owns it) until the completion is reaped.
    pub keep: std::sync::Arc<dyn Send + Sync>,
    /// The epoch-gate ticket, released when the I/O is over, before `finish` runs.
    pub ticket: Ticket,
    /// Called on the completion thread with the outcome.
    pub finish: Box<dyn FnOnce(Outcome) + Send>,
}

struct Pending {
    op: Op,
    /// Bytes of a read or write already done (short completions).
    done: usize,
}

impl Pending {
    /// The submission entry for the rest of this operation.
    fn entry(&mut self, slot: usize) -> io_uring::squeue::Entry {
        let fd = types::Fd(self.op.fd);
        let offset = self.op.offset + self.done as u64;
        let entry = match &mut self.op.kind {
            Kind::Read(buf) => {
                let rest = &mut buf.as_mut_slice()[self.done..];
                opcode::Read::new(fd, rest.as_mut_ptr(), len_u32(rest.len()))
                    .offset(offset)
                    .build()
            }
            Kind::Write { data, dsync } => {
                let rest = &data[self.done..];
                let flags = if *dsync { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, rest.as_ptr(), len_u32(rest.len()))
                    .offset(offset)
                    .rw_flags(flags)
                    .build()
            }
            Kind::SyncData => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        };
        entry.user_data(slot as u64)
    }

    /// Bytes the operation moves in all.
    fn total(&self) -> usize {
        match &self.op.kind {
            Kind::Read(buf) => buf.len(),
            Kind::Write { data, .. } => data.len(),
            Kind::SyncData => 0,
        }
    }
}

/// Operation lengths are at most a replica request's (MAX_PAYLOAD_BYTES), far below u32::MAX.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The operations in flight, by slot (the entry's user data), and the free slots.
struct Slots {
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
}

pub struct Ring {
    ring: IoUring,
    /// Held while touching the submission queue or `pending`.
    slots: Mutex<Slots>,
}

/// A slot held for an operation about to be submitted: [`Ring::reserve`].
pub struct Reserved<'a> {
    ring: &'a Ring,
    slot: Option<usize>,
}

thread_local! {
    static ON_COMPLETION_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this is a ring's completion thread, where `finish` callbacks run. Such a callback
/// must never wait for an epoch gate (`EpochGate::enter`, so no synchronous replica I/O): an
/// epoch change waiting there waits for completions only this thread can reap.
pub fn on_completion_thread() -> bool {
    ON_COMPLETION_THREAD.get()
}

/// The process's ring, made on first use; `None` if this kernel cannot give one.
pub fn global() -> Option<&'static Ring> {
    static RING: OnceLock<Option<&'static Ring>> = OnceLock::new();
    *RING.get_or_init(|| match Ring::start(RING_ENTRIES) {
        Ok(ring) => Some(ring),
        Err(e) => {
            tracing::info!(error = %e, "no io_uring; replica disk I/O uses the thread pool");
            None
        }
    })
}

impl Ring {
    /// A ring of `entries` with its completion thread. Both live as long as the process.
    pub fn start(entries: u32) -> io::Result<&'static Ring> {
        let ring: &'static Ring = Box::leak(Box::new(Ring::new(entries)?));
        std::thread::Builder::new()
            .name("hawser-uring".into())
            .spawn(move || ring.reap_forever())?;
        Ok(ring)
    }

    fn new(entries: u32) -> io::Result<Ring> {
        let ring = IoUring::new(entries)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        let needed = [opcode::Read::CODE, opcode::Write::CODE, opcode::Fsync::CODE];
        if let Some(missing) = needed.iter().find(|&&c| !probe.is_supported(c)) {
            return Err(io::Error::other(format!("io_uring lacks opcode {missing}")));
        }
        let n = entries as usize;
        Ok(Ring {
            ring,
            slots: Mutex::new(Slots {
                pending: (0..n).map(|_| None).collect(),
                free: (0..n).rev().collect(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for one operation, or `None` if the ring is full (run it elsewhere).
    pub fn reserve(&self) -> Option<Reserved<'_>> {
        let slot = self.lock().free.pop()?;
        Some(Reserved {
            ring: self,
            slot: Some(slot),
        })
    }

    /// Queue `p` in `slot` (which the caller holds) and tell the kernel.
    fn push(&self, mut slots: MutexGuard<'_, Slots>, slot: usize, mut p: Pending) {
        let entry = p.entry(slot);
        slots.pending[slot] = Some(p);
        // SAFETY: the submission queue is touched only under `slots`, which is held. The
        // entry points into the buffer of the operation now stored in `pending[slot]`, which
        // stays there (neither moved nor dropped, and a `Bytes` or `AlignedBuf` keeps its
        // heap memory in place when the value moves) until the completion for `slot` is
        // reaped; the descriptor stays open as long as `keep` lives, which is as long.
        let pushed = unsafe { self.ring.submission_shared().push(&entry) };
        // At most `entries` slots exist, so the queue always has room for one.
        debug_assert!(pushed.is_ok(), "submission queue full with a free slot");
        drop(slots);
        self.enter();
    }

    /// Hand what is queued to the kernel. Entries left unsubmitted on an error are submitted
    /// by the completion thread's next enter.
    fn enter(&self) {
        loop {
            match self.ring.submitter().submit() {
                Ok(_) => return,
                Err(e) if retry(&e) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "io_uring submission failed");
                    return;
                }
            }
        }
    }

    /// The completion thread: wait for completions, finish them, forever.
    fn reap_forever(&self) {
        ON_COMPLETION_THREAD.set(true);
        let mut reaped: Vec<(u64, i32)> = Vec::with_capacity(RING_ENTRIES as usize * 2);
        loop {
            if let Err(e) = self.ring.submitter().submit_and_wait(1) {
                if !retry(&e) {
                    tracing::error!(error = %e, "io_uring wait failed");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            // SAFETY: this thread is the only one that reads the completion queue.
            let cq = unsafe { self.ring.completion_shared() };
            reaped.extend(cq.map(|c| (c.user_data(), c.result())));
            for (slot, result) in reaped.drain(..) {
                self.complete(usize::try_from(slot).unwrap_or(usize::MAX), result);
            }
        }
    }

    /// One completion: resubmit the rest of a short read or write, or finish the operation.
    fn complete(&self, slot: usize, result: i32) {
        let mut slots = self.lock();
        let Some(mut p) = slots.pending.get_mut(slot).and_then(Option::take) else {
            tracing::error!(slot, "io_uring completion for no operation");
            return;
        };
        let total = p.total();
        let outcome = match advance(&mut p.done, total, result) {
            Step::More => return self.push(slots, slot, p),
            Step::Done => Ok(()),
            Step::Failed(e) => Err(e),
        };
        slots.free.push(slot);
        drop(slots);
        let Pending { op, .. } = p;
        // The I/O is over: an epoch change may go ahead before the caller hears of it.
        drop(op.ticket);
        let outcome = outcome.map(|()| match op.kind {
            Kind::Read(buf) => Some(buf),
            Kind::Write { .. } | Kind::SyncData => None,
        });
        // A panicking callback must not take the ring's only completion thread with it:
        // every later operation would wait for ever. Its own request is lost (its caller's
        // watchdogs see to that); the others go on.
        let finish = op.finish;
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || finish(outcome))).is_err()
        {
            tracing::error!(slot, "an io_uring completion callback panicked");
        }
        drop(op.keep);
    }
}

impl Reserved<'_> {
    /// Submit `op` in this slot; its `finish` runs on the completion thread.
    pub fn submit(mut self, op: Op) {
        let slot = self.slot.take().expect("a reserved slot is submitted once");
        let slots = self.ring.lock();
        self.ring.push(slots, slot, Pending { op, done: 0 });
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.ring.lock().free.push(slot);
        }
    }
}

fn retry(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

/// What a completion means for an operation with `done` of `total` bytes moved.
#[derive(Debug)]
enum Step {
    /// Submit the rest.
    More,
    Done,
    Failed(io::Error),
}

fn advance(done: &mut usize, total: usize, result: i32) -> Step {
    let Ok(n) = usize::try_from(result) else {
        return Step::Failed(io::Error::from_raw_os_error(-result));
    };
    if total == 0 {
        return Step::Done;
    }
    if n == 0 {
        // Nothing moved and no error: past the end of the file, or a device that takes no
        // more. Submitting again would spin.
        return Step::Failed(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "io_uring read or write moved no bytes",
        ));
    }
    *done = (*done + n).min(total);
    if *done < total {
        Step::More
    } else {
        Step::Done
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
