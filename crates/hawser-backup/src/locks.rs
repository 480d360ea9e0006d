//! Locks on a target, so that a prune never deletes a block that a running backup is about to
//! name. A backup names two kinds of blocks it did not store itself: those its previous
//! backup named, and those it found with a look-up. Either may be a block no manifest names
//! any more (its backups were deleted), which is exactly what a prune deletes. So a backup
//! and a prune of one target must not overlap, whichever cluster, node or controller runs
//! them, including an agent cut off from its controller that still runs a backup the
//! controller gave up on. The lock therefore lives on the target itself, not in a store.
//!
//! Each holder writes `locks/<kind>-<holder>.json` and rewrites it every
//! [`LOCK_REFRESH_SECS`]; the target stamps each write with its own clock. Then it lists
//! `locks/` (after its write is acknowledged): the two sides each write, then read, so with
//! a target whose listing shows every write acknowledged before it (S3 since 2020, SeaweedFS,
//! a local or NFS directory), at least one of a backup and a prune that overlap sees the
//! other. A prune that sees a live backup lock stops and tries later; a backup that sees a
//! live prune lock waits for it to go.
//!
//! A lock is live if the target stamped it less than [`LOCK_STALE_SECS`] before the
//! reader's own lock (so both times are the target's clock). A holder that could not
//! rewrite its lock for [`LOCK_LAPSE_SECS`] (half the stale time) may have looked dead to
//! the other side: a backup then fails before it writes its manifest, and a prune stops
//! deleting. A holder killed with its lock in place blocks the other side for at most the
//! stale time.
//!
//! Readers (a restore, a standby's apply, a verify) hold a third kind, `read`, naming the
//! backups they read (`readers.rs`): it does not stop a prune, which keeps what those backups
//! name instead, and a reader waits out a live prune before it relies on the target, as a
//! backup does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::constants::{LOCK_LAPSE_SECS, LOCK_REFRESH_SECS, LOCK_STALE_SECS, LOCK_WAIT_POLL_MS};
use crate::error::BackupError;
use crate::target::{Listed, Target};

pub const LOCKS: &str = "locks";

/// What holds a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockKind {
    Backup,
    Prune,
    /// A reader of backups: a prune keeps every block they name (`readers.rs`).
    Read,
}

impl LockKind {
    const ALL: [LockKind; 3] = [LockKind::Backup, LockKind::Prune, LockKind::Read];

    fn word(self) -> &'static str {
        match self {
            LockKind::Backup => "backup",
            LockKind::Prune => "prune",
            LockKind::Read => "read",
        }
    }
}

/// A lock's body, for people reading the target: who holds it, from where, since when.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LockBody {
    pub kind: LockKind,
    pub holder: String,
    #[serde(default)]
    pub cluster: Option<String>,
    #[serde(default)]
    pub host: Option<String>,
    pub started_ms: u64,
    /// The backups a reader reads (for [`LockKind::Read`]; empty for the others).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<String>,
}

/// Another holder's live lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub kind: LockKind,
    pub holder: String,
    /// How long before our own lock's stamp the target stamped it, in ms.
    pub age_ms: u64,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} (lock written {} s ago)",
            self.kind.word(),
            self.holder,
            self.age_ms / 1000
        )
    }
}

/// The object of a lock.
pub fn object(kind: LockKind, holder: &str) -> String {
    format!("{LOCKS}/{}-{holder}.json", kind.word())
}

/// The kind and holder of a lock's object name, if it is one.
pub fn parse_object(name: &str) -> Option<(LockKind, &str)> {
    let file = name.strip_prefix(LOCKS)?.strip_prefix('/')?;
    let stem = file.strip_suffix(".json")?;
    LockKind::ALL.into_iter().find_map(|kind| {
        let holder = stem.strip_prefix(kind.word())?.strip_prefix('-')?;
        (!holder.is_empty()).then_some((kind, holder))
    })
}

/// The largest lock body read from a target (a few backup names and a host).
pub(crate) const MAX_BODY_BYTES: u64 = 64 << 10;

/// Every lock of `kind` on `target`, with its body: for a holder that knows some of them
/// are dead (a controller's own prune locks, left when it was killed). A lock whose body is
/// gone since the listing, or does not decode, is left out.
pub async fn bodies(
    target: &Target,
    kind: LockKind,
) -> Result<Vec<(String, LockBody)>, BackupError> {
    let mut found = Vec::new();
    for object in target.list(LOCKS).await? {
        if parse_object(&object).is_none_or(|(k, _)| k != kind) {
            continue;
        }
        let Some(bytes) = target.get(&object, MAX_BODY_BYTES).await? else {
            continue;
        };
        match serde_json::from_slice::<LockBody>(&bytes) {
            Ok(body) => found.push((object, body)),
            Err(e) => tracing::debug!(lock = %object, error = %e, "lock body does not decode"),
        }
    }
    Ok(found)
}

