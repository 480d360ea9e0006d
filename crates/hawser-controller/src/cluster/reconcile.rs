//! The leader repairs what interrupted operations left behind: on becoming leader, and every
//! [`RECONCILE_INTERVAL`] while it leads, it
//! 1. rolls back volumes left `Creating` and finishes volumes left `Deleting` (a controller
//!    died, was deposed, or lost the store mid-operation), and
//! 2. deletes replicas that agents hold but no volume record references (orphans: a failed
//!    create's rollback could not reach the agent, or a deposed leader's call landed late),
//! 3. records as `Failed` the replicas of detached volumes that their agent reports failed
//!    (it could not load them: corrupt metadata, a data file of the wrong size), so that
//!    self-healing rebuilds them elsewhere. Only while another replica is in sync: the last
//!    one stays as it is for an operator to look at, and an attached volume's engine outdates
//!    a replica it cannot reach by itself.
//!
//! Why deleting an unreferenced replica is safe. Every replica comes from a create, and a
//! create records the volume, with every replica id it will use, *before* its first agent
//! call (`volumes/create.rs`); ids carry a random tag, so no later record reuses one. A round
//! lists the agents' replicas first and reads the records second, so a replica seen on an
//! agent had its record written before that listing; if the later read has no record naming
//! it, the record was deleted (rolled back, or the volume deleted) and nothing can name the
//! replica again. A deposed leader cannot change that: its record writes are fenced (refused
//! by etcd), and its only late agent calls are creates of replicas its own, now unrecorded,
//! create listed (orphans the next round deletes) and deletes of replicas of records being
//! removed anyway (a rollback of its own create, or a delete already marked `Deleting`).
//!
//! An agent is asked for its list with the tag of the list it gave last (`If-None-Match`),
//! and answers "unchanged" when its list now is that one: the round then uses the list it
//! kept, which the agent has just confirmed, so the order above holds as if it had been sent
//! again (`hawser-agent/src/control/held.rs`).
//!
//! The round finds its candidates in the watch-fed copy of the records
//! (`store/volume_cache.rs`), which may lag the store; when it finds an unreferenced
//! replica, it lists the store itself, after the agents, and trashes only what that list
//! does not name either.
//!
//! A store that adopted another cluster's nodes (`hawser cluster recover`, after the store
//! was lost) breaks the first premise: the nodes' replicas were created under records this
//! store never had. So from the adoption until a recovery has rebuilt the records, the
//! cluster record says `recovering` and no round trashes anything. A round reads that flag
//! after the node records and before the volume records. The adoption sets it before any
//! adopted node can register, so a round that lists an adopted node sees it set; the
//! recovery clears it after writing the rebuilt records, so a round that sees it clear reads
//! those records.
//!
//! Why rolling back `Creating` is safe. This leader's own creates hold the volume's lock
//! from before the record is written until it is `Detached` or gone, and the round takes the
//! same lock and re-reads: a volume still `Creating` then belongs to no running operation of
//! this controller. One of a deposed leader can no longer finish (its `Detached` write is
//! fenced); rolling it back is what that create would have done on failure.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use hawser_api::agent::HeldReplica;
use hawser_api::controller::{ReplicaState, SnapshotState, VolumeState};
use tokio::time::Instant;

use crate::cluster::agent_client::AgentClient;
use crate::cluster::agent_client::HeldAnswer;
use crate::constants::{ELECTION_TICK, RECONCILE_INTERVAL};
use crate::state::AppState;
use crate::store::leader::Role;
use crate::store::model::{NodeRecord, VolumeRecord};
use crate::volumes::delete::delete_locked;

