//! Giving a replica of this node a snapshot it lacks, from a replica on another node that
//! holds it (`POST /v1/replicas/{id}/snapshots/{snapshot}/fetch`, asked by the controller):
//! a read-only snapshot session to the holder (`replica/snapshot_session.rs` there), the copy started
//! from this replica's own data, and only the 64 KiB blocks whose digests differ read over
//! the network (`hawser_storage::snapshot_fetch`).

use std::sync::Arc;

use bytes::Bytes;
use hawser_core::ReplicaResult;
use hawser_storage::SnapshotFile;
use hawser_wire::frame::{
    Op, Status, CHECKSUM_BLOCK_BYTES, CHECKSUM_DIGEST_BYTES, MAX_CHECKSUM_BYTES,
};
use hawser_wire::grant::HelloSnapshotRequest;

use crate::replica::client::{ReplicaClient, ReplySink};
use crate::storage::pools::NodeStorage;

/// What a fetch did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub file: SnapshotFile,
    /// Bytes compared by digest (the snapshot's size).
    pub compared_bytes: u64,
    /// Bytes read from the holder (the blocks that differed).
    pub fetched_bytes: u64,
}

/// The session's replies all go to `call`s; a lost connection fails the fetch through them.
struct NoSink;

impl ReplySink for NoSink {
    fn on_reply(&self, _: hawser_core::SubId, _: ReplicaResult) {}
    fn on_lost(&self, _: bool) {}
}

/// Fetches snapshot `hello.snapshot` of replica `hello.replica` at `addr` into replica
/// `replica_id` of this node. Errors say what failed, for the controller to report.
pub async fn fetch_snapshot(
    storage: &NodeStorage,
    replica_id: &str,
    addr: &str,
    tls: Option<Arc<hawser_tls::rustls::ClientConfig>>,
    hello: HelloSnapshotRequest,
) -> Result<Fetched, String> {
    let replica = storage
        .replica(replica_id)
        .ok_or_else(|| format!("replica {replica_id} is not on this node"))?;
    let (client, info) = ReplicaClient::connect_snapshot(addr, tls, &hello, Arc::new(NoSink))
        .await
        .map_err(|e| format!("open snapshot {} of {}: {e}", hello.snapshot, hello.replica))?;
    let size = info.size;
    let snapshot = hello.snapshot.clone();
    let r = replica.clone();
    let fetch = tokio::task::spawn_blocking(move || r.begin_snapshot_fetch(&snapshot, size))
        .await
        .map_err(|e| format!("start the copy: {e}"))?
        .map_err(|e| format!("start the copy: {e}"))?;
    let fetch = Arc::new(fetch);
    let mut fetched = 0u64;
    let mut at = 0u64;
    while at < size {
        let len = u32::try_from((size - at).min(u64::from(MAX_CHECKSUM_BYTES))).unwrap_or(0);
        let theirs = call(&client, Op::Checksum, at, len).await?;
        let f = fetch.clone();
        let mine = tokio::task::spawn_blocking(move || f.digests(at, len))
            .await
            .map_err(|e| format!("digest the copy: {e}"))?
            .map_err(|e| format!("digest the copy: {e}"))?;
        if theirs.len() != mine.len() {
            return Err(format!(
                "the holder sent {} bytes of digests for {len} bytes at {at}, not {}",
                theirs.len(),
                mine.len()
            ));
        }
        let blocks = theirs
            .chunks(CHECKSUM_DIGEST_BYTES)
            .zip(mine.chunks(CHECKSUM_DIGEST_BYTES));
        for (i, (a, b)) in blocks.enumerate() {
            if a == b {
                continue;
            }
            let off = at + i as u64 * CHECKSUM_BLOCK_BYTES;
            let blen = u32::try_from((size - off).min(CHECKSUM_BLOCK_BYTES)).unwrap_or(0);
            let data = call(&client, Op::Read, off, blen).await?;
            if data.len() != blen as usize {
                return Err(format!(
                    "the holder sent {} bytes for a read of {blen} at {off}",
                    data.len()
                ));
            }
            let f = fetch.clone();
            tokio::task::spawn_blocking(move || f.write_at(off, &data))
                .await
                .map_err(|e| format!("write the copy: {e}"))?
                .map_err(|e| format!("write the copy: {e}"))?;
            fetched += u64::from(blen);
        }
        at += u64::from(len);
    }
    client.close();
    let fetch = Arc::try_unwrap(fetch).map_err(|_| "the copy is still in use".to_string())?;
    let file = tokio::task::spawn_blocking(move || fetch.commit())
        .await
        .map_err(|e| format!("finish the copy: {e}"))?
        .map_err(|e| format!("finish the copy: {e}"))?;
    tracing::info!(
        replica = replica_id, snapshot = %hello.snapshot, from = %hello.replica,
        compared = size, fetched, "snapshot fetched from a holder"
    );
    Ok(Fetched {
        file,
        compared_bytes: size,
        fetched_bytes: fetched,
    })
}

/// One request of the session; anything but an answer with data is an error.
async fn call(client: &ReplicaClient, op: Op, offset: u64, len: u32) -> Result<Bytes, String> {
    match client.call(op, offset, len, None).await {
        Some((Status::Ok, Some(data))) => Ok(data),
        Some((status, _)) => Err(format!(
            "the holder answered {status:?} to {op:?} of {len} bytes at {offset}"
        )),
        None => Err("the connection to the holder was lost".into()),
    }
}
