//! The NBD transmission phase of one connection: requests in, simple replies out, all on one
//! task.
//!
//! Many requests are in flight at once, and one task does everything for all of them: it reads
//! headers (as many as one read brings in) and write payloads, starts each request on the
//! device by polling its future for the first time right there (so the engine sends it to the
//! replicas, and an idle engine may complete a small one, before the next header is looked
//! at), collects the requests that finish, and writes their replies, all that are ready, with
//! one write. Nothing is handed to another task or thread per request: no spawn, no channel,
//! no semaphore. A completion that happens elsewhere (an I/O thread, a replica's reply) wakes
//! this task, which then answers every request that finished meanwhile.
//!
//! Back-pressure: no new header is read while `MAX_IN_FLIGHT_REQUESTS` requests are
//! unanswered (a reply counts as unanswered until its last byte is written), nor while a
//! request's data would push the data held past `MAX_IN_FLIGHT_BYTES`. A client that stops
//! reading replies therefore stops being read from, and memory stays bounded.
//!
//! A bad request (unknown command or flag, misaligned, out of range, too long a read) gets an
//! error reply and the connection carries on. Broken framing (bad magic, or a write whose
//! payload is too large to skip safely) ends the connection, as do `NBD_CMD_DISC`, end of
//! stream and server shutdown; in every case the requests already in flight are answered
//! first. If the socket fails, the requests in flight still run to completion (their replies
//! are dropped): a write is never abandoned half-submitted.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use hawser_storage::AlignedBuf;
use hawser_wire::constants::MAX_PAYLOAD_BYTES;
use hawser_wire::nbd::{self, Command, NbdError, Request};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tracing::debug;

use crate::frontends::block::{with_queue_hint, BlockDevice};
use crate::nbd::buffers::{Input, Replies};
use crate::nbd::errno::errno;
use crate::nbd::own_wake::OwnWake;
use crate::nbd::request::{check_request, execute, Op};

/// Requests one connection may have unanswered. Deep enough for fio/qemu queue depths of
/// 32-64 plus slack; at the bound the reader stops reading, so the client's socket fills up.
pub const MAX_IN_FLIGHT_REQUESTS: usize = 128;
/// Read and write data one connection may hold in memory at once.
pub const MAX_IN_FLIGHT_BYTES: u32 = 128 * 1024 * 1024;
/// Socket read buffer: many small headers and payloads per syscall.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// A write payload with at least this much left to read is read straight into its own buffer
/// rather than through the read buffer and a copy.
const DIRECT_READ_MIN_BYTES: usize = 32 * 1024;
/// Initial room for replies that go out together.
const REPLY_BUFFER_BYTES: usize = 64 * 1024;
/// Rounds of read, start, collect and write one wake-up may run before the task yields to
/// others on its runtime thread (and is woken again at once).
const MAX_ROUNDS_PER_WAKE: usize = 64;

// A single maximal request must fit the budget, or it would wait forever.
const _: () = assert!(MAX_IN_FLIGHT_BYTES >= MAX_PAYLOAD_BYTES);

/// Why a transmission phase ended other than by DISC, shutdown or the client hanging up.
#[derive(Debug, thiserror::Error)]
pub enum TransmissionError {
    #[error("socket error reading requests: {0}")]
    Read(#[source] io::Error),
    #[error("socket error writing replies: {0}")]
    Write(#[source] io::Error),
    #[error("malformed request header: {0}")]
    Framing(#[from] NbdError),
    #[error("write {handle:#x} announces {length} bytes, over the {MAX_PAYLOAD_BYTES} maximum")]
    WriteTooLarge { handle: u64, length: u32 },
}

/// Resolves once shutdown is requested. A dropped sender counts as a request: nobody could
/// ever ask again, and the owner going away is the usual way a process stops.
pub(crate) async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|&stop| stop).await;
}

/// Serve requests from `stream` until DISC, shutdown, end of stream or a framing error, then
/// answer every request in flight and shut the stream's write side down.
pub async fn serve<S>(
    stream: S,
    device: Arc<dyn BlockDevice>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), TransmissionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let stop = shutdown_requested(&mut shutdown);
    tokio::pin!(stop);
    let mut conn = Connection::new(stream, device);
    std::future::poll_fn(|cx| conn.poll(cx, stop.as_mut())).await
}

/// A request started on the device; resolves to its reply.
type Running = Pin<Box<dyn Future<Output = Done> + Send>>;

