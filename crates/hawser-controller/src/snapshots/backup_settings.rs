//! What a controller's backup jobs share (`AppState::backups`): where S3 credentials are
//! kept (a 0600 file per target, never the store), how fast a backup may read, and the
//! wake-ups and in-memory lists of the loops that run backups, restores, applies and prunes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hawser_backup::S3Credentials;
use tokio::sync::Notify;

use crate::errors::ControllerError;
use crate::snapshots::prune_runs::Running;
use crate::snapshots::restore_holds::RestoreHolds;
use crate::snapshots::retries::Retries;

/// Where a controller keeps what backups need outside the store, and how fast they may read.
#[derive(Clone, Debug)]
pub struct BackupSettings {
    /// `<data-dir>/backup-targets`: one 0600 credentials file per S3 target.
    pub credentials_dir: PathBuf,
    /// The most a backup reads per second on its node (0: no limit).
    pub bytes_per_sec: u64,
    /// How long one request to a target is retried before the backup fails.
    pub retry_secs: u64,
    /// The running backups this controller follows (`backups::follow`).
    pub following: Arc<Mutex<BTreeSet<String>>>,
    /// Wakes the loop over volumes that read backups (`standby::run`) when a standby is
    /// created or activated, or a restore from a backup starts.
    pub standby_wake: Arc<Notify>,
    /// Wakes the schedule loop (`schedules::run`) when a schedule is set or a prune wanted.
    pub schedule_wake: Arc<Notify>,
    /// Targets a backup was deleted from, to prune (`retention.rs`).
    pub prune_wanted: Arc<Mutex<BTreeSet<String>>>,
    /// A block no manifest names is pruned only once the target wrote it this long ago.
    pub prune_grace_secs: u64,
    /// Restores from a backup that failed, and when each is tried again (`restores::step`).
    pub restore_retries: Arc<Retries>,
    /// The backups that restoring volumes hold on their targets (`restore_holds.rs`).
    pub restore_holds: Arc<RestoreHolds>,
    /// The prunes this process runs (`prune_runs.rs`).
    pub pruning: Arc<Running>,
}

impl BackupSettings {
    pub fn new(data_dir: &Path, bytes_per_sec: u64, retry_secs: u64) -> BackupSettings {
        BackupSettings {
            credentials_dir: data_dir.join("backup-targets"),
            bytes_per_sec,
            retry_secs,
            following: Default::default(),
            standby_wake: Default::default(),
            schedule_wake: Default::default(),
            prune_wanted: Default::default(),
            prune_grace_secs: hawser_backup::constants::LOCK_STALE_SECS,
            restore_retries: Default::default(),
            restore_holds: Default::default(),
            pruning: Default::default(),
        }
    }

    /// Asks for a prune of `target` on the leader's next pass (`retention::prune_wanted`).
    pub fn want_prune(&self, target: &str) {
        if let Ok(mut w) = self.prune_wanted.lock() {
            w.insert(target.to_owned());
        }
        self.schedule_wake.notify_one();
    }

    pub(crate) fn credentials_path(&self, target: &str) -> PathBuf {
        self.credentials_dir.join(format!("{target}.credentials"))
    }

    /// The target's access key, if this controller holds one.
    pub fn credentials(&self, target: &str) -> Result<Option<S3Credentials>, ControllerError> {
        let path = self.credentials_path(target);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                S3Credentials::parse(&text)
                    .map(Some)
                    .map_err(|e| ControllerError::BackupTarget {
                        target: target.into(),
                        reason: e.to_string(),
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ControllerError::BackupTarget {
                target: target.into(),
                reason: format!("read {}: {e}", path.display()),
            }),
        }
    }

    /// Writes the key as a 0600 file, whole or not at all (a temporary file renamed).
    pub(crate) fn save_credentials(
        &self,
        target: &str,
        key: &S3Credentials,
    ) -> Result<(), ControllerError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let fail = |what: &str, e: std::io::Error| ControllerError::BackupTarget {
            target: target.into(),
            reason: format!("{what} {}: {e}", self.credentials_dir.display()),
        };
        std::fs::create_dir_all(&self.credentials_dir).map_err(|e| fail("create", e))?;
        let tmp = self
            .credentials_dir
            .join(format!(".{target}.credentials.tmp"));
        let body = format!(
            "access_key_id = {}\nsecret_access_key = {}\n",
            key.access_key_id, key.secret_access_key
        );
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| fail("write in", e))?;
        f.write_all(body.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| fail("write in", e))?;
        std::fs::rename(&tmp, self.credentials_path(target)).map_err(|e| fail("rename in", e))
    }
}
