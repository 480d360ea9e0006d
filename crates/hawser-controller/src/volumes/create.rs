//! Creating a volume: validate, place, record it as Creating, create the replicas on their
//! agents, mark it Detached. Any failure undoes everything, so a failed create leaves neither
//! a record nor a replica behind (best effort for replicas on agents that stop answering).

use std::collections::BTreeMap;

use hawser_api::agent::{CreateReplica, SnapshotRef};
use hawser_api::backup::BackupSchedule;
use hawser_api::controller::{CreateVolume, Replica, ReplicaState, VolumePlacement, VolumeState};
use hawser_api::size::check_volume_size;
use hawser_api::validate_name;

use crate::constants::{MAX_REPLICAS, MAX_UNANSWERED_NODES};
use crate::errors::ControllerError;
use crate::healing::placement::{replica_id, rules, Request};
use crate::healing::reservations::Reservations;
use crate::state::AppState;
use crate::store::model::{NodeRecord, VolumeRecord};
use crate::volumes::keys::Keks;
use crate::volumes::keys::WrappedKey;

pub async fn create_volume(
    st: &std::sync::Arc<AppState>,
    mut req: CreateVolume,
) -> Result<VolumeRecord, ControllerError> {
    // From a backup, or a standby of one's volume: the manifest says the size and whether
    // it is encrypted.
    let sources = [
        req.from.is_some(),
        req.from_backup.is_some(),
        req.standby_of.is_some(),
    ];
    if sources.iter().filter(|s| **s).count() > 1 {
        return Err(ControllerError::invalid(
            "a volume comes from one of a clone's source, a backup or a standby's volume",
        ));
    }
    let restore = match (req.from_backup.clone(), req.standby_of.clone()) {
        (Some(from), _) => Some(crate::snapshots::restores::resolve(st, &mut req, &from).await?),
        (_, Some(of)) => Some(crate::snapshots::standby::resolve(st, &mut req, &of).await?),
        (None, None) => None,
    };
    validate(&req)?;
    let schedules = crate::snapshots::schedules::initial(st, &req).await?;
    let _guard = st.volume_locks.lock(&req.name).await;
    if st.records.volume(&req.name).await?.is_some() {
        return Err(ControllerError::VolumeExists { volume: req.name });
    }
    let nodes = st.records.nodes().await?;
    if let Some(node) = &req.prefer_node {
        if !nodes.iter().any(|n| n.name == *node) {
            return Err(ControllerError::invalid(format!(
                "prefer_node {node:?} is not a registered node"
            )));
        }
    }
    // Evacuating nodes take no new replicas.
    let settings = st.records.node_settings().await?;
    let usable: Vec<NodeRecord> = nodes
        .iter()
        .filter(|n| !settings.get(&n.name).is_some_and(|s| s.evacuate))
        .cloned()
        .collect();
    // A node whose agent just died still counts as online until its heartbeat times out
    // (seconds), and placement may pick it. Its create cannot connect; the attempt
    // is rolled back and the volume placed again without that node, so `volume create` works
    // while any other placement does. When none does, the agent's error is the one to show.
    let source = match &req.from {
        Some(from) => Some(crate::volumes::clone::resolve(st, &req, from).await?),
        None => None,
    };
    let key = match &restore {
        Some(r) => crate::snapshots::restores::data_key(st, &req.name, r).await,
        None => data_key(&st.keks, &req, source.as_ref()).await,
    };
    let encryption = match key {
        Ok(k) => k,
        Err(e) => {
            if let Some(s) = &source {
                crate::volumes::clone::finish(st, s).await;
            }
            return Err(e);
        }
    };
    let created = place_and_create(
        st,
        &req,
        &nodes,
        usable,
        source.as_ref(),
        &encryption,
        &schedules,
    )
    .await;
    if let Some(s) = &source {
        crate::volumes::clone::finish(st, s).await;
    }
    match (created, restore) {
        (Ok(v), Some(r)) if req.standby_of.is_some() => {
            crate::snapshots::standby::start(st, &v, r).await
        }
        (Ok(v), Some(r)) => crate::snapshots::restores::start(st, &v, r).await,
        (created, _) => created,
    }
}

/// The new volume's wrapped data key: a clone of an encrypted volume gets its source's key
/// (re-wrapped for its own name), an encrypted volume a new one, any other none. A clone of
/// a plain volume cannot be encrypted: its data would be plaintext under a key.
async fn data_key(
    keks: &Keks,
    req: &CreateVolume,
    source: Option<&crate::volumes::clone::CloneSource>,
) -> Result<Option<WrappedKey>, ControllerError> {
    let keys = |e: crate::volumes::keys::KeyError| ControllerError::invalid(e.to_string());
    let encrypted = req.encrypted || source.is_some_and(|s| s.encryption.is_some());
    if encrypted {
        keks.ready().await.map_err(keys)?;
    }
    match source.map(|s| &s.encryption) {
        Some(Some((from, wrapped))) => {
            keks.fetch(wrapped.kek).await.map_err(keys)?;
            let key = keks.unwrap(from, wrapped).map_err(keys)?;
            Ok(Some(keks.wrap(&req.name, &key).map_err(keys)?))
        }
        Some(None) if req.encrypted => Err(ControllerError::invalid(
            "a clone of an unencrypted snapshot or volume cannot be encrypted: its data \
             starts as the source's plaintext",
        )),
        Some(None) => Ok(None),
        None if req.encrypted => Ok(Some(keks.new_data_key(&req.name).map_err(keys)?.1)),
        None => Ok(None),
    }
}

