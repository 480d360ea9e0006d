//! The controller's hold on the backup a volume is restored from, for as long as the volume
//! is `restoring` (docs/backup.md, "Why a prune never deletes a block a restore reads").
//!
//! Each replica's job holds the backup while it reads (`hawser-backup` `readers.rs`), but a
//! job's hold ends with the job, and a finished job lives only in its agent's memory. Without
//! a hold of its own, a backup deleted during the restore could be pruned once the last job
//! ended and before the controller cleared `restoring`; an agent restarted then loses its
//! finished job, which runs again, finds no backup, and leaves the volume `restoring` for
//! good. So the restore itself holds the backup: from the request (the lock is written before
//! the volume is marked, and confirmed in the background: a request does not wait out a
//! prune) until `restoring` is cleared or the volume is gone.
//!
//! A hold lives in the controller that took it. A new leader takes its own at its first
//! turn; the old one's lock stays live for the stale time after its controller died, so a
//! prune between the two still keeps the backup. Every hold of one restore is named
//! `restore-<volume uid>-<ms>`, so the new hold, once confirmed, deletes the old ones
//! ([`hawser_backup::ReadHold::supersede`]) rather than leave them to hold the backup for
//! the stale time after the restore ends. A hold that cannot be taken (the target
//! is down, or the backup was pruned before the first hold was confirmed) is tried again
//! every [`RETAKE_EVERY`]; the restore goes on meanwhile, its jobs holding the backup.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hawser_backup::{ReadHold, Target};
use tokio::sync::oneshot;

use crate::store::model::{now_ms, BackupRef, VolumeRecord};

/// How often a hold that could not be taken, or lapsed, is taken again.
pub const RETAKE_EVERY: Duration = Duration::from_secs(30);

/// What every hold of `v`'s restore is named by: its uid (its name, for a volume older than
/// uids), which a namesake created later does not share.
pub fn prefix(v: &VolumeRecord) -> String {
    format!("restore-{}-", v.uid.as_deref().unwrap_or(&v.name))
}

/// A new hold's name.
pub fn holder(prefix: &str) -> String {
    format!("{prefix}{}", now_ms())
}

/// The holds of this controller, by volume.
#[derive(Debug, Default)]
pub struct RestoreHolds {
    held: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    from: BackupRef,
    /// Dropped or sent: the holder task lets the backup go.
    release: oneshot::Sender<()>,
    /// When the holder task was started.
    since: Instant,
}

impl RestoreHolds {
    /// Keeps `volume`'s hold on `from`: `written` (its lock already written) or, when none,
    /// a hold taken in the background. Replaces any hold `volume` had.
    pub fn keep(
        &self,
        v: &VolumeRecord,
        from: &BackupRef,
        target: Target,
        written: Option<ReadHold>,
    ) {
        let volume = v.name.as_str();
        let (release, released) = oneshot::channel();
        tokio::spawn(hold(
            target,
            from.clone(),
            Named {
                volume: volume.to_owned(),
                prefix: prefix(v),
            },
            written,
            released,
        ));
        if let Ok(mut h) = self.held.lock() {
            h.insert(
                volume.to_owned(),
                Entry {
                    from: from.clone(),
                    release,
                    since: Instant::now(),
                },
            );
        }
    }

    /// Whether `volume` needs a hold on `from` taken now: it has none, or one of another
    /// backup, or its holder task ended (could not take it, or it lapsed) at least
    /// [`RETAKE_EVERY`] after it started.
    pub fn wanted(&self, volume: &str, from: &BackupRef) -> bool {
        let Ok(h) = self.held.lock() else {
            return false;
        };
        match h.get(volume) {
            None => true,
            Some(e) if &e.from != from => true,
            Some(e) => e.release.is_closed() && e.since.elapsed() >= RETAKE_EVERY,
        }
    }

    /// Lets `volume`'s backup go (its restore is done).
    pub fn release(&self, volume: &str) {
        if let Ok(mut h) = self.held.lock() {
            h.remove(volume);
        }
    }

    /// Keeps only the holds of `restoring` volumes: the others were deleted, finished by
    /// another controller, or this one no longer leads (then `restoring` is empty).
    pub fn retain(&self, restoring: &BTreeSet<String>) {
        if let Ok(mut h) = self.held.lock() {
            h.retain(|v, _| restoring.contains(v));
        }
    }
}

/// Whose hold a holder task keeps.
struct Named {
    volume: String,
    prefix: String,
}

/// The holder task: takes (or confirms) the hold, then keeps it until released or lapsed.
async fn hold(
    target: Target,
    from: BackupRef,
    named: Named,
    written: Option<ReadHold>,
    mut released: oneshot::Receiver<()>,
) {
    let volume = named.volume.as_str();
    let taken = match written {
        Some(h) => h,
        None => {
            let name = holder(&named.prefix);
            tokio::select! {
                h = ReadHold::write_as(&target, &from.backup, &name) => match h {
                    Ok(h) => h,
                    Err(e) => return not_held(volume, &from, &e),
                },
                _ = &mut released => return,
            }
        }
    };
    tokio::select! {
        confirmed = taken.confirm() => if let Err(e) = confirmed {
            taken.release().await;
            return not_held(volume, &from, &e);
        },
        _ = &mut released => return taken.release().await,
    }
    tracing::debug!(volume, backup = %from.backup, "restore holds its backup");
    // The holds of controllers before this one (killed, or no longer leading).
    match taken.supersede(&named.prefix).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(volume, superseded = n, "older holds of the restore deleted"),
        Err(e) => tracing::debug!(volume, error = %e, "older holds of the restore left to lapse"),
    }
    let check_every = Duration::from_secs(hawser_backup::constants::LOCK_REFRESH_SECS);
    loop {
        tokio::select! {
            _ = &mut released => break,
            _ = tokio::time::sleep(check_every) => {
                if let Err(e) = taken.check() {
                    tracing::warn!(volume, backup = %from.backup, error = %e,
                        "restore's hold on its backup lapsed; it is taken again");
                    break;
                }
            }
        }
    }
    taken.release().await;
}

fn not_held(volume: &str, from: &BackupRef, e: &hawser_backup::BackupError) {
    tracing::warn!(volume, target = %from.target, backup = %from.backup, error = %e,
        "restore cannot hold its backup on the target yet; its jobs hold it while they read");
}
