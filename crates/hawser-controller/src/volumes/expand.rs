//! Growing a detached volume: every replica first, then the volume record.
//!
//! The order is what keeps it safe. A replica is never smaller than its volume's record: an
//! engine starts with the record's size and every replica already has at least that much. A
//! replica larger than the record (a grow that stopped after some replicas) is harmless: its
//! extra range is zeros on every replica that has it, no engine serves it, and the next
//! expand to that size finds those replicas already grown (a no-op). Attached volumes are
//! refused: an NBD server cannot tell a connected client that the export grew.

use hawser_api::controller::{ExpandVolume, VolumeState};
use hawser_api::size::check_volume_size;

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::{now_ms, VolumeRecord};
use crate::volumes::create::find_node;

const ATTACHED_HINT: &str = "; an NBD client cannot be told that its export grew, so detach \
     the volume, expand it and attach it again (Kubernetes does this for a CSI volume once no \
     pod uses it)";

/// Grows `name` to `req.size_bytes`; returns the record (unchanged when it has that size).
pub async fn expand_volume(
    st: &AppState,
    name: &str,
    req: ExpandVolume,
) -> Result<VolumeRecord, ControllerError> {
    check_volume_size(req.size_bytes).map_err(|e| ControllerError::invalid(e.to_string()))?;
    let _guard = st.volume_locks.lock(name).await;
    let current = st.records.existing_volume(name).await?;
    let size = req.size_bytes;
    if size == current.size_bytes {
        return Ok(current);
    }
    if size < current.size_bytes {
        return Err(ControllerError::invalid(format!(
            "shrinking a volume is not supported ({name} is {} bytes; asked {size})",
            current.size_bytes
        )));
    }
    check_unused(&current, ATTACHED_HINT)?;
    let nodes = st.records.nodes().await?;
    // Every node first, so an offline one refuses the expand before any replica grows.
    let mut targets = Vec::new();
    for r in &current.replicas {
        let node = find_node(&nodes, &r.node)?;
        if !st.is_online(node) {
            return Err(ControllerError::NodeOffline {
                node: node.name.clone(),
                age_secs: node.age_ms(now_ms()) / 1000,
            });
        }
        targets.push((r.id.clone(), node.clone()));
    }
    for (replica, node) in &targets {
        st.agents
            .grow_replica(node.agent(), replica, size)
            .await
            .map_err(|source| ControllerError::Agent {
                node: node.name.clone(),
                op: format!("grow replica {replica} to {size} bytes"),
                source,
            })?;
    }
    let (rec, ()) = st
        .records
        .update_volume(name, |v| {
            check_unused(v, ATTACHED_HINT)?;
            if v.replicas
                .iter()
                .map(|r| &r.id)
                .ne(current.replicas.iter().map(|r| &r.id))
            {
                return Err(ControllerError::Changed {
                    volume: v.name.clone(),
                });
            }
            v.size_bytes = v.size_bytes.max(size);
            Ok(())
        })
        .await?;
    tracing::info!(volume = %name, size, "volume expanded");
    let msg = format!("expanded to {size} bytes");
    st.events.keep(Some(name), None, false, "Expanded", &msg);
    Ok(rec)
}

/// A detached volume whose replicas no engine uses (to grow it, or force it up); `hint` says
/// what to do when it is attached.
pub(crate) fn check_unused(v: &VolumeRecord, hint: &'static str) -> Result<(), ControllerError> {
    if let Some(snapshot) = &v.restoring {
        return Err(ControllerError::Restoring {
            volume: v.name.clone(),
            snapshot: snapshot.clone(),
        });
    }
    check_idle(v, hint)
}

/// Detached, and no engine syncing its replicas: nothing reads or writes them.
pub(crate) fn check_idle(v: &VolumeRecord, hint: &'static str) -> Result<(), ControllerError> {
    match v.state {
        VolumeState::Detached => {}
        VolumeState::Attached => {
            return Err(ControllerError::Attached {
                volume: v.name.clone(),
                node: v.attached_node.clone().unwrap_or_default(),
                hint,
            })
        }
        state => {
            return Err(ControllerError::Busy {
                volume: v.name.clone(),
                state,
            })
        }
    }
    if let Some(node) = &v.sync_node {
        return Err(ControllerError::Syncing {
            volume: v.name.clone(),
            node: node.clone(),
        });
    }
    Ok(())
}
