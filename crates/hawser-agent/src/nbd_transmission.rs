//! The NBD transmission phase of one connection: requests in, simple replies out.
//!
//! Many requests are in flight at once. The reader validates each header, reads a write's
//! payload and spawns one task per request; a single writer serialises the replies, each
//! echoing its request's handle, in whatever order the requests finish. Back-pressure: the
//! reader reads no new header while `MAX_IN_FLIGHT_REQUESTS` requests are unanswered, and
//! holds a request back while `MAX_IN_FLIGHT_BYTES` of read or write data are outstanding.
//!
//! A bad request (unknown command or flag, misaligned, out of range, too long a read) gets an
//! error reply and the connection carries on. Broken framing (bad magic, or a write whose
//! payload is too large to skip safely) ends the connection, as do `NBD_CMD_DISC` and server
//! shutdown; in every case the requests already in flight are answered first.
//!
//! A data request of length 0 is refused with EINVAL: the spec leaves it unspecified, no real
//! client sends it, and refusing it keeps every request the device sees non-empty.

use std::future::Future;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use hawser_core::IoError;
use hawser_storage::AlignedBuf;
use hawser_wire::constants::{MAX_PAYLOAD_BYTES, SECTOR_BYTES};
use hawser_wire::nbd::{self, Command, NbdError, Request, SimpleReply};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn, Instrument};

use crate::block::BlockDevice;
use crate::nbd_errno::errno;
use crate::nbd_server::shutdown_requested;

/// Requests one connection may have unanswered. Deep enough for fio/qemu queue depths of
/// 32-64 plus slack; at the bound the reader stops reading, so the client's socket fills up.
pub const MAX_IN_FLIGHT_REQUESTS: usize = 128;
/// Read and write data one connection may hold in memory at once.
pub const MAX_IN_FLIGHT_BYTES: u32 = 128 * 1024 * 1024;
/// Socket read buffer: many small headers per syscall; large payloads bypass it.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Reply buffer: replies that are ready together go out in one syscall.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

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

/// A request that passed validation, ready for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    },
}

impl Op {
    /// Bytes of data this request holds in memory while in flight.
    fn data_bytes(&self) -> u32 {
        match *self {
            Op::Read { len, .. } | Op::Write { len, .. } => len,
            _ => 0,
        }
    }
}

/// Validate a request against an export of `size` bytes; `Err` is the errno to reply with.
///
/// FUA is accepted on every command (the spec requires it once SEND_FUA is advertised);
/// NO_HOLE only on WRITE_ZEROES; any other flag is EINVAL. Writes past the end get ENOSPC
/// and other out-of-range requests EINVAL, as the spec recommends. FLUSH ignores its offset
/// and length, which the spec reserves.
pub fn check_request(req: &Request, size: u64) -> Result<Op, u32> {
    let allowed = match req.command {
        Command::WriteZeroes => nbd::CMD_FLAG_FUA | nbd::CMD_FLAG_NO_HOLE,
        Command::Read | Command::Write | Command::Flush | Command::Trim => nbd::CMD_FLAG_FUA,
        // DISC never reaches here; unknown commands carry no payload we could know about.
        Command::Disc | Command::Unknown(_) => return Err(nbd::EINVAL),
    };
    if req.flags & !allowed != 0 {
        return Err(nbd::EINVAL);
    }
    let fua = req.flags & nbd::CMD_FLAG_FUA != 0;
    let (offset, len) = (req.offset, req.length);
    match req.command {
        Command::Read => {
            if len > MAX_PAYLOAD_BYTES {
                return Err(nbd::EOVERFLOW);
            }
            check_range(offset, len, size, nbd::EINVAL)?;
            Ok(Op::Read { offset, len })
        }
        Command::Write => {
            check_range(offset, len, size, nbd::ENOSPC)?;
            Ok(Op::Write { offset, len, fua })
        }
        Command::Trim => {
            check_range(offset, len, size, nbd::EINVAL)?;
            Ok(Op::Trim { offset, len, fua })
        }
        Command::WriteZeroes => {
            check_range(offset, len, size, nbd::ENOSPC)?;
            let may_trim = req.flags & nbd::CMD_FLAG_NO_HOLE == 0;
            Ok(Op::WriteZeroes {
                offset,
                len,
                fua,
                may_trim,
            })
        }
        _ => Ok(Op::Flush),
    }
}

