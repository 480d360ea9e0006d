//! One ublk queue: a thread of its own, because the kernel takes a queue's commands only from
//! the task that fetched first. The thread submits a FETCH for every tag, then runs the
//! queue's loop with the agent's runtime (`Handle::block_on`), so the volume's engine is
//! polled right here and each answer goes back as COMMIT_AND_FETCH from this same thread.
//!
//! Memory the kernel shares with a queue: the descriptors (`mmap` of the char device,
//! read-only) and one data buffer per tag (ours; the kernel copies a write's data into it
//! before handing the request over, and a read's data out of it at the commit). A tag's
//! buffer is touched only between its request's arrival and its commit.

use std::fs::File;
use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use io_uring::{opcode, types, IoUring};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;
use tracing::warn;

use super::abi::{self, IoDesc};
use super::request;
use crate::frontends::block::{with_queue_hint, BlockDevice};

/// Descriptor areas are laid out as if every queue had the largest depth.
const MAX_QUEUE_DEPTH: usize = 4096;

pub struct QueueSpec {
    pub dev_id: u32,
    pub q_id: u16,
    pub depth: u16,
    pub max_io_bytes: u32,
}

/// An `mmap`ed region, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; access is coordinated by the tag protocol above.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(len: usize, prot: i32, flags: i32, fd: RawFd, offset: i64) -> std::io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel picks; checked for failure.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, offset) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped, once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

struct RingFd(RawFd);
impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

pub struct Queue {
    spec: QueueSpec,
    char_dev: Arc<File>,
    ring: IoUring,
    descs: Mapping,
    bufs: Mapping,
}

impl Queue {
    /// Map the queue's memory and fetch every tag. Runs on the queue's own thread.
    pub fn fetch_all(spec: QueueSpec, char_dev: Arc<File>) -> std::io::Result<Queue> {
        let depth = usize::from(spec.depth);
        let page = page_size();
        let desc_len = round_up(depth * abi::IO_DESC_BYTES, page);
        let desc_stride = round_up(MAX_QUEUE_DEPTH * abi::IO_DESC_BYTES, page);
        let descs = Mapping::new(
            desc_len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            char_dev.as_raw_fd(),
            i64::try_from(usize::from(spec.q_id) * desc_stride).unwrap_or(i64::MAX),
        )?;
        let bufs = Mapping::new(
            depth * spec.max_io_bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )?;
        let ring = IoUring::new(u32::from(spec.depth).next_power_of_two())?;
        let mut q = Queue {
            spec,
            char_dev,
            ring,
            descs,
            bufs,
        };
        for tag in 0..q.spec.depth {
            q.push(abi::IO_FETCH_REQ, tag, -1)?;
        }
        q.submit()?;
        Ok(q)
    }

    fn buf_addr(&self, tag: u16) -> u64 {
        self.bufs.ptr as u64 + u64::from(tag) * u64::from(self.spec.max_io_bytes)
    }

