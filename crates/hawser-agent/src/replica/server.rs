//! The replica server: serves this node's replicas to engines on any node over the replica
//! protocol (hawser_wire::frame). A connection starts with Hello, which binds it to one
//! replica and raises the replica's epoch; every later request is checked against that epoch
//! by the replica itself. Requests on a connection run concurrently (bounded); replies are
//! written by one writer task, batched while more are ready.
//!
//! Any malformed frame, checksum mismatch or protocol violation closes the connection before
//! anything reaches a disk.
//!
//! On a node that has joined a cluster, Hello must carry the controller's epoch grant for the
//! replica's volume at the Hello's epoch (`replica/grants.rs`), or it is refused (`Denied`) before the
//! replica is looked up or its epoch raised.
//!
//! Sessions: the engine of one epoch may reconnect to a replica (after a partition, or after
//! it dropped a replica that failed a write). Requests of its old connection may still be on
//! their way to the disk, and one landing after the resync that follows the reconnect would
//! overwrite copied data with stale bytes. So every Hello opens a new session of that replica:
//! it waits until the requests of earlier sessions that are executing have finished, and from
//! then on those sessions' requests are refused (`Unavailable`) instead of executed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hawser_listen::{ConnLimits, ConnPermit, Refused};
use hawser_storage::{Replica, ReplicaIoError, StoredJournal};
use hawser_wire::constants::MAX_PAYLOAD_BYTES;
use hawser_wire::frame::{FrameHeader, HelloInfo, Op, Status};
use hawser_wire::grant::{
    HelloRequest, HelloSnapshotRequest, MAX_HELLO_BYTES, MAX_HELLO_SNAPSHOT_BYTES,
};
use hawser_wire::journal::StoredReport;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedRwLockReadGuard, OwnedSemaphorePermit, RwLock, Semaphore};
use tracing::Instrument;

use crate::constants::{
    INLINE_IO_MAX_BYTES, REPLICA_CONN_LINGER, REPLICA_CONN_MAX_BACKLOG_BYTES,
    REPLICA_CONN_MAX_INFLIGHT, REPLICA_HELLO_TIMEOUT, REPLICA_PAYLOAD_TIMEOUT,
    REPLICA_SERVER_MAX_CONNS, REPLICA_SERVER_MAX_CONNS_PER_PEER, REPLICA_SERVER_MEMORY_BUDGET,
    REPLICA_UNGREETED_MAX_CONNS, REPLICA_UNGREETED_MAX_PER_PEER,
};
use crate::observe::refusals::RefusalMetrics;
use crate::replica::frame_io::{read_header, read_payload, FrameIoError};
use crate::replica::grants::{self, Expected};
pub use crate::replica::replies::{error_reply, status_of};
use crate::replica::replies::{memory_cost, reply, reply_now, Replies, Reply};
use crate::replica::snapshot_session::{hello_snapshot, snapshot_loop};
use crate::storage::io_pool;
use crate::storage::pools::NodeStorage;
use crate::tls::conn;
use hawser_tls::Peer;

/// The current session of each replica, and the gate that orders a new session after the
/// requests of older ones (readers: requests executing; writer: a Hello).
#[derive(Default)]
struct Sessions {
    gates: Mutex<HashMap<String, Arc<Gate>>>,
}

#[derive(Default)]
struct Gate {
    current: AtomicU64,
    lock: Arc<RwLock<()>>,
}

impl Sessions {
    fn gate(&self, replica: &str) -> Arc<Gate> {
        self.gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(replica.to_owned())
            .or_default()
            .clone()
    }
}

/// A connection's session of one replica.
struct Session {
    gate: Arc<Gate>,
    id: u64,
}

impl Session {
    /// Hold the gate for one request, or `None` if a newer session replaced this one.
    async fn enter(&self) -> Option<OwnedRwLockReadGuard<()>> {
        let guard = self.gate.lock.clone().read_owned().await;
        (self.gate.current.load(Ordering::Acquire) == self.id).then_some(guard)
    }
}

pub use hawser_storage::node_boot_id as boot_id;