fn check_range(offset: u64, len: u32, size: u64, beyond_end: u32) -> Result<(), u32> {
    let len = u64::from(len);
    if len == 0 || !offset.is_multiple_of(SECTOR_BYTES) || !len.is_multiple_of(SECTOR_BYTES) {
        return Err(nbd::EINVAL);
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(beyond_end),
    }
}

/// Capacity a request holds until its reply has been handed to the socket.
struct Permits {
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// One simple reply on its way to the writer. `data` is only set on a successful read.
struct Reply {
    handle: u64,
    error: u32,
    data: Option<Bytes>,
    _permits: Permits,
}

/// Serve requests from `reader` until DISC, shutdown, EOF or a framing error, then wait for
/// every request in flight to be answered on `writer` and shut the writer down.
pub async fn serve<R, W>(
    reader: R,
    writer: W,
    device: Arc<dyn BlockDevice>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), TransmissionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, rx) = mpsc::channel(MAX_IN_FLIGHT_REQUESTS);
    let reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    // The reader owns the only sender outside request tasks, so the writer ends exactly when
    // the reader has stopped and every spawned request has sent its reply.
    let (read, write) = tokio::join!(
        read_requests(reader, device, tx, shutdown),
        write_replies(writer, rx)
    );
    read?;
    write.map_err(TransmissionError::Write)
}

/// The reader half: one header at a time, each turned into a spawned request or an error reply.
async fn read_requests<R>(
    mut reader: R,
    device: Arc<dyn BlockDevice>,
    tx: mpsc::Sender<Reply>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), TransmissionError>
where
    R: AsyncRead + Unpin,
{
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT_REQUESTS));
    let budget = Arc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES as usize));
    // One future for the whole connection, not two per request: building and dropping the
    // shutdown and writer-gone waits around every read cost more than the read itself.
    let stopped = async {
        tokio::select! {
            () = shutdown_requested(&mut shutdown) => {}
            () = tx.closed() => {}
        }
    };
    tokio::pin!(stopped);
    loop {
        let slot = unless_stopped(slots.clone().acquire_owned(), stopped.as_mut()).await;
        // The semaphore is never closed, so only a stop ends the wait without a permit.
        let Some(Ok(slot)) = slot else { return Ok(()) };
        let mut header = [0u8; nbd::REQUEST_LEN];
        match unless_stopped(reader.read_exact(&mut header), stopped.as_mut()).await {
            None => return Ok(()),
            Some(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                debug!("client closed the connection without NBD_CMD_DISC");
                return Ok(());
            }
            Some(r) => r.map_err(TransmissionError::Read)?,
        };
        let req = Request::decode(&header)?;
        if req.command == Command::Disc {
            debug!("client sent NBD_CMD_DISC");
            return Ok(());
        }
        if req.payload_too_large() {
            return Err(TransmissionError::WriteTooLarge {
                handle: req.handle,
                length: req.length,
            });
        }
        dispatch(&mut reader, &device, &tx, &budget, req, slot).await?;
    }
}

/// Run `fut` unless `stopped` (the server shuts down, or the reply writer has gone away)
/// resolves first. `stopped` must not be polled again once it resolved.
async fn unless_stopped<F: Future>(
    fut: F,
    stopped: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        () = stopped => None,
        out = fut => Some(out),
    }
}

