//! The sending side of a connection, written from the caller's own thread when that helps.
//!
//! Frames queue here in order. A frame pushed with `now` onto an empty queue is written to the
//! socket at once (a non-blocking `writev`) by the pushing thread; everything else, and what
//! the socket does not take, is written by the connection's drain task, which batches what
//! has queued up into few `writev`s and waits while the socket is full. Handing a lone frame
//! to a task costs a wake-up, and tokio runs a task woken from a worker on that same worker,
//! after the current task yields: the engine's remote send would then wait for the local
//! write that follows it, and the two would no longer overlap (measured: +150 µs on a 4k QD1
//! write with two replicas). Under load the batching matters more than the wake-up.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use tokio::sync::Notify;

use crate::tls::sealer::Sealer;

/// The non-blocking half of a stream socket that an [`Outbox`] writes to.
pub trait TryWrite: Send + Sync + 'static {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    fn writable(&self) -> impl std::future::Future<Output = io::Result<()>> + Send;
    /// The socket's descriptor, for `shutdown(2)` (see [`Outbox::abort`]).
    fn raw_fd(&self) -> std::os::fd::RawFd;
}

impl TryWrite for tokio::net::tcp::OwnedWriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        tokio::net::tcp::OwnedWriteHalf::try_write_vectored(self, bufs)
    }
    async fn writable(&self) -> io::Result<()> {
        tokio::net::tcp::OwnedWriteHalf::writable(self).await
    }
    fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(self.as_ref())
    }
}

impl TryWrite for tokio::net::unix::OwnedWriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        tokio::net::unix::OwnedWriteHalf::try_write_vectored(self, bufs)
    }
    async fn writable(&self) -> io::Result<()> {
        tokio::net::unix::OwnedWriteHalf::writable(self).await
    }
    fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(self.as_ref())
    }
}

/// At most this many segments per `writev`.
const MAX_IOVECS: usize = 64;

/// Why a push was refused: the connection failed earlier (the error was reported then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("connection closed")]
pub struct Closed;

struct Queue {
    segments: VecDeque<Bytes>,
    /// Bytes in `segments`.
    bytes: usize,
    failed: bool,
}

pub struct Outbox<W: TryWrite> {
    socket: W,
    /// A TLS connection: frames are sealed into records as they are queued.
    tls: Option<Arc<Sealer>>,
    queue: Mutex<Queue>,
    /// Wakes the drain task: something is queued that the socket did not take.
    more: Notify,
    /// Wakes `backlog_at_most` waiters: the queue shrank (or failed).
    less: Notify,
}

impl<W: TryWrite> Outbox<W> {
    pub fn new(socket: W) -> Arc<Outbox<W>> {
        Self::build(socket, None)
    }

    /// An outbox whose frames go out as TLS records of `tls` (see `tls::conn`).
    pub fn with_tls(socket: W, tls: Arc<Sealer>) -> Arc<Outbox<W>> {
        Self::build(socket, Some(tls))
    }

    fn build(socket: W, tls: Option<Arc<Sealer>>) -> Arc<Outbox<W>> {
        Arc::new(Outbox {
            socket,
            tls,
            queue: Mutex::new(Queue {
                segments: VecDeque::new(),
                bytes: 0,
                failed: false,
            }),
            more: Notify::new(),
            less: Notify::new(),
        })
    }

    /// Queue `segments` (one frame) as a unit. With `now`, write them at once if nothing is
    /// queued before them (the latency case: one request alone); otherwise the drain task
    /// writes them, together with whatever else is queued by then (the throughput case: one
    /// `writev` for many frames). Empty segments are skipped. `Err(Closed)`: the connection
    /// has failed; the frame was not sent.
    pub fn push(&self, segments: impl IntoIterator<Item = Bytes>, now: bool) -> Result<(), Closed> {
        self.push_with(now, |tls, q| {
            match tls {
                None => segments.into_iter().for_each(|s| q.add(s)),
                Some(t) => q.add(t.seal(segments)?),
            }
            Ok(())
        })
    }