/// Accept connections until `shutdown` flips to true.
///
/// Limits (`constants.rs`): connections in total and per peer; connections that have not
/// opened a session get a smaller share and [`REPLICA_HELLO_TIMEOUT`] to do it, with a Hello
/// no longer than a Hello can be; request payloads must follow their header within
/// [`REPLICA_PAYLOAD_TIMEOUT`]; and payloads held at once, over all connections, stay within
/// [`REPLICA_SERVER_MEMORY_BUDGET`]. A session's connection may stay idle: an idle engine
/// does not ping, and only an engine the controller granted an epoch gets that far.
///
/// With `tls`, every connection starts with a TLS handshake (within the Hello timeout) in
/// which the client presents a node certificate of the cluster, and a session opens only for
/// a grant naming that node as the engine's.
///
/// The limits on connections with a session grow with the replicas this node holds
/// ([`session_limits`]): an engine node opens one connection per volume it runs with a
/// replica here, so a fixed limit was a ceiling on the volumes a node pair could share. A
/// refusal is counted and logged with the limit's name (`observe/refusals.rs`).
pub async fn serve(
    listener: TcpListener,
    storage: Arc<NodeStorage>,
    tls: Option<Arc<hawser_tls::rustls::ServerConfig>>,
    refusals: RefusalMetrics,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let conns = ConnLimits::new(REPLICA_SERVER_MAX_CONNS, REPLICA_SERVER_MAX_CONNS_PER_PEER);
    let ungreeted = ConnLimits::new(REPLICA_UNGREETED_MAX_CONNS, REPLICA_UNGREETED_MAX_PER_PEER);
    let budget = Arc::new(Semaphore::new(REPLICA_SERVER_MEMORY_BUDGET >> 10));
    let sessions = Arc::new(Sessions::default());
    let boot = boot_id();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "replica server accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (total, per_peer) = session_limits(storage.replica_count());
        conns.raise_to(total, per_peer);
        let admitted = match conns.admit(peer.ip()) {
            Err(why) => Err((why, &conns, SESSION_LIMIT_NAMES)),
            Ok(c) => match ungreeted.admit(peer.ip()) {
                Ok(u) => Ok((c, u)),
                Err(why) => Err((why, &ungreeted, UNGREETED_LIMIT_NAMES)),
            },
        };
        let (permit, greeting) = match admitted {
            Ok(p) => p,
            Err((why, limits, (total_name, peer_name))) => {
                let (total, per_peer) = limits.limits();
                match why {
                    Refused::Total => refusals.refused(total_name, total, peer),
                    Refused::Peer => refusals.refused(peer_name, per_peer, peer),
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let storage = storage.clone();
        let sessions = sessions.clone();
        let budget = budget.clone();
        let tls = tls.clone();
        let span = tracing::info_span!("replica_conn", %peer);
        tokio::spawn(
            async move {
                let conn = match tls {
                    None => Ok((stream, None)),
                    Some(cfg) => {
                        let shake = conn::accept(stream, cfg);
                        match tokio::time::timeout(REPLICA_HELLO_TIMEOUT, shake).await {
                            Ok(Ok((s, c))) => Ok((s, Some(c))),
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(_) => Err("no TLS handshake in time".to_string()),
                        }
                    }
                };
                let (stream, conn) = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        // Anyone can cause this: debug, not warn.
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                };
                match serve_conn(stream, conn, storage, &sessions, boot, greeting, budget).await {
                    Ok(()) | Err(FrameIoError::Closed) => tracing::debug!("closed"),
                    Err(e) => tracing::warn!(error = %e, "replica connection dropped"),
                }
                drop(permit);
            }
            .instrument(span),
        );
    }
}

/// The names of the limits (total, per peer) a refusal reports.
const SESSION_LIMIT_NAMES: (&str, &str) = (
    "REPLICA_SERVER_MAX_CONNS",
    "REPLICA_SERVER_MAX_CONNS_PER_PEER",
);
const UNGREETED_LIMIT_NAMES: (&str, &str) = (
    "REPLICA_UNGREETED_MAX_CONNS",
    "REPLICA_UNGREETED_MAX_PER_PEER",
);

/// The limits on the replica port's connections (total, per peer) for a node holding
/// `replicas` replicas: each replica has one engine session at a time, from one peer, plus a
/// session being replaced and a snapshot copy's; the constants are the floor.
fn session_limits(replicas: usize) -> (usize, usize) {
    let need = replicas.saturating_mul(2).saturating_add(64);
    (
        REPLICA_SERVER_MAX_CONNS.max(need.saturating_mul(2)),
        REPLICA_SERVER_MAX_CONNS_PER_PEER.max(need),
    )
}

async fn serve_conn(
    stream: TcpStream,
    tls: Option<hawser_tls::rustls::Connection>,
    storage: Arc<NodeStorage>,
    sessions: &Sessions,
    boot: u64,
    greeting: ConnPermit,
    budget: Arc<Semaphore>,
) -> Result<(), FrameIoError> {
    let (mut rd, out, sealer) = conn::split(stream, tls);
    // Over TLS, the node the client's certificate names: only its engines get sessions.
    let client = match &sealer {
        None => None,
        Some(s) => match s.peer() {
            Some(Peer::Node(n)) => Some(n),
            _ => {
                tracing::debug!("a replica client whose certificate names no node");
                out.close();
                return Err(FrameIoError::Closed);
            }
        },
    };
    let writer = tokio::spawn({
        let out = out.clone();
        async move { out.drain().await }
    });
    let result = async {
        // Before a session, failures are a peer's business, logged at debug: anyone who
        // reaches the port can cause them, and must not be able to flood the logs.
        let first = read_hello(&mut rd, &out).await.map_err(|e| {
            tracing::debug!(error = %e, "no session opened");
            FrameIoError::Closed
        })?;
        let (h, req) = match first {
            Greeting::Engine(h, req) => (h, req),
            Greeting::Snapshot(h, req) => {
                let snap = hello_snapshot(h, &req, &storage, boot, &out, client.as_deref())
                    .await
                    .map_err(|e| {
                        tracing::debug!(error = %e, "no snapshot session opened");
                        FrameIoError::Closed
                    })?;
                drop(greeting);
                let span = tracing::info_span!(
                    "snapshot", replica = %req.replica, snapshot = %req.snapshot
                );
                return snapshot_loop(&mut rd, Arc::new(snap), &out, &budget)
                    .instrument(span)
                    .await;
            }
        };
        let (replica, session) = hello(h, req, &storage, sessions, boot, &out, client.as_deref())
            .await
            .map_err(|e| {
                tracing::debug!(error = %e, "no session opened");
                FrameIoError::Closed
            })?;
        drop(greeting);
        let span = tracing::info_span!("replica", id = replica.id(), session = session.id);
        request_loop(&mut rd, replica, session, &out, &budget)
            .instrument(span)
            .await
    }
    .await;
    // Replies still executing are dropped with the connection; what is queued goes out first.
    let _ = tokio::time::timeout(REPLICA_CONN_LINGER, out.backlog_at_most(0)).await;
    out.close();
    let _ = writer.await;
    result
}

/// What opens a connection: an engine's session of a replica, or a read-only session of one
/// snapshot copy.
enum Greeting {
    Engine(FrameHeader, HelloRequest),
    Snapshot(FrameHeader, HelloSnapshotRequest),
}

/// The first frame, within [`REPLICA_HELLO_TIMEOUT`]: a Hello or HelloSnapshot request no
/// longer than one can be (a longer one closes the connection unread and unanswered).
async fn read_hello(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    out: &Replies,
) -> Result<Greeting, FrameIoError> {
    let read = async {
        let h = read_header(rd).await?;
        if !matches!(h.op, Op::Hello | Op::HelloSnapshot) || h.is_reply() {
            reply(out, (h.reply(Status::Invalid), None));
            return Err(FrameIoError::Closed);
        }
        let most = match h.op {
            Op::Hello => MAX_HELLO_BYTES,
            _ => MAX_HELLO_SNAPSHOT_BYTES,
        };
        if h.payload_len as usize > most {
            // Not a Hello any engine or agent sends; not worth reading (or answering).
            return Err(FrameIoError::Closed);
        }
        let payload = read_payload(rd, &h).await?;
        let p = payload.as_deref().unwrap_or_default();
        let greeting = match h.op {
            Op::Hello => HelloRequest::decode(p).map(|r| Greeting::Engine(h, r)),
            _ => HelloSnapshotRequest::decode(p).map(|r| Greeting::Snapshot(h, r)),
        };
        let Some(greeting) = greeting else {
            reply(out, (h.reply(Status::Invalid), None));
            return Err(FrameIoError::Closed);
        };
        Ok(greeting)
    };
    tokio::time::timeout(REPLICA_HELLO_TIMEOUT, read)
        .await
        .map_err(|_| FrameIoError::Timeout("Hello"))?
}

/// The first frame must be a Hello naming a replica of this node with an epoch at least the
/// replica's. It opens a new session of that replica (see the module doc).
async fn hello(
    h: FrameHeader,
    req: HelloRequest,
    storage: &NodeStorage,
    sessions: &Sessions,
    boot: u64,
    out: &Replies,
    client: Option<&str>,
) -> Result<(Arc<Replica>, Session), FrameIoError> {
    let id = req.replica.as_str();
    // A node of a cluster checks the grant before it even says whether the replica exists:
    // ids cannot be probed without the cluster's signature.
    let key = storage.grant_key();
    let cluster = storage.cluster_id().unwrap_or_default();
    let volume = match &req.grant {
        Some(g) => hawser_wire::grant::Grant::decode(g)
            .map(|(g, _, _)| g.volume)
            .ok(),
        None => None,
    };
    if key.is_none() && client.is_some() {
        // A TLS node always belongs to a cluster, whose grants it can check once its first
        // registration answer gave it the key; until then no Hello is good enough.
        tracing::debug!(
            replica = id,
            "Hello refused: no grant key yet (not registered)"
        );
        reply(out, (h.reply(Status::Denied), None));
        return Err(FrameIoError::Closed);
    }
    let mut granted = None;
    if let Some(key) = &key {
        let want = Expected {
            cluster: &cluster,
            volume: volume.as_deref().unwrap_or(""),
            epoch: h.epoch,
            node: client,
        };
        match grants::check(key, req.grant.as_deref(), &want) {
            Ok(g) => granted = Some(g),
            Err(e) => {
                tracing::debug!(replica = id, epoch = h.epoch, error = %e, "Hello refused");
                reply(out, (h.reply(Status::Denied), None));
                return Err(FrameIoError::Closed);
            }
        }
    }
    let replica = match storage.replica(id) {
        Some(r) if key.is_none() || volume.as_deref() == Some(r.volume()) => r,
        _ => {
            reply(out, (h.reply(Status::NoSuchReplica), None));
            return Err(FrameIoError::Closed);
        }
    };
    if let Some(g) = &granted {
        // Before the epoch is raised: an engine holding another data key than the one this
        // replica's data is encrypted with (or none, or one for a plain replica) would write
        // what no key reads back.
        if let Err(e) = grants::check_key(g, replica.key_check()) {
            tracing::warn!(replica = id, epoch = h.epoch, error = %e, "Hello refused");
            reply(out, (h.reply(Status::Denied), None));
            return Err(FrameIoError::Closed);
        }
    }
    let gate = sessions.gate(id);
    let id = {
        // Waits for the executing requests of older sessions; newer requests of those
        // sessions then see they were replaced.
        let _exclusive = gate.lock.write().await;
        let r = replica.clone();
        let epoch = h.epoch;
        let raised = tokio::task::spawn_blocking(move || r.raise_epoch(epoch)).await;
        if !matches!(raised, Ok(Ok(()))) {
            reply(out, (h.reply(Status::StaleEpoch), None));
            return Err(FrameIoError::Closed);
        }
        gate.current.fetch_add(1, Ordering::AcqRel) + 1
    };
    let info = HelloInfo {
        // The size now. A grow (`Pool::grow_replica`) grows this very object in place, and
        // every request of the session is checked against the size when it runs, so a
        // session opened before a grow serves the new range after it; clients keep no size.
        size: replica.size(),
        epoch: replica.epoch(),
        generation: replica.generation(),
        boot_id: boot,
    }
    .encode();
    let ok = h.reply(Status::Ok).with_payload(&info);
    reply(out, (ok, Some(Bytes::copy_from_slice(&info))));
    Ok((replica, Session { gate, id }))
}

async fn request_loop(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    replica: Arc<Replica>,
    session: Session,
    out: &Replies,
    budget: &Arc<Semaphore>,
) -> Result<(), FrameIoError> {
    let inflight = Arc::new(Semaphore::new(REPLICA_CONN_MAX_INFLIGHT));
    loop {
        // A peer that does not read its replies stops being read from.
        out.backlog_at_most(REPLICA_CONN_MAX_BACKLOG_BYTES).await;
        let permit = inflight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| FrameIoError::Closed)?;
        let h = read_header(rd).await?;
        let memory = budget
            .clone()
            .acquire_many_owned(memory_cost(&h))
            .await
            .map_err(|_| FrameIoError::Closed)?;
        let payload = tokio::time::timeout(REPLICA_PAYLOAD_TIMEOUT, read_payload(rd, &h))
            .await
            .map_err(|_| FrameIoError::Timeout("request payload"))??;
        if h.is_reply() || matches!(h.op, Op::Hello | Op::HelloSnapshot) {
            return Err(FrameIoError::Closed);
        }
        if h.op == Op::Ping {
            reply(out, (h.reply(Status::Ok), None));
            continue;
        }
        let Some(entered) = session.enter().await else {
            // Replaced by a newer session: refuse, and end this connection.
            reply(out, (h.reply(Status::Unavailable), None));
            return Err(FrameIoError::Closed);
        };
        let idle = inflight.available_permits() == REPLICA_CONN_MAX_INFLIGHT - 1;
        if runs_inline(&h, idle) {
            let r = execute(&replica, &h, payload);
            drop(entered);
            reply(out, r);
            drop((permit, memory));
            continue;
        }
        let done = Done {
            h,
            replica: replica.clone(),
            out: out.clone(),
            inflight: inflight.clone(),
            held: (entered, permit, memory),
        };
        start(&replica, h, payload, done);
    }
}

