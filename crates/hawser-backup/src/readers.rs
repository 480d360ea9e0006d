//! Readers of backups and the prune (docs/backup.md, "Why a prune never deletes a block a
//! restore reads"). A restore, a standby's apply and a verify read a backup's blocks for
//! minutes or hours; a prune deletes every block that no manifest names. Two things keep
//! them apart:
//!
//! 1. **A reader holds the target.** Before it relies on a block, a reader writes a `read`
//!    lock (`locks.rs`) naming the backups it reads, rewritten like the others, then waits
//!    out any live prune. A prune keeps what live readers hold, so it still runs while a
//!    multi-hour restore or a standby's endless applies go on. Lock, then list: a prune that
//!    overlaps a reader either is seen by it (the reader waits) or sees its lock.
//! 2. **A deleted backup's manifest is retired, not dropped.** A backup can be deleted while
//!    someone restores it; the prune must still know which blocks it names. Deleting moves
//!    the manifest to `retired/` (copy first, then delete, so it is always in one of the two
//!    places), and the prune drops a retired manifest only when no live reader holds its
//!    backup, before the blocks it alone named. So a retired manifest that is still there
//!    means its blocks are too, for a reader that waited out the prunes.
//!
//! The other choice, recording every block hash a reader holds in its lock, would write
//! megabytes per lock refresh for a large volume; a retired manifest costs one copy, once.
//! A reader that lost its lock for the stale time may lose blocks to a prune; it then fails
//! with [`BackupError::MissingBlock`], never writing a block that does not match its hash.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::constants::MAX_MANIFEST_BYTES;
use crate::error::BackupError;
use crate::locks::{Held, Lock, LockBody, LockKind};
use crate::manifest::Manifest;
use crate::names;
use crate::target::Target;
use crate::upload::{hostname, now_ms};

/// A reader's hold on a backup: while it lives, no prune deletes what the backup names, even
/// once the backup is deleted.
#[derive(Debug)]
pub struct ReadHold {
    lock: Lock,
    backup: String,
}

impl ReadHold {
    /// Holds `backup` on `target`: writes the read lock, waits out live prunes, then checks
    /// that the backup is still there (live or retired); if it is not, a prune may have
    /// taken its blocks before the lock was seen, and the hold fails with `NotFound`.
    pub async fn take(target: &Target, backup: &str) -> Result<ReadHold, BackupError> {
        let hold = ReadHold::write(target, backup).await?;
        match hold.confirm().await {
            Ok(()) => Ok(hold),
            Err(e) => {
                hold.release().await;
                Err(e)
            }
        }
    }

    /// The first half of [`ReadHold::take`]: the read lock is written (and rewritten from
    /// now on), so every prune that lists the locks from now on keeps `backup`; but a prune
    /// that listed them before may still be deleting, so nothing may be relied on until
    /// [`ReadHold::confirm`] says so. A caller that must not wait (an API request) writes
    /// the lock at once and confirms in the background.
    pub async fn write(target: &Target, backup: &str) -> Result<ReadHold, BackupError> {
        ReadHold::write_as(target, backup, &holder(backup)).await
    }

    /// [`ReadHold::write`] under the name `holder` (unique to this hold, and valid in an
    /// object name), for a holder that later supersedes its own older holds
    /// ([`ReadHold::supersede`]).
    pub async fn write_as(
        target: &Target,
        backup: &str,
        holder: &str,
    ) -> Result<ReadHold, BackupError> {
        names::validate_backup(backup)?;
        let lock = Lock::take(
            target,
            LockBody {
                kind: LockKind::Read,
                holder: holder.to_owned(),
                cluster: None,
                host: hostname(),
                started_ms: now_ms(),
                reads: vec![backup.to_owned()],
            },
        )
        .await?;
        Ok(ReadHold {
            lock,
            backup: backup.to_owned(),
        })
    }

    /// Waits out live prunes (each saw this lock, or ran before it), then checks that the
    /// backup is still there, live or retired: from then on its blocks stay while the hold
    /// lives. `NotFound`: a prune that did not see the lock took the backup first.
    pub async fn confirm(&self) -> Result<(), BackupError> {
        self.lock.wait_out_prunes().await?;
        let target = self.lock.target();
        if manifest_object(target, &self.backup).await?.is_none() {
            return Err(BackupError::NotFound {
                target: target.name().to_owned(),
                backup: self.backup.clone(),
            });
        }
        Ok(())
    }

