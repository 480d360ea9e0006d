//! Restoring a detached volume to one of its snapshots (`POST /v1/volumes/{name}/restore`).
//!
//! The replicas holding the snapshot replace their data with their copy of it (the agent
//! writes the copy beside the data file, then renames it over: a replica is either all old or
//! all restored). Their copies are identical (taken at one paused moment, docs/snapshots.md),
//! so after the restore they are identical too and become the in-sync set. Every other replica
//! (one that lacked the snapshot, a holder whose node is offline, a failed one) becomes blank:
//! whatever it holds is of no moment the volume is at now, and resync copies it in full
//! (self-healing's sync engine while detached, or the engine at attach).
//!
//! Three records, so a controller that stops half-way never leaves replicas that differ
//! called in-sync: first every replica leaves the in-sync set and the volume is marked
//! `restoring` (attach, expand, force-promote and snapshots refuse it; with no in-sync
//! replica nothing copies from it); then the holders are restored; then they are in sync and
//! the mark is cleared. The same request again finishes a restore that stopped (a restore of
//! a replica already restored writes the same data).

use hawser_api::controller::{ReplicaState, RestoreVolume, SnapshotState};

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::VolumeRecord;
use crate::volumes::create::find_node;

pub async fn restore_volume(
    st: &AppState,
    name: &str,
    req: RestoreVolume,
) -> Result<VolumeRecord, ControllerError> {
    let _guard = st.volume_locks.lock(name).await;
    let current = st.records.existing_volume(name).await?;
    let snap = match current.snapshots.iter().find(|s| s.name == req.snapshot) {
        Some(s) => s.clone(),
        None => {
            let volumes = st.records.volumes().await?;
            return Err(
                match crate::snapshots::create::find(&volumes, &req.snapshot) {
                    Some((v, _)) => ControllerError::invalid(format!(
                        "snapshot {:?} is of volume {:?}, not {name:?}; clone it instead \
                     (`hawser volume create NEW --from {}`)",
                        req.snapshot, v.name, req.snapshot
                    )),
                    None => ControllerError::SnapshotNotFound {
                        snapshot: req.snapshot,
                    },
                },
            );
        }
    };
    if snap.state != SnapshotState::Ready {
        return Err(ControllerError::Refused {
            message: format!(
                "snapshot {:?} is {:?}; only a ready snapshot can be restored",
                snap.name, snap.state
            ),
        });
    }
    check_restorable(&current, &snap.name)?;
    let nodes = st.records.nodes().await?;
    // The holders that can be restored now: on an online node, not failed.
    let mut restore = Vec::new();
    for r in current
        .replicas
        .iter()
        .filter(|r| snap.replicas.contains(&r.id))
    {
        let node = find_node(&nodes, &r.node)?;
        if r.state != ReplicaState::Failed && st.is_online(node) {
            restore.push((r.id.clone(), node.clone()));
        }
    }
    if restore.is_empty() {
        return Err(ControllerError::Refused {
            message: format!(
                "no replica of volume {name:?} that holds snapshot {:?} can be restored now \
                 (holders {:?}: offline, failed or replaced)",
                snap.name, snap.replicas
            ),
        });
    }
    let restored: Vec<String> = restore.iter().map(|(id, _)| id.clone()).collect();
    st.records
        .update_volume(name, |v| {
            check_restorable(v, &snap.name)?;
            v.restoring = Some(snap.name.clone());
            for r in &mut v.replicas {
                if r.state == ReplicaState::InSync {
                    r.state = ReplicaState::Outdated;
                }
                if !restored.contains(&r.id) {
                    r.blank = true;
                }
            }
            Ok(())
        })
        .await?;
    for (replica, node) in &restore {
        st.agents
            .restore_replica(node.agent(), replica, &snap.id)
            .await
            .map_err(|source| ControllerError::Agent {
                node: node.name.clone(),
                op: format!(
                    "restore replica {replica} to snapshot {} (the volume stays restoring; \
                     the same restore again finishes it)",
                    snap.name
                ),
                source,
            })?;
    }
    let (rec, ()) = st
        .records
        .update_volume(name, |v| {
            v.restoring = None;
            for r in &mut v.replicas {
                if restored.contains(&r.id) {
                    r.state = ReplicaState::InSync;
                    r.blank = false;
                }
            }
            Ok(())
        })
        .await?;
    tracing::warn!(
        volume = name, snapshot = %snap.name, replicas = ?restored,
        "volume restored to a snapshot"
    );
    st.events.keep(
        Some(name),
        None,
        false,
        "Restored",
        &format!(
            "restored to snapshot {} ({} replica(s) restored, {} to copy in full)",
            snap.name,
            restored.len(),
            rec.replicas.len() - restored.len()
        ),
    );
    Ok(rec)
}

/// Detached, no sync engine, and not half-way through a restore to another snapshot.
fn check_restorable(v: &VolumeRecord, snapshot: &str) -> Result<(), ControllerError> {
    if let Some(other) = v.restoring.as_deref().filter(|s| *s != snapshot) {
        return Err(ControllerError::restoring(v, other));
    }
    crate::volumes::expand::check_idle(
        v,
        " (detach it to restore it: its users must not see the data change)",
    )
}