/// What a request started off the connection's task holds until it is answered.
struct Done {
    h: FrameHeader,
    replica: Arc<Replica>,
    out: Replies,
    inflight: Arc<Semaphore>,
    held: (
        OwnedRwLockReadGuard<()>,
        OwnedSemaphorePermit,
        OwnedSemaphorePermit,
    ),
}

impl Done {
    /// Answer with the request's result (on whichever thread finished it).
    fn finish(self, result: Result<Option<Bytes>, ReplicaIoError>) {
        let Done {
            h,
            replica,
            out,
            inflight,
            held: (entered, permit, memory),
        } = self;
        let r = reply_of(&replica, &h, result);
        drop(entered);
        reply_now(&out, r, alone(inflight.available_permits()));
        drop((permit, memory));
    }
}

/// Start a request that does not run inline: reads and writes on the io_uring
/// (`hawser_storage::ring`); everything else, and what the ring cannot take now, on the I/O
/// pool. A flush too: the kernel runs an io_uring fsync on a worker thread of its own, which
/// costs one more wake-up than a pool thread (measured at queue depth 1).
fn start(replica: &Arc<Replica>, h: FrameHeader, payload: Option<Bytes>, done: Done) {
    let r = replica.clone();
    match h.op {
        Op::Read if h.length <= MAX_PAYLOAD_BYTES => {
            let ring = replica.start_read(h.epoch, h.offset, h.length, move |res| {
                done.finish(res.map(Some));
            });
            if let Err(done) = ring {
                io_pool::spawn(move || done(r.read(h.epoch, h.offset, h.length)));
            }
        }
        Op::Write => {
            let data = payload.unwrap_or_default();
            let ring =
                replica.start_write(h.epoch, h.offset, data.clone(), h.is_fua(), move |res| {
                    done.finish(res.map(|()| None));
                });
            if let Err(done) = ring {
                io_pool::spawn(move || done(r.write(h.epoch, h.offset, &data, h.is_fua())));
            }
        }
        _ => io_pool::spawn(move || done.finish(run(&r, &h, payload))),
    }
}