    /// Deletes the other read locks whose holder starts with `prefix`: holds of the same
    /// reader left by a process that died (a controller killed mid-restore), which would
    /// otherwise hold their backups for the stale time. Only after [`ReadHold::confirm`]:
    /// this hold keeps the backup from then on. A holder that still lives writes its lock
    /// again at its next refresh, and holds as before.
    pub async fn supersede(&self, prefix: &str) -> Result<usize, BackupError> {
        let target = self.lock.target();
        let mut deleted = 0;
        for object in target.list(crate::locks::LOCKS).await? {
            let Some((LockKind::Read, holder)) = crate::locks::parse_object(&object) else {
                continue;
            };
            if holder.starts_with(prefix) && object != self.lock.object() {
                target.delete(&object).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Fails if the lock may have looked dead to a prune at some time since it was taken
    /// (it could not be rewritten for [`crate::constants::LOCK_LAPSE_SECS`]): the hold no
    /// longer promises anything, and a holder that needs it takes a new one.
    pub fn check(&self) -> Result<(), BackupError> {
        self.lock.check()
    }

    /// The lock's object on the target (for tests and logs).
    pub fn object(&self) -> &str {
        self.lock.object()
    }

    /// Lets the backup go: a prune may now delete what only it names.
    pub async fn release(self) {
        self.lock.release().await;
    }
}

/// A unique holder for a reader of `backup`: the backup, the process and a counter, so two
/// replicas' jobs on one node, or two nodes, never share a lock.
fn holder(backup: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{backup}-{:x}-{nanos:x}-{n}", std::process::id())
}

/// Where `backup`'s manifest is now: live, retired, or nowhere.
async fn manifest_object(target: &Target, backup: &str) -> Result<Option<String>, BackupError> {
    for object in [names::manifest(backup), names::retired(backup)] {
        if target.size(&object).await?.is_some() {
            return Ok(Some(object));
        }
    }
    Ok(None)
}

/// The manifest of `backup`, live or retired: what a reader that was given the backup before
/// it was deleted (a restore resumed after a restart, a standby's base) reads. New restores
/// start from [`crate::read_manifest`], which knows live backups only.
pub async fn read_held_manifest(target: &Target, backup: &str) -> Result<Manifest, BackupError> {
    names::validate_backup(backup)?;
    for object in [names::manifest(backup), names::retired(backup)] {
        if let Some(bytes) = target.get(&object, MAX_MANIFEST_BYTES).await? {
            return Manifest::decode(backup, &bytes);
        }
    }
    Err(BackupError::NotFound {
        target: target.name().to_owned(),
        backup: backup.to_owned(),
    })
}

/// Deletes `backup` from `target` for good as far as new readers go: its manifest moves to
/// `retired/`, where a prune keeps it while a reader holds it. Returns whether there was a
/// manifest (live or already retired). Copy before delete: a crash between them leaves both,
/// and the next call finishes.
pub async fn retire(target: &Target, backup: &str) -> Result<bool, BackupError> {
    names::validate_backup(backup)?;
    let live = names::manifest(backup);
    let Some(bytes) = target.get(&live, MAX_MANIFEST_BYTES).await? else {
        return Ok(target.size(&names::retired(backup)).await?.is_some());
    };
    target.put(&names::retired(backup), bytes).await?;
    target.delete(&live).await?;
    Ok(true)
}

/// The backups that the live reader locks `readers` hold, from their bodies. A lock gone
/// since it was listed holds nothing; one that cannot be read or decoded makes the prune
/// busy (what it holds is unknown, so nothing retired may go).
pub(crate) async fn held_backups(
    target: &Target,
    readers: &[Held],
) -> Result<HashSet<String>, BackupError> {
    let mut held = HashSet::new();
    for r in readers.iter().filter(|r| r.kind == LockKind::Read) {
        let object = crate::locks::object(LockKind::Read, &r.holder);
        let Some(bytes) = target.get(&object, crate::locks::MAX_BODY_BYTES).await? else {
            continue;
        };
        let body: LockBody = serde_json::from_slice(&bytes).map_err(|e| BackupError::Busy {
            target: target.name().to_owned(),
            why: format!("reader lock {object} does not decode ({e}), so nothing is pruned"),
        })?;
        held.extend(body.reads);
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn holders_are_unique_and_valid_lock_names() {
        let (a, b) = (holder("db-1"), holder("db-1"));
        assert_ne!(a, b);
        let object = crate::locks::object(LockKind::Read, &a);
        assert_eq!(
            crate::locks::parse_object(&object),
            Some((LockKind::Read, a.as_str()))
        );
    }
}
