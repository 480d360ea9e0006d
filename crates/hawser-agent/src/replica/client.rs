//! The engine's connection to a replica on another node. `connect` performs the Hello (which
//! raises the replica's epoch to the engine's, or fails if a newer engine exists); after that
//! `send` puts requests on the wire (see [`Outbox`]), a reader task matches replies
//! by request id and hands them to the [`ReplySink`]. A request left unanswered longer than
//! `REPLICA_REQUEST_TIMEOUT`, a malformed reply, or a closed socket ends the connection and
//! the sink hears `on_lost` exactly once; the engine then fails every request still in flight
//! on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use hawser_core::IdMap;
use hawser_core::{ClientOp, ReplicaFailure, ReplicaResult, SubId};
use hawser_wire::frame::{FrameHeader, HelloInfo, Op, Status, FLAG_FUA, FLAG_MAY_TRIM, FLAG_QUIET};
use hawser_wire::grant::{HelloRequest, HelloSnapshotRequest};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;

use crate::constants::{
    REPLICA_CONNECT_TIMEOUT, REPLICA_PING_INTERVAL, REPLICA_REQUEST_TIMEOUT,
    REPLICA_SILENCE_TIMEOUT, REPLICA_WATCHDOG_INTERVAL,
};
use crate::replica::frame_io::{read_frame, FrameIoError};
use crate::replica::outbox::Outbox;
use crate::tls::conn::{self, ReadSide};

/// Where replies go.
pub trait ReplySink: Send + Sync + 'static {
    fn on_reply(&self, sub: SubId, result: ReplicaResult);
    /// The connection is gone; called once. `corrupt`: it ended because the replica sent a
    /// frame that failed its checksum or did not decode.
    fn on_lost(&self, corrupt: bool);
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect to replica {replica} at {addr}: {source}")]
    Io {
        replica: String,
        addr: String,
        source: std::io::Error,
    },
    #[error("replica {replica} at {addr} did not answer Hello within the timeout")]
    Timeout { replica: String, addr: String },
    #[error("replica {replica} at {addr}: {source}")]
    Protocol {
        replica: String,
        addr: String,
        source: FrameIoError,
    },
    #[error("replica {replica} at {addr} refused Hello: {status:?}")]
    Refused {
        replica: String,
        addr: String,
        status: Status,
    },
}

impl ConnectError {
    pub fn is_stale_epoch(&self) -> bool {
        matches!(
            self,
            ConnectError::Refused {
                status: Status::StaleEpoch,
                ..
            }
        )
    }
}

/// Request ids of the client's own liveness pings (engine sub ids stay far below).
const PING_ID_BASE: u64 = 1 << 62;
/// Request ids of `call`s (journal and checksum requests of the driver itself).
const CALL_ID_BASE: u64 = 1 << 61;

/// The answer to a `call`: the reply's status and payload.
pub type CallReply = (Status, Option<Bytes>);

struct Shared {
    /// Outstanding requests: sub -> (op, sent at). Pings included.
    outstanding: Mutex<IdMap<SubId, (Op, Instant)>>,
    /// When the last frame arrived from the replica.
    last_rx: Mutex<Instant>,
    closed: AtomicBool,
    /// Set before closing when the replica sent a corrupt frame.
    corrupt: AtomicBool,
    /// The connection's sending side, which `close` shuts down.
    out: Arc<Outbox<OwnedWriteHalf>>,
    sink: Arc<dyn ReplySink>,
    /// Waiters of `call`s; dropped (the caller sees the connection lost) on close.
    calls: Mutex<IdMap<u64, tokio::sync::oneshot::Sender<CallReply>>>,
    next_call: std::sync::atomic::AtomicU64,
    /// Set while the watchdog waits for a request: an idle connection runs no timer, so a
    /// node's idle volumes cost it nothing (issue 44: 1,000 of them ticked 8,000 times a
    /// second). A request that finds it set wakes the watchdog through `wake`.
    parked: AtomicBool,
    wake: tokio::sync::Notify,
}

impl Shared {
    /// The connection is over: the socket is shut down at once (see `Outbox::abort`), the
    /// waiters are dropped and the sink hears of the loss, once.
    fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.out.abort();
            self.outstanding
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            self.calls.lock().unwrap_or_else(|p| p.into_inner()).clear();
            self.sink.on_lost(self.corrupt.load(Ordering::Acquire));
            self.wake.notify_one();
        }
    }

    /// Records request `id` as outstanding, and wakes a parked watchdog. The flag is read
    /// after the insert, under the same lock the watchdog's last look takes after it sets the
    /// flag: either that look sees the request, or this sees the flag (and a `notify_one`
    /// before the watchdog waits is kept for it).
    fn outstanding_add(&self, id: SubId, op: Op) {
        self.outstanding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (op, Instant::now()));
        if self.parked.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Whether requests other than the watchdog's own pings are outstanding.
    fn busy(&self) -> bool {
        self.outstanding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|(op, _)| *op != Op::Ping)
    }
}

