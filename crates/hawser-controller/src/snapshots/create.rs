//! Taking a crash-consistent snapshot of a volume, attached or not.
//!
//! 1. **Record** the snapshot as Creating in the volume's record (one compare-and-swap),
//!    before any agent is asked: a controller that dies mid-way leaves a record that says
//!    what to clean up.
//! 2. **Hold the writes.** Attached: the engine's node pauses it (`engine/registry/pause.rs` in
//!    the agent): requests in flight finish, new ones wait, every replica is flushed; the pause
//!    answers with the epoch and the engine's in-sync set. Detached: nothing writes; the
//!    record's in-sync replicas are the volume. (An engine that syncs a detached volume's new
//!    replicas writes only to replicas that are not in sync, which are not copied.)
//! 3. **Copy** every in-sync replica (`hawser_storage::replica::snapshot`), concurrently, each call
//!    carrying the epoch so a fenced engine's replica set cannot be used.
//! 4. **Resume**, and only if the pause was still held (its lease did not run out) do the
//!    copies count: otherwise a later write may be in some of them, and they are deleted.
//! 5. **Record** it Ready with the replicas that hold it.
//!
//! So a Ready snapshot is, on every replica that holds it, the volume after every write
//! acknowledged before the pause and before every write acknowledged after it; and every
//! replica that was in sync holds it (any failure fails the whole snapshot), so it survives
//! the loss of a node as the volume does.

use hawser_api::agent::{ReplicaSnapshot, TakeSnapshot};
use hawser_api::controller::{CreateSnapshot, SnapshotState, VolumeState};

use crate::cluster::agent_client::AgentClient;
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::{now_ms, NodeRecord, SnapshotRecord, VolumeRecord};

/// The longest a volume's requests are held while its replicas copy (the pause's lease).
/// Reflink copies take milliseconds; a full copy (ext4) of a large volume may not fit, and
/// the snapshot then fails rather than hold the volume longer.
pub const PAUSE_LEASE_MS: u64 = 30_000;

/// The snapshot named `name`, with its volume's record, if any volume has it.
pub fn find<'a>(
    volumes: &'a [VolumeRecord],
    name: &str,
) -> Option<(&'a VolumeRecord, &'a SnapshotRecord)> {
    volumes
        .iter()
        .find_map(|v| v.snapshots.iter().find(|s| s.name == name).map(|s| (v, s)))
}

pub async fn create_snapshot(
    st: &AppState,
    req: CreateSnapshot,
) -> Result<SnapshotRecord, ControllerError> {
    hawser_api::validate_name("snapshot", &req.name)?;
    let _guard = st.volume_locks.lock(&req.volume).await;
    let volumes = st.records.volumes().await?;
    if let Some((v, s)) = find(&volumes, &req.name) {
        if v.name != req.volume {
            return Err(ControllerError::SnapshotExists {
                snapshot: req.name,
                volume: v.name.clone(),
            });
        }
        match s.state {
            // The same request again (CSI retries): the snapshot it made.
            SnapshotState::Ready => return Ok(s.clone()),
            SnapshotState::Deleting => {
                return Err(ControllerError::Refused {
                    message: format!("snapshot {:?} is being deleted; retry later", req.name),
                })
            }
            // Left by a controller that stopped mid-way (creates hold the volume's lock):
            // clean it up and take it anew.
            SnapshotState::Creating => discard(st, v, s).await?,
        }
    }
    let v = st.records.existing_volume(&req.volume).await?;
    if let Some(label) = &v.restoring {
        return Err(ControllerError::restoring(&v, label));
    }
    if !matches!(v.state, VolumeState::Attached | VolumeState::Detached) {
        return Err(ControllerError::Busy {
            volume: v.name,
            state: v.state,
        });
    }
    let tag: u32 = rand::random::<u32>() & 0xff_ffff;
    let record = SnapshotRecord {
        name: req.name.clone(),
        id: format!("{}-{tag:06x}", req.name),
        size_bytes: v.size_bytes,
        created_ms: now_ms(),
        state: SnapshotState::Creating,
        replicas: Vec::new(),
        pause_micros: None,
        how: None,
    };
    let (v, ()) = st
        .records
        .update_volume(&req.volume, |v| {
            v.snapshots.push(record.clone());
            Ok(())
        })
        .await?;
    match take(st, &v, &record).await {
        Ok(taken) => {
            let (v, ready) = st
                .records
                .update_volume(&req.volume, |v| {
                    let s = v
                        .snapshots
                        .iter_mut()
                        .find(|s| s.id == record.id)
                        .ok_or_else(|| ControllerError::Changed {
                            volume: v.name.clone(),
                        })?;
                    s.state = SnapshotState::Ready;
                    s.replicas = taken.replicas.clone();
                    s.pause_micros = taken.pause_micros;
                    s.how = Some(taken.how.clone());
                    Ok(s.clone())
                })
                .await?;
            tracing::info!(
                volume = %v.name, snapshot = %ready.name, replicas = ?ready.replicas,
                pause_us = ?ready.pause_micros, how = ?ready.how, "snapshot taken"
            );
            let msg = format!(
                "snapshot {} taken on {} replica(s){}",
                ready.name,
                ready.replicas.len(),
                ready
                    .pause_micros
                    .map_or(String::new(), |us| format!(", writes held {us} µs"))
            );
            st.events.normal(&v.name, "SnapshotTaken", msg);
            Ok(ready)
        }
        Err(e) => {
            tracing::warn!(volume = %v.name, snapshot = %record.name, error = %e, "snapshot failed");
            // The snapshot's own error is the one to report; a cleanup that cannot finish
            // leaves the record Deleting for `snapshot delete` to retry, and says so.
            let v = st.records.existing_volume(&req.volume).await?;
            if let Some(s) = v.snapshots.iter().find(|s| s.id == record.id) {
                if let Err(c) = discard(st, &v, s).await {
                    tracing::warn!(
                        snapshot = %record.name, error = %c,
                        "the failed snapshot's copies are not all deleted; it stays deleting"
                    );
                }
            }
            Err(e)
        }
    }
}

