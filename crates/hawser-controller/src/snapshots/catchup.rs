//! Snapshots follow their volume's replicas: a replica that lacks a ready snapshot (it was
//! outdated when the snapshot was taken, or it was built since to replace one) gets a copy
//! from a replica that holds it, so a snapshot survives the loss of a node like the volume
//! does. Only the 64 KiB blocks that differ from the replica's own data cross the network
//! (`hawser-agent` `snapshot_fetch.rs`).
//!
//! Runs beside self-healing, on the leader, one copy at a time: a copy can take long and must
//! not hold up a rebuild. No lock is held while the agent copies; the holder's copy never
//! changes, so the result is the snapshot whatever happens to the volume meanwhile. Only the
//! record is checked afterwards, under the volume's lock: the snapshot must still be ready,
//! or the new copy is deleted (a delete that ran during the copy could not see it).
//!
//! Sources: a replica of the volume that holds the snapshot, else a retired one that does
//! (self-healing keeps a retired replica that holds the only copy of a snapshot until this
//! has copied it, `healing/plan.rs`).

use std::sync::Arc;
use std::time::Duration;

use hawser_api::agent::FetchSnapshot;
use hawser_api::controller::{ReplicaState, SnapshotState};

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::leader::Role;
use crate::store::model::{NodeRecord, VolumeRecord};

/// One copy to make: snapshot (name, id) of `volume` onto `target` from `source`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Catchup {
    pub volume: String,
    pub snapshot: String,
    pub snapshot_id: String,
    pub target: String,
    pub source: String,
}