pub struct ReplicaClient {
    out: Arc<Outbox<OwnedWriteHalf>>,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    epoch: u64,
}

impl ReplicaClient {
    /// Connect (over TLS with `tls`, which accepts only the replica's node) and say Hello.
    /// The caller's sink starts receiving after this returns.
    pub async fn connect(
        addr: &str,
        tls: Option<Arc<hawser_tls::rustls::ClientConfig>>,
        hello: &HelloRequest,
        epoch: u64,
        sink: Arc<dyn ReplySink>,
    ) -> Result<(ReplicaClient, HelloInfo), ConnectError> {
        let payload = Bytes::from(hello.encode());
        Self::connect_as(addr, tls, &hello.replica, Op::Hello, payload, epoch, sink).await
    }

    /// Connect for a read-only session of one snapshot copy (`Op::HelloSnapshot`): then
    /// `call` Read and Checksum read the copy.
    pub async fn connect_snapshot(
        addr: &str,
        tls: Option<Arc<hawser_tls::rustls::ClientConfig>>,
        hello: &HelloSnapshotRequest,
        sink: Arc<dyn ReplySink>,
    ) -> Result<(ReplicaClient, HelloInfo), ConnectError> {
        let payload = Bytes::from(hello.encode());
        let op = Op::HelloSnapshot;
        Self::connect_as(addr, tls, &hello.replica, op, payload, 0, sink).await
    }

    async fn connect_as(
        addr: &str,
        tls: Option<Arc<hawser_tls::rustls::ClientConfig>>,
        replica: &str,
        op: Op,
        payload: Bytes,
        epoch: u64,
        sink: Arc<dyn ReplySink>,
    ) -> Result<(ReplicaClient, HelloInfo), ConnectError> {
        let fut = Self::hello(addr, tls, replica, op, payload, epoch);
        let (rd, out, drain, info) = tokio::time::timeout(REPLICA_CONNECT_TIMEOUT, fut)
            .await
            .map_err(|_| ConnectError::Timeout {
                replica: replica.into(),
                addr: addr.into(),
            })??;
        let shared = Arc::new(Shared {
            outstanding: Mutex::new(IdMap::default()),
            last_rx: Mutex::new(Instant::now()),
            closed: AtomicBool::new(false),
            corrupt: AtomicBool::new(false),
            out: out.clone(),
            sink,
            calls: Mutex::new(IdMap::default()),
            next_call: std::sync::atomic::AtomicU64::new(CALL_ID_BASE),
            parked: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        });
        let tasks = vec![
            tokio::spawn(writer(drain, shared.clone())),
            tokio::spawn(reader(rd, shared.clone())),
            tokio::spawn(watchdog(shared.clone(), out.clone(), epoch)),
        ];
        Ok((
            ReplicaClient {
                out,
                shared,
                tasks,
                epoch,
            },
            info,
        ))
    }