struct Taken {
    replicas: Vec<String>,
    pause_micros: Option<u64>,
    how: String,
}

async fn take(
    st: &AppState,
    v: &VolumeRecord,
    snap: &SnapshotRecord,
) -> Result<Taken, ControllerError> {
    let nodes = st.records.nodes().await?;
    let failed = |reason: String| ControllerError::SnapshotFailed {
        snapshot: snap.name.clone(),
        reason,
    };
    if v.state != VolumeState::Attached {
        let in_sync: Vec<String> = v.in_sync().map(|r| r.id.clone()).collect();
        let copies = copy_all(&st.agents, v, &nodes, &in_sync, v.epoch, &snap.id)
            .await
            .map_err(failed)?;
        return Ok(taken(copies, None));
    }
    let name = v.attached_node.as_deref().unwrap_or_default();
    let node = nodes
        .iter()
        .find(|n| n.name == name)
        .ok_or_else(|| ControllerError::NodeNotFound { node: name.into() })?;
    let paused = st
        .agents
        .pause_engine(node.agent(), &v.name, PAUSE_LEASE_MS)
        .await
        .map_err(|e| failed(format!("pausing its engine on node {name}: {e}")))?;
    // The engine's in-sync set, within the record's: a replica the store no longer calls in
    // sync gets no copy even if an engine's view lagged (a copy of it could lack writes the
    // others' hold). Fewer holders is safe; a holder missing a write is not.
    let holders: Vec<String> = paused
        .in_sync
        .iter()
        .filter(|id| v.in_sync().any(|r| r.id == **id))
        .cloned()
        .collect();
    let copies = if paused.epoch == v.epoch {
        copy_all(&st.agents, v, &nodes, &holders, paused.epoch, &snap.id).await
    } else {
        Err(format!(
            "its engine runs epoch {}, the record says {} (moved meanwhile?)",
            paused.epoch, v.epoch
        ))
    };
    let resumed = st
        .agents
        .resume_engine(node.agent(), &v.name, paused.pause_id)
        .await;
    let copies = copies.map_err(failed)?;
    let resumed = resumed.map_err(|e| {
        failed(format!(
            "its writes were not held until the copies were done ({e}); they may hold later \
             writes and are deleted. Writes are held at most {} s: on a pool without reflinks \
             (ext4) a snapshot copies the volume's data, so a large one cannot be taken while \
             attached; detach the volume to snapshot it without a pause, or use an XFS \
             (reflink=1) or btrfs pool",
            PAUSE_LEASE_MS / 1000
        ))
    })?;
    Ok(taken(copies, Some(resumed.held_micros)))
}