/// Whether a request runs on this connection's task rather than the I/O pool: a small read
/// or write, nothing else in flight (`idle`), and the engine's hint that it has nothing else
/// to send (a connection that looks idle may just be between frames of a deep queue, and
/// running those inline would serialise them). That saves the two thread wake-ups of the
/// pool at queue depth 1.
///
/// Never a flush: it takes as long as the disk wants (seconds on a busy one), and while a
/// request runs inline the connection reads nothing, not even the client's pings, so the
/// client would take a slow disk for a dead peer and drop a healthy replica.
fn runs_inline(h: &FrameHeader, idle: bool) -> bool {
    let small = matches!(h.op, Op::Read | Op::Write) && h.length <= INLINE_IO_MAX_BYTES;
    small && h.is_quiet() && idle
}

/// Whether a request that ran on the I/O pool is alone on its connection, given the in-flight
/// permits left: then the pool thread writes its reply (a flush at queue depth 1), sparing the
/// wake-up of the drain task through the runtime (an eventfd write, an epoll wake-up, and
/// often a second runtime thread woken to take the I/O driver). Under load the drain task
/// batches replies into few writes. Held when alone: this request's permit, and the one the
/// loop takes before it reads the next header.
fn alone(available_permits: usize) -> bool {
    available_permits + 2 >= REPLICA_CONN_MAX_INFLIGHT
}