    /// Connects, says Hello and reads the answer; the outbox's drain task runs from the
    /// start (a Hello, like any frame, may find the socket full).
    async fn hello(
        addr: &str,
        tls: Option<Arc<hawser_tls::rustls::ClientConfig>>,
        replica: &str,
        op: Op,
        payload: Bytes,
        epoch: u64,
    ) -> Result<(ReadSide, Arc<Outbox<OwnedWriteHalf>>, Drain, HelloInfo), ConnectError> {
        let ctx = |source| ConnectError::Io {
            replica: replica.into(),
            addr: addr.into(),
            source,
        };
        let stream = TcpStream::connect(addr).await.map_err(ctx)?;
        stream.set_nodelay(true).map_err(ctx)?;
        let (stream, conn) = match tls {
            None => (stream, None),
            Some(cfg) => {
                let (s, c) = conn::connect(stream, cfg)
                    .await
                    .map_err(|e| ctx(closed_hint(e)))?;
                (s, Some(c))
            }
        };
        let (mut rd, out, _) = conn::split(stream, conn);
        let drain = tokio::spawn({
            let out = out.clone();
            async move { out.drain().await }
        });
        let result = async {
            let h = FrameHeader::request(op, 0, epoch, 0, 0).with_payload(&payload);
            push_frame(&out, &h, Some(payload), true).map_err(|_| {
                ctx(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the connection failed before Hello",
                ))
            })?;
            let proto = |source| ConnectError::Protocol {
                replica: replica.into(),
                addr: addr.into(),
                source,
            };
            let (reply, payload) = read_frame(&mut rd).await.map_err(proto)?;
            if !reply.is_reply() || reply.op != op {
                return Err(proto(FrameIoError::Closed));
            }
            if reply.status != Status::Ok {
                return Err(ConnectError::Refused {
                    replica: replica.into(),
                    addr: addr.into(),
                    status: reply.status,
                });
            }
            payload
                .as_deref()
                .and_then(HelloInfo::decode)
                .ok_or_else(|| proto(FrameIoError::Closed))
        }
        .await;
        match result {
            Ok(info) => Ok((rd, out, drain, info)),
            Err(e) => {
                out.close();
                let _ = drain.await;
                Err(e)
            }
        }
    }

    /// Queue a request. If the connection is already gone the request fails at once (the
    /// sink hears `Lost` for it), so every send is answered exactly once.
    pub fn send(&self, sub: SubId, op: &ClientOp, quiet: bool) {
        let (mut header, payload) = encode(sub, self.epoch, op);
        if quiet {
            header.flags |= FLAG_QUIET;
        }
        if self.shared.closed.load(Ordering::Acquire) {
            self.shared.sink.on_reply(sub, Err(ReplicaFailure::Lost));
            return;
        }
        self.shared.outstanding_add(sub, header.op);
        // Alone (an idle engine): write it now, so it overlaps the local write that follows.
        if push_frame(&self.out, &header, payload, quiet).is_err() {
            self.shared.close();
        }
    }

    /// One request outside the engine (journal, checksum), answered to the caller rather than
    /// the sink. `None`: the connection is gone (the sink hears `on_lost`, as for any loss).
    pub async fn call(
        &self,
        op: Op,
        offset: u64,
        length: u32,
        payload: Option<Bytes>,
    ) -> Option<CallReply> {
        let id = self.shared.next_call.fetch_add(1, Ordering::AcqRel);
        let mut h = FrameHeader::request(op, id, self.epoch, offset, length);
        if let Some(p) = &payload {
            h = h.with_payload(p);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.shared
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        self.shared.outstanding_add(id, op);
        // Checked after the waiter is in place: a close that ran before it could not have
        // dropped it, and nothing would ever answer it.
        if self.shared.closed.load(Ordering::Acquire) {
            self.shared
                .calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return None;
        }
        if push_frame(&self.out, &h, payload, true).is_err() {
            self.shared.close();
        }
        rx.await.ok()
    }

    /// Close the connection (the sink hears `on_lost` if it has not already).
    pub fn close(&self) {
        for t in &self.tasks {
            t.abort();
        }
        self.out.close();
        self.shared.close();
    }
}

impl Drop for ReplicaClient {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // The outbox's drain task is not among them (aborting `writer` only detaches it),
        // and it holds the socket until the outbox fails: without this a dropped client's
        // connection stayed open, and the replica's session with it, for good.
        self.out.abort();
    }
}

fn encode(sub: SubId, epoch: u64, op: &ClientOp) -> (FrameHeader, Option<Bytes>) {
    match op {
        ClientOp::Read { offset, len } => (
            FrameHeader::request(Op::Read, sub, epoch, *offset, *len),
            None,
        ),
        ClientOp::Write { offset, data, fua } => {
            // Payloads are bounded by the NBD frontend (32 MiB), so the length fits in u32.
            let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
            let mut h =
                FrameHeader::request(Op::Write, sub, epoch, *offset, len).with_payload(data);
            if *fua {
                h.flags |= FLAG_FUA;
            }
            (h, Some(data.clone()))
        }
        ClientOp::Flush => (FrameHeader::request(Op::Flush, sub, epoch, 0, 0), None),
        ClientOp::Trim { offset, len } => (
            FrameHeader::request(Op::Trim, sub, epoch, *offset, *len),
            None,
        ),
        ClientOp::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        } => {
            let mut h = FrameHeader::request(Op::WriteZeroes, sub, epoch, *offset, *len);
            if *fua {
                h.flags |= FLAG_FUA;
            }
            if *may_trim {
                h.flags |= FLAG_MAY_TRIM;
            }
            (h, None)
        }
    }
}

/// Queue one frame, header and payload together.
fn push_frame(
    out: &Outbox<OwnedWriteHalf>,
    h: &FrameHeader,
    payload: Option<Bytes>,
    now: bool,
) -> Result<(), crate::replica::outbox::Closed> {
    let header = Bytes::copy_from_slice(&h.encode());
    out.push(std::iter::once(header).chain(payload), now)
}

/// The outbox's drain task: it finishes the writes the socket could not take at once and
/// ends when a write fails (or the outbox is closed).
type Drain = tokio::task::JoinHandle<()>;

/// Ends the connection when the drain task ends.
async fn writer(drain: Drain, shared: Arc<Shared>) {
    let _ = drain.await;
    shared.close();
}

