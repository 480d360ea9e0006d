//! The replica server's replies: how a reply is queued on a connection, what a request may
//! hold in memory, and the one place a replica's error becomes a wire status. Shared by the
//! engine sessions ([`super::server`]) and the snapshot sessions ([`super::snapshot_session`]),
//! which is why it is a file of its own: both sessions use it, and neither uses the other's.

use std::sync::Arc;

use bytes::Bytes;
use hawser_storage::ReplicaIoError;
use hawser_wire::constants::MAX_PAYLOAD_BYTES;
use hawser_wire::frame::{FrameHeader, Op, Status};
use tokio::net::tcp::OwnedWriteHalf;

use crate::replica::outbox::Outbox;

/// A reply: its header, and its payload if it has one.
pub(crate) type Reply = (FrameHeader, Option<Bytes>);

/// Where a connection's replies go, written from whichever thread produced them.
pub(crate) type Replies = Arc<Outbox<OwnedWriteHalf>>;

/// Queue one reply (a closed connection drops it: the engine hears of the loss anyway).
/// `now`: write it at once (see [`Outbox::push`]).
pub(crate) fn reply_now(out: &Replies, (h, payload): Reply, now: bool) {
    let header = Bytes::copy_from_slice(&h.encode());
    let _ = out.push(std::iter::once(header).chain(payload), now);
}

/// Queue one reply and write it at once.
pub(crate) fn reply(out: &Replies, r: Reply) {
    reply_now(out, r, true);
}

/// What a request may hold in memory, in KiB of the budget: its payload, and for a read the
/// data it returns (reads longer than a payload can be are refused, so count at most that).
pub(crate) fn memory_cost(h: &FrameHeader) -> u32 {
    let read = if h.op == Op::Read {
        h.length.min(MAX_PAYLOAD_BYTES)
    } else {
        0
    };
    (h.payload_len.div_ceil(1024)) + read.div_ceil(1024)
}

/// The reply header of a failed request: its status, and for a corrupt read the first bad
/// block and the count (`Status::Corrupt`).
pub fn error_reply(h: &FrameHeader, e: ReplicaIoError) -> FrameHeader {
    let reply = h.reply(status_of(e));
    match e {
        ReplicaIoError::Corrupt { offset, blocks } => FrameHeader {
            offset,
            length: blocks,
            ..reply
        },
        _ => reply,
    }
}

/// The one place replica errors become wire statuses.
pub fn status_of(e: ReplicaIoError) -> Status {
    match e {
        ReplicaIoError::StaleEpoch { .. } => Status::StaleEpoch,
        ReplicaIoError::OutOfRange => Status::OutOfRange,
        ReplicaIoError::NoSpace => Status::NoSpace,
        ReplicaIoError::Io { .. } | ReplicaIoError::Failed => Status::IoError,
        ReplicaIoError::Corrupt { .. } => Status::Corrupt,
    }
}
