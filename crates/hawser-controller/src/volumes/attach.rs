//! Attaching a volume to a node (a new epoch and an engine there) and detaching it.
//!
//! The epoch is incremented in the store *before* the engine starts, and never goes down, so
//! a new engine always has a higher epoch than any older one; replicas refuse writes from
//! older epochs and the controller refuses their outdate reports. That fencing is what makes
//! attaching elsewhere safe even when an old engine may still be running.

use hawser_api::agent::{EngineReplica, StartEngine};
use hawser_api::controller::{Attach, VolumeState};

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::{now_ms, NodeRecord, VolumeRecord};
use crate::volumes::create::find_node;
use crate::volumes::keys::Keks;
use hawser_api::Secret;

/// Attaches `name` to `req.node`; returns the record and the node it is attached to.
pub async fn attach_volume(
    st: &AppState,
    name: &str,
    req: Attach,
) -> Result<(VolumeRecord, NodeRecord), ControllerError> {
    let _guard = st.volume_locks.lock(name).await;
    let nodes = st.records.nodes().await?;
    let node = find_node(&nodes, &req.node)?.clone();
    let current = st.records.existing_volume(name).await?;
    if current.state == VolumeState::Attached
        && current.attached_node.as_deref() == Some(node.name.as_str())
    {
        // Attaching again where it is attached makes sure the engine runs: the agent may have
        // restarted (node reboot) and lost it. The agent keeps a live engine of this epoch
        // as it is; the only other engine of this epoch ran in that agent's previous life.
        ensure_engine(st, &current, &node, &nodes).await?;
        return Ok((current, node));
    }
    check_detached(&current, " (detach it first)")?;
    // Before anything changes: a key that does not open refuses the attach as it is.
    let key = data_key(&st.keks, &current).await?;
    if !st.is_online(&node) {
        let age_secs = node.age_ms(now_ms()) / 1000;
        return Err(ControllerError::NodeOffline {
            node: node.name,
            age_secs,
        });
    }
    if let Some(sync) = &current.sync_node {
        // The engine syncing its new replicas stops first (flushed, its journal clean); if
        // it cannot be reached, the new epoch fences it. Self-healing resumes the sync in
        // the attached engine.
        if let Err(e) = stop_engine(st, name, sync).await {
            tracing::warn!(volume = %name, node = %sync, error = %e, "sync engine not stopped; the attach fences it");
        }
    }
    let (rec, ()) = st
        .records
        .update_volume(name, |v| {
            check_detached(v, " (detach it first)")?;
            v.sync_node = None;
            v.epoch += 1;
            v.attached_epoch = Some(v.epoch);
            v.state = VolumeState::Attached;
            v.attached_node = Some(node.name.clone());
            Ok(())
        })
        .await?;
    let start = StartEngine {
        volume: rec.name.clone(),
        size_bytes: rec.size_bytes,
        epoch: rec.epoch,
        replicas: engine_replicas(&rec, &nodes)?,
        controller_url: st.engine_controller_urls().await,
        on_quorum_loss: rec.on_quorum_loss,
        export: true,
        grant: Some(crate::cluster::signer(st).await?.grant(
            &rec.name,
            &node.name,
            rec.epoch,
            key_check(&rec),
        )?),
        qos: rec.qos,
        data_key: key,
        uid: rec.uid.clone(),
    };
    if let Err(source) = st.agents.start_engine(node.agent(), &start).await {
        let err = ControllerError::Agent {
            node: node.name.clone(),
            op: "start engine".into(),
            source,
        };
        undo_attach(st, &rec, &node.name).await;
        return Err(err);
    }
    tracing::info!(volume = %name, node = %node.name, epoch = rec.epoch, "volume attached");
    st.events.normal(
        name,
        "Attached",
        format!("attached on node {} at epoch {}", node.name, rec.epoch),
    );
    Ok((rec, node))
}

pub(crate) async fn ensure_engine(
    st: &AppState,
    rec: &VolumeRecord,
    node: &NodeRecord,
    nodes: &[NodeRecord],
) -> Result<(), ControllerError> {
    let start = StartEngine {
        volume: rec.name.clone(),
        size_bytes: rec.size_bytes,
        epoch: rec.epoch,
        replicas: engine_replicas(rec, nodes)?,
        controller_url: st.engine_controller_urls().await,
        on_quorum_loss: rec.on_quorum_loss,
        // Only an attached volume is served; a detached one's engine only syncs replicas.
        export: rec.state == VolumeState::Attached,
        grant: Some(crate::cluster::signer(st).await?.grant(
            &rec.name,
            &node.name,
            rec.epoch,
            key_check(rec),
        )?),
        qos: rec.qos,
        data_key: data_key(&st.keks, rec).await?,
        uid: rec.uid.clone(),
    };
    st.agents
        .start_engine(node.agent(), &start)
        .await
        .map_err(|source| ControllerError::Agent {
            node: node.name.clone(),
            op: "start engine".into(),
            source,
        })
        .map(|_| ())
}