    fn push(&mut self, op: u32, tag: u16, result: i32) -> std::io::Result<()> {
        let cmd = abi::io_cmd(self.spec.q_id, tag, result, self.buf_addr(tag));
        let sqe = opcode::UringCmd16::new(types::Fd(self.char_dev.as_raw_fd()), op)
            .cmd(cmd)
            .build()
            .user_data(u64::from(tag));
        loop {
            // SAFETY: the command names only the tag's buffer, which lives as long as the
            // queue (the ring is dropped first: field order).
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return Ok(());
            }
            self.submit()?;
        }
    }

    fn submit(&mut self) -> std::io::Result<()> {
        loop {
            match self.ring.submit() {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                other => return other.map(drop),
            }
        }
    }

    fn desc(&self, tag: u16) -> IoDesc {
        let mut b = [0u8; abi::IO_DESC_BYTES];
        let at = usize::from(tag) * abi::IO_DESC_BYTES;
        if at + b.len() <= self.descs.len {
            // SAFETY: in bounds of the descriptor mapping; the kernel wrote this tag's
            // descriptor before completing its fetch, and does not touch it until the commit.
            unsafe {
                std::ptr::copy_nonoverlapping(self.descs.ptr.add(at), b.as_mut_ptr(), b.len());
            }
        }
        IoDesc::decode(&b)
    }

    /// Serve requests until the device stops (every tag aborted). After `shutdown` the
    /// requests running are answered and `drained` is sent; later ones are taken but not
    /// started, and the queue keeps its ring until the process exits. The kernel then hands
    /// what it had given this agent to the next one (user recovery with reissue), as after a
    /// `kill -9`. (Closing the ring while the process lives on left the kernel's quiesce
    /// waiting forever for such a request in Linux 6.12, now and then; the process's exit is
    /// the path that always recovers.)
    pub async fn run(
        mut self,
        dev: Arc<dyn BlockDevice>,
        mut shutdown: watch::Receiver<bool>,
        drained: std::sync::mpsc::Sender<()>,
    ) {
        let ring_fd = RingFd(self.ring.as_raw_fd());
        // SAFETY: the ring's fd stays open until `self` drops, after `ready` (a local).
        let ready = match unsafe { AsyncFd::register_with_interest(ring_fd, Interest::READABLE) } {
            Ok(r) => r,
            Err(e) => {
                warn!(dev = self.spec.dev_id, error = %e, "ublk queue cannot wait on its ring");
                return;
            }
        };
        type Running<'a> = Pin<Box<dyn Future<Output = (u16, i32)> + Send + 'a>>;
        let mut running: FuturesUnordered<Running<'_>> = FuturesUnordered::new();
        let depth = usize::from(self.spec.depth);
        let (mut ended, mut stopping) = (0usize, *shutdown.borrow());
        let max_io = self.spec.max_io_bytes;
        let base = self.bufs.ptr as usize;
        loop {
            let done: Vec<(u16, i32)> = self
                .ring
                .completion()
                .map(|c| (u16::try_from(c.user_data()).unwrap_or(u16::MAX), c.result()))
                .collect();
            let mut commits = Vec::new();
            for (tag, res) in done {
                match res {
                    abi::IO_RES_OK if stopping => {} // held by the kernel for the next server
                    // The export's size now: it grows online (`engine/volume/grow.rs`).
                    abi::IO_RES_OK => match request::decode(&self.desc(tag), dev.size(), max_io) {
                        Ok(op) => {
                            let dev = Arc::clone(&dev);
                            let at = base + usize::from(tag) * max_io as usize;
                            let alone = running.is_empty();
                            running.push(Box::pin(async move {
                                // SAFETY: the tag's own buffer, owned by this request until
                                // its commit; no other request uses the tag meanwhile.
                                let buf = unsafe {
                                    std::slice::from_raw_parts_mut(at as *mut u8, max_io as usize)
                                };
                                let res = with_queue_hint(alone, request::run(&*dev, op, buf));
                                (tag, res.await)
                            }));
                        }
                        Err(errno) => {
                            let d = self.desc(tag);
                            warn!(
                                dev = self.spec.dev_id,
                                tag,
                                errno,
                                op = d.op(),
                                flags = d.flags(),
                                sector = d.start_sector,
                                sectors = d.nr_sectors,
                                "ublk request refused"
                            );
                            commits.push((tag, errno));
                        }
                    },
                    abi::IO_RES_ABORT => ended += 1,
                    other => {
                        warn!(
                            dev = self.spec.dev_id,
                            q = self.spec.q_id,
                            tag,
                            res = other,
                            "ublk command failed"
                        );
                        ended += 1;
                    }
                }
            }
            // Answer what is already done without waiting again.
            while let Some(Some(answer)) = running.next().now_or_never() {
                commits.push(answer);
            }
            for &(tag, res) in &commits {
                if let Err(e) = self.push(abi::IO_COMMIT_AND_FETCH_REQ, tag, res) {
                    warn!(dev = self.spec.dev_id, error = %e, "ublk commit");
                }
            }
            if !commits.is_empty() {
                if let Err(e) = self.submit() {
                    warn!(dev = self.spec.dev_id, error = %e, "ublk submit; queue ends");
                    return;
                }
            }
            if running.is_empty() && ended >= depth {
                return;
            }
            if running.is_empty() && stopping {
                let _ = drained.send(());
                // Hold the ring, its commands and the buffers until the process exits, even
                // past the runtime's shutdown (which would wake the wait below with an error).
                loop {
                    std::thread::park();
                }
            }
            tokio::select! {
                biased;
                Some(answer) = running.next(), if !running.is_empty() => {
                    if let Err(e) = self.push(abi::IO_COMMIT_AND_FETCH_REQ, answer.0, answer.1) {
                        warn!(dev = self.spec.dev_id, error = %e, "ublk commit");
                    }
                    if let Err(e) = self.submit() {
                        warn!(dev = self.spec.dev_id, error = %e, "ublk submit; queue ends");
                        return;
                    }
                }
                guard = ready.readable() => match guard {
                    Ok(mut g) => g.clear_ready(),
                    Err(e) => {
                        warn!(dev = self.spec.dev_id, error = %e, "ublk ring wait; queue ends");
                        return;
                    }
                },
                _ = shutdown.changed(), if !stopping => stopping = true,
            }
        }
    }
}