async fn place_and_create(
    st: &AppState,
    req: &CreateVolume,
    nodes: &[NodeRecord],
    mut usable: Vec<NodeRecord>,
    source: Option<&crate::volumes::clone::CloneSource>,
    encryption: &Option<WrappedKey>,
    schedules: &[BackupSchedule],
) -> Result<VolumeRecord, ControllerError> {
    let mut unanswered: Option<ControllerError> = None;
    for _ in 0..=MAX_UNANSWERED_NODES {
        let placed = match source {
            Some(s) => crate::volumes::clone::place(st, req, &usable, s),
            None => place(st, req, &usable).map(|(r, p)| (r, p, BTreeMap::new())),
        };
        let (replicas, placement, seeds) = match placed {
            Ok(placed) => placed,
            Err(e) => return Err(unanswered.unwrap_or(e)),
        };
        let placed = Placed {
            replicas,
            placement,
            seeds,
        };
        match create_placed(st, req, placed, nodes, encryption, schedules).await {
            Err(ControllerError::Agent { node, op, source }) if source.never_sent() => {
                tracing::warn!(
                    volume = %req.name, node = %node, error = %source,
                    "agent did not answer; placing the volume again without its node"
                );
                usable.retain(|n| n.name != node);
                unanswered = Some(ControllerError::Agent { node, op, source });
            }
            result => return result,
        }
    }
    Err(unanswered.expect("the loop only continues after an unanswered create"))
}

/// Where a volume's replicas go: each replica's pool, the volume's rules, and a clone's
/// seed snapshot on each node.
struct Placed {
    replicas: Vec<Replica>,
    placement: VolumePlacement,
    seeds: BTreeMap<String, SnapshotRef>,
}

/// Records the volume as Creating with the placed replicas, creates them, marks it Detached;
/// any failure rolls all of it back.
async fn create_placed(
    st: &AppState,
    req: &CreateVolume,
    placed: Placed,
    nodes: &[NodeRecord],
    encryption: &Option<WrappedKey>,
    schedules: &[BackupSchedule],
) -> Result<VolumeRecord, ControllerError> {
    let Placed {
        replicas,
        placement,
        seeds,
    } = placed;
    let record = VolumeRecord {
        thin: req.thin,
        state: VolumeState::Creating,
        replicas,
        placement,
        on_quorum_loss: req.on_quorum_loss,
        origin: req.from.clone(),
        backup_schedules: schedules.to_vec(),
        qos: req.qos,
        encryption: encryption.clone(),
        checksums: req.wants_checksums(),
        uid: Some(crate::store::model::new_volume_uid()),
        ..VolumeRecord::new(&req.name, req.size_bytes, req.replicas)
    };
    // Recorded before any agent call, so a controller crash mid-create leaves a Creating
    // volume listing every replica it may have made, which the next leader rolls back
    // (`cluster/reconcile.rs`, which also relies on this order to delete orphan replicas safely).
    if let Err(e) = st.records.create_volume(&record).await {
        release_all(&st.reservations, &record);
        return Err(e);
    }
    let mut attempted = Vec::new();
    let result = create_replicas(st, &record, nodes, &seeds, &mut attempted).await;
    let result = match result {
        Ok(()) => mark_detached(st, &record.name).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(created) => {
            tracing::info!(volume = %created.name, size = created.size_bytes, "volume created");
            let from = req
                .from
                .as_ref()
                .and_then(|f| f.snapshot.as_ref().or(f.volume.as_ref()))
                .map_or(String::new(), |s| format!(", a clone of {s}"));
            let msg = format!(
                "created: {} bytes, {} replica(s){from}",
                created.size_bytes, created.replica_count
            );
            st.events
                .keep(Some(&created.name), None, false, "Created", &msg);
            if !created.backup_schedules.is_empty() {
                st.backups.schedule_wake.notify_one();
            }
            Ok(created)
        }
        Err(e) => {
            tracing::warn!(volume = %record.name, error = %e, "create failed; rolling back");
            rollback(st, &record, nodes, &attempted).await;
            Err(e)
        }
    }
}

fn validate(req: &CreateVolume) -> Result<(), ControllerError> {
    validate_name("volume", &req.name)?;
    if let Some(pool) = &req.pool {
        validate_name("pool", pool)?;
    }
    if let Some(node) = &req.prefer_node {
        validate_name("node", node)?;
    }
    check_volume_size(req.size_bytes).map_err(|e| ControllerError::invalid(e.to_string()))?;
    if req.replicas == 0 || req.replicas > MAX_REPLICAS {
        return Err(ControllerError::invalid(format!(
            "replicas must be between 1 and {MAX_REPLICAS}, got {}",
            req.replicas
        )));
    }
    req.qos
        .validate()
        .map_err(|e| ControllerError::invalid(e.message))?;
    Ok(())
}