/// Validate one request, read its payload, and either spawn it or queue its error reply.
async fn dispatch<R>(
    reader: &mut R,
    device: &Arc<dyn BlockDevice>,
    tx: &mpsc::Sender<Reply>,
    budget: &Arc<Semaphore>,
    req: Request,
    slot: OwnedSemaphorePermit,
) -> Result<(), TransmissionError>
where
    R: AsyncRead + Unpin,
{
    let op = match check_request(&req, device.size()) {
        Ok(op) => op,
        Err(error) => return refuse(reader, tx, req, error, slot).await,
    };
    let bytes = match op.data_bytes() {
        0 => None,
        n => budget.clone().acquire_many_owned(n).await.ok(),
    };
    let payload = match op {
        Op::Write { len, .. } => read_payload(reader, len)
            .await
            .map_err(TransmissionError::Read)?,
        _ => Bytes::new(),
    };
    let permits = Permits {
        _slot: slot,
        _bytes: bytes,
    };
    let (device, tx, handle) = (Arc::clone(device), tx.clone(), req.handle);
    let task = async move {
        let (error, data) = match execute(device.as_ref(), op, payload).await {
            Ok(data) => (0, data),
            Err(e) => {
                debug!(handle, ?op, error = %e, "NBD request failed");
                (errno(e), None)
            }
        };
        let _ = tx
            .send(Reply {
                handle,
                error,
                data,
                _permits: permits,
            })
            .await;
    };
    tokio::spawn(task.in_current_span());
    Ok(())
}

/// Answer a request that failed validation with `error`, without touching the device.
async fn refuse<R>(
    reader: &mut R,
    tx: &mpsc::Sender<Reply>,
    req: Request,
    error: u32,
    slot: OwnedSemaphorePermit,
) -> Result<(), TransmissionError>
where
    R: AsyncRead + Unpin,
{
    // The payload of a refused write is still on the wire; skip it to stay in sync.
    if req.has_payload() {
        discard(reader, req.length)
            .await
            .map_err(TransmissionError::Read)?;
    }
    debug!(handle = req.handle, command = ?req.command, error, "refused NBD request");
    let permits = Permits {
        _slot: slot,
        _bytes: None,
    };
    let reply = Reply {
        handle: req.handle,
        error,
        data: None,
        _permits: permits,
    };
    // Fails only when the writer is gone, which the reader notices at its next wait.
    let _ = tx.send(reply).await;
    Ok(())
}

/// Read a write payload straight into an aligned buffer: the replicas write with O_DIRECT, so
/// the data reaches their disks without another copy.
async fn read_payload<R: AsyncRead + Unpin>(reader: &mut R, len: u32) -> io::Result<Bytes> {
    let len = usize::try_from(len).map_err(io::Error::other)?;
    let mut buf = AlignedBuf::for_overwrite(len);
    reader.read_exact(buf.as_mut_slice()).await?;
    Ok(buf.into_bytes())
}

async fn discard<R: AsyncRead + Unpin>(reader: &mut R, len: u32) -> io::Result<()> {
    let len = u64::from(len);
    let skipped = tokio::io::copy(&mut (&mut *reader).take(len), &mut tokio::io::sink()).await?;
    if skipped < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Perform one validated request. A successful read returns its data.
async fn execute(
    device: &dyn BlockDevice,
    op: Op,
    payload: Bytes,
) -> Result<Option<Bytes>, IoError> {
    match op {
        Op::Read { offset, len } => {
            let data = device.read(offset, len).await?;
            // A short or long read would desynchronise the stream for every later reply.
            if u32::try_from(data.len()) != Ok(len) {
                warn!(
                    offset,
                    len,
                    got = data.len(),
                    "block device returned a wrong-sized read"
                );
                return Err(IoError::Io);
            }
            Ok(Some(data))
        }
        Op::Write { offset, fua, .. } => device.write(offset, payload, fua).await.map(|()| None),
        Op::Flush => device.flush().await.map(|()| None),
        Op::Trim { offset, len, fua } => {
            device.trim(offset, len).await?;
            // TRIM has no FUA of its own on the device seam; a flush gives the same guarantee.
            if fua {
                device.flush().await?;
            }
            Ok(None)
        }
        Op::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        } => device
            .write_zeroes(offset, len, fua, may_trim)
            .await
            .map(|()| None),
    }
}

