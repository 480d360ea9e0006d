//! Self-healing and evacuation: the leader runs the plan of `healing/plan.rs` every few seconds
//! and carries out its actions, one volume at a time under that volume's lock.
//!
//! A membership change is one compare-and-swap on the volume record. While the volume is
//! attached the same swap increments the epoch, and the agent where it is attached swaps
//! its engine for one of the new epoch with the new replica list (`engines.rs` in the
//! agent: requests pause, none fails). The new engine resyncs a blank replica from scratch
//! and marks it in-sync through the controller as any resync does. If the engine swap
//! fails, the old engine keeps serving in the old epoch until the engine check restarts it
//! in the new one (`cluster/engine_watch.rs`); it cannot do harm meanwhile: its outdate and
//! mark-in-sync reports are refused as stale, and the replica it does not know is blank
//! (not in-sync) in the record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hawser_api::agent::CreateReplica;
use hawser_api::controller::{Replica, ReplicaState, VolumeState, ZoneSpread};

use crate::errors::ControllerError;
use crate::healing::placement::replica_id;
use crate::healing::placement::Request;
use crate::healing::plan::{plan, Action, HealConfig, NodeView};
use crate::state::AppState;
use crate::store::leader::Role;
use crate::store::model::{now_ms, NodeRecord, VolumeRecord};
use crate::volumes::attach::{ensure_engine, stop_engine};
use crate::volumes::create::find_node;

/// Runs until the task is aborted; `every` zero disables it.
pub async fn run(st: Arc<AppState>, every: Duration, cfg: HealConfig) {
    if every.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_held: Vec<String> = Vec::new();
    loop {
        tick.tick().await;
        if matches!(st.leadership.role(), Role::Follower { .. }) {
            continue;
        }
        match round(&st, cfg).await {
            Ok(held) => {
                if held != last_held {
                    for h in &held {
                        tracing::warn!("self-healing held: {h}");
                    }
                    last_held = held;
                }
            }
            Err(e) => tracing::warn!(error = %e, "self-healing round failed"),
        }
    }
}

/// One round: plan, then act. Returns what the plan held back.
pub async fn round(st: &AppState, cfg: HealConfig) -> Result<Vec<String>, ControllerError> {
    let volumes = st.records.volumes_seen().await?;
    let nodes = st.records.nodes().await?;
    let settings = st.records.node_settings().await?;
    let now = now_ms();
    let views: BTreeMap<String, NodeView> = nodes
        .iter()
        .map(|n| {
            let view = NodeView {
                online: st.is_online(n),
                age_ms: n.age_ms(now),
                evacuate: settings.get(&n.name).is_some_and(|s| s.evacuate),
            };
            (n.name.clone(), view)
        })
        .collect();
    let p = plan(&volumes, &views, cfg);
    for action in p.actions {
        if let Err(e) = act(st, &action, &nodes, &views, cfg).await {
            tracing::warn!(?action, error = %e, "self-healing action failed; will retry");
        }
    }
    Ok(p.held)
}

async fn act(
    st: &AppState,
    action: &Action,
    nodes: &[NodeRecord],
    views: &BTreeMap<String, NodeView>,
    cfg: HealConfig,
) -> Result<(), ControllerError> {
    let (Action::Replace { volume, .. }
    | Action::AddFor { volume, .. }
    | Action::Retire { volume, .. }
    | Action::DeleteRetired { volume, .. }
    | Action::SyncDetached { volume, .. }
    | Action::EndSync { volume }) = action;
    let _guard = st.volume_locks.lock(volume).await;
    // The record may have changed since the plan (an attach, a detach, the engine's own
    // reports): act only if the plan for the current record still says so.
    let current = st.records.existing_volume(volume).await?;
    let still = plan(std::slice::from_ref(&current), views, cfg);
    if !still.actions.contains(action) {
        return Ok(());
    }
    match action {
        Action::Replace { replica, .. } => {
            add_blank(st, &current, nodes, views, Some(replica), true).await
        }
        Action::AddFor { replica, .. } => {
            add_blank(st, &current, nodes, views, Some(replica), false).await
        }
        Action::Retire { replica, .. } => retire(st, &current, nodes, replica).await,
        Action::DeleteRetired { replica, .. } => delete_retired(st, &current, nodes, replica).await,
        Action::SyncDetached { node, .. } => start_sync(st, &current, nodes, node).await,
        Action::EndSync { .. } => end_sync(st, &current).await,
    }
}

