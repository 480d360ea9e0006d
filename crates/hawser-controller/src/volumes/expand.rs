//! Growing a volume: every replica first, then the volume record, then (attached) the engine
//! and the kernel device on the volume's node.
//!
//! The order is what keeps it safe. A replica is never smaller than its volume's record: an
//! engine starts with the record's size and every replica already has at least that much. A
//! replica larger than the record (a grow that stopped after some replicas) is harmless: its
//! extra range is zeros on every replica that has it, no engine serves it, and the next
//! expand to that size finds those replicas already grown (a no-op).
//!
//! An attached volume grows online (docs/protocol.md, "Growing a volume online"): replicas
//! grow in place under their open sessions, then the record, then the running engine is told,
//! which tells its kernel device (a mounted filesystem can then be grown). Its node is asked
//! first whether the device can follow (ublk cannot before Linux 6.16), so a volume that
//! cannot grow online is refused before anything grows. An engine that did not hear of the
//! grow (its agent was down) is told by the next expand to the same size, and an engine that
//! starts later starts with the record's size.

use hawser_api::controller::{ExpandVolume, VolumeState};
use hawser_api::size::check_volume_size;

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::{now_ms, NodeRecord, VolumeRecord};
use crate::volumes::create::find_node;

const ATTACHED_HINT: &str = "; detach it first";

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
    if size < current.size_bytes {
        return Err(ControllerError::invalid(format!(
            "shrinking a volume is not supported ({name} is {} bytes; asked {size})",
            current.size_bytes
        )));
    }
    check_growable(&current)?;
    let nodes = st.records.nodes().await?;
    let online = |node: &NodeRecord| {
        if st.is_online(node) {
            Ok(())
        } else {
            Err(ControllerError::NodeOffline {
                node: node.name.clone(),
                age_secs: node.age_ms(now_ms()) / 1000,
            })
        }
    };
    let engine_node = match (&current.state, &current.attached_node) {
        (VolumeState::Attached, Some(n)) => {
            let node = find_node(&nodes, n)?.clone();
            online(&node)?;
            Some(node)
        }
        _ => None,
    };
    if size == current.size_bytes {
        // Already that big; an engine that missed the grow hears of it now.
        if let Some(node) = &engine_node {
            grow_engine(st, node, name, size, false).await?;
        }
        return Ok(current);
    }
    if let Some(node) = &engine_node {
        grow_engine(st, node, name, size, true).await?;
    }
    // Every node first, so an offline one refuses the expand before any replica grows.
    let mut targets = Vec::new();
    for r in &current.replicas {
        let node = find_node(&nodes, &r.node)?;
        online(node)?;
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
            check_growable(v)?;
            let moved = v.state != current.state
                || v.attached_node != current.attached_node
                || v.replicas
                    .iter()
                    .map(|r| &r.id)
                    .ne(current.replicas.iter().map(|r| &r.id));
            if moved {
                return Err(ControllerError::Changed {
                    volume: v.name.clone(),
                });
            }
            v.size_bytes = v.size_bytes.max(size);
            Ok(())
        })
        .await?;
    if let Some(node) = &engine_node {
        grow_engine(st, node, name, size, false).await?;
    }
    tracing::info!(volume = %name, size, online = engine_node.is_some(), "volume expanded");
    let msg = match &engine_node {
        Some(node) => format!("expanded online to {size} bytes on node {}", node.name),
        None => format!("expanded to {size} bytes"),
    };
    st.events.keep(Some(name), None, false, "Expanded", &msg);
    Ok(rec)
}

/// Asks `node` to grow `volume`'s engine and kernel device (`check_only`: whether it could).
async fn grow_engine(
    st: &AppState,
    node: &NodeRecord,
    volume: &str,
    size: u64,
    check_only: bool,
) -> Result<(), ControllerError> {
    match st
        .agents
        .grow_engine(node.agent(), volume, size, check_only)
        .await
    {
        Ok(_) => Ok(()),
        // The device cannot follow: say so as the agent put it, and that a detach helps.
        Err(e) if e.api_code() == Some(hawser_api::ErrorCode::Conflict) => {
            Err(ControllerError::Refused {
                message: format!(
                    "{}; detach the volume, expand it and attach it again (Kubernetes does \
                     this for a CSI volume once no pod uses it)",
                    refusal_text(&e)
                ),
            })
        }
        Err(source) => Err(ControllerError::Agent {
            node: node.name.clone(),
            op: if check_only {
                format!("ask whether volume {volume} can grow online")
            } else {
                format!(
                    "grow the engine of volume {volume} to {size} bytes (its replicas and \
                     record have that size; expand again to retry)"
                )
            },
            source,
        }),
    }
}

/// The agent's own words in a refusal.
fn refusal_text(e: &crate::errors::AgentError) -> String {
    match e {
        crate::errors::AgentError::Refused { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Attached, or detached with no engine syncing its replicas; not being restored.
fn check_growable(v: &VolumeRecord) -> Result<(), ControllerError> {
    match v.state {
        VolumeState::Attached => check_not_restoring(v),
        _ => check_unused(v, ATTACHED_HINT),
    }
}

fn check_not_restoring(v: &VolumeRecord) -> Result<(), ControllerError> {
    match &v.restoring {
        Some(label) => Err(ControllerError::restoring(v, label)),
        None => Ok(()),
    }
}

/// A detached volume whose replicas no engine uses (to grow it, or force it up); `hint` says
/// what to do when it is attached.
pub(crate) fn check_unused(v: &VolumeRecord, hint: &'static str) -> Result<(), ControllerError> {
    check_not_restoring(v)?;
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
