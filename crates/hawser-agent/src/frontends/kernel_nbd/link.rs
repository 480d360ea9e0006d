//! One `/dev/nbdN` served by this agent: each of its connections is a socketpair, one end
//! given to the kernel, the other served by the NBD transmission phase
//! ([`crate::nbd::transmission::serve`]) on the volume's export, in this process: no port, no
//! handshake, nothing another process could connect to.
//!
//! A connection ends in three ways, and each is handled so that the application above sees a
//! pause at most:
//! - **The kernel gave up on a request** (none answered within the device's I/O timeout): it
//!   declares the socket dead, shuts it down and requeues the request. The slot's task sees
//!   the end of its stream and hands the kernel a new socket with RECONFIGURE at once, and the
//!   requeued requests are sent again on it. A write sent twice is harmless: the kernel has
//!   acknowledged neither copy to anyone.
//! - **The agent stops** (SIGTERM, an upgrade) or dies (`kill -9`): the sockets close, the
//!   kernel holds I/O for `dead_conn_timeout`, and the next agent reconnects the device from
//!   its record (`frontends::devices`).
//! - **Detach**: DISCONNECT first, with the slots told not to reconnect.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::netlink::{self, NbdNetlink, NetlinkError};
use crate::frontends::block::BlockDevice;
use crate::nbd::transmission;

/// How often a reconnect retries while the kernel has not yet seen the old socket die
/// (RECONFIGURE answers ENOSPC until it has), and how many times.
const RECONNECT_RETRY: Duration = Duration::from_millis(50);
const RECONNECT_TRIES: u32 = 200;

/// A socket pair: the kernel's end (an owned descriptor, closed here once the kernel holds
/// its own reference) and ours.
pub(crate) fn pair() -> std::io::Result<(OwnedFd, StdUnixStream)> {
    let (kernel, ours) = StdUnixStream::pair()?;
    ours.set_nonblocking(true)?;
    // SAFETY: into_raw_fd gives up ownership of a valid descriptor.
    let kernel = unsafe { OwnedFd::from_raw_fd(kernel.into_raw_fd()) };
    Ok((kernel, ours))
}

/// The live connections of one device.
pub struct DeviceLink {
    pub index: u32,
    /// Set before a deliberate DISCONNECT: a slot whose stream ends does not reconnect.
    detaching: Arc<AtomicBool>,
    tasks: JoinSet<()>,
}

impl DeviceLink {
    /// Serve `ours` (our ends of the device's connections) on `export`, reconnecting each
    /// slot the kernel drops, until `shutdown` (the agent stopping) or a detach.
    pub fn serve(
        index: u32,
        backend: String,
        export: Arc<dyn BlockDevice>,
        ours: Vec<StdUnixStream>,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<DeviceLink> {
        let detaching = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for (slot, stream) in ours.into_iter().enumerate() {
            let stream = UnixStream::from_std(stream)?;
            let slot = Slot {
                index,
                slot,
                backend: backend.clone(),
                export: Arc::clone(&export),
                detaching: Arc::clone(&detaching),
                shutdown: shutdown.clone(),
            };
            tasks.spawn(slot.run(stream));
        }
        Ok(DeviceLink {
            index,
            detaching,
            tasks,
        })
    }

    /// DISCONNECT the device (what is queued fails with EIO) and wait for its connections to
    /// end.
    pub async fn detach(mut self) -> Result<(), NetlinkError> {
        self.detaching.store(true, Ordering::Release);
        let index = self.index;
        let done = tokio::task::spawn_blocking(move || NbdNetlink::open()?.disconnect(index))
            .await
            .unwrap_or_else(|e| {
                Err(NetlinkError::Socket(std::io::Error::other(format!(
                    "disconnect task: {e}"
                ))))
            });
        if done.is_err() {
            // The kernel would not end the device; our ends closing leaves it waiting for
            // `dead_conn_timeout`, then failing its I/O, which is the next best thing.
            self.tasks.abort_all();
        }
        while self.tasks.join_next().await.is_some() {}
        done
    }

    /// Wait until every connection has ended (after the agent's shutdown signal).
    pub async fn join(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

struct Slot {
    index: u32,
    slot: usize,
    backend: String,
    export: Arc<dyn BlockDevice>,
    detaching: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
}

impl Slot {
    async fn run(self, mut stream: UnixStream) {
        let mut quick_ends = 0;
        loop {
            let started = std::time::Instant::now();
            let ended =
                transmission::serve(stream, Arc::clone(&self.export), self.shutdown.clone()).await;
            if *self.shutdown.borrow() || self.detaching.load(Ordering::Acquire) {
                return;
            }
            // RECONFIGURE succeeds without taking the socket when no slot is dead yet (the
            // kernel answers ENOSPC and turns it into success), and the socket then ends at
            // once: try again a little later, a bounded number of times.
            if started.elapsed() < RECONNECT_RETRY {
                quick_ends += 1;
                if quick_ends > RECONNECT_TRIES {
                    warn!(device = %format!("/dev/nbd{}", self.index), "kernel NBD connection keeps ending at once; giving up on this slot");
                    return;
                }
                tokio::time::sleep(RECONNECT_RETRY).await;
            } else {
                quick_ends = 0;
            }
            // The kernel dropped this connection while we serve the device: a request it
            // timed out. Hand it a new socket.
            warn!(device = %format!("/dev/nbd{}", self.index), slot = self.slot, result = ?ended.err(),
                "kernel NBD connection ended; reconnecting");
            match self.reconnect().await {
                Some(s) => stream = s,
                None => return,
            }
        }
    }

    /// A new connection for this slot, or `None` when the device is no longer ours (or the
    /// kernel refuses for good).
    async fn reconnect(&self) -> Option<UnixStream> {
        for _ in 0..RECONNECT_TRIES {
            if self.detaching.load(Ordering::Acquire) || *self.shutdown.borrow() {
                return None;
            }
            if netlink::backend_of(self.index).as_deref() != Some(self.backend.as_str()) {
                warn!(device = %format!("/dev/nbd{}", self.index), "device is no longer configured for this volume; not reconnecting");
                return None;
            }
            let (kernel, ours) = match pair() {
                Ok(p) => p,
                Err(e) => {
                    warn!(error = %e, "socketpair for a kernel NBD reconnect");
                    tokio::time::sleep(RECONNECT_RETRY).await;
                    continue;
                }
            };
            let (index, backend) = (self.index, self.backend.clone());
            let done = tokio::task::spawn_blocking(move || {
                use std::os::fd::AsRawFd as _;
                let r = NbdNetlink::open()
                    .and_then(|mut nl| nl.reconfigure(index, &backend, &[kernel.as_raw_fd()]));
                drop(kernel);
                r
            })
            .await;
            match done {
                Ok(Ok(())) => {
                    info!(device = %format!("/dev/nbd{index}"), slot = self.slot, "kernel NBD connection replaced");
                    return UnixStream::from_std(ours).ok();
                }
                Ok(Err(NetlinkError::Refused { err, .. }))
                    if err.raw_os_error() == Some(libc::ENOSPC) =>
                {
                    // The kernel has not yet marked the old socket dead.
                    tokio::time::sleep(RECONNECT_RETRY).await;
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "kernel NBD reconnect failed");
                    return None;
                }
                Err(e) => {
                    warn!(error = %e, "kernel NBD reconnect task failed");
                    return None;
                }
            }
        }
        warn!(device = %format!("/dev/nbd{}", self.index), "kernel NBD reconnect gave up");
        None
    }
}
