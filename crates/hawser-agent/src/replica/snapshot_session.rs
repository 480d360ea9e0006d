//! The replica server's read-only snapshot sessions (`Op::HelloSnapshot`): another node's
//! agent reads one snapshot copy of a replica here to give its own replica the snapshot
//! (`replica/snapshot_fetch.rs`). The copy never changes, so the session raises no epoch, replaces no
//! engine session and needs no ordering against writes; it serves Read and Checksum of the
//! copy and Ping, and ends the connection on anything else.
//!
//! On a node of a cluster the Hello must carry the controller's snapshot-read grant, for the
//! replica's volume and the reading node (the TLS peer), checked before the replica is
//! looked up.

use std::sync::Arc;

use hawser_storage::snapshot_fetch::SnapshotReader;
use hawser_storage::ReplicaIoError;
use hawser_wire::constants::MAX_PAYLOAD_BYTES;
use hawser_wire::frame::{FrameHeader, HelloInfo, Op, Status};
use hawser_wire::grant::HelloSnapshotRequest;
use tokio::sync::Semaphore;

use crate::constants::REPLICA_CONN_MAX_BACKLOG_BYTES;
use crate::replica::frame_io::{read_header, read_payload, FrameIoError};
use crate::replica::grants;
use crate::replica::replies::{error_reply, memory_cost, reply, Replies};
use crate::storage::pools::NodeStorage;

/// Opens the snapshot session `req` asks for, or answers why not and ends the connection.
pub(crate) async fn hello_snapshot(
    h: FrameHeader,
    req: &HelloSnapshotRequest,
    storage: &NodeStorage,
    boot: u64,
    out: &Replies,
    client: Option<&str>,
) -> Result<SnapshotReader, FrameIoError> {
    let refuse = |status| {
        reply(out, (h.reply(status), None));
        Err(FrameIoError::Closed)
    };
    let key = storage.grant_key();
    if key.is_none() && client.is_some() {
        // As for an engine's Hello: a TLS node checks grants once it is registered.
        return refuse(Status::Denied);
    }
    let granted_volume = match &key {
        Some(key) => {
            let cluster = storage.cluster_id().unwrap_or_default();
            match grants::check_snapshot_read(key, req.grant.as_deref(), &cluster, client) {
                Ok(g) => Some(g.volume),
                Err(e) => {
                    tracing::debug!(replica = %req.replica, error = %e, "HelloSnapshot refused");
                    return refuse(Status::Denied);
                }
            }
        }
        None => None,
    };
    let replica = match storage.replica(&req.replica) {
        Some(r) if granted_volume.as_deref().is_none_or(|v| v == r.volume()) => r,
        _ => return refuse(Status::NoSuchReplica),
    };
    let (r, snapshot) = (replica.clone(), req.snapshot.clone());
    let opened = tokio::task::spawn_blocking(move || r.open_snapshot(&snapshot)).await;
    let Ok(Ok(reader)) = opened else {
        return refuse(Status::NoSuchReplica);
    };
    let info = HelloInfo {
        size: reader.size(),
        epoch: replica.epoch(),
        generation: replica.generation(),
        boot_id: boot,
    }
    .encode();
    let ok = h.reply(Status::Ok).with_payload(&info);
    reply(out, (ok, Some(bytes::Bytes::copy_from_slice(&info))));
    Ok(reader)
}

/// Serves Read, Checksum and Ping of the copy, one request at a time, until the peer closes
/// or sends anything else.
pub(crate) async fn snapshot_loop(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    reader: Arc<SnapshotReader>,
    out: &Replies,
    budget: &Arc<Semaphore>,
) -> Result<(), FrameIoError> {
    loop {
        // A peer that stops reading replies stops being read from, as in an engine session.
        out.backlog_at_most(REPLICA_CONN_MAX_BACKLOG_BYTES).await;
        let h = read_header(rd).await?;
        // Nothing sent here carries data: a frame announcing some (or a reply) ends the
        // session before any memory is reserved or read for it.
        if h.is_reply() || h.payload_len > 0 {
            return Err(FrameIoError::Closed);
        }
        let memory = budget
            .clone()
            .acquire_many_owned(memory_cost(&h))
            .await
            .map_err(|_| FrameIoError::Closed)?;
        read_payload(rd, &h).await?;
        let (offset, len) = (h.offset, h.length);
        let result = match h.op {
            Op::Ping => Ok(None),
            Op::Read if len <= MAX_PAYLOAD_BYTES => {
                let r = reader.clone();
                tokio::task::spawn_blocking(move || r.read(offset, len).map(Some))
                    .await
                    .unwrap_or(Err(ReplicaIoError::OutOfRange))
            }
            Op::Checksum => {
                let r = reader.clone();
                tokio::task::spawn_blocking(move || r.checksum(offset, len).map(Some))
                    .await
                    .unwrap_or(Err(ReplicaIoError::OutOfRange))
            }
            _ => {
                reply(out, (h.reply(Status::Invalid), None));
                return Err(FrameIoError::Closed);
            }
        };
        let r = match result {
            Ok(Some(data)) => (h.reply(Status::Ok).with_payload(&data), Some(data)),
            Ok(None) => (h.reply(Status::Ok), None),
            Err(e) => (error_reply(&h, e), None),
        };
        reply(out, r);
        drop(memory);
    }
}
