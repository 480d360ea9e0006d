//! Inputs and outputs of the engine state machine.

use bytes::Bytes;

use crate::io_error::IoError;

/// Identifies a client request while it is in flight; chosen by the driver, unique among the
/// requests in flight.
pub type Tag = u64;

/// Identifies one request to one replica; chosen by the engine, never reused.
pub type SubId = u64;

/// Index of a replica in the engine's replica list (fixed for the engine's life).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaIdx(pub u8);

/// A client block request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOp {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: Bytes,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    },
}

impl ClientOp {
    /// The byte range a modifying request changes; `None` for reads and flushes.
    pub fn write_range(&self) -> Option<(u64, u64)> {
        match self {
            ClientOp::Write { offset, data, .. } => Some((*offset, data.len() as u64)),
            ClientOp::Trim { offset, len } | ClientOp::WriteZeroes { offset, len, .. } => {
                Some((*offset, u64::from(*len)))
            }
            ClientOp::Read { .. } | ClientOp::Flush => None,
        }
    }
}

/// A request to one replica. Modifying requests are the client's, forwarded unchanged.
pub type ReplicaOp = ClientOp;

/// Why a replica request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaFailure {
    /// The replica's filesystem is full.
    NoSpace,
    /// Disk error, corrupt frame, or a request the replica refused as invalid.
    Io,
    /// The connection to the replica is gone (or timed out).
    Lost,
    /// The replica has seen a newer epoch: another engine owns the volume.
    StaleEpoch,
    /// A read found blocks whose data does not match their checksum (the bytes rotted on
    /// the medium; the replica still has every write it acknowledged). `first`: byte offset
    /// of the first bad `ORDER_BLOCK_BYTES` block; `blocks`: bad blocks in the read's range.
    /// Only reads answer it. The client sees it as `IoError::Io`.
    Corrupt { first: u64, blocks: u32 },
}

/// A replica's answer to one sub-request: read data, or nothing for other operations.
pub type ReplicaResult = Result<Option<Bytes>, ReplicaFailure>;

/// What the engine asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send `op` to `replica`. The driver answers every `Send` exactly once: with
    /// `Engine::on_reply(sub, ..)`, or with `Engine::on_replica_lost(replica)` when the
    /// connection is gone (which answers all of that replica's outstanding sends).
    /// `background`: resync, repair and scrub traffic, which the driver may delay to honour a rate limit.
    Send {
        replica: ReplicaIdx,
        sub: SubId,
        op: ReplicaOp,
        background: bool,
    },
    /// Complete client request `tag`.
    Complete {
        tag: Tag,
        result: Result<Option<Bytes>, IoError>,
    },
    /// Remove `replica` from the volume's in-sync set in the cluster store (compare-and-swap
    /// on the current epoch), as `failed` (disk error: never resynced automatically) or as
    /// outdated; answer with `on_outdate_done` or `on_fenced`. Writes the replica missed stay
    /// unacknowledged until then.
    Outdate { replica: ReplicaIdx, failed: bool },
    /// Close the session with `replica` (it left the set that receives writes); answer with
    /// `on_replica_lost` once its outstanding requests are answered or failed. The driver
    /// reconnects (with backoff) while `Engine::wants_connection` says so and reports success
    /// with `on_replica_connected`.
    Disconnect { replica: ReplicaIdx },
    /// `replica` has been resynced (every dirty chunk copied and flushed): make it in-sync in
    /// the cluster store (compare-and-swap on the current epoch); answer with
    /// `on_mark_in_sync_done(replica, accepted)` or `on_fenced`.
    MarkInSync { replica: ReplicaIdx },
    /// The engine learnt that a newer epoch exists; the driver should stop it.
    Fenced,
    /// Corrupt blocks were confirmed on `replica` under the range lock: `blocks` of them from
    /// byte `offset` on, rewritten from another in-sync replica (`repaired`) or found on every
    /// in-sync replica (not repaired: that data is lost). Counted in `Engine::integrity`; the
    /// driver logs and counts it, nothing more.
    Corruption {
        replica: ReplicaIdx,
        offset: u64,
        blocks: u32,
        repaired: bool,
    },
    /// A scrub pass (`Engine::start_scrub`) read the whole volume on every in-sync replica
    /// and every repair it queued is over. Its findings, in blocks summed over replicas (as
    /// `Engine::scrub_view`). The driver records when the last pass ended, nothing more.
    ScrubDone {
        found_blocks: u64,
        repaired_blocks: u64,
        unrecoverable_blocks: u64,
    },
}