/// The writer half: replies in completion order, batched while more are already waiting.
async fn write_replies<W>(writer: W, mut rx: mpsc::Receiver<Reply>) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
    while let Some(reply) = rx.recv().await {
        let header = SimpleReply {
            error: reply.error,
            handle: reply.handle,
        }
        .encode();
        out.write_all(&header).await?;
        if let Some(data) = &reply.data {
            out.write_all(data).await?;
        }
        // The reply's data is buffered or sent: release its slot and budget now.
        drop(reply);
        if rx.is_empty() {
            out.flush().await?;
        }
    }
    out.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u64 = 1 << 20;

    fn req(command: Command, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command,
            handle: 9,
            offset,
            length,
        }
    }

    #[test]
    fn valid_requests_become_ops() {
        let r = check_request(&req(Command::Read, 0, 512, 4096), SIZE);
        assert_eq!(
            r,
            Ok(Op::Read {
                offset: 512,
                len: 4096
            })
        );
        let w = check_request(&req(Command::Write, nbd::CMD_FLAG_FUA, 0, 512), SIZE);
        assert_eq!(
            w,
            Ok(Op::Write {
                offset: 0,
                len: 512,
                fua: true
            })
        );
        let z = check_request(
            &req(Command::WriteZeroes, nbd::CMD_FLAG_NO_HOLE, 0, 512),
            SIZE,
        );
        assert_eq!(
            z,
            Ok(Op::WriteZeroes {
                offset: 0,
                len: 512,
                fua: false,
                may_trim: false
            })
        );
        let t = check_request(
            &req(Command::Trim, nbd::CMD_FLAG_FUA, SIZE - 512, 512),
            SIZE,
        );
        assert_eq!(
            t,
            Ok(Op::Trim {
                offset: SIZE - 512,
                len: 512,
                fua: true
            })
        );
        // FLUSH ignores its reserved fields.
        assert_eq!(
            check_request(&req(Command::Flush, 0, 3, 7), SIZE),
            Ok(Op::Flush)
        );
    }

    #[test]
    fn bad_requests_get_the_right_errno() {
        let cases = [
            (req(Command::Read, 0, 1, 512), nbd::EINVAL),
            (req(Command::Read, 0, 0, 511), nbd::EINVAL),
            (req(Command::Read, 0, 0, 0), nbd::EINVAL),
            (req(Command::Read, 0, SIZE, 512), nbd::EINVAL),
            (req(Command::Read, 0, u64::MAX - 511, 1024), nbd::EINVAL),
            (
                req(Command::Read, 0, 0, MAX_PAYLOAD_BYTES + 512),
                nbd::EOVERFLOW,
            ),
            (
                req(Command::Read, nbd::CMD_FLAG_NO_HOLE, 0, 512),
                nbd::EINVAL,
            ),
            (req(Command::Read, nbd::CMD_FLAG_DF, 0, 512), nbd::EINVAL),
            (req(Command::Write, 0, SIZE - 512, 1024), nbd::ENOSPC),
            (req(Command::Write, 0, 0, 0), nbd::EINVAL),
            (req(Command::WriteZeroes, 0, SIZE, 512), nbd::ENOSPC),
            (
                req(Command::WriteZeroes, nbd::CMD_FLAG_FAST_ZERO, 0, 512),
                nbd::EINVAL,
            ),
            (req(Command::Trim, 0, SIZE, 512), nbd::EINVAL),
            (req(Command::Flush, 1 << 15, 0, 0), nbd::EINVAL),
            (req(Command::Unknown(5), 0, 0, 512), nbd::EINVAL),
            (req(Command::Unknown(0xffff), 0, 0, 0), nbd::EINVAL),
        ];
        for (r, want) in cases {
            assert_eq!(check_request(&r, SIZE), Err(want), "{r:?}");
        }
    }
}