/// Places and creates a blank replica, then records it (instead of `replacing`, which is
/// retired, or in addition).
async fn add_blank(
    st: &AppState,
    v: &VolumeRecord,
    nodes: &[NodeRecord],
    views: &BTreeMap<String, NodeView>,
    leaving: Option<&str>,
    replace: bool,
) -> Result<(), ControllerError> {
    let replacing = leaving.filter(|_| replace);
    let id = replica_id(
        &v.name,
        u32::try_from(v.replicas.len() + v.retired.len()).unwrap_or(0),
    );
    let placed = place_one(st, v, nodes, views, leaving, &id)?;
    let node = find_node(nodes, &placed.node)?;
    let req = CreateReplica {
        replica_id: id.clone(),
        volume: v.name.clone(),
        size_bytes: v.size_bytes,
        pool: placed.pool.clone(),
        thin: v.thin,
        cluster_id: Some(crate::cluster::identity(st).await?.id),
        from: None,
        key_check: v.encryption.as_ref().map(|w| w.check),
        checksums: v.checksums,
        wrapped_key: v.encryption.clone(),
        volume_uid: v.uid.clone(),
    };
    if let Err(source) = st.agents.create_replica(node.agent(), &req).await {
        st.reservations.release(&id);
        if !source.never_sent() {
            let _ = st.agents.delete_replica(node.agent(), &id).await;
        }
        return Err(ControllerError::Agent {
            node: node.name.clone(),
            op: format!("create replica {id}"),
            source,
        });
    }
    st.reservations.created(&id);
    let blank = Replica {
        id: id.clone(),
        node: placed.node.clone(),
        pool: placed.pool.clone(),
        state: ReplicaState::Outdated,
        blank: true,
        engine: None,
    };
    let epoch = v.epoch;
    let changed = st
        .records
        .update_volume(&v.name, |r| {
            if r.epoch != epoch {
                return Err(changed(r));
            }
            if let Some(old) = replacing {
                let i = r.replicas.iter().position(|x| x.id == old).ok_or_else(|| {
                    ControllerError::ReplicaNotFound {
                        volume: r.name.clone(),
                        replica: old.into(),
                    }
                })?;
                let gone = r.replicas.remove(i);
                r.retired.push(gone);
            }
            r.replicas.push(blank.clone());
            if r.state == VolumeState::Attached {
                r.epoch += 1;
            }
            Ok(())
        })
        .await;
    let rec = match changed {
        Ok((rec, ())) => rec,
        Err(e) => {
            let _ = st.agents.delete_replica(node.agent(), &id).await;
            st.reservations.release(&id);
            return Err(e);
        }
    };
    tracing::warn!(
        volume = %v.name, replica = %id, node = %placed.node, replacing = ?replacing,
        epoch = rec.epoch, "self-healing: blank replica added; it resyncs from scratch"
    );
    st.events.warning(
        &v.name,
        "ReplicaReplaced",
        format!(
            "self-healing added replica {id} on node {}{}; it resyncs from scratch",
            placed.node,
            replacing.map_or(String::new(), |r| format!(" in place of {r}"))
        ),
    );
    swap_engine(st, &rec, nodes).await;
    Ok(())
}

/// One pool for a new replica of `v` (taking over from `leaving`): not on a node that holds
/// one of its replicas or is evacuating; under strict zone spread not in the zone of one of
/// the replicas that stay, under preferred spread such zones last.
fn place_one(
    st: &AppState,
    v: &VolumeRecord,
    nodes: &[NodeRecord],
    views: &BTreeMap<String, NodeView>,
    leaving: Option<&str>,
    id: &str,
) -> Result<crate::healing::placement::Placement, ControllerError> {
    let used: Vec<&str> = v.replicas.iter().map(|r| r.node.as_str()).collect();
    let staying: Vec<&str> = v
        .replicas
        .iter()
        .filter(|r| Some(r.id.as_str()) != leaving)
        .map(|r| r.node.as_str())
        .collect();
    let zones: Vec<Option<&str>> = staying
        .iter()
        .filter_map(|n| nodes.iter().find(|x| x.name == *n))
        .map(|n| n.zone())
        .collect();
    let candidates: Vec<_> = st
        .candidates(nodes)
        .into_iter()
        .filter(|c| !used.contains(&c.node.as_str()))
        .filter(|c| !views.get(&c.node).is_some_and(|n| n.evacuate))
        .collect();
    let (other_zones, same_zones): (Vec<_>, Vec<_>) = candidates
        .iter()
        .cloned()
        .partition(|c| !zones.contains(&c.zone.as_deref()));
    let request = Request {
        size_bytes: v.size_bytes,
        thin: v.thin,
        count: 1,
        rules: v.placement.clone(),
    };
    let ids = [id.to_string()];
    let mut placed = match v.placement.zone_spread {
        // Only zones none of its replicas is in.
        ZoneSpread::Strict => st
            .reservations
            .place_and_reserve(other_zones, &request, &ids)?,
        // Those first; a zone that has one if no other has room.
        ZoneSpread::Preferred => {
            match st
                .reservations
                .place_and_reserve(other_zones, &request, &ids)
            {
                Ok(p) => p,
                Err(_) => st
                    .reservations
                    .place_and_reserve(same_zones, &request, &ids)?,
            }
        }
        ZoneSpread::None => st
            .reservations
            .place_and_reserve(candidates, &request, &ids)?,
    };
    placed.replicas.pop().ok_or_else(|| {
        ControllerError::invalid(format!("placement chose no node for volume {}", v.name))
    })
}

