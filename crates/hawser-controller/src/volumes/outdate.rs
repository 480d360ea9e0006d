//! Outdating a replica: an engine that lost a replica removes it from the in-sync set before
//! acknowledging writes without it. This is the safety-critical path.
//!
//! The change is one compare-and-swap on the volume record, conditioned on the engine's
//! epoch being the volume's current one, so:
//! - a fenced engine (an older epoch; the volume was attached again) cannot outdate anything
//!   and must fail its writes instead (`stale_epoch`);
//! - the last in-sync replica is never outdated, so two engines-worth of concurrent reports
//!   about the two replicas of a 2-replica volume cannot both win: the second sees one
//!   in-sync replica left and is refused.
//!
//! It does not take the per-volume lock (see `store/locks.rs`), and it is allowed while the volume
//! is detached in the same epoch: refusing a truthful report about missed writes would let
//! the next attach read from a replica that lacks them.

use hawser_api::controller::{MarkInSync, Outdate, ReplicaState, VolumeState};

use crate::errors::ControllerError;
use crate::state::metrics::ControllerMetrics;
use crate::state::AppState;
use crate::store::model::VolumeRecord;

/// Applies an outdate report to the record. Already outdated (or failed) is a success, so an
/// engine can retry a report whose answer it lost; `failed` turns an outdated replica failed.
pub fn apply_outdate(
    v: &mut VolumeRecord,
    replica: &str,
    epoch: u64,
    failed: bool,
) -> Result<(), ControllerError> {
    check_epoch(v, epoch)?;
    let in_sync = v.in_sync().count();
    if v.retired.iter().any(|r| r.id == replica) {
        // Removed from the volume (replaced or moved off its node) after this engine
        // started: out of the in-sync set already, more so than outdated.
        return Ok(());
    }
    let Some(r) = v.replicas.iter_mut().find(|r| r.id == replica) else {
        return Err(ControllerError::ReplicaNotFound {
            volume: v.name.clone(),
            replica: replica.into(),
        });
    };
    let to = if failed {
        ReplicaState::Failed
    } else {
        ReplicaState::Outdated
    };
    match r.state {
        ReplicaState::InSync => {}
        ReplicaState::Outdated if failed => {
            r.state = to;
            return Ok(());
        }
        ReplicaState::Outdated | ReplicaState::Failed => return Ok(()),
    }
    if in_sync <= 1 {
        return Err(ControllerError::LastInSyncReplica {
            volume: v.name.clone(),
            replica: replica.into(),
        });
    }
    r.state = to;
    Ok(())
}

/// Applies a resync-complete report: an outdated replica becomes in-sync again. Only the
/// engine of the current epoch may do this, and only it knows the replica got every chunk it
/// missed; a failed replica stays failed (a disk that erred is not trusted again without an
/// operator). Already in-sync is a success, so a lost answer can be retried.
pub fn apply_mark_in_sync(
    v: &mut VolumeRecord,
    replica: &str,
    epoch: u64,
) -> Result<(), ControllerError> {
    check_epoch(v, epoch)?;
    let Some(r) = v.replicas.iter_mut().find(|r| r.id == replica) else {
        return Err(ControllerError::ReplicaNotFound {
            volume: v.name.clone(),
            replica: replica.into(),
        });
    };
    match r.state {
        ReplicaState::InSync => Ok(()),
        ReplicaState::Outdated => {
            r.state = ReplicaState::InSync;
            // A blank replica that completed its first resync holds everything now.
            r.blank = false;
            Ok(())
        }
        ReplicaState::Failed => Err(ControllerError::ReplicaFailed {
            volume: v.name.clone(),
            replica: replica.into(),
        }),
    }
}

fn check_epoch(v: &VolumeRecord, epoch: u64) -> Result<(), ControllerError> {
    if matches!(v.state, VolumeState::Creating | VolumeState::Deleting) {
        return Err(ControllerError::Busy {
            volume: v.name.clone(),
            state: v.state,
        });
    }
    if epoch != v.epoch {
        tracing::info!(volume = %v.name, epoch, current = v.epoch, "report of a stale epoch refused");
        return Err(ControllerError::StaleEpoch {
            volume: v.name.clone(),
            epoch,
            current: v.epoch,
        });
    }
    Ok(())
}