/// A finished request: its reply, and the data budget it held.
struct Done {
    handle: u64,
    error: u32,
    data: Option<Bytes>,
    holds: u32,
}

/// Where the reader is in the request stream.
enum ReadState {
    /// At a header boundary.
    Header,
    /// A valid request waiting for room in the data budget.
    Admit { handle: u64, op: Op },
    /// Reading a write's payload: `filled` of it so far.
    Payload {
        handle: u64,
        op: Op,
        buf: AlignedBuf,
        filled: usize,
    },
    /// Skipping the payload of a refused write.
    Skip { left: usize },
}

/// The reader's next state and what it did, or why reading ended: `None` for a clean end.
type Next = Result<(ReadState, Step), Option<TransmissionError>>;

/// What the reader did this round.
enum Step {
    /// Consumed input or started requests.
    Progress,
    /// Waits for the socket, a completion or a written reply.
    Blocked,
}

struct Connection<S> {
    stream: S,
    device: Arc<dyn BlockDevice>,
    input: Input,
    state: ReadState,
    running: FuturesUnordered<Running>,
    /// Data bytes the running requests hold.
    running_bytes: u64,
    replies: Replies,
    /// Whether requests are still read (not after DISC, end of stream, shutdown or an error).
    reading: bool,
    stopped: bool,
    /// Why reading ended with an error, reported once everything in flight is answered.
    failure: Option<TransmissionError>,
    /// The socket failed writing: replies are dropped from then on.
    write_failed: Option<io::Error>,
    /// The waker `running` gets (see `own_wake`).
    own_wake: OwnWake,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    fn new(stream: S, device: Arc<dyn BlockDevice>) -> Connection<S> {
        Connection {
            stream,
            device,
            input: Input::with_capacity(READ_BUFFER_BYTES),
            state: ReadState::Header,
            running: FuturesUnordered::new(),
            running_bytes: 0,
            replies: Replies::new(REPLY_BUFFER_BYTES),
            reading: true,
            stopped: false,
            failure: None,
            write_failed: None,
            own_wake: OwnWake::default(),
        }
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Poll<Result<(), TransmissionError>> {
        for _ in 0..MAX_ROUNDS_PER_WAKE {
            if !self.stopped && stop.as_mut().poll(cx).is_ready() {
                // Polled no more once resolved.
                self.stopped = true;
                if self.reading {
                    debug!("server shutting down: no more requests on this connection");
                    self.reading = false;
                }
            }
            let mut progress = false;
            if self.reading {
                progress |= matches!(self.read(cx), Step::Progress);
            }
            progress |= self.collect(cx);
            progress |= self.write(cx);
            let answered = self.write_failed.is_some() || self.replies.is_idle();
            if !self.reading && self.running.is_empty() && answered {
                return self.finish(cx);
            }
            if !progress {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Requests unanswered, and the data they hold.
    fn held(&self) -> (usize, u64) {
        (
            self.running.len() + self.replies.held_requests(),
            self.running_bytes + self.replies.held_bytes(),
        )
    }

    /// Read and start requests until the socket has nothing more or a bound is reached.
    fn read(&mut self, cx: &mut Context<'_>) -> Step {
        let mut step = Step::Blocked;
        loop {
            let state = std::mem::replace(&mut self.state, ReadState::Header);
            let next = match state {
                ReadState::Header => self.header(cx),
                ReadState::Admit { handle, op } => self.admit(handle, op),
                ReadState::Payload {
                    handle,
                    op,
                    buf,
                    filled,
                } => self.payload(cx, handle, op, buf, filled),
                ReadState::Skip { left } => self.skip(cx, left),
            };
            match next {
                Ok((state, Step::Progress)) => {
                    self.state = state;
                    step = Step::Progress;
                }
                Ok((state, Step::Blocked)) => {
                    self.state = state;
                    return step;
                }
                Err(end) => {
                    self.reading = false;
                    self.failure = end;
                    return Step::Progress;
                }
            }
            if !self.reading {
                return Step::Progress;
            }
        }
    }

    /// The next header, if a request slot is free and the header has arrived.
    fn header(&mut self, cx: &mut Context<'_>) -> Next {
        if self.held().0 >= MAX_IN_FLIGHT_REQUESTS {
            return Ok((ReadState::Header, Step::Blocked));
        }
        if self.input.len() < nbd::REQUEST_LEN {
            return match self.fill(cx)? {
                true => Ok((ReadState::Header, Step::Progress)),
                false => Ok((ReadState::Header, Step::Blocked)),
            };
        }
        let req =
            Request::decode(&self.input.data()[..nbd::REQUEST_LEN]).map_err(|e| Some(e.into()))?;
        self.input.consume(nbd::REQUEST_LEN);
        if req.command == Command::Disc {
            debug!("client sent NBD_CMD_DISC");
            self.reading = false;
            return Ok((ReadState::Header, Step::Progress));
        }
        if req.payload_too_large() {
            return Err(Some(TransmissionError::WriteTooLarge {
                handle: req.handle,
                length: req.length,
            }));
        }
        // The device's size now, not at the handshake: a volume grows online, and a kernel
        // NBD device is told so (`frontends/devices.rs`).
        let state = match check_request(&req, self.device.size()) {
            Ok(op) => ReadState::Admit {
                handle: req.handle,
                op,
            },
            Err(error) => self.refuse(&req, error),
        };
        Ok((state, Step::Progress))
    }

    /// Answer a request that failed validation with `error`, without touching the device.
    fn refuse(&mut self, req: &Request, error: u32) -> ReadState {
        debug!(handle = req.handle, command = ?req.command, error, "refused NBD request");
        self.reply(req.handle, error, None, 0);
        match req.has_payload() {
            // The payload of a refused write is still on the wire; skip it to stay in sync.
            // (Its length is at most MAX_PAYLOAD_BYTES: `payload_too_large` came first.)
            true => ReadState::Skip {
                left: req.length as usize,
            },
            false => ReadState::Header,
        }
    }

    /// Start a valid request once its data fits the budget; a write reads its payload first.
    fn admit(&mut self, handle: u64, op: Op) -> Next {
        let want = u64::from(op.data_bytes());
        if want > 0 && self.held().1 + want > u64::from(MAX_IN_FLIGHT_BYTES) {
            return Ok((ReadState::Admit { handle, op }, Step::Blocked));
        }
        let state = match op {
            Op::Write { len, .. } => ReadState::Payload {
                handle,
                op,
                // Read straight into an aligned buffer: the replicas write with O_DIRECT, so
                // the data reaches their disks without another copy.
                buf: AlignedBuf::for_overwrite(len as usize),
                filled: 0,
            },
            _ => {
                self.start(handle, op, Bytes::new());
                ReadState::Header
            }
        };
        Ok((state, Step::Progress))
    }

    fn payload(
        &mut self,
        cx: &mut Context<'_>,
        handle: u64,
        op: Op,
        mut buf: AlignedBuf,
        mut filled: usize,
    ) -> Next {
        let mut step = Step::Blocked;
        loop {
            let take = self.input.len().min(buf.len() - filled);
            if take > 0 {
                buf.as_mut_slice()[filled..filled + take]
                    .copy_from_slice(&self.input.data()[..take]);
                self.input.consume(take);
                filled += take;
                step = Step::Progress;
            }
            if filled == buf.len() {
                self.start(handle, op, buf.into_bytes());
                return Ok((ReadState::Header, Step::Progress));
            }
            // Some(true): bytes came; Some(false): end of stream; None: none yet.
            let more = if buf.len() - filled >= DIRECT_READ_MIN_BYTES {
                let mut tail = tokio::io::ReadBuf::new(&mut buf.as_mut_slice()[filled..]);
                match Pin::new(&mut self.stream).poll_read(cx, &mut tail) {
                    Poll::Ready(Ok(())) => {
                        let n = tail.filled().len();
                        filled += n;
                        Some(n > 0)
                    }
                    Poll::Ready(Err(e)) => return Err(Some(TransmissionError::Read(e))),
                    Poll::Pending => None,
                }
            } else {
                match self.fill(cx) {
                    Ok(came) => came.then_some(true),
                    Err(None) => Some(false),
                    Err(e) => return Err(e),
                }
            };
            match more {
                Some(true) => step = Step::Progress,
                Some(false) => {
                    return Err(Some(TransmissionError::Read(
                        io::ErrorKind::UnexpectedEof.into(),
                    )))
                }
                None => {
                    let state = ReadState::Payload {
                        handle,
                        op,
                        buf,
                        filled,
                    };
                    return Ok((state, step));
                }
            }
        }
    }

    fn skip(&mut self, cx: &mut Context<'_>, mut left: usize) -> Next {
        let take = self.input.len().min(left);
        self.input.consume(take);
        left -= take;
        if left == 0 {
            return Ok((ReadState::Header, Step::Progress));
        }
        match self.fill(cx) {
            Ok(true) => Ok((ReadState::Skip { left }, Step::Progress)),
            Ok(false) => Ok((ReadState::Skip { left }, step_of(take > 0))),
            Err(None) => Err(Some(TransmissionError::Read(
                io::ErrorKind::UnexpectedEof.into(),
            ))),
            Err(e) => Err(e),
        }
    }

    /// Read more input: `Ok(true)` if some came, `Ok(false)` if the socket has none now,
    /// `Err(None)` at end of stream (a clean end at a header boundary).
    fn fill(&mut self, cx: &mut Context<'_>) -> Result<bool, Option<TransmissionError>> {
        match self.input.poll_fill(cx, &mut self.stream) {
            Poll::Pending => Ok(false),
            Poll::Ready(Ok(0)) => {
                debug!("client closed the connection without NBD_CMD_DISC");
                Err(None)
            }
            Poll::Ready(Ok(_)) => Ok(true),
            Poll::Ready(Err(e)) => Err(Some(TransmissionError::Read(e))),
        }
    }

    /// Start `op` on the device. It is first polled by the next `collect`, on this task.
    fn start(&mut self, handle: u64, op: Op, payload: Bytes) {
        let holds = op.data_bytes();
        self.running_bytes += u64::from(holds);
        let device = Arc::clone(&self.device);
        // Alone: nothing else running and no further header read. Only then may the device
        // run it inline; otherwise this task would run a deep queue one request at a time.
        let alone = self.running.is_empty() && self.input.len() < nbd::REQUEST_LEN;
        self.running
            .push(Box::pin(with_queue_hint(alone, async move {
                let (error, data) = match execute(device.as_ref(), op, payload).await {
                    Ok(data) => (0, data),
                    Err(e) => {
                        debug!(handle, ?op, error = %e, "NBD request failed");
                        (errno(e), None)
                    }
                };
                Done {
                    handle,
                    error,
                    data,
                    holds,
                }
            })));
    }

    /// Poll the running requests; queue the replies of those that finished. True if any did,
    /// or if one was woken meanwhile (another round then polls it).
    fn collect(&mut self, cx: &mut Context<'_>) -> bool {
        let Connection {
            own_wake,
            running,
            running_bytes,
            replies,
            write_failed,
            ..
        } = self;
        let (any, woken) = own_wake.poll(cx, |cx| {
            let mut any = false;
            while let Poll::Ready(Some(done)) = running.poll_next_unpin(cx) {
                *running_bytes -= u64::from(done.holds);
                if write_failed.is_none() {
                    replies.push(done.handle, done.error, done.data, done.holds);
                }
                any = true;
            }
            any
        });
        any || woken
    }

    fn reply(&mut self, handle: u64, error: u32, data: Option<Bytes>, holds: u32) {
        if self.write_failed.is_none() {
            self.replies.push(handle, error, data, holds);
        }
    }

    /// Write what replies are queued. True if that freed room for more requests.
    fn write(&mut self, cx: &mut Context<'_>) -> bool {
        if self.write_failed.is_some() || self.replies.is_idle() {
            return false;
        }
        let before = self.replies.held_requests();
        match self.replies.poll_write(cx, &mut self.stream) {
            Poll::Ready(Ok(())) => true,
            Poll::Pending => self.replies.held_requests() < before,
            Poll::Ready(Err(e)) => {
                debug!(error = %e, "cannot write replies; finishing the requests in flight");
                self.replies.discard();
                self.write_failed = Some(e);
                self.reading = false;
                true
            }
        }
    }

    /// Everything is answered: shut the write side down and say how the connection ended.
    fn finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), TransmissionError>> {
        if self.write_failed.is_none() {
            if let Err(e) = std::task::ready!(Pin::new(&mut self.stream).poll_shutdown(cx)) {
                self.write_failed = Some(e);
            }
        }
        Poll::Ready(match (self.failure.take(), self.write_failed.take()) {
            (Some(e), _) => Err(e),
            (None, Some(e)) => Err(TransmissionError::Write(e)),
            (None, None) => Ok(()),
        })
    }
}

fn step_of(progress: bool) -> Step {
    match progress {
        true => Step::Progress,
        false => Step::Blocked,
    }
}

#[cfg(test)]
#[path = "transmission_tests.rs"]
mod tests;