/// Run one request against the replica (blocking) and build its reply.
fn execute(replica: &Replica, h: &FrameHeader, payload: Option<Bytes>) -> Reply {
    reply_of(replica, h, run(replica, h, payload))
}

/// Run one request against the replica (blocking).
fn run(
    replica: &Replica,
    h: &FrameHeader,
    payload: Option<Bytes>,
) -> Result<Option<Bytes>, ReplicaIoError> {
    let (epoch, offset, len) = (h.epoch, h.offset, h.length);
    match h.op {
        Op::Read if len > MAX_PAYLOAD_BYTES => Err(ReplicaIoError::OutOfRange),
        Op::Read => replica.read(epoch, offset, len).map(Some),
        Op::Write => {
            let data = payload.unwrap_or_default();
            replica
                .write(epoch, offset, &data, h.is_fua())
                .map(|()| None)
        }
        Op::Flush => replica.flush(epoch).map(|()| None),
        Op::Trim => replica.trim(epoch, offset, len).map(|()| None),
        Op::WriteZeroes => replica
            .write_zeroes(epoch, offset, len, h.is_fua(), h.may_trim())
            .map(|()| None),
        Op::PutJournal => replica
            .put_journal(epoch, payload.as_deref().unwrap_or_default())
            .map(|()| None),
        // Missing or unreadable both answer with no journal: the engine then assumes the
        // worst about this replica.
        Op::GetJournal => replica.get_journal(epoch).map(|stored| match stored {
            StoredJournal::Found { journal, rebooted } => StoredReport { journal, rebooted }
                .encode()
                .ok()
                .map(Bytes::from),
            StoredJournal::Missing | StoredJournal::Unreadable => None,
        }),
        Op::Checksum => replica.checksum(epoch, offset, len).map(Some),
        Op::Hello | Op::HelloSnapshot | Op::Ping => Ok(None),
    }
}