/// The copies the records ask for: for each ready snapshot, each in-sync replica on an online
/// node that lacks it, from a holder on an online node (a current replica first).
pub fn plan(volumes: &[VolumeRecord], online: impl Fn(&str) -> bool) -> Vec<Catchup> {
    let mut out = Vec::new();
    for v in volumes {
        for s in v
            .snapshots
            .iter()
            .filter(|s| s.state == SnapshotState::Ready)
        {
            let holder = v
                .replicas
                .iter()
                .filter(|r| r.state != ReplicaState::Failed)
                .chain(v.retired.iter())
                .find(|r| s.replicas.contains(&r.id) && online(&r.node));
            let Some(holder) = holder else { continue };
            for r in &v.replicas {
                let lacks = !s.replicas.contains(&r.id);
                if lacks && r.state == ReplicaState::InSync && !r.blank && online(&r.node) {
                    out.push(Catchup {
                        volume: v.name.clone(),
                        snapshot: s.name.clone(),
                        snapshot_id: s.id.clone(),
                        target: r.id.clone(),
                        source: holder.id.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Runs until aborted, every `every` (zero disables it).
pub async fn run(st: Arc<AppState>, every: Duration) {
    if every.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if matches!(st.leadership.role(), Role::Follower { .. }) {
            continue;
        }
        if let Err(e) = round(&st).await {
            tracing::warn!(error = %e, "snapshot catch-up round failed; will retry");
        }
    }
}

/// Makes every copy the plan asks for now, one at a time.
pub async fn round(st: &AppState) -> Result<usize, ControllerError> {
    let volumes = st.records.volumes_seen().await?;
    let nodes = st.records.nodes().await?;
    let online = |name: &str| nodes.iter().any(|n| n.name == name && st.is_online(n));
    let mut done = 0;
    for c in plan(&volumes, online) {
        match copy(st, &volumes, &nodes, &c).await {
            Ok(()) => done += 1,
            Err(e) => tracing::warn!(?c, error = %e, "snapshot copy failed; will retry"),
        }
    }
    Ok(done)
}

async fn copy(
    st: &AppState,
    volumes: &[VolumeRecord],
    nodes: &[NodeRecord],
    c: &Catchup,
) -> Result<(), ControllerError> {
    let v = volumes.iter().find(|v| v.name == c.volume).ok_or_else(|| {
        ControllerError::VolumeNotFound {
            volume: c.volume.clone(),
        }
    })?;
    let replica_node = |id: &str| -> Result<&NodeRecord, ControllerError> {
        let r = v
            .replicas
            .iter()
            .chain(v.retired.iter())
            .find(|r| r.id == id)
            .ok_or_else(|| ControllerError::invalid(format!("replica {id} is gone")))?;
        crate::volumes::create::find_node(nodes, &r.node)
    };
    let (target, source) = (replica_node(&c.target)?, replica_node(&c.source)?);
    let grant = crate::cluster::signer(st)
        .await?
        .snapshot_read_grant(&v.name, &target.name)?;
    let req = FetchSnapshot {
        from_replica: c.source.clone(),
        from_node: source.name.clone(),
        from_addr: source.replica_addr.clone(),
        grant: Some(grant),
    };
    let fetched = st
        .agents
        .fetch_snapshot(target.agent(), &c.target, &c.snapshot_id, &req)
        .await
        .map_err(|e| ControllerError::Agent {
            node: target.name.clone(),
            op: format!(
                "copy snapshot {} to replica {} from {}",
                c.snapshot, c.target, c.source
            ),
            source: e,
        })?;
    let _guard = st.volume_locks.lock(&c.volume).await;
    let kept = st
        .records
        .update_volume(&c.volume, |v| {
            let Some(s) = v
                .snapshots
                .iter_mut()
                .find(|s| s.id == c.snapshot_id && s.state == SnapshotState::Ready)
            else {
                return Ok(false);
            };
            if !s.replicas.contains(&c.target) {
                s.replicas.push(c.target.clone());
            }
            Ok(true)
        })
        .await;
    match kept {
        Ok((_, true)) => {
            tracing::info!(
                volume = %c.volume, snapshot = %c.snapshot, replica = %c.target,
                from = %c.source, micros = fetched.micros, "snapshot copied to a replica that lacked it"
            );
            st.events.keep(
                Some(&c.volume),
                Some(&target.name),
                false,
                "SnapshotCopied",
                &format!(
                    "snapshot {} copied to replica {} (from {})",
                    c.snapshot, c.target, c.source
                ),
            );
            Ok(())
        }
        // Deleted meanwhile (or the volume is gone): the copy goes too.
        Ok((_, false)) | Err(ControllerError::VolumeNotFound { .. }) => {
            let _ = st
                .agents
                .delete_snapshot(target.agent(), &c.target, &c.snapshot_id)
                .await;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::model::SnapshotRecord;
    use hawser_api::controller::Replica;

    fn replica(id: &str, node: &str, state: ReplicaState) -> Replica {
        Replica {
            id: id.into(),
            node: node.into(),
            pool: "default".into(),
            state,
            blank: false,
            engine: None,
        }
    }

    fn snapshot(name: &str, holders: &[&str], state: SnapshotState) -> SnapshotRecord {
        SnapshotRecord {
            name: name.into(),
            id: format!("{name}-000001"),
            size_bytes: 1 << 20,
            created_ms: 1,
            state,
            replicas: holders.iter().map(|h| h.to_string()).collect(),
            pause_micros: None,
            how: None,
        }
    }

    #[test]
    fn in_sync_replicas_that_lack_a_ready_snapshot_get_it_from_an_online_holder() {
        let mut v = VolumeRecord {
            epoch: 1,
            ..VolumeRecord::new("v", 1048576, 3)
        };
        v.replicas = vec![
            replica("a", "n1", ReplicaState::InSync),
            replica("b", "n2", ReplicaState::InSync),
            replica("c", "n3", ReplicaState::Outdated),
            replica("d", "n4", ReplicaState::InSync),
        ];
        v.retired = vec![replica("old", "n5", ReplicaState::InSync)];
        v.snapshots = vec![
            snapshot("s1", &["a"], SnapshotState::Ready),
            snapshot("s2", &["old"], SnapshotState::Ready),
            snapshot("s3", &["a"], SnapshotState::Creating),
        ];
        let online = |n: &str| n != "n4";
        let got: Vec<(String, String, String)> = plan(std::slice::from_ref(&v), online)
            .into_iter()
            .map(|c| (c.snapshot, c.target, c.source))
            .collect();
        let want: Vec<(String, String, String)> =
            [("s1", "b", "a"), ("s2", "a", "old"), ("s2", "b", "old")]
                .iter()
                .map(|(s, t, f)| (s.to_string(), t.to_string(), f.to_string()))
                .collect();
        // c is outdated, d's node is offline, s3 is not ready.
        assert_eq!(got, want);
        // A holder whose node is offline is no source.
        let none = plan(std::slice::from_ref(&v), |n: &str| n != "n1" && n != "n5");
        assert!(none.is_empty(), "{none:?}");
    }
}