/// Counts a report refused for a stale epoch (a fenced engine) in the metrics.
fn count_refusal(metrics: &ControllerMetrics, e: &ControllerError) {
    if matches!(e, ControllerError::StaleEpoch { .. }) {
        metrics.stale_epoch_reports.inc();
    }
}

pub async fn outdate_replica(
    st: &AppState,
    name: &str,
    replica: &str,
    req: Outdate,
) -> Result<VolumeRecord, ControllerError> {
    let (rec, was) = st
        .records
        .update_volume(name, |v| {
            let was = replica_state(v, replica);
            apply_outdate(v, replica, req.epoch, req.failed).map(|()| was)
        })
        .await
        .inspect_err(|e| count_refusal(&st.metrics, e))?;
    tracing::warn!(
        volume = %name, replica, epoch = req.epoch, reason = %req.reason, failed = req.failed,
        "replica outdated"
    );
    if was == Some(ReplicaState::InSync) {
        st.metrics.outdated.inc();
    }
    if req.failed && was != Some(ReplicaState::Failed) {
        st.metrics.failed.inc();
    }
    if was == Some(ReplicaState::InSync) {
        let (reason, what) = if req.failed {
            ("ReplicaFailed", "failed")
        } else {
            ("Degraded", "outdated")
        };
        st.events.warning(
            name,
            reason,
            format!(
                "replica {replica} on node {} {what} at epoch {}: {}; {}",
                replica_node(&rec, replica),
                req.epoch,
                req.reason,
                in_sync_summary(&rec)
            ),
        );
    }
    Ok(rec)
}

pub async fn mark_in_sync(
    st: &AppState,
    name: &str,
    replica: &str,
    req: MarkInSync,
) -> Result<VolumeRecord, ControllerError> {
    let (rec, was) = st
        .records
        .update_volume(name, |v| {
            let was = replica_state(v, replica);
            apply_mark_in_sync(v, replica, req.epoch).map(|()| was)
        })
        .await
        .inspect_err(|e| count_refusal(&st.metrics, e))?;
    if was.is_some_and(|s| s != ReplicaState::InSync) {
        st.metrics.resynced.inc();
    }
    tracing::info!(volume = %name, replica, epoch = req.epoch, "replica resynced: in-sync");
    if was.is_some_and(|s| s != ReplicaState::InSync) {
        st.events.normal(
            name,
            "Resynced",
            format!(
                "replica {replica} on node {} is in sync again; {}",
                replica_node(&rec, replica),
                in_sync_summary(&rec)
            ),
        );
    }
    Ok(rec)
}

fn replica_state(v: &VolumeRecord, replica: &str) -> Option<ReplicaState> {
    v.replicas.iter().find(|r| r.id == replica).map(|r| r.state)
}

fn replica_node<'a>(v: &'a VolumeRecord, replica: &str) -> &'a str {
    v.replicas
        .iter()
        .find(|r| r.id == replica)
        .map_or("?", |r| r.node.as_str())
}

