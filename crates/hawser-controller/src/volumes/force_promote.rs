//! Forcing a stuck volume up (DRBD's `--force primary`). Crash recovery refuses to start an
//! engine when no reachable replica is sure to hold every acknowledged write while an in-sync
//! replica cannot be reached: that one may hold them, and copying over it later would lose
//! them for good. If that replica's node never comes back (and self-healing cannot replace it
//! yet), the operator may accept the loss: every in-sync replica but the kept ones becomes
//! outdated, as blank (it is copied in full when it returns, whatever journals say of it),
//! in one compare-and-swap that also raises the epoch. The next attach then recovers from the
//! kept replicas, each chunk from the one most likely to hold it.

use hawser_api::controller::{ForcePromote, ReplicaState};

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::VolumeRecord;
use crate::volumes::expand::check_unused;

/// Outdates the in-sync replicas of detached volume `name` that `req` does not keep.
pub async fn force_promote(
    st: &AppState,
    name: &str,
    req: ForcePromote,
) -> Result<VolumeRecord, ControllerError> {
    if !req.accept_data_loss {
        return Err(ControllerError::invalid(
            "force-promote outdates the in-sync replicas it does not keep: acknowledged \
             writes only they hold are lost. Set accept_data_loss (hawser volume force-promote \
             --accept-data-loss) to do it",
        ));
    }
    let _guard = st.volume_locks.lock(name).await;
    let current = st.records.existing_volume(name).await?;
    let nodes = st.records.nodes().await?;
    let online = |node: &str| {
        nodes
            .iter()
            .find(|n| n.name == node)
            .is_some_and(|n| st.is_online(n))
    };
    let keep: Vec<String> = match &req.replica {
        Some(id) => vec![id.clone()],
        None => current
            .in_sync()
            .filter(|r| online(&r.node))
            .map(|r| r.id.clone())
            .collect(),
    };
    let (rec, demoted) = st.records.update_volume(name, |v| plan(v, &keep)).await?;
    tracing::warn!(volume = %name, ?keep, ?demoted, epoch = rec.epoch, "volume force-promoted");
    st.events.warning(
        name,
        "ForcePromoted",
        format!(
            "forced up from {} at epoch {}; outdated as blank: {} (acknowledged writes only they held are lost)",
            keep.join(", "),
            rec.epoch,
            demoted.join(", ")
        ),
    );
    Ok(rec)
}

/// The change to the record: every in-sync replica not in `keep` outdated and blank, the
/// epoch raised. Returns the replicas outdated.
fn plan(v: &mut VolumeRecord, keep: &[String]) -> Result<Vec<String>, ControllerError> {
    check_unused(
        v,
        "; detach it first (an attach that recovery refused leaves it detached)",
    )?;
    if keep.is_empty() {
        return Err(ControllerError::invalid(format!(
            "no in-sync replica of {} is on an online node: nothing to promote",
            v.name
        )));
    }
    for id in keep {
        match v.replicas.iter().find(|r| &r.id == id) {
            None => {
                return Err(ControllerError::ReplicaNotFound {
                    volume: v.name.clone(),
                    replica: id.clone(),
                })
            }
            Some(r) if r.state != ReplicaState::InSync => {
                return Err(ControllerError::invalid(format!(
                    "replica {id} of {} is {:?}, not in sync: only an in-sync replica holds \
                     what was acknowledged",
                    v.name, r.state
                )))
            }
            Some(_) => {}
        }
    }
    let mut demoted = Vec::new();
    for r in &mut v.replicas {
        if r.state == ReplicaState::InSync && !keep.contains(&r.id) {
            r.state = ReplicaState::Outdated;
            r.blank = true;
            demoted.push(r.id.clone());
        }
    }
    if demoted.is_empty() {
        return Err(ControllerError::invalid(format!(
            "every in-sync replica of {} is kept: nothing to force (attach it)",
            v.name
        )));
    }
    v.epoch += 1;
    Ok(demoted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_api::controller::{Replica, VolumeState};

    fn volume(states: &[ReplicaState]) -> VolumeRecord {
        VolumeRecord {
            epoch: 7,
            replicas: states
                .iter()
                .enumerate()
                .map(|(i, &state)| Replica {
                    id: format!("r{i}"),
                    node: format!("n{i}"),
                    pool: "default".into(),
                    state,
                    blank: false,
                    engine: None,
                })
                .collect(),
            ..VolumeRecord::new("v", 1 << 20, u32::try_from(states.len()).unwrap_or(3))
        }
    }

    #[test]
    fn outdates_every_other_in_sync_replica_as_blank_and_raises_the_epoch() {
        use ReplicaState::{InSync, Outdated};
        let mut v = volume(&[InSync, InSync, Outdated]);
        let demoted = plan(&mut v, &["r0".into()]).expect("forced");
        assert_eq!(demoted, ["r1"]);
        assert_eq!(v.epoch, 8);
        assert_eq!((v.replicas[1].state, v.replicas[1].blank), (Outdated, true));
        assert_eq!((v.replicas[0].state, v.replicas[0].blank), (InSync, false));
        assert!(
            !v.replicas[2].blank,
            "an outdated replica is left as it was"
        );
    }

    #[test]
    fn refuses_what_would_not_help_or_would_lose_more() {
        use ReplicaState::{InSync, Outdated};
        let mut v = volume(&[InSync, Outdated]);
        assert!(
            plan(&mut v, &["r1".into()]).is_err(),
            "keeping an outdated replica"
        );
        assert!(plan(&mut v, &["r0".into()]).is_err(), "nothing to force");
        assert!(plan(&mut v, &["nope".into()]).is_err());
        assert!(plan(&mut v, &[]).is_err());
        let mut v = volume(&[InSync, InSync]);
        v.state = VolumeState::Attached;
        v.attached_node = Some("n0".into());
        assert!(plan(&mut v, &["r0".into()]).is_err(), "attached");
        assert_eq!(v.epoch, 7);
        assert!(v.replicas.iter().all(|r| r.state == InSync));
    }
}
