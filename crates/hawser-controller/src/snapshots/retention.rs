//! What a schedule keeps, and pruning (docs/backup.md). A schedule keeps its newest
//! `retain` ready backups on its target and deletes older ones it made: their manifests
//! first, so no one restores them any more, then, by a prune of the target, the blocks that
//! no manifest names. Backups made by hand are never deleted by a schedule.
//!
//! A prune is `hawser_backup::prune`: it holds the target's prune lock, so it never runs
//! alongside a backup (of this cluster or another), and it deletes nothing if a manifest
//! cannot be read. It runs on the leader after retention or `hawser backup delete` left
//! blocks behind, and by hand with `hawser backup target prune`. Targets waiting for one
//! are kept in memory: after a controller restart, the next deletion prunes what is left.

use std::sync::Arc;

use hawser_api::backup::{BackupSchedule, BackupState, PruneReport};

use crate::errors::ControllerError;
use crate::snapshots::backups::{self, BackupRecord};
use crate::state::AppState;
use crate::store::model::now_ms;

/// Deletes the backups `s` made beyond its newest `retain` ready ones, and the failed ones
/// it made before the newest ready one (their blocks are reused or pruned). Returns how
/// many backups were deleted from the target.
pub async fn apply(
    st: &AppState,
    volume: &str,
    s: &BackupSchedule,
) -> Result<u64, ControllerError> {
    let mine: Vec<BackupRecord> = backups::records(&st.records, Some(volume), Some(&s.target))
        .await?
        .into_iter()
        .filter(|r| r.scheduled)
        .collect();
    let mut ready: Vec<&BackupRecord> = mine
        .iter()
        .filter(|r| r.backup.state == BackupState::Ready)
        .collect();
    ready.sort_by_key(|r| std::cmp::Reverse((r.backup.taken_ms, r.backup.created_ms)));
    let keep = usize::try_from(s.retain).unwrap_or(usize::MAX);
    let newest_ready = ready.first().map(|r| r.backup.created_ms);
    let old: Vec<String> = ready
        .iter()
        .skip(keep)
        .map(|r| r.backup.name.clone())
        .collect();
    let failed: Vec<String> = mine
        .iter()
        .filter(|r| r.backup.state == BackupState::Failed)
        .filter(|r| newest_ready.is_some_and(|n| r.backup.created_ms < n))
        .map(|r| r.backup.name.clone())
        .collect();
    for name in failed {
        backups::delete(st, &name).await?;
    }
    let mut deleted = 0;
    for name in old {
        backups::delete(st, &name).await?;
        deleted += 1;
    }
    if deleted > 0 {
        tracing::info!(volume, target = %s.target, deleted, retain = s.retain,
            "backup schedule's retention deleted old backups");
    }
    Ok(deleted)
}

/// Prunes each target that waits for one. A target busy with a backup stays waiting.
pub async fn prune_wanted(st: &Arc<AppState>) {
    let wanted: Vec<String> = st
        .backups
        .prune_wanted
        .lock()
        .map(|w| w.iter().cloned().collect())
        .unwrap_or_default();
    for target in wanted {
        match prune(st, &target).await {
            Ok(_) => {
                if let Ok(mut w) = st.backups.prune_wanted.lock() {
                    w.remove(&target);
                }
            }
            Err(e) => tracing::info!(target = %target, error = %e,
                "backup target not pruned yet; tried again later"),
        }
    }
}

/// Prunes `target` now: `POST /v1/backup-targets/{name}/prune`, and the leader's pass.
pub async fn prune(st: &AppState, target: &str) -> Result<PruneReport, ControllerError> {
    let t = crate::snapshots::backup_targets::open_with_retry(st, target, st.backups.retry_secs)
        .await?
        .2;
    let cluster = crate::cluster::identity(st).await.ok().map(|c| c.id);
    let holder = format!("controller-{}", now_ms());
    // Noted before the lock is written: a sweep of locks left by dead runs spares it.
    let _running = st.backups.pruning.start(&holder);
    let report = hawser_backup::prune::prune(&t, &holder, cluster, st.backups.prune_grace_secs)
        .await
        .map_err(|e| match e {
            hawser_backup::BackupError::Busy { .. } => ControllerError::Refused {
                message: e.to_string(),
            },
            e => ControllerError::BackupTarget {
                target: target.into(),
                reason: e.to_string(),
            },
        })?;
    tracing::info!(target, ?report, "backup target pruned");
    st.events.keep(
        None,
        None,
        false,
        "BackupTargetPruned",
        &format!(
            "target {target} pruned: {} unnamed blocks deleted ({} bytes), {} backups kept",
            report.deleted_blocks, report.freed_bytes, report.backups
        ),
    );
    Ok(report)
}
