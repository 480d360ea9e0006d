//! Crash recovery at start: what the attach finds of each replica goes to
//! `hawser_core::driver::recovery` (the decision the simulator runs), whose plan is carried out
//! here before the engine takes any I/O.

use std::sync::atomic::Ordering;
use std::time::Instant;

use hawser_api::agent::{RecoveryReport, StartEngine};
use hawser_api::controller::ReplicaState;
use hawser_core::driver::journal::Keeper;
use hawser_core::driver::recovery::{decide, Decision, Found, Member, Stored};
use hawser_core::{EngineConfig, ReplicaIdx, ReplicaSpec};

use super::{keeper_params, VolumeEngine};
use crate::engine::recovery;
use crate::replica::access::Access;

impl VolumeEngine {
    /// Crash recovery (see `engine/recovery.rs`) before any I/O: reconcile the reachable in-sync
    /// replicas over the previous engine's activity logs, work out what the others lack, then
    /// commit this engine's first journal.
    pub(super) async fn recover(
        &self,
        req: &StartEngine,
        specs: &[ReplicaSpec],
        cfg: EngineConfig,
        unreachable: &[ReplicaIdx],
    ) -> anyhow::Result<()> {
        // What the attach finds of each replica; the decision is `hawser_core::driver`'s,
        // the one the simulator runs.
        let mut members = Vec::with_capacity(req.replicas.len());
        let mut access: Vec<Option<Access>> = Vec::with_capacity(req.replicas.len());
        for (i, r) in req.replicas.iter().enumerate() {
            let stored = match r.state {
                ReplicaState::InSync => Stored::InSync,
                ReplicaState::Outdated => Stored::Outdated { blank: r.blank },
                ReplicaState::Failed => Stored::Failed,
            };
            let a = self.access(i);
            let found = match (&a, stored) {
                (_, Stored::Outdated { .. } | Stored::Failed) => Found::NotAsked,
                _ if unreachable.contains(&Self::idx(i)) => Found::Unreachable,
                (None, _) => Found::Unreachable,
                (Some(a), _) => match a.get_journal(self.epoch).await {
                    Ok(j) => Found::Journal {
                        rebooted: j.as_ref().is_none_or(|j| j.rebooted),
                        journal: j.map(|s| s.journal),
                    },
                    Err(e) if e.is_stale_epoch() => anyhow::bail!("fenced: {e}"),
                    // A replica whose disk fails its journal read is failed, not waited for:
                    // one broken disk must not keep the volume from attaching.
                    Err(e) if e.is_disk_error() => {
                        tracing::error!(volume = %req.volume, error = %e, "in-sync replica failed at attach; it will be marked failed");
                        Found::DiskError
                    }
                    Err(e) => anyhow::bail!("crash recovery: {e}"),
                },
            };
            members.push(Member {
                id: r.replica_id.clone(),
                local: specs[i].local,
                stored,
                found,
            });
            access.push(a);
        }
        let start = match decide(
            self.epoch,
            self.size.load(Ordering::Acquire),
            cfg.chunk_bytes,
            &members,
        ) {
            Decision::Start(s) => s,
            Decision::Refuse(why) => {
                anyhow::bail!("crash recovery of volume {}: {why}", req.volume)
            }
        };
        let reach: Vec<Access> = start
            .sources
            .iter()
            .filter_map(|&i| access[i].clone())
            .collect();
        if start.source_not_whole && reach.len() > 1 {
            tracing::warn!(volume = %req.volume, "no in-sync replica is known to be whole (every node rebooted?); writes none of them had flushed may be lost");
        } else if !members[start.sources[0]].local
            && start.sources.iter().any(|&i| members[i].local)
        {
            tracing::info!(volume = %req.volume, source = reach[0].id(), "crash recovery source: a whole replica rather than the local one");
        }
        let started = Instant::now();
        anyhow::ensure!(
            reach.len() == start.sources.len(),
            "crash recovery of volume {}: an in-sync replica's session closed during recovery",
            req.volume
        );
        let source_of = |c: u64| start.source_of(c);
        let done = recovery::reconcile(self.epoch, &reach, &start.plan, &source_of)
            .await
            .map_err(|e| anyhow::anyhow!("crash recovery: {e}"))?;
        let report = RecoveryReport {
            replicas: u32::try_from(reach.len()).unwrap_or(u32::MAX),
            compared_bytes: done.compared_bytes,
            copied_bytes: done.copied_bytes,
            millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        tracing::info!(volume = %self.volume, ?report, "crash recovery done");
        *self.recovery.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
        {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.engine = start.engine(self.size.load(Ordering::Acquire), cfg);
            inner.keeper = Keeper::new(
                keeper_params(),
                self.epoch,
                self.size.load(Ordering::Acquire),
                cfg.chunk_bytes,
                self.replica_ids.clone(),
                start.plan.next_seq,
            );
        }
        self.run(|e, out| start.begin(e, out));
        self.commit(0).await;
        Ok(())
    }
}
