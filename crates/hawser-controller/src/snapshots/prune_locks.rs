//! Prune locks that this cluster's controller left on its targets when it was killed.
//!
//! A prune holds its target (`hawser-backup` `locks.rs`); every backup and reader waits out a
//! live prune lock, for the stale time (10 min) if its holder died with it in place. A
//! controller on the embedded store is the only controller its cluster has (the store's file
//! lock ensures it), so at its start every prune lock that names this cluster and is not a
//! prune this process runs was written by a process that is gone: it is deleted at once,
//! and the backups that a `kill -9` mid-prune held up go on within seconds.
//!
//! Controllers sharing etcd or the Kubernetes API cannot say that of one another's locks: a
//! controller that lost its lease may still be deleting blocks until it notices. Their prune
//! locks go stale as before.

use hawser_backup::locks::{bodies, LockKind};
use hawser_store::list_json;

use crate::snapshots::backup_targets::{open_with_retry, TargetRecord, PREFIX};
use crate::state::AppState;
use crate::store::leader::Role;

/// At the start of the only controller of its cluster: deletes, on every target, the prune
/// locks of this cluster that no prune of this process holds. A target that cannot be
/// reached keeps its locks (they go stale).
pub async fn clear_left(st: &AppState) {
    if st.leadership.role() != Role::Sole {
        return;
    }
    let Ok(cluster) = crate::cluster::identity(st).await.map(|c| c.id) else {
        return;
    };
    let Ok(targets) = list_json::<TargetRecord>(&*st.records.store(), PREFIX).await else {
        return;
    };
    for (_, record, _) in targets {
        let retry = hawser_backup::constants::CHECK_RETRY_SECS;
        let Ok((_, _, target)) = open_with_retry(st, &record.name, retry).await else {
            continue;
        };
        let left = match bodies(&target, LockKind::Prune).await {
            Ok(found) => found,
            Err(e) => {
                tracing::info!(target = %record.name, error = %e,
                    "cannot read the target's prune locks; any left there go stale");
                continue;
            }
        };
        for (object, body) in left {
            if body.cluster.as_deref() != Some(cluster.as_str())
                || st.backups.pruning.runs(&body.holder)
            {
                continue;
            }
            match target.delete(&object).await {
                Ok(()) => tracing::info!(target = %record.name, lock = %object,
                    "deleted the prune lock an earlier run of this controller left"),
                Err(e) => tracing::warn!(target = %record.name, lock = %object, error = %e,
                    "cannot delete a prune lock left by an earlier run; it goes stale"),
            }
        }
    }
}