/// "1 of 2 replicas in sync".
fn in_sync_summary(v: &VolumeRecord) -> String {
    format!(
        "{} of {} replicas in sync",
        v.in_sync().count(),
        v.replica_count
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_api::controller::Replica;

    fn volume(states: &[ReplicaState]) -> VolumeRecord {
        VolumeRecord {
            state: VolumeState::Attached,
            epoch: 3,
            attached_node: Some("n1".into()),
            replicas: states
                .iter()
                .enumerate()
                .map(|(i, s)| Replica {
                    id: format!("r{i}"),
                    node: format!("n{i}"),
                    pool: "p".into(),
                    state: *s,
                    blank: false,
                    engine: None,
                })
                .collect(),
            ..VolumeRecord::new("v", 4096, u32::try_from(states.len()).unwrap())
        }
    }

    use ReplicaState::{Failed, InSync, Outdated};

    #[test]
    fn outdates_an_in_sync_replica() {
        let mut v = volume(&[InSync, InSync, InSync]);
        apply_outdate(&mut v, "r1", 3, false).unwrap();
        assert_eq!(v.replicas[1].state, Outdated);
        assert_eq!(v.in_sync().count(), 2);
    }

    #[test]
    fn stale_epoch_is_refused_and_changes_nothing() {
        for epoch in [2, 4, 0] {
            let mut v = volume(&[InSync, InSync]);
            let before = v.clone();
            let e = apply_outdate(&mut v, "r1", epoch, false).unwrap_err();
            assert!(
                matches!(e, ControllerError::StaleEpoch { current: 3, .. }),
                "{e}"
            );
            // The answer does not tell a caller which epoch to claim.
            assert!(!e.to_string().contains('3'), "{e}");
            assert_eq!(v, before);
        }
    }

    #[test]
    fn last_in_sync_replica_is_never_outdated() {
        let mut v = volume(&[Outdated, InSync, Failed]);
        let before = v.clone();
        let e = apply_outdate(&mut v, "r1", 3, false).unwrap_err();
        assert!(
            matches!(e, ControllerError::LastInSyncReplica { .. }),
            "{e}"
        );
        assert_eq!(v, before);
    }

    #[test]
    fn already_outdated_is_idempotent() {
        let mut v = volume(&[Outdated, InSync]);
        let before = v.clone();
        apply_outdate(&mut v, "r0", 3, false).unwrap();
        assert_eq!(v, before);
    }

    #[test]
    fn unknown_replica_and_wrong_states() {
        let mut v = volume(&[InSync, InSync]);
        let e = apply_outdate(&mut v, "nope", 3, false).unwrap_err();
        assert!(matches!(e, ControllerError::ReplicaNotFound { .. }), "{e}");
        v.state = VolumeState::Deleting;
        let e = apply_outdate(&mut v, "r0", 3, false).unwrap_err();
        assert!(matches!(e, ControllerError::Busy { .. }), "{e}");
        // Detached in the same epoch: the report is still the truth, so it applies.
        v.state = VolumeState::Detached;
        apply_outdate(&mut v, "r0", 3, false).unwrap();
    }

    #[test]
    fn disk_errors_fail_replicas_and_failed_ones_never_come_back() {
        let mut v = volume(&[InSync, InSync, Outdated]);
        apply_outdate(&mut v, "r1", 3, true).unwrap();
        assert_eq!(v.replicas[1].state, Failed);
        // An outdated replica reported failed becomes failed.
        apply_outdate(&mut v, "r2", 3, true).unwrap();
        assert_eq!(v.replicas[2].state, Failed);
        let e = apply_mark_in_sync(&mut v, "r1", 3).unwrap_err();
        assert!(matches!(e, ControllerError::ReplicaFailed { .. }), "{e}");
        assert_eq!(v.replicas[1].state, Failed);
    }

    #[test]
    fn resynced_replica_is_marked_in_sync_only_in_the_current_epoch() {
        let mut v = volume(&[InSync, Outdated]);
        let before = v.clone();
        let e = apply_mark_in_sync(&mut v, "r1", 2).unwrap_err();
        assert!(matches!(e, ControllerError::StaleEpoch { .. }), "{e}");
        assert_eq!(v, before);
        apply_mark_in_sync(&mut v, "r1", 3).unwrap();
        assert_eq!(v.replicas[1].state, InSync);
        // Retrying a lost answer is fine.
        apply_mark_in_sync(&mut v, "r1", 3).unwrap();
        let e = apply_mark_in_sync(&mut v, "nope", 3).unwrap_err();
        assert!(matches!(e, ControllerError::ReplicaNotFound { .. }), "{e}");
    }

    /// Forces the race: the first two reads of the volume wait for each other, so both
    /// writers read the same version before either writes.
    struct RacingStore {
        inner: hawser_store::EmbeddedStore,
        barrier: tokio::sync::Barrier,
        reads: std::sync::atomic::AtomicU32,
    }

    #[async_trait::async_trait]
    impl hawser_store::Store for RacingStore {
        async fn get(&self, key: &str) -> hawser_store::Result<Option<hawser_store::Versioned>> {
            let v = self.inner.get(key).await;
            if self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
                self.barrier.wait().await;
            }
            v
        }
        async fn list(
            &self,
            prefix: &str,
        ) -> hawser_store::Result<Vec<(String, hawser_store::Versioned)>> {
            self.inner.list(prefix).await
        }
        async fn list_at(
            &self,
            prefix: &str,
        ) -> hawser_store::Result<(Vec<(String, hawser_store::Versioned)>, u64)> {
            self.inner.list_at(prefix).await
        }
        async fn put_with(
            &self,
            key: &str,
            value: Vec<u8>,
            expect: hawser_store::Expect,
            opts: &hawser_store::WriteOptions,
        ) -> hawser_store::Result<u64> {
            self.inner.put_with(key, value, expect, opts).await
        }
        async fn delete_with(
            &self,
            key: &str,
            expect: hawser_store::Expect,
            opts: &hawser_store::WriteOptions,
        ) -> hawser_store::Result<()> {
            self.inner.delete_with(key, expect, opts).await
        }
        async fn grant_lease(&self, ttl: std::time::Duration) -> hawser_store::Result<i64> {
            self.inner.grant_lease(ttl).await
        }
        async fn keep_alive(&self, lease: i64) -> hawser_store::Result<()> {
            self.inner.keep_alive(lease).await
        }
        async fn revoke_lease(&self, lease: i64) -> hawser_store::Result<()> {
            self.inner.revoke_lease(lease).await
        }
        async fn watch(
            &self,
            prefix: &str,
            after: u64,
        ) -> hawser_store::Result<hawser_store::Watch> {
            self.inner.watch(prefix, after).await
        }
        async fn revision(&self) -> hawser_store::Result<u64> {
            self.inner.revision().await
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_outdates_of_both_replicas_exactly_one_wins() {
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let inner = hawser_store::EmbeddedStore::open(dir.path().join("s.json")).unwrap();
        let store = RacingStore {
            inner,
            barrier: tokio::sync::Barrier::new(2),
            reads: Default::default(),
        };
        let v = volume(&[InSync, InSync]);
        hawser_store::put_json(&store, "volumes/v", &v, hawser_store::Expect::Absent)
            .await
            .unwrap();
        let st = Arc::new(AppState {
            records: crate::store::records::Records::new(Arc::new(store)),
            agents: crate::cluster::agent_client::AgentClient::new(Some("t"), None).unwrap(),
            tls: None,
            tokens: crate::auth::ClusterTokens::for_tests("admin", "agent"),
            volume_locks: Default::default(),
            reservations: Default::default(),
            node_timeout_ms: 1000,
            controller_url: "http://127.0.0.1:1".into(),
            leadership: crate::store::leader::Leadership::sole(),
            events: crate::cluster::events::ClusterEvents::none(),
            waiting: Default::default(),
            metrics: Default::default(),
            keks: crate::volumes::keys::Keks::new(std::path::Path::new("/nonexistent")),
            backups: crate::snapshots::backup_settings::BackupSettings::new(
                std::path::Path::new("/nonexistent"),
                0,
                120,
            ),
        });
        let report = |id: &'static str| {
            let st = st.clone();
            tokio::spawn(async move {
                let req = Outdate {
                    epoch: 3,
                    reason: "test".into(),
                    failed: false,
                };
                outdate_replica(&st, "v", id, req).await
            })
        };
        let (a, b) = (report("r0"), report("r1"));
        let results = [a.await.unwrap(), b.await.unwrap()];
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "{results:?}");
        let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(
            matches!(lost, ControllerError::LastInSyncReplica { .. }),
            "{lost}"
        );
        let v = st.records.existing_volume("v").await.unwrap();
        assert_eq!(v.in_sync().count(), 1);
    }
}
