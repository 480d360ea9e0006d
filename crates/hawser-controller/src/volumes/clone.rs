//! Clones: a new volume that starts with a snapshot's data (`CreateVolume.from`).
//!
//! Each replica the snapshot is on can seed one of the clone's replicas on the same node, in
//! the same pool: the agent makes the new replica's data file a copy of the snapshot's
//! (`hawser-storage` `clone.rs`: shared extents where the filesystem has reflinks, so the
//! clone is usable at once and takes no space until written). A clone with more replicas
//! than the snapshot has copies gets the rest as blank replicas elsewhere, which the engine
//! syncing a detached volume's new replicas fills (`healing/self_heal.rs`), as it fills a rebuilt
//! replica. The clone is a volume of its own from then on: deleting the snapshot, or its
//! volume, leaves it whole (its files share extents, not names).
//!
//! A clone of a volume takes a snapshot of that volume first (crash-consistent, as any), clones
//! it, and deletes it.

use std::collections::BTreeMap;

use hawser_api::agent::SnapshotRef;
use hawser_api::controller::{
    CreateSnapshot, CreateVolume, Replica, ReplicaState, SnapshotState, VolumePlacement,
    VolumeSource,
};

use crate::errors::ControllerError;
use crate::healing::placement::{replica_id, rules, Request};
use crate::healing::reservations::Reservations;
use crate::snapshots::create::{self, find};
use crate::state::AppState;
use crate::store::model::{NodeRecord, SnapshotRecord};

/// A clone's replicas, its placement rules, and which replica is seeded from which copy.
pub type Placed = (Vec<Replica>, VolumePlacement, BTreeMap<String, SnapshotRef>);

/// Where a clone comes from, resolved.
pub struct CloneSource {
    pub snapshot: SnapshotRecord,
    /// The source volume's name and wrapped data key, when it is encrypted: the clone's data
    /// is its ciphertext, so the clone gets the same key.
    pub encryption: Option<(String, crate::volumes::keys::WrappedKey)>,
    /// The replicas holding a copy: their node and pool.
    pub holders: Vec<Replica>,
    /// A snapshot taken for this clone (of a volume), deleted once the clone exists.
    pub temporary: bool,
}

/// Finds (or, for a volume, takes) the snapshot a clone starts from.
pub async fn resolve(
    st: &AppState,
    req: &CreateVolume,
    from: &VolumeSource,
) -> Result<CloneSource, ControllerError> {
    let (name, temporary) = match (&from.snapshot, &from.volume) {
        (Some(s), None) => (s.clone(), false),
        (None, Some(v)) => {
            hawser_api::validate_name("volume", v)?;
            let tag: u32 = rand::random::<u32>() & 0xff_ffff;
            let mut name = format!("clone-{}", req.name);
            name.truncate(55);
            let name = format!("{}-{tag:06x}", name.trim_end_matches('-'));
            let snap = CreateSnapshot {
                name: name.clone(),
                volume: v.clone(),
            };
            create::create_snapshot(st, snap).await?;
            (name, true)
        }
        _ => {
            return Err(ControllerError::invalid(
                "from: name exactly one of snapshot and volume",
            ))
        }
    };
    hawser_api::validate_name("snapshot", &name)?;
    let volumes = st.records.volumes().await?;
    let (v, s) = find(&volumes, &name).ok_or_else(|| ControllerError::SnapshotNotFound {
        snapshot: name.clone(),
    })?;
    let source = CloneSource {
        snapshot: s.clone(),
        encryption: v.encryption.clone().map(|k| (v.name.clone(), k)),
        holders: v
            .replicas
            .iter()
            .filter(|r| s.replicas.contains(&r.id))
            .cloned()
            .collect(),
        temporary,
    };
    let problem = if s.state != SnapshotState::Ready {
        Some(format!("snapshot {name:?} is not ready"))
    } else if req.size_bytes < s.size_bytes {
        Some(format!(
            "a clone of snapshot {name:?} needs at least its {} bytes, not {}",
            s.size_bytes, req.size_bytes
        ))
    } else if source.holders.is_empty() {
        Some(format!(
            "no replica of volume {:?} holds snapshot {name:?}",
            v.name
        ))
    } else {
        None
    };
    if let Some(p) = problem {
        finish(st, &source).await;
        return Err(ControllerError::invalid(p));
    }
    Ok(source)
}

