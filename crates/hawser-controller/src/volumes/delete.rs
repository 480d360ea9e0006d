//! Deleting a volume: mark it Deleting, delete its replicas on their agents, then delete the
//! record. An agent that does not answer leaves the volume Deleting so a retry finishes it.

use hawser_api::controller::VolumeState;

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::VolumeRecord;
use crate::volumes::create::same_replicas;

/// Deletes a volume; one with snapshots only when `with_snapshots` (its replicas' files go,
/// and their snapshots with them).
pub async fn delete_volume(
    st: &AppState,
    name: &str,
    with_snapshots: bool,
) -> Result<(), ControllerError> {
    let _guard = st.volume_locks.lock(name).await;
    if !with_snapshots {
        let v = st.records.existing_volume(name).await?;
        if !v.snapshots.is_empty() && v.state != VolumeState::Deleting {
            return Err(ControllerError::HasSnapshots {
                volume: name.into(),
                count: v.snapshots.len(),
                names: v
                    .snapshots
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    delete_locked(st, name).await
}

/// The delete, for a caller that holds the volume's lock.
pub(crate) async fn delete_locked(st: &AppState, name: &str) -> Result<(), ControllerError> {
    let (rec, ()) = st
        .records
        .update_volume(name, |v| match v.state {
            VolumeState::Attached => Err(ControllerError::Attached {
                volume: v.name.clone(),
                node: v.attached_node.clone().unwrap_or_default(),
                hint: "; detach it first",
            }),
            // Creating is only seen here if a create crashed (creates hold the volume lock):
            // deleting is how that is cleaned up.
            VolumeState::Detached | VolumeState::Creating | VolumeState::Deleting => {
                v.state = VolumeState::Deleting;
                Ok(())
            }
        })
        .await?;
    if let Some(node) = &rec.sync_node {
        // The engine syncing its new replicas goes first (it writes to them).
        crate::volumes::attach::stop_engine(st, name, node).await?;
    }
    let nodes = st.records.nodes().await?;
    // Retired replicas too: their files may still be on their nodes.
    for r in rec.replicas.iter().chain(&rec.retired) {
        let Some(node) = nodes.iter().find(|n| n.name == r.node) else {
            // A node that never registered (or was wiped) has nothing to delete.
            tracing::warn!(volume = %name, replica = %r.id, node = %r.node, "node unknown");
            continue;
        };
        st.agents
            .delete_replica(node.agent(), &r.id)
            .await
            .map_err(|source| ControllerError::Agent {
                node: r.node.clone(),
                op: format!("delete replica {} (volume stays deleting; retry)", r.id),
                source,
            })?;
    }
    // The record this delete marked Deleting, and no other (see `delete_volume_if`).
    let ours = |v: &VolumeRecord| v.state == VolumeState::Deleting && same_replicas(v, &rec);
    st.records.delete_volume_if(name, ours).await?;
    tracing::info!(volume = %name, "volume deleted");
    st.events
        .keep(Some(name), None, false, "Deleted", "volume deleted");
    Ok(())
}
