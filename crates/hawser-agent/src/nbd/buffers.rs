//! The two socket buffers of an NBD connection, polled by hand from its one task
//! (`transmission`): requests come in through [`Input`], replies go out through
//! [`Replies`]. Both are plain state, so a poll that returns `Pending` loses nothing: a read or
//! write that has not happened has not consumed or produced a byte.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use hawser_wire::nbd::SimpleReply;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes read from the socket and not consumed yet. One read syscall brings in as many
/// request headers (and small write payloads) as the client has sent, up to its capacity.
pub struct Input {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Input {
    pub fn with_capacity(capacity: usize) -> Input {
        Input {
            buf: vec![0; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// The bytes read and not consumed.
    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Mark the first `n` unconsumed bytes consumed.
    pub fn consume(&mut self, n: usize) {
        assert!(n <= self.len(), "consumed {n} of {} bytes", self.len());
        self.start += n;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// Read more from `r`, after what is already here. `Ready(Ok(0))` is end of stream.
    pub fn poll_fill<R>(&mut self, cx: &mut Context<'_>, r: &mut R) -> Poll<io::Result<usize>>
    where
        R: AsyncRead + Unpin,
    {
        if self.end == self.buf.len() {
            // Only ever a partial request header or payload here: move it to the front.
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let mut tail = ReadBuf::new(&mut self.buf[self.end..]);
        ready!(Pin::new(r).poll_read(cx, &mut tail))?;
        let n = tail.filled().len();
        self.end += n;
        Poll::Ready(Ok(n))
    }
}

/// Read data up to this size is copied next to its reply header, so many replies leave in one
/// contiguous write; larger data goes out as its own slice of a vectored write, uncopied.
const COPY_MAX_BYTES: usize = 16 * 1024;
/// Slices handed to one vectored write.
const MAX_SLICES: usize = 64;

/// Replies waiting for the socket, in the order they completed. Each keeps what its request
/// held (a request slot, and its data bytes) until its last byte has been written, so a client
/// that stops reading stops the connection from taking new requests instead of growing this.
pub struct Replies {
    /// Headers and small data not yet made a segment.
    staged: BytesMut,
    /// What to write, in order; `first_done` bytes of the first one are written.
    segments: VecDeque<Bytes>,
    first_done: usize,
    /// Stream positions: bytes queued in total and written in total.
    queued: u64,
    written: u64,
    /// Per queued reply: the stream position just past its last byte, and the data bytes it
    /// holds against the connection's budget.
    ends: VecDeque<(u64, u32)>,
    held_bytes: u64,
    /// Written since the last flush of the writer (a TLS stream buffers records).
    unflushed: bool,
}

impl Replies {
    pub fn new(capacity: usize) -> Replies {
        Replies {
            staged: BytesMut::with_capacity(capacity),
            segments: VecDeque::new(),
            first_done: 0,
            queued: 0,
            written: 0,
            ends: VecDeque::new(),
            held_bytes: 0,
            unflushed: false,
        }
    }

    /// Replies queued and not completely written.
    pub fn held_requests(&self) -> usize {
        self.ends.len()
    }

    /// Data bytes those replies hold.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Nothing to write and nothing to flush.
    pub fn is_idle(&self) -> bool {
        self.ends.is_empty() && !self.unflushed
    }

    /// Queue a simple reply; `data` follows the header (a successful read). `holds` is the
    /// data budget the request held, released when the reply is written.
    pub fn push(&mut self, handle: u64, error: u32, data: Option<Bytes>, holds: u32) {
        let header = SimpleReply { error, handle }.encode();
        self.staged.extend_from_slice(&header);
        let mut len = header.len();
        if let Some(data) = data {
            len += data.len();
            if data.len() <= COPY_MAX_BYTES {
                self.staged.extend_from_slice(&data);
            } else {
                self.seal();
                self.segments.push_back(data);
            }
        }
        self.queued += len as u64;
        self.ends.push_back((self.queued, holds));
        self.held_bytes += u64::from(holds);
    }

    /// Forget every queued reply, releasing what they hold (the socket is gone).
    pub fn discard(&mut self) {
        self.staged.clear();
        self.segments.clear();
        self.first_done = 0;
        self.written = self.queued;
        self.ends.clear();
        self.held_bytes = 0;
        self.unflushed = false;
    }

    fn seal(&mut self) {
        if !self.staged.is_empty() {
            self.segments.push_back(self.staged.split().freeze());
        }
    }

    /// Write queued replies to `w` until all are written and flushed (`Ready(Ok)`), the
    /// socket is full (`Pending`), or it fails. Whatever was written stays written either way.
    pub fn poll_write<W>(&mut self, cx: &mut Context<'_>, w: &mut W) -> Poll<io::Result<()>>
    where
        W: AsyncWrite + Unpin,
    {
        self.seal();
        while let Some(first) = self.segments.front() {
            let n = if w.is_write_vectored() && self.segments.len() > 1 {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let mut count = 0;
                for (i, s) in self.segments.iter().take(MAX_SLICES).enumerate() {
                    let skip = if i == 0 { self.first_done } else { 0 };
                    slices[i] = IoSlice::new(&s[skip..]);
                    count += 1;
                }
                ready!(Pin::new(&mut *w).poll_write_vectored(cx, &slices[..count]))?
            } else {
                ready!(Pin::new(&mut *w).poll_write(cx, &first[self.first_done..]))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance(n);
        }
        if self.unflushed {
            ready!(Pin::new(&mut *w).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }

    fn advance(&mut self, mut n: usize) {
        self.written += n as u64;
        self.unflushed = true;
        while n > 0 {
            let Some(first) = self.segments.front() else {
                unreachable!("the writer reported more bytes written than it was given")
            };
            let left = first.len() - self.first_done;
            if n < left {
                self.first_done += n;
                break;
            }
            n -= left;
            self.first_done = 0;
            self.segments.pop_front();
        }
        while let Some(&(end, holds)) = self.ends.front() {
            if end > self.written {
                break;
            }
            self.ends.pop_front();
            self.held_bytes -= u64::from(holds);
        }
    }
}