fn taken(copies: Vec<ReplicaSnapshot>, pause_micros: Option<u64>) -> Taken {
    let hows: std::collections::BTreeSet<&str> =
        copies.iter().filter_map(|c| c.how.as_deref()).collect();
    let how = match hows.len() {
        1 => hows.into_iter().next().unwrap_or("copy").to_string(),
        _ => "mixed".to_string(),
    };
    Taken {
        replicas: copies.into_iter().map(|c| c.replica_id).collect(),
        pause_micros,
        how,
    }
}

/// Copies every replica of `ids`, all at once; the first failure (as a reason) if any fails.
async fn copy_all(
    agents: &AgentClient,
    v: &VolumeRecord,
    nodes: &[NodeRecord],
    ids: &[String],
    epoch: u64,
    snapshot: &str,
) -> Result<Vec<ReplicaSnapshot>, String> {
    if ids.is_empty() {
        return Err("no replica is in sync".into());
    }
    let calls = ids.iter().map(|id| async move {
        let r = v
            .replicas
            .iter()
            .find(|r| r.id == *id)
            .ok_or_else(|| format!("the engine's replica {id} is not in the record"))?;
        let node = nodes
            .iter()
            .find(|n| n.name == r.node)
            .ok_or_else(|| format!("node {} of replica {id} is unknown", r.node))?;
        let req = TakeSnapshot {
            snapshot: snapshot.into(),
            epoch,
        };
        agents
            .take_snapshot(node.agent(), id, &req)
            .await
            .map_err(|e| format!("replica {id} on node {}: {e}", r.node))
    });
    futures_util::future::join_all(calls)
        .await
        .into_iter()
        .collect()
}

/// Deletes a snapshot's copies from every replica that may have one, then its record. A node
/// that does not answer leaves the record (Deleting) for a retry.
pub async fn discard(
    st: &AppState,
    v: &VolumeRecord,
    s: &SnapshotRecord,
) -> Result<(), ControllerError> {
    st.records
        .update_volume(&v.name, |v| {
            if let Some(x) = v.snapshots.iter_mut().find(|x| x.id == s.id) {
                x.state = SnapshotState::Deleting;
            }
            Ok(())
        })
        .await?;
    let nodes = st.records.nodes().await?;
    // A Creating snapshot may have copies on any replica, not only those it names.
    for r in v.replicas.iter().chain(&v.retired) {
        let Some(node) = nodes.iter().find(|n| n.name == r.node) else {
            continue;
        };
        st.agents
            .delete_snapshot(node.agent(), &r.id, &s.id)
            .await
            .or_else(|e| match e.api_code() {
                // The replica is gone: so is its copy.
                Some(hawser_api::ErrorCode::NotFound) => Ok(()),
                _ => Err(e),
            })
            .map_err(|source| ControllerError::Agent {
                node: r.node.clone(),
                op: format!(
                    "delete snapshot {} of replica {} (the snapshot stays deleting; retry)",
                    s.name, r.id
                ),
                source,
            })?;
    }
    st.records
        .update_volume(&v.name, |v| {
            v.snapshots.retain(|x| x.id != s.id);
            Ok(())
        })
        .await?;
    Ok(())
}

/// Deletes snapshot `name`.
pub async fn delete_snapshot(st: &AppState, name: &str) -> Result<(), ControllerError> {
    let volumes = st.records.volumes().await?;
    let volume = find(&volumes, name)
        .map(|(v, _)| v.name.clone())
        .ok_or_else(|| ControllerError::SnapshotNotFound {
            snapshot: name.into(),
        })?;
    let _guard = st.volume_locks.lock(&volume).await;
    let v = st.records.existing_volume(&volume).await?;
    let s = v
        .snapshots
        .iter()
        .find(|s| s.name == name)
        .cloned()
        .ok_or_else(|| ControllerError::SnapshotNotFound {
            snapshot: name.into(),
        })?;
    discard(st, &v, &s).await?;
    tracing::info!(volume = %volume, snapshot = name, "snapshot deleted");
    st.events.keep(
        Some(&volume),
        None,
        false,
        "SnapshotDeleted",
        &format!("snapshot {name} deleted"),
    );
    Ok(())
}