    /// Queue and write the records a TLS connection wants to send of its own accord (taken
    /// under the queue lock: in the stream they follow everything sealed before them).
    pub fn push_pending_tls(&self) {
        if self.tls.is_some() {
            let _ = self.push_with(true, |tls, q| {
                if let Some(t) = tls {
                    q.add(t.pending()?);
                }
                Ok(())
            });
        }
    }

    /// Queues what `make` adds (with the queue locked), then writes as [`Outbox::push`] says.
    /// A failure of `make` (TLS) fails the connection.
    fn push_with(
        &self,
        now: bool,
        make: impl FnOnce(Option<&Sealer>, &mut Queue) -> io::Result<()>,
    ) -> Result<(), Closed> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.failed {
            return Err(Closed);
        }
        let was_empty = q.segments.is_empty();
        if let Err(e) = make(self.tls.as_deref(), &mut q) {
            tracing::debug!(error = %e, "TLS records could not be made");
            fail(&mut q);
            drop(q);
            self.more.notify_one();
            self.less.notify_waiters();
            return Ok(());
        }
        if !was_empty || q.segments.is_empty() {
            // The drain task (or whoever queued before us) is responsible for what is queued.
            return Ok(());
        }
        if !now {
            drop(q);
            self.more.notify_one();
            return Ok(());
        }
        match self.write_some(&mut q) {
            Ok(()) if q.segments.is_empty() => Ok(()),
            Ok(()) => {
                drop(q);
                self.more.notify_one();
                Ok(())
            }
            Err(e) => {
                tracing::debug!(error = %e, "socket write failed");
                fail(&mut q);
                drop(q);
                // Let the drain task see the failure and end, and backlog waiters return.
                self.more.notify_one();
                self.less.notify_waiters();
                // This frame is lost with the connection; the caller learns it from the close.
                Ok(())
            }
        }
    }

    /// Write queued segments until the queue is empty or the socket would block.
    fn write_some(&self, q: &mut Queue) -> io::Result<()> {
        while !q.segments.is_empty() {
            let written = {
                let slices: Vec<IoSlice<'_>> = q
                    .segments
                    .iter()
                    .take(MAX_IOVECS)
                    .map(|s| IoSlice::new(s))
                    .collect();
                match self.socket.try_write_vectored(&slices) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            advance(&mut q.segments, written);
            q.bytes -= written;
        }
        Ok(())
    }

    /// Wait until at most `limit` bytes are queued (or the connection failed): a reader of
    /// requests calls this before taking the next one, so a peer that sends requests but does
    /// not read their replies cannot make the queue grow without bound.
    pub async fn backlog_at_most(&self, limit: usize) {
        loop {
            let less = self.less.notified();
            tokio::pin!(less);
            less.as_mut().enable();
            {
                let q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.failed || q.bytes <= limit {
                    return;
                }
            }
            less.await;
        }
    }

    /// Write what `push` could not, until the connection fails. Returns then; the caller
    /// closes the connection.
    pub async fn drain(&self) {
        loop {
            self.more.notified().await;
            loop {
                {
                    let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                    if q.failed {
                        return;
                    }
                    if let Err(e) = self.write_some(&mut q) {
                        tracing::debug!(error = %e, "socket write failed");
                        fail(&mut q);
                        drop(q);
                        self.less.notify_waiters();
                        return;
                    }
                    let empty = q.segments.is_empty();
                    drop(q);
                    self.less.notify_waiters();
                    if empty {
                        break;
                    }
                }
                if let Err(e) = self.socket.writable().await {
                    tracing::debug!(error = %e, "socket failed while waiting to write");
                    fail(&mut self.queue.lock().unwrap_or_else(|p| p.into_inner()));
                    self.less.notify_waiters();
                    return;
                }
            }
        }
    }

    /// Refuse further pushes (the connection is being closed).
    pub fn close(&self) {
        fail(&mut self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        self.more.notify_one();
        self.less.notify_waiters();
    }

    /// End the connection now: refuse further pushes, drop what is queued, and shut the
    /// socket down both ways, so the peer sees it end and a read on this side returns at
    /// once. The descriptor itself closes when the last owner drops it, which may be much
    /// later (a task still holding the read half, a request waiting for a reply that will
    /// not come): until then the peer would otherwise keep its end, and what it holds, open.
    pub fn abort(&self) {
        self.close();
        // SAFETY: shutdown(2) on the descriptor this outbox owns, open as long as `self` is;
        // it changes the socket's state, not the descriptor, and touches no memory.
        let _ = unsafe { libc::shutdown(self.socket.raw_fd(), libc::SHUT_RDWR) };
    }
}

impl Queue {
    fn add(&mut self, s: Bytes) {
        if !s.is_empty() {
            self.bytes += s.len();
            self.segments.push_back(s);
        }
    }
}

fn fail(q: &mut Queue) {
    q.failed = true;
    q.segments.clear();
    q.bytes = 0;
}

/// Drop `n` written bytes from the front of the queue.
fn advance(segments: &mut VecDeque<Bytes>, mut n: usize) {
    while n > 0 {
        let Some(front) = segments.front_mut() else {
            return;
        };
        if n >= front.len() {
            n -= front.len();
            segments.pop_front();
        } else {
            front.advance(n);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn advance_drops_whole_segments_and_splits_the_last() {
        let mut q: VecDeque<Bytes> = [&b"abc"[..], b"de", b"fgh"]
            .into_iter()
            .map(Bytes::from_static)
            .collect();
        advance(&mut q, 4);
        assert_eq!(
            q,
            VecDeque::from([Bytes::from_static(b"e"), Bytes::from_static(b"fgh")])
        );
        advance(&mut q, 4);
        assert!(q.is_empty());
    }

    /// Many frames, some far larger than the socket buffer, arrive whole and in order while
    /// the reader is slow to start (so pushes find the socket full and the drain task
    /// finishes them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_arrive_whole_and_in_order_when_the_socket_fills() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (_ra, wa) = a.into_split();
        let out = Outbox::new(wa);
        let drain = tokio::spawn({
            let out = out.clone();
            async move { out.drain().await }
        });
        let mut expected = Vec::new();
        for i in 0u32..200 {
            let len = if i % 10 == 0 {
                1 << 20
            } else {
                100 + i as usize
            };
            let header = Bytes::from(i.to_le_bytes().to_vec());
            let body = Bytes::from(vec![(i % 251) as u8; len]);
            expected.extend_from_slice(&header);
            expected.extend_from_slice(&body);
            out.push([header, body], true).unwrap();
        }
        let mut got = vec![0u8; expected.len()];
        let mut b = b;
        b.read_exact(&mut got).await.unwrap();
        assert!(
            got == expected,
            "the byte stream differs from the frames pushed"
        );
        out.close();
        drain.await.unwrap();
        assert_eq!(out.push([Bytes::from_static(b"x")], true), Err(Closed));
    }

    /// A peer that does not read: pushes pile up beyond the socket buffer, `backlog_at_most`
    /// waits until the peer reads, then returns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn backlog_waits_for_the_peer_to_read() {
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        let (_ra, wa) = a.into_split();
        let out = Outbox::new(wa);
        let drain = tokio::spawn({
            let out = out.clone();
            async move { out.drain().await }
        });
        let total = 16usize << 20;
        for _ in 0..16 {
            out.push([Bytes::from(vec![7u8; 1 << 20])], true).unwrap();
        }
        let waiter = tokio::spawn({
            let out = out.clone();
            async move { out.backlog_at_most(0).await }
        });
        // The socket buffer holds far less than 16 MiB: the backlog cannot be empty yet.
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "backlog reported empty with 16 MiB unread"
        );
        let mut got = vec![0u8; total];
        b.read_exact(&mut got).await.unwrap();
        waiter.await.unwrap();
        assert!(got.iter().all(|&x| x == 7));
        out.close();
        drain.await.unwrap();
    }

    #[tokio::test]
    async fn a_push_after_the_peer_closed_fails_the_outbox() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        drop(b);
        let (_ra, wa) = a.into_split();
        let out = Outbox::new(wa);
        // The first write to a closed peer fails (EPIPE); the outbox is then closed.
        let _ = out.push([Bytes::from_static(b"hello")], true);
        out.drain().await; // returns: the outbox failed
        assert_eq!(out.push([Bytes::from_static(b"x")], true), Err(Closed));
    }
}