/// The live locks among `listed`, other than `own`, judged against `own_ms` (the target's
/// stamp of our own lock). `stale_ms` is [`LOCK_STALE_SECS`] outside tests.
pub fn live_others(listed: &[Listed], own: &str, own_ms: u64, stale_ms: u64) -> Vec<Held> {
    listed
        .iter()
        .filter(|l| l.name != own)
        .filter_map(|l| {
            let (kind, holder) = parse_object(&l.name)?;
            let age_ms = own_ms.saturating_sub(l.modified_ms);
            (age_ms < stale_ms).then(|| Held {
                kind,
                holder: holder.to_owned(),
                age_ms,
            })
        })
        .collect()
}

/// When the lock was last known to be live.
#[derive(Debug)]
struct Freshness {
    /// The start of the last write the target acknowledged: its stamp is no older.
    last_ok: Instant,
}

/// A lock this process holds on a target, rewritten in the background until released.
pub struct Lock {
    target: Target,
    object: String,
    fresh: Arc<Mutex<Freshness>>,
    lapsed: Arc<AtomicBool>,
    refresher: tokio::task::JoinHandle<()>,
    /// The target's stamp of the first write.
    stamped_ms: u64,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lock({} on {})", self.object, self.target.name())
    }
}

impl Lock {
    /// Writes the lock and starts rewriting it every [`LOCK_REFRESH_SECS`].
    pub async fn take(target: &Target, body: LockBody) -> Result<Lock, BackupError> {
        let object = object(body.kind, &body.holder);
        let bytes =
            Bytes::from(
                serde_json::to_vec_pretty(&body).map_err(|e| BackupError::Invalid {
                    what: format!("encode lock {object}: {e}"),
                })?,
            );
        let start = Instant::now();
        target.put(&object, bytes.clone()).await?;
        let stamped_ms =
            target
                .modified_ms(&object)
                .await?
                .ok_or_else(|| BackupError::BadTarget {
                    target: target.name().to_owned(),
                    why: format!("lock {object} was written but is not there"),
                })?;
        let fresh = Arc::new(Mutex::new(Freshness { last_ok: start }));
        let lapsed = Arc::new(AtomicBool::new(false));
        let refresher = tokio::spawn(refresh(
            target.clone(),
            object.clone(),
            bytes,
            fresh.clone(),
            lapsed.clone(),
        ));
        Ok(Lock {
            target: target.clone(),
            object,
            fresh,
            lapsed,
            refresher,
            stamped_ms,
        })
    }

    pub fn object(&self) -> &str {
        &self.object
    }

    /// The target the lock is on.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The target's stamp of the lock's first write: "now" by the target's clock.
    pub fn stamped_ms(&self) -> u64 {
        self.stamped_ms
    }

    /// The live locks of others on the target, judged by the target's clock: against the
    /// stamp of our own lock's latest write in the same listing.
    pub async fn others(&self) -> Result<Vec<Held>, BackupError> {
        let listed = self.target.list_listed(LOCKS).await?;
        let own_ms = listed
            .iter()
            .find(|l| l.name == self.object)
            .map_or(self.stamped_ms, |l| l.modified_ms);
        Ok(live_others(
            &listed,
            &self.object,
            own_ms,
            LOCK_STALE_SECS * 1000,
        ))
    }

