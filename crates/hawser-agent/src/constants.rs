//! Bounds and timings of the agent, in one place.

use std::time::Duration;

// What the API lets a `StartEngine` name is what the engine's replica sets hold: the agent
// is the one crate that sees both definitions, so it holds them equal.
const _: () =
    assert!(hawser_api::agent::ENGINE_MAX_REPLICAS == hawser_core::constants::MAX_REPLICAS);

/// Requests one replica connection may have in flight on the server (back-pressure beyond).
pub const REPLICA_CONN_MAX_INFLIGHT: usize = 256;
/// Reply bytes a replica connection may have queued for a peer that is slow to read them
/// before the server stops reading that peer's requests.
pub const REPLICA_CONN_MAX_BACKLOG_BYTES: usize = 64 << 20;
/// How long a closing replica connection tries to deliver its queued replies (a refused
/// Hello's answer, say) to a peer that is not reading.
pub const REPLICA_CONN_LINGER: Duration = Duration::from_secs(5);
/// Replica connections a server accepts at once, and from one peer (IP address): an engine
/// node has one per volume it runs with a replica here.
pub const REPLICA_SERVER_MAX_CONNS: usize = 1024;
pub const REPLICA_SERVER_MAX_CONNS_PER_PEER: usize = 512;
/// Connections that have not yet opened a session (no Hello answered), in total and per
/// peer. They are unauthenticated, so they get a small share, and they must say Hello
/// within [`REPLICA_HELLO_TIMEOUT`].
pub const REPLICA_UNGREETED_MAX_CONNS: usize = 128;
pub const REPLICA_UNGREETED_MAX_PER_PEER: usize = 16;
pub const REPLICA_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Once a request's header has arrived, its payload must follow within this time (a 32 MiB
/// payload at 1 MiB/s), so a peer cannot hold a request half-sent.
pub const REPLICA_PAYLOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of request and read-reply payloads the replica server holds at once, over all
/// connections; a request waits for its share before its payload is read. At least the
/// largest payload (32 MiB).
pub const REPLICA_SERVER_MEMORY_BUDGET: usize = 512 << 20;
/// Client requests one volume engine has in flight; further requests wait.
pub const ENGINE_MAX_INFLIGHT: usize = 1024;
/// A replica that leaves a request unanswered this long is treated as lost.
pub const REPLICA_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the replica client checks for overdue requests and a silent replica.
pub const REPLICA_WATCHDOG_INTERVAL: Duration = Duration::from_millis(250);
/// While requests are outstanding the client pings the replica this often...
pub const REPLICA_PING_INTERVAL: Duration = Duration::from_millis(500);
/// ...and drops the connection when nothing at all came back for this long (a partition),
/// so I/O continues on the other replicas within about two seconds.
pub const REPLICA_SILENCE_TIMEOUT: Duration = Duration::from_millis(1500);
/// Connecting to a replica (TCP connect + Hello) gives up after this long.
pub const REPLICA_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A peer probe (`control/peers.rs`) that has not connected and finished its handshake in
/// this long counts as not reached: a path that slow would not carry an engine's writes.
pub const PEER_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Peers one probe call may name: more than any cluster Hawser is built for has nodes.
pub const PEER_PROBE_MAX_PEERS: usize = 256;
/// Pause between attempts to reach the controller for an outdate.
pub const OUTDATE_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// How often the agent re-registers (heartbeat) with the controller.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
/// Timeout of one HTTP call to the controller.
pub const CONTROLLER_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long swapping a volume's engine for one in a new epoch waits for the running
/// engine's requests to finish (a suspended request can wait for ever) before giving up.
pub const ENGINE_SWAP_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long stopping an engine waits for its final flush before failing what is in flight.
pub const ENGINE_STOP_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Threads doing blocking disk I/O for engines and the replica server.
pub const IO_THREADS: usize = 16;
/// Largest read or write an idle engine or replica connection runs inline instead of on the
/// I/O pool (saves two thread wake-ups at queue depth 1).
pub const INLINE_IO_MAX_BYTES: u32 = 64 * 1024;
/// How often an engine's maintenance task runs: reconnecting lost replicas, background
/// flushes.
pub const ENGINE_TICK: Duration = Duration::from_millis(500);
/// An engine at rest runs no clock (`engine/volume.rs`, `maintenance`); it looks again this
/// often anyway, so a missed wake-up could cost at most this long.
pub const ENGINE_REST_RECHECK: Duration = Duration::from_secs(30);
/// A background flush when something was written and nothing flushed for this long, so a
/// replica whose node crashes has at most this much recent writing to recopy.
pub const BACKGROUND_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Reconnect attempts to a lost replica back off from the first value to the second.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(500);
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Default resync rate limit per engine, bytes per second (`--resync-rate`, or the
/// `HAWSER_RESYNC_RATE` environment variable, overrides it; 0 means unlimited).
pub const DEFAULT_RESYNC_RATE: u64 = 200 * 1024 * 1024;
/// Default resync rate limit per engine while its volume has client I/O (`--resync-busy-rate`,
/// `HAWSER_RESYNC_BUSY_RATE`; 0: only the rate above). DRBD's default c-max-rate is the same
/// 100 MiB/s. Measured on a 2-vCPU VM with `scripts/bench-resync.sh` at a fixed rate, 4k QD32
/// random writes during a resync kept 0.57 of their IOPS at 100 MiB/s and 0.27 at 200 MiB/s.
pub const DEFAULT_RESYNC_BUSY_RATE: u64 = 100 * 1024 * 1024;
/// While a replica resyncs, what it still lacks is saved this often (a flush of the replica,
/// then a journal commit with its dirty map as it is now: the journal keeper's resync save,
/// `hawser_core::driver::journal`), so an engine that
/// restarts in the middle (agent killed, detach and attach, engine swap) resumes the resync
/// instead of copying the replica's whole map again. A time, not a byte count: a save costs
/// the same whatever was copied (one fdatasync on the replica, one journal commit: an
/// fdatasync on each replica receiving writes), and what a restart repeats is at most this
/// much copying at any rate limit. 5 s: about 0.5-1 GiB at the default rates (100-200 MiB/s),
/// a few seconds of repeated work after a crash against minutes for a large map, for two
/// fdatasyncs per replica every 5 s, nothing next to the copy stream itself.
pub const RESYNC_SAVE_INTERVAL: Duration = Duration::from_secs(5);
/// An extent leaves the activity log once unused for this many engine ticks (and flushed):
/// long enough that a working set stays in the log (each entry costs a journal commit on the
/// write path), short enough that recovery after a crash compares little.
pub const ACTIVITY_IDLE_TICKS: u64 = 10;
/// The activity log's soft cap, in 4 MiB extents (4 GiB): what crash recovery compares at
/// most, whatever the volume's size (DRBD's default al-extents, 1237, is about as much).
pub const ACTIVITY_MAX_EXTENTS: usize = 1024;
/// Connections per kernel NBD device, until `make bench` in a guest says more are worth a
/// task and a socket each (`--kernel-nbd-connections`).
pub const DEFAULT_KERNEL_NBD_CONNECTIONS: usize = 1;
/// A kernel NBD request unanswered this long is resent on a new connection. Short, because a
/// resend costs only a reconnect (`frontends/kernel_nbd/link.rs`), and after `kill -9` the
/// requests that were in flight wait this long before they are resent.
pub const DEFAULT_KERNEL_NBD_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a kernel device holds I/O with no agent serving it: a restart or an upgrade of
/// the agent must fit in it.
pub const DEFAULT_KERNEL_DEAD_CONN_TIMEOUT: Duration = Duration::from_secs(120);

/// Backups this node runs at once (`backup/`): each reads a snapshot and keeps up to
/// `hawser_backup::constants::MAX_IN_FLIGHT_BLOCKS` blocks in flight; more would compete
/// with the volumes' own I/O. A start past it is refused (503) and retried by the controller.
pub const MAX_BACKUP_JOBS: usize = 2;
/// Finished backup jobs kept for the controller to read their result.
pub const MAX_FINISHED_BACKUP_JOBS: usize = 64;