/// The reply to `h` carrying `result`.
fn reply_of(
    replica: &Replica,
    h: &FrameHeader,
    result: Result<Option<Bytes>, ReplicaIoError>,
) -> Reply {
    match result {
        Ok(Some(data)) => (h.reply(Status::Ok).with_payload(&data), Some(data)),
        Ok(None) => (h.reply(Status::Ok), None),
        Err(e) => {
            if matches!(e, ReplicaIoError::Io { .. }) {
                tracing::error!(replica = replica.id(), error = %e, "replica disk error");
            }
            (error_reply(h, e), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use hawser_wire::frame::FLAG_QUIET;

    use super::*;

    fn quiet(op: Op, length: u32) -> FrameHeader {
        let mut h = FrameHeader::request(op, 1, 1, 0, length);
        h.flags |= FLAG_QUIET;
        h
    }

    #[test]
    fn a_pooled_request_is_alone_only_beside_the_loops_own_permit() {
        let max = REPLICA_CONN_MAX_INFLIGHT;
        assert!(alone(max - 1));
        assert!(alone(max - 2));
        assert!(!alone(max - 3));
        assert!(!alone(0));
    }

    #[test]
    fn only_small_quiet_reads_and_writes_of_an_idle_connection_run_inline() {
        assert!(runs_inline(&quiet(Op::Write, 4096), true));
        assert!(runs_inline(&quiet(Op::Read, INLINE_IO_MAX_BYTES), true));
        assert!(!runs_inline(
            &quiet(Op::Read, INLINE_IO_MAX_BYTES + 512),
            true
        ));
        assert!(!runs_inline(&quiet(Op::Write, 4096), false));
        assert!(!runs_inline(
            &FrameHeader::request(Op::Write, 1, 1, 0, 4096),
            true
        ));
        // A flush would stop the connection from answering pings for as long as it takes.
        assert!(!runs_inline(&quiet(Op::Flush, 0), true));
        assert!(!runs_inline(&quiet(Op::PutJournal, 0), true));
    }
}
