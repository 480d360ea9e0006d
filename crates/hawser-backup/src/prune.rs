//! Pruning a target: deleting the blocks that no manifest on it names, once their backups
//! were deleted (by hand, or by a schedule's retention). It holds the target's prune lock
//! (`locks.rs`), so no backup runs meanwhile, and it deletes nothing if any manifest cannot
//! be read: a block it names would look unnamed. Readers do not stop it: it keeps what the
//! backups they hold name, retired ones too, and drops a retired manifest only once no
//! reader holds it (`readers.rs`).

use std::collections::HashSet;

use futures::{StreamExt, TryStreamExt};

use crate::constants::MAX_IN_FLIGHT_BLOCKS;
use crate::error::BackupError;
use crate::locks::{Lock, LockBody, LockKind};
use crate::restore::{list_backups, read_manifest};
use crate::target::Target;
use crate::upload::{hostname, now_ms};
use crate::{names, readers};

/// Deletes between two checks of the lock.
const CHECK_EVERY: usize = 64;

pub use hawser_api::backup::PruneReport;

/// The hash a block object is named by, if the name is one of ours.
fn hash_of(object: &str) -> Option<&str> {
    let rest = object.strip_prefix(names::BLOCKS)?.strip_prefix('/')?;
    let (fan, file) = rest.split_once('/')?;
    let hash = file.strip_suffix(".zst")?;
    (names::is_hash(hash) && hash.get(..2) == Some(fan)).then_some(hash)
}

/// Prunes `target` as `holder` (a name for its lock, unique to this prune). A block named by
/// no manifest is kept if the target wrote it less than `grace_secs` ago: a writer this
/// prune cannot see (an agent older than the locks, one whose lock lapsed) may be about to
/// name it; [`crate::constants::LOCK_STALE_SECS`] is the safe choice. Fails with
/// [`BackupError::Busy`] if a backup or another prune holds the target: try again later.
pub async fn prune(
    target: &Target,
    holder: &str,
    cluster: Option<String>,
    grace_secs: u64,
) -> Result<PruneReport, BackupError> {
    let lock = Lock::take(
        target,
        LockBody {
            kind: LockKind::Prune,
            holder: holder.to_owned(),
            cluster,
            host: hostname(),
            started_ms: now_ms(),
            reads: Vec::new(),
        },
    )
    .await?;
    let done = locked(target, &lock, grace_secs).await;
    lock.release().await;
    done
}

async fn locked(target: &Target, lock: &Lock, grace_secs: u64) -> Result<PruneReport, BackupError> {
    let (readers, blockers): (Vec<_>, Vec<_>) = lock
        .others()
        .await?
        .into_iter()
        .partition(|h| h.kind == LockKind::Read);
    if let Some(first) = blockers.first() {
        return Err(BackupError::Busy {
            target: target.name().to_owned(),
            why: format!("{first} holds it; the prune is left for later"),
        });
    }
    let held = readers::held_backups(target, &readers).await?;
    let mut stats = PruneReport::default();
    let mut named = HashSet::new();
    for backup in list_backups(target).await? {
        let m = read_manifest(target, &backup)
            .await
            .map_err(|e| unreadable(target, &backup, e))?;
        named.extend(m.blocks.into_values());
        stats.backups += 1;
    }
    let mut retired_doomed = Vec::new();
    for object in target.list(names::RETIRED).await? {
        let Some(backup) = names::retired_of(&object) else {
            continue;
        };
        if !held.contains(backup) {
            retired_doomed.push(object);
            continue;
        }
        let m = readers::read_held_manifest(target, backup)
            .await
            .map_err(|e| unreadable(target, backup, e))?;
        named.extend(m.blocks.into_values());
        stats.held_backups += 1;
    }
    let young_from = lock
        .stamped_ms()
        .saturating_sub(grace_secs.saturating_mul(1000));
    let mut doomed = Vec::new();
    for o in target.list_listed(names::BLOCKS).await? {
        let Some(hash) = hash_of(&o.name) else {
            continue;
        };
        stats.blocks += 1;
        if named.contains(hash) {
            continue;
        }
        if o.modified_ms > young_from {
            stats.young_blocks += 1;
            continue;
        }
        doomed.push(o);
    }
    // The retired manifests first: one still there promises its blocks to a reader that
    // waited out this prune (readers.rs), so it must not outlive them.
    delete_all(target, lock, &retired_doomed).await?;
    stats.retired_deleted = retired_doomed.len() as u64;
    for chunk in doomed.chunks(CHECK_EVERY) {
        let names: Vec<String> = chunk.iter().map(|o| o.name.clone()).collect();
        delete_all(target, lock, &names).await?;
        stats.deleted_blocks += chunk.len() as u64;
        stats.freed_bytes += chunk.iter().map(|o| o.size).sum::<u64>();
    }
    target.barrier().await?;
    Ok(stats)
}

/// A manifest that cannot be read stops the prune: a block it names would look unnamed.
fn unreadable(target: &Target, backup: &str, e: BackupError) -> BackupError {
    BackupError::Busy {
        target: target.name().to_owned(),
        why: format!(
            "cannot read the manifest of backup {backup}, so nothing is pruned (a block it \
             names would look unnamed): {e}"
        ),
    }
}

/// Deletes `objects`, [`CHECK_EVERY`] at a time, each batch only while the lock holds.
async fn delete_all(target: &Target, lock: &Lock, objects: &[String]) -> Result<(), BackupError> {
    for chunk in objects.chunks(CHECK_EVERY) {
        lock.check()?;
        futures::stream::iter(chunk.iter().cloned())
            .map(|name| {
                let t = target.clone();
                async move { t.delete(&name).await }
            })
            .buffer_unordered(MAX_IN_FLIGHT_BLOCKS)
            .try_collect::<Vec<()>>()
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_block_objects_are_candidates() {
        let h = "ab".repeat(32);
        assert_eq!(hash_of(&format!("blocks/ab/{h}.zst")), Some(h.as_str()));
        for not in [
            format!("blocks/cd/{h}.zst"),
            format!("blocks/ab/{h}"),
            format!("blocks/{h}.zst"),
            format!("backups/ab/{h}.zst"),
            "blocks/ab/xyz.zst".to_owned(),
            String::new(),
        ] {
            assert_eq!(hash_of(&not), None, "{not:?}");
        }
    }
}