    /// Waits while a prune holds the target (at most the stale time of its lock): a backup
    /// or a reader then relies on no block vanishing, since any later prune sees this lock.
    pub async fn wait_out_prunes(&self) -> Result<(), BackupError> {
        let since = Instant::now();
        loop {
            let prunes: Vec<_> = self
                .others()
                .await?
                .into_iter()
                .filter(|h| h.kind == LockKind::Prune)
                .collect();
            let Some(first) = prunes.first() else {
                return Ok(());
            };
            if since.elapsed() > Duration::from_secs(LOCK_STALE_SECS) {
                return Err(BackupError::Busy {
                    target: self.target.name().to_owned(),
                    why: format!("a prune still holds it after {LOCK_STALE_SECS} s: {first}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(LOCK_WAIT_POLL_MS)).await;
        }
    }

    /// Fails if the lock may have looked dead to another holder at any time since it was
    /// taken: a backup must not then write its manifest, nor a prune go on deleting.
    pub fn check(&self) -> Result<(), BackupError> {
        let since = self.fresh.lock().map(|f| f.last_ok.elapsed()).ok();
        let lapse = Duration::from_secs(LOCK_LAPSE_SECS);
        if self.lapsed.load(Ordering::SeqCst) || since.is_none_or(|s| s > lapse) {
            return Err(BackupError::LockLapsed {
                target: self.target.name().to_owned(),
                lock: self.object.clone(),
                secs: LOCK_LAPSE_SECS,
            });
        }
        Ok(())
    }

    /// Stops rewriting the lock and deletes it. A lock that cannot be deleted goes stale.
    pub async fn release(self) {
        self.refresher.abort();
        if let Err(e) = self.target.delete(&self.object).await {
            tracing::warn!(lock = %self.object, error = %e,
                "cannot delete a lock on the backup target; it goes stale by itself");
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        self.refresher.abort();
    }
}

async fn refresh(
    target: Target,
    object: String,
    body: Bytes,
    fresh: Arc<Mutex<Freshness>>,
    lapsed: Arc<AtomicBool>,
) {
    let lapse = Duration::from_secs(LOCK_LAPSE_SECS);
    loop {
        tokio::time::sleep(Duration::from_secs(LOCK_REFRESH_SECS)).await;
        let start = Instant::now();
        match target.put(&object, body.clone()).await {
            Ok(()) => {
                if let Ok(mut f) = fresh.lock() {
                    // From the start of the last acknowledged write to the end of this one:
                    // the longest the target's stamp may have been that old.
                    if f.last_ok.elapsed() > lapse {
                        lapsed.store(true, Ordering::SeqCst);
                    }
                    f.last_ok = start;
                }
            }
            Err(e) => {
                tracing::warn!(lock = %object, error = %e, "cannot rewrite a lock on the backup target");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn listed(name: &str, modified_ms: u64) -> Listed {
        Listed {
            name: name.into(),
            size: 1,
            modified_ms,
        }
    }

    #[tokio::test]
    async fn a_lock_unwritten_for_the_lapse_time_fails_its_check() {
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::TargetSpec::Dir {
            path: dir.path().display().to_string(),
        };
        let target = Target::open("t", &spec, None).unwrap();
        let body = LockBody {
            kind: LockKind::Backup,
            holder: "v-1".into(),
            cluster: None,
            host: None,
            started_ms: 0,
            reads: Vec::new(),
        };
        let lock = Lock::take(&target, body).await.unwrap();
        lock.check().unwrap();
        let long_ago = Instant::now()
            .checked_sub(Duration::from_secs(LOCK_LAPSE_SECS + 1))
            .unwrap();
        lock.fresh.lock().unwrap().last_ok = long_ago;
        let e = lock.check().unwrap_err().to_string();
        assert!(
            e.contains("lock locks/backup-v-1.json could not be rewritten"),
            "{e}"
        );
        lock.release().await;
        assert!(target.list(LOCKS).await.unwrap().is_empty());
    }

    #[test]
    fn lock_names_parse_and_garbage_does_not() {
        assert_eq!(object(LockKind::Backup, "db-1"), "locks/backup-db-1.json");
        assert_eq!(
            parse_object("locks/backup-db-1.json"),
            Some((LockKind::Backup, "db-1"))
        );
        assert_eq!(
            parse_object("locks/prune-c1-5.json"),
            Some((LockKind::Prune, "c1-5"))
        );
        assert_eq!(
            parse_object("locks/read-db-1-9f.json"),
            Some((LockKind::Read, "db-1-9f"))
        );
        for junk in [
            "",
            "locks/",
            "locks/read-.json",
            "locks/reader-a.json",
            "locks/x.json",
            "lock/backup-a.json",
            "locks/backup-a",
        ] {
            assert_eq!(parse_object(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn only_live_locks_of_others_count() {
        let all = [
            listed("locks/prune-me.json", 1_000_000),
            listed("locks/backup-fresh.json", 999_000),
            listed("locks/backup-old.json", 1_000_000 - 600_000 - 1),
            listed("locks/notalock.txt", 1_000_000),
            // Stamped after ours (the target's clock moved on while we listed): live.
            listed("locks/prune-later.json", 1_000_500),
        ];
        let live = live_others(&all, "locks/prune-me.json", 1_000_000, 600_000);
        let names: Vec<_> = live.iter().map(|h| h.holder.as_str()).collect();
        assert_eq!(names, ["fresh", "later"]);
        assert_eq!(live[0].age_ms, 1000);
        assert!(live[0].to_string().contains("backup fresh"));
    }
}