/// Chooses and reserves the replicas' pools. Returns the replicas and the volume's rules,
/// with the zone spread resolved so later placements of this volume follow the same rules
/// whatever labels appear meanwhile.
fn place(
    st: &AppState,
    req: &CreateVolume,
    nodes: &[NodeRecord],
) -> Result<(Vec<Replica>, VolumePlacement), ControllerError> {
    let candidates = st.candidates(nodes);
    let rules = rules(req, &candidates);
    let ids: Vec<String> = (0..req.replicas)
        .map(|n| replica_id(&req.name, n))
        .collect();
    let request = Request {
        size_bytes: req.size_bytes,
        thin: req.thin,
        count: ids.len(),
        rules: rules.clone(),
    };
    let placed = st
        .reservations
        .place_and_reserve(candidates, &request, &ids)?;
    for note in &placed.notes {
        tracing::info!(volume = %req.name, "placement: {note}");
    }
    let replicas = ids
        .into_iter()
        .zip(placed.replicas)
        .map(|(id, p)| Replica {
            id,
            node: p.node,
            pool: p.pool,
            state: ReplicaState::InSync,
            blank: false,
            engine: None,
        })
        .collect();
    Ok((replicas, rules))
}

async fn create_replicas(
    st: &AppState,
    record: &VolumeRecord,
    nodes: &[NodeRecord],
    seeds: &BTreeMap<String, SnapshotRef>,
    attempted: &mut Vec<String>,
) -> Result<(), ControllerError> {
    let cluster = crate::cluster::identity(st).await?.id;
    for r in &record.replicas {
        let node = find_node(nodes, &r.node)?;
        let req = CreateReplica {
            replica_id: r.id.clone(),
            volume: record.name.clone(),
            size_bytes: record.size_bytes,
            pool: r.pool.clone(),
            thin: record.thin,
            cluster_id: Some(cluster.clone()),
            from: seeds.get(&r.id).cloned(),
            key_check: record.encryption.as_ref().map(|w| w.check),
            checksums: record.checksums,
            wrapped_key: record.encryption.clone(),
            volume_uid: record.uid.clone(),
        };
        if let Err(source) = st.agents.create_replica(node.agent(), &req).await {
            // A create that timed out or got an error answer may still have happened on the
            // agent, so roll it back too; one whose connection failed certainly did not.
            if !source.never_sent() {
                attempted.push(r.id.clone());
            }
            let op = format!("create replica {}", r.id);
            return Err(ControllerError::Agent {
                node: r.node.clone(),
                op,
                source,
            });
        }
        attempted.push(r.id.clone());
        st.reservations.created(&r.id);
        tracing::debug!(volume = %record.name, replica = %r.id, node = %r.node, "replica created");
    }
    Ok(())
}

async fn mark_detached(st: &AppState, name: &str) -> Result<VolumeRecord, ControllerError> {
    let (rec, ()) = st
        .records
        .update_volume(name, |v| {
            if v.state != VolumeState::Creating {
                return Err(ControllerError::Busy {
                    volume: v.name.clone(),
                    state: v.state,
                });
            }
            v.state = VolumeState::Detached;
            Ok(())
        })
        .await?;
    Ok(rec)
}

async fn rollback(
    st: &AppState,
    record: &VolumeRecord,
    nodes: &[NodeRecord],
    attempted: &[String],
) {
    for r in record.replicas.iter().filter(|r| attempted.contains(&r.id)) {
        let Ok(node) = find_node(nodes, &r.node) else {
            continue;
        };
        if let Err(e) = st.agents.delete_replica(node.agent(), &r.id).await {
            tracing::warn!(
                volume = %record.name, replica = %r.id, node = %r.node, error = %e,
                "could not delete replica of failed create; it is orphaned on the node"
            );
        }
    }
    release_all(&st.reservations, record);
    // Only this create's record (its replica ids carry random tags): a record that another
    // leader replaced while this one was cut off from the store is not ours to delete.
    let ours = |v: &VolumeRecord| same_replicas(v, record);
    if let Err(e) = st.records.delete_volume_if(&record.name, ours).await {
        tracing::error!(
            volume = %record.name, error = %e,
            "could not delete the record of a failed create; `volume delete` removes it"
        );
    }
}

/// Whether two records of a volume list the same replicas (by id, in order).
pub(crate) fn same_replicas(a: &VolumeRecord, b: &VolumeRecord) -> bool {
    a.replicas.len() == b.replicas.len()
        && a.replicas
            .iter()
            .zip(&b.replicas)
            .all(|(x, y)| x.id == y.id)
}

fn release_all(reservations: &Reservations, record: &VolumeRecord) {
    for r in &record.replicas {
        reservations.release(&r.id);
    }
}

pub fn find_node<'a>(
    nodes: &'a [NodeRecord],
    name: &str,
) -> Result<&'a NodeRecord, ControllerError> {
    nodes
        .iter()
        .find(|n| n.name == name)
        .ok_or_else(|| ControllerError::NodeNotFound { node: name.into() })
}
