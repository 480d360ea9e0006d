//! Pruning a target: deleting the blocks that no manifest on it names, once their backups
//! were deleted (by hand, or by a schedule's retention). It holds the target's prune lock
//! (`locks.rs`), so no backup runs meanwhile, and it deletes nothing if any manifest cannot
//! be read: a block it names would look unnamed.

use std::collections::HashSet;

use futures::{StreamExt, TryStreamExt};

use crate::constants::MAX_IN_FLIGHT_BLOCKS;
use crate::error::BackupError;
use crate::locks::{Lock, LockBody, LockKind};
use crate::names;
use crate::restore::{list_backups, read_manifest};
use crate::target::Target;
use crate::upload::{hostname, now_ms};

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
        },
    )
    .await?;
    let done = locked(target, &lock, grace_secs).await;
    lock.release().await;
    done
}

async fn locked(target: &Target, lock: &Lock, grace_secs: u64) -> Result<PruneReport, BackupError> {
    let others = lock.others().await?;
    if let Some(first) = others.first() {
        return Err(BackupError::Busy {
            target: target.name().to_owned(),
            why: format!("{first} holds it; the prune is left for later"),
        });
    }
    let now_ms = lock.stamped_ms();
    let mut stats = PruneReport::default();
    let mut named = HashSet::new();
    for backup in list_backups(target).await? {
        let m = read_manifest(target, &backup)
            .await
            .map_err(|e| BackupError::Busy {
                target: target.name().to_owned(),
                why: format!(
                    "cannot read the manifest of backup {backup}, so nothing is pruned (a block \
                 it names would look unnamed): {e}"
                ),
            })?;
        named.extend(m.blocks.into_values());
        stats.backups += 1;
    }
    let young_from = now_ms.saturating_sub(grace_secs.saturating_mul(1000));
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
    for chunk in doomed.chunks(CHECK_EVERY) {
        lock.check()?;
        let names: Vec<String> = chunk.iter().map(|o| o.name.clone()).collect();
        futures::stream::iter(names)
            .map(|name| {
                let t = target.clone();
                async move { t.delete(&name).await }
            })
            .buffer_unordered(MAX_IN_FLIGHT_BLOCKS)
            .try_collect::<Vec<()>>()
            .await?;
        stats.deleted_blocks += chunk.len() as u64;
        stats.freed_bytes += chunk.iter().map(|o| o.size).sum::<u64>();
    }
    target.barrier().await?;
    Ok(stats)
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