/// Removes `replica` from the volume (it moved: the others suffice) and retires it.
async fn retire(
    st: &AppState,
    v: &VolumeRecord,
    nodes: &[NodeRecord],
    replica: &str,
) -> Result<(), ControllerError> {
    let epoch = v.epoch;
    let (rec, ()) = st
        .records
        .update_volume(&v.name, |r| {
            if r.epoch != epoch {
                return Err(changed(r));
            }
            let Some(i) = r.replicas.iter().position(|x| x.id == replica) else {
                return Ok(());
            };
            let others = r
                .replicas
                .iter()
                .filter(|x| x.id != replica && x.state == ReplicaState::InSync)
                .count();
            if others == 0 {
                return Err(ControllerError::LastInSyncReplica {
                    volume: r.name.clone(),
                    replica: replica.into(),
                });
            }
            let gone = r.replicas.remove(i);
            r.retired.push(gone);
            if r.state == VolumeState::Attached {
                r.epoch += 1;
            }
            Ok(())
        })
        .await?;
    tracing::warn!(volume = %v.name, replica, epoch = rec.epoch, "replica moved off its node: retired");
    st.events.normal(
        &v.name,
        "ReplicaRetired",
        format!("replica {replica} retired: its replacement is in sync"),
    );
    swap_engine(st, &rec, nodes).await;
    Ok(())
}

/// Deletes a retired replica on its node, then forgets it.
async fn delete_retired(
    st: &AppState,
    v: &VolumeRecord,
    nodes: &[NodeRecord],
    replica: &str,
) -> Result<(), ControllerError> {
    let Some(r) = v.retired.iter().find(|r| r.id == replica) else {
        return Ok(());
    };
    if let Ok(node) = find_node(nodes, &r.node) {
        st.agents
            .delete_replica(node.agent(), replica)
            .await
            .map_err(|source| ControllerError::Agent {
                node: node.name.clone(),
                op: format!("delete retired replica {replica}"),
                source,
            })?;
    }
    st.records
        .update_volume(&v.name, |rec| {
            rec.retired.retain(|x| x.id != replica);
            // Its snapshot copies went with it.
            for s in &mut rec.snapshots {
                s.replicas.retain(|x| x != replica);
            }
            Ok(())
        })
        .await?;
    tracing::info!(volume = %v.name, replica, node = %r.node, "retired replica deleted");
    Ok(())
}

/// After a membership change of an attached volume: start the engine of the new epoch where
/// it is attached (the agent swaps it in). A failure is retried by the engine check.
async fn swap_engine(st: &AppState, rec: &VolumeRecord, nodes: &[NodeRecord]) {
    if rec.state != VolumeState::Attached {
        return;
    }
    let Some(node) = rec
        .attached_node
        .as_deref()
        .and_then(|n| find_node(nodes, n).ok())
    else {
        return;
    };
    match ensure_engine(st, rec, node, nodes).await {
        Ok(()) => tracing::info!(volume = %rec.name, epoch = rec.epoch, "engine swapped"),
        Err(e) => tracing::warn!(
            volume = %rec.name, epoch = rec.epoch, error = %e,
            "engine swap failed; the engine check retries it"
        ),
    }
}

/// Starts an engine (not exported) on `node` that syncs the blank replicas of a detached
/// volume, in a new epoch: attaching later raises it again and fences this one.
async fn start_sync(
    st: &AppState,
    v: &VolumeRecord,
    nodes: &[NodeRecord],
    node: &str,
) -> Result<(), ControllerError> {
    let epoch = v.epoch;
    let (rec, ()) = st
        .records
        .update_volume(&v.name, |r| {
            if r.epoch != epoch || r.state != VolumeState::Detached || r.sync_node.is_some() {
                return Err(changed(r));
            }
            r.epoch += 1;
            r.sync_node = Some(node.to_string());
            Ok(())
        })
        .await?;
    let n = find_node(nodes, node)?;
    ensure_engine(st, &rec, n, nodes).await?;
    tracing::warn!(volume = %v.name, node, epoch = rec.epoch, "detached volume: syncing its new replicas");
    Ok(())
}

/// Stops a detached volume's sync engine and forgets it. An agent that does not answer
/// blocks this unless its node is offline (the next epoch fences that engine).
async fn end_sync(st: &AppState, v: &VolumeRecord) -> Result<(), ControllerError> {
    let Some(node) = &v.sync_node else {
        return Ok(());
    };
    stop_engine(st, &v.name, node).await?;
    st.records
        .update_volume(&v.name, |r| {
            if r.state == VolumeState::Detached && r.sync_node.as_deref() == Some(node) {
                r.sync_node = None;
            }
            Ok(())
        })
        .await?;
    tracing::info!(volume = %v.name, node = %node, "detached volume: sync engine stopped");
    Ok(())
}

/// The record changed since the plan (another action, an attach or detach): try next round.
fn changed(r: &VolumeRecord) -> ControllerError {
    ControllerError::Busy {
        volume: r.name.clone(),
        state: r.state,
    }
}