async fn reader(mut rd: ReadSide, shared: Arc<Shared>) {
    loop {
        let (h, payload) = match read_frame(&mut rd).await {
            Ok(f) => f,
            Err(e) => {
                if let FrameIoError::Frame(f) = &e {
                    tracing::error!(error = %f, "corrupt frame from the replica; failing it");
                    shared.corrupt.store(true, Ordering::Release);
                } else if !matches!(e, FrameIoError::Closed) {
                    tracing::warn!(error = %e, "replica connection failed");
                }
                break;
            }
        };
        *shared.last_rx.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let known = shared
            .outstanding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&h.request_id);
        let Some((op, _)) = known else {
            tracing::warn!(request_id = h.request_id, "reply to no outstanding request");
            break;
        };
        if !h.is_reply() || h.op != op {
            tracing::warn!(
                request_id = h.request_id,
                "reply does not match its request"
            );
            break;
        }
        if op == Op::Ping {
            continue; // liveness only
        }
        if h.request_id >= CALL_ID_BASE {
            let waiter = shared
                .calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&h.request_id);
            if let Some(w) = waiter {
                let _ = w.send((h.status, payload));
            }
            continue;
        }
        let result = match h.status {
            Status::Ok if op == Op::Read => match payload {
                Some(p) if p.len() == h.length as usize => Ok(Some(p)),
                _ => Err(ReplicaFailure::Io),
            },
            Status::Ok => Ok(None),
            Status::StaleEpoch => Err(ReplicaFailure::StaleEpoch),
            Status::NoSpace => Err(ReplicaFailure::NoSpace),
            // A newer session of this replica replaced this connection: it is gone, the
            // replica is fine.
            Status::Unavailable => Err(ReplicaFailure::Lost),
            // The reply names the first bad block and the count (`Status::Corrupt`).
            Status::Corrupt => Err(ReplicaFailure::Corrupt {
                first: h.offset,
                blocks: h.length,
            }),
            _ => Err(ReplicaFailure::Io),
        };
        shared.sink.on_reply(h.request_id, result);
    }
    shared.close();
}

/// Ends the connection when the replica goes silent: while requests are outstanding it pings
/// the replica (answered without touching the disk), so a partition is detected after
/// `REPLICA_SILENCE_TIMEOUT` even when a request may legitimately take longer; a request
/// unanswered for `REPLICA_REQUEST_TIMEOUT` (a hung disk) also ends it.
///
/// Silence counts from the later of the last frame received and the start of the current
/// busy spell: a connection idle for longer than the timeout has heard nothing for that
/// long, and its next request must not be taken for a partition (it was, when the watchdog
/// ticked while that request was in flight). While nothing is outstanding the watchdog
/// parks (`Shared::parked`) and the next request wakes it.
async fn watchdog(shared: Arc<Shared>, out: Arc<Outbox<OwnedWriteHalf>>, epoch: u64) {
    let mut tick = tokio::time::interval(REPLICA_WATCHDOG_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pings = 0u64;
    let mut last_ping = Instant::now();
    let mut busy_since = Instant::now();
    loop {
        tick.tick().await;
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        if !shared.busy() {
            shared.parked.store(true, Ordering::SeqCst);
            if !shared.busy() && !shared.closed.load(Ordering::Acquire) {
                shared.wake.notified().await;
            }
            shared.parked.store(false, Ordering::SeqCst);
            busy_since = Instant::now();
            last_ping = busy_since;
            tick.reset();
            continue;
        }
        let overdue = shared
            .outstanding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|(_, at)| at.elapsed() > REPLICA_REQUEST_TIMEOUT);
        let silent = shared
            .last_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            .min(busy_since.elapsed());
        if overdue || silent > REPLICA_SILENCE_TIMEOUT {
            tracing::warn!(
                overdue,
                silent_ms = silent.as_millis(),
                "replica not answering; dropping the connection"
            );
            shared.close();
            return;
        }
        if last_ping.elapsed() >= REPLICA_PING_INTERVAL {
            last_ping = Instant::now();
            pings += 1;
            let id = PING_ID_BASE + pings;
            shared.outstanding_add(id, Op::Ping);
            let h = FrameHeader::request(Op::Ping, id, epoch, 0, 0);
            if push_frame(&out, &h, None, false).is_err() {
                shared.close();
                return;
            }
        }
    }
}

/// A TLS handshake the replica's node ended without a word: say what does that, rather than
/// only "tls handshake eof" (issue 44: a node pair out of connections was silent on both
/// sides).
fn closed_hint(e: std::io::Error) -> std::io::Error {
    if e.kind() != std::io::ErrorKind::UnexpectedEof {
        return e;
    }
    std::io::Error::new(
        e.kind(),
        format!(
            "{e}: the replica's node closed the connection during the TLS handshake; it does \
             that at a connection limit (its log names the limit, and its metric \
             hawser_replica_connections_refused_total counts it) or when it does not accept \
             this node's certificate"
        ),
    )
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