/// Runs until the task is aborted: a round at once whenever this controller starts a new
/// term as leader, then every [`RECONCILE_INTERVAL`].
pub async fn run(st: Arc<AppState>) {
    let mut seen = Seen::default();
    let mut tick = tokio::time::interval(ELECTION_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<(Role, Instant)> = None;
    loop {
        tick.tick().await;
        let role = st.leadership.role();
        if matches!(role, Role::Follower { .. }) {
            last = None;
            continue;
        }
        let due = match &last {
            Some((term, at)) => *term != role || at.elapsed() >= RECONCILE_INTERVAL,
            None => true,
        };
        if due {
            round(&st, &mut seen).await;
            last = Some((role, Instant::now()));
        }
    }
}

/// One round; errors are logged and the next round tries again.
async fn round(st: &AppState, seen: &mut Seen) {
    let nodes = match st.records.nodes().await {
        Ok(n) => n,
        Err(e) => return tracing::warn!(error = %e, "reconcile: cannot read the nodes"),
    };
    // After the nodes and before the volumes (see the module doc).
    let may_trash = match super::recovering(&st.records).await {
        Ok(false) => true,
        Ok(true) => {
            tracing::info!(
                "reconcile: an adopted cluster's recovery is unfinished; no replica is an \
                 orphan until `hawser cluster recover` has rebuilt the volumes"
            );
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "reconcile: cannot read the cluster record");
            false
        }
    };
    // Agents first, records second (see the module doc).
    let lists = replicas_on_agents(&st.agents, &nodes, seen).await;
    let held: Vec<Held> = lists
        .iter()
        .flat_map(|(node, list)| {
            let node: &NodeRecord = node;
            list.iter().map(move |replica| Held { node, replica })
        })
        .collect();
    // The watch-fed copy finds the candidates; nothing is trashed on its word (below).
    let volumes = match st.records.volumes_seen().await {
        Ok(v) => v,
        Err(e) => return tracing::warn!(error = %e, "reconcile: cannot read the volumes"),
    };
    if may_trash && !unreferenced(&held, &volumes).is_empty() {
        // The copy may lag the store: the orphans are those no record names in a list read
        // after the agents' (see the module doc).
        match st.records.volumes_listed().await {
            Ok(fresh) => {
                for held in unreferenced(&held, &fresh) {
                    delete_orphan(st, held).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "reconcile: cannot read the volumes"),
        }
    }
    for held in held.iter().filter(|h| h.replica.failed) {
        if let Some(v) = volumes
            .iter()
            .find(|v| v.replicas.iter().any(|r| r.id == held.replica.replica_id))
        {
            record_failed(st, &v.name, held).await;
        }
    }
    for v in volumes.iter() {
        if matches!(v.state, VolumeState::Creating | VolumeState::Deleting) {
            finish(st, &v.name).await;
        } else if v
            .snapshots
            .iter()
            .any(|s| s.state == SnapshotState::Deleting)
            && all_online(st, v, &nodes)
        {
            discard_again(st, &v.name).await;
        }
    }
}

/// Whether every node holding a replica of `v` (retired ones too) is online: a discard asks
/// them all, and one that is down would only fail it again, after its timeout.
fn all_online(st: &AppState, v: &VolumeRecord, nodes: &[NodeRecord]) -> bool {
    v.replicas.iter().chain(&v.retired).all(|r| {
        nodes
            .iter()
            .find(|n| n.name == r.node)
            .is_none_or(|n| st.is_online(n))
    })
}

/// Discards again the snapshots of `name` left `Deleting` (a node that did not answer when
/// a delete, or a backup's end, discarded them): their copies hold space on the replicas'
/// nodes, and a volume with snapshots is not deleted without `--with-snapshots`. Under the
/// volume's lock, on the record as it is then; a discard already running elsewhere does the
/// same deletes, which are idempotent.
async fn discard_again(st: &AppState, name: &str) {
    let _guard = st.volume_locks.lock(name).await;
    let v = match st.records.volume(name).await {
        Ok(Some(v)) => v,
        Ok(None) => return,
        Err(e) => return tracing::warn!(volume = name, error = %e, "reconcile: cannot read"),
    };
    for s in v
        .snapshots
        .iter()
        .filter(|s| s.state == SnapshotState::Deleting)
    {
        match crate::snapshots::create::discard(st, &v, s).await {
            Ok(()) => {
                tracing::info!(volume = name, snapshot = %s.name, "a snapshot left deleting is gone")
            }
            Err(e) => {
                tracing::warn!(volume = name, snapshot = %s.name, error = %e, "a snapshot left deleting: will try again")
            }
        }
    }
}

/// The replicas in `held` that no record in `volumes` names, as a replica or a retired one.
fn unreferenced<'h, 'n>(held: &'h [Held<'n>], volumes: &[VolumeRecord]) -> Vec<&'h Held<'n>> {
    let referenced: BTreeSet<&str> = volumes
        .iter()
        .flat_map(|v| v.replicas.iter().chain(&v.retired).map(|r| r.id.as_str()))
        .collect();
    held.iter()
        .filter(|h| !referenced.contains(h.replica.replica_id.as_str()))
        .collect()
}

/// A replica an agent reported: its id, the volume the agent says it belongs to, and
/// whether the agent cannot serve it.
struct Held<'a> {
    node: &'a NodeRecord,
    replica: &'a HeldReplica,
}