/// Deletes the snapshot taken for the clone, if there is one (best effort: a failure leaves
/// a snapshot named `clone-...` to delete by hand, and says so).
pub async fn finish(st: &AppState, source: &CloneSource) {
    if !source.temporary {
        return;
    }
    if let Err(e) = create::delete_snapshot(st, &source.snapshot.name).await {
        tracing::warn!(
            snapshot = %source.snapshot.name, error = %e,
            "could not delete the snapshot taken for a clone; delete it by hand"
        );
    }
}

/// The clone's replicas: one on each holder's node and pool while there are replicas to place
/// and holders with room (seeded from the snapshot, in sync), the rest placed as any replica
/// (blank, synced after the create). Returns them, the volume's rules, and which replica is
/// seeded from which copy.
pub fn place(
    st: &AppState,
    req: &CreateVolume,
    nodes: &[NodeRecord],
    source: &CloneSource,
) -> Result<Placed, ControllerError> {
    let candidates = st.candidates(nodes);
    let rules = rules(req, &candidates);
    let request = |count: usize| Request {
        size_bytes: req.size_bytes,
        thin: req.thin,
        count,
        rules: VolumePlacement {
            prefer_node: None,
            ..rules.clone()
        },
    };
    let mut replicas = Vec::new();
    let mut seeds = BTreeMap::new();
    let mut n = 0u32;
    for holder in &source.holders {
        if replicas.len() == req.replicas as usize {
            break;
        }
        // Only the holder's pool (a reflink needs the same filesystem) on the holder's node.
        let only: Vec<_> = candidates
            .iter()
            .filter(|c| c.node == holder.node && c.online)
            .map(|c| {
                let mut c = c.clone();
                c.pools.retain(|p| p.name == holder.pool);
                c
            })
            .filter(|c| !c.pools.is_empty())
            .collect();
        let id = replica_id(&req.name, n);
        let Ok(placed) =
            st.reservations
                .place_and_reserve(only, &request(1), std::slice::from_ref(&id))
        else {
            continue; // offline, or no room there: the replica goes elsewhere, blank
        };
        n += 1;
        seeds.insert(
            id.clone(),
            SnapshotRef {
                replica_id: holder.id.clone(),
                snapshot: source.snapshot.id.clone(),
            },
        );
        replicas.extend(placed.replicas.into_iter().map(|p| Replica {
            id: id.clone(),
            node: p.node,
            pool: p.pool,
            state: ReplicaState::InSync,
            blank: false,
            engine: None,
        }));
    }
    if replicas.is_empty() {
        return Err(ControllerError::invalid(format!(
            "no node holding snapshot {:?} is online with room for the clone",
            source.snapshot.name
        )));
    }
    let rest = req.replicas as usize - replicas.len();
    if rest > 0 {
        let used: Vec<&str> = replicas.iter().map(|r| r.node.as_str()).collect();
        let others: Vec<_> = candidates
            .iter()
            .filter(|c| !used.contains(&c.node.as_str()))
            .cloned()
            .collect();
        let ids: Vec<String> = (0..rest)
            .map(|i| replica_id(&req.name, n + u32::try_from(i).unwrap_or(0)))
            .collect();
        let placed = match st
            .reservations
            .place_and_reserve(others, &request(rest), &ids)
        {
            Ok(p) => p,
            Err(e) => {
                release(&st.reservations, &replicas);
                return Err(e.into());
            }
        };
        replicas.extend(ids.into_iter().zip(placed.replicas).map(|(id, p)| Replica {
            id,
            node: p.node,
            pool: p.pool,
            state: ReplicaState::Outdated,
            blank: true,
            engine: None,
        }));
    }
    Ok((replicas, rules, seeds))
}

fn release(reservations: &Reservations, replicas: &[Replica]) {
    for r in replicas {
        reservations.release(&r.id);
    }
}