/// The key check an encrypted volume's grants carry.
fn key_check(rec: &VolumeRecord) -> Option<hawser_api::KeyCheck> {
    rec.encryption.as_ref().map(|w| w.check)
}

/// An encrypted volume's data key, unwrapped for its engine (which gets it over TLS and keeps
/// it in memory). A key that does not open refuses the start, saying why.
async fn data_key(keks: &Keks, rec: &VolumeRecord) -> Result<Option<Secret>, ControllerError> {
    let Some(wrapped) = &rec.encryption else {
        return Ok(None);
    };
    let refused = |e: crate::volumes::keys::KeyError| ControllerError::Refused {
        message: e.to_string(),
    };
    keks.fetch(wrapped.kek).await.map_err(refused)?;
    let key = keks.unwrap(&rec.name, wrapped).map_err(refused)?;
    Ok(Some(Secret::new(&key)))
}

/// The in-sync replicas with their nodes' replica addresses. Replicas on offline nodes are
/// included on purpose: the engine must find them unreachable and outdate them through the
/// controller, or the record would keep calling them in sync.
fn engine_replicas(
    rec: &VolumeRecord,
    nodes: &[NodeRecord],
) -> Result<Vec<EngineReplica>, ControllerError> {
    rec.replicas
        .iter()
        .map(|r| {
            let node = find_node(nodes, &r.node)?;
            Ok(EngineReplica {
                replica_id: r.id.clone(),
                node: r.node.clone(),
                replica_addr: node.replica_addr.clone(),
                state: r.state,
                blank: r.blank,
            })
        })
        .collect()
}

/// The engine did not start: back to Detached. The epoch stays incremented (epochs never go
/// down; a half-started engine of this epoch is fenced by the next attach).
async fn undo_attach(st: &AppState, rec: &VolumeRecord, node: &str) {
    let result = st
        .records
        .update_volume(&rec.name, |v| {
            if v.state == VolumeState::Attached
                && v.epoch == rec.epoch
                && v.attached_node.as_deref() == Some(node)
            {
                v.state = VolumeState::Detached;
                v.attached_node = None;
            }
            Ok(())
        })
        .await;
    if let Err(e) = result {
        tracing::error!(volume = %rec.name, error = %e, "could not undo a failed attach");
    }
}

fn check_detached(v: &VolumeRecord, hint: &'static str) -> Result<(), ControllerError> {
    if let Some(label) = &v.restoring {
        return Err(ControllerError::restoring(v, label));
    }
    match v.state {
        VolumeState::Detached => Ok(()),
        VolumeState::Attached => Err(ControllerError::Attached {
            volume: v.name.clone(),
            node: v.attached_node.clone().unwrap_or_default(),
            hint,
        }),
        state => Err(ControllerError::Busy {
            volume: v.name.clone(),
            state,
        }),
    }
}

/// Stops the engine and marks the volume Detached. Detaching a detached volume is a no-op.
pub async fn detach_volume(st: &AppState, name: &str) -> Result<VolumeRecord, ControllerError> {
    let _guard = st.volume_locks.lock(name).await;
    let current = st.records.existing_volume(name).await?;
    let node_name = match (current.state, &current.attached_node) {
        (VolumeState::Detached, _) => return Ok(current),
        (VolumeState::Attached, Some(n)) => n.clone(),
        (state, _) => {
            return Err(ControllerError::Busy {
                volume: name.into(),
                state,
            })
        }
    };
    stop_engine(st, name, &node_name).await?;
    let (rec, ()) = st
        .records
        .update_volume(name, |v| {
            if v.state == VolumeState::Attached && v.attached_node.as_deref() == Some(&node_name) {
                v.state = VolumeState::Detached;
                v.attached_node = None;
            }
            Ok(())
        })
        .await?;
    tracing::info!(volume = %name, node = %node_name, "volume detached");
    let msg = format!("detached from node {node_name}");
    st.events
        .keep(Some(name), Some(&node_name), false, "Detached", &msg);
    Ok(rec)
}

/// Stops the volume's engine on `node_name`. An agent that does not answer blocks the detach,
/// unless its node is offline: then the detach goes ahead, because the next attach's higher
/// epoch fences whatever that engine still does.
pub(crate) async fn stop_engine(
    st: &AppState,
    volume: &str,
    node_name: &str,
) -> Result<(), ControllerError> {
    let Some(node) = st.records.node(node_name).await? else {
        tracing::warn!(
            volume,
            node = node_name,
            "attached node is unknown; detaching anyway"
        );
        return Ok(());
    };
    match st.agents.stop_engine(node.agent(), volume).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_unreachable() && !st.is_online(&node) => {
            tracing::warn!(
                volume, node = node_name, error = %e,
                "node offline; detaching without stopping its engine (fenced by epoch)"
            );
            Ok(())
        }
        Err(source) => Err(ControllerError::Agent {
            node: node_name.into(),
            op: "stop engine".into(),
            source,
        }),
    }
}