/// Rule 3 of the module doc, under the volume's lock.
async fn record_failed(st: &AppState, volume: &str, held: &Held<'_>) {
    let _guard = st.volume_locks.lock(volume).await;
    let id = held.replica.replica_id.as_str();
    let changed = st
        .records
        .update_volume(volume, |v| {
            let others_in_sync = v.in_sync().filter(|r| r.id != id).count();
            if v.state != VolumeState::Detached || others_in_sync == 0 {
                return Ok(false);
            }
            match v
                .replicas
                .iter_mut()
                .find(|r| r.id == id && r.node == held.node.name)
            {
                Some(r) if r.state != ReplicaState::Failed => {
                    r.state = ReplicaState::Failed;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
        .await;
    match changed {
        Ok((_, true)) => tracing::warn!(
            volume, replica = id, node = %held.node.name,
            "the agent reports the replica failed; recorded, self-healing replaces it"
        ),
        Ok((_, false)) => {}
        Err(e) => {
            tracing::warn!(volume, replica = id, error = %e, "cannot record a failed replica")
        }
    }
}

/// Deletes an unreferenced replica, under its volume's lock and after a fresh read of that
/// volume: an operation of this controller that creates a replica on an agent before it
/// records it (as a membership change may) holds that lock throughout, so the replica is
/// either recorded or rolled back by the time the lock is free.
async fn delete_orphan(st: &AppState, held: &Held<'_>) {
    let (node, replica) = (&held.node.name, held.replica.replica_id.as_str());
    let volume = held.replica.volume.as_str();
    let _guard = st.volume_locks.lock(volume).await;
    match st.records.volume(volume).await {
        // Retired replicas are self-healing's to delete (when their node answers).
        Ok(Some(v)) if v.replicas.iter().chain(&v.retired).any(|r| r.id == replica) => return,
        Ok(_) => {}
        Err(e) => return tracing::warn!(replica, error = %e, "reconcile: cannot read"),
    }
    match st.agents.trash_replica(held.node.agent(), replica).await {
        Ok(()) => tracing::warn!(%node, replica, "moved an orphan replica to its pool's trash"),
        Err(e) => tracing::warn!(%node, replica, error = %e, "cannot trash an orphan yet"),
    }
}

/// What each node's agent last listed, with the tag it gave the list: the next round asks
/// for the list only if it changed (`AgentClient::held_replicas`).
#[derive(Default)]
struct Seen {
    by_node: HashMap<String, (String, Arc<Vec<HeldReplica>>)>,
}

/// Every replica on every agent that answers, with its node. An agent that answers that
/// its list is the one of the tag `seen` holds has confirmed that list now: as good as
/// sending it again, for the ordering the module doc relies on.
async fn replicas_on_agents<'a>(
    agents: &AgentClient,
    nodes: &'a [NodeRecord],
    seen: &mut Seen,
) -> Vec<(&'a NodeRecord, Arc<Vec<HeldReplica>>)> {
    seen.by_node
        .retain(|name, _| nodes.iter().any(|n| &n.name == name));
    let mut lists = Vec::new();
    for node in nodes {
        let cached = seen.by_node.get(&node.name);
        let tag = cached.map(|(tag, _)| tag.as_str());
        let answer = tokio::time::timeout(STATUS_TIMEOUT, agents.held_replicas(node.agent(), tag));
        match answer.await {
            Ok(Ok(HeldAnswer::Unchanged)) => match cached {
                Some((_, list)) => lists.push((node, list.clone())),
                // Not asked with a tag: an agent that says "unchanged" anyway is wrong.
                None => {
                    tracing::warn!(node = %node.name, "reconcile: an untagged list came back unchanged")
                }
            },
            Ok(Ok(HeldAnswer::Listed { tag, replicas })) => {
                let list = Arc::new(replicas);
                match tag {
                    Some(tag) => {
                        seen.by_node.insert(node.name.clone(), (tag, list.clone()));
                    }
                    None => {
                        seen.by_node.remove(&node.name);
                    }
                }
                lists.push((node, list));
            }
            // An agent that does not answer keeps its orphans until a later round.
            _ => tracing::debug!(node = %node.name, "reconcile: agent does not answer"),
        }
    }
    lists
}

/// How long a round waits for one agent's replica list.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Rolls back a `Creating` volume or finishes a `Deleting` one, if it still is one once this
/// round holds its lock.
async fn finish(st: &AppState, name: &str) {
    let _guard = st.volume_locks.lock(name).await;
    let state = match st.records.volume(name).await {
        Ok(Some(v)) => v.state,
        Ok(None) => return,
        Err(e) => return tracing::warn!(volume = name, error = %e, "reconcile: cannot read"),
    };
    if !matches!(state, VolumeState::Creating | VolumeState::Deleting) {
        return;
    }
    match delete_locked(st, name).await {
        Ok(()) => tracing::warn!(volume = name, ?state, "interrupted operation cleaned up"),
        Err(e) => tracing::warn!(
            volume = name, ?state, error = %e, "cannot clean up an interrupted operation yet"
        ),
    }
}
