//! Types of backups off the cluster (docs/backup.md), shared by the controller, the agent, the
//! CLI and `hawser-backup`: where a target is, a backup as the API shows it, and the job an
//! agent runs.

use serde::{Deserialize, Serialize};

use crate::Secret;

/// Where a target is. The store keeps this; S3 credentials are never in it (docs/backup.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum TargetSpec {
    S3 {
        /// The server's URL, `http(s)://host[:port]`; requests are path-style, which every
        /// S3-compatible server takes.
        endpoint: String,
        bucket: String,
        /// Objects go under this prefix in the bucket ("" for the bucket's top).
        #[serde(default)]
        prefix: String,
        /// The signing region (most S3-compatible servers accept any; default us-east-1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        region: Option<String>,
    },
    Dir {
        /// An absolute path to a directory that exists, the same on every node that runs
        /// backups (an NFS mount, say).
        path: String,
    },
}

impl TargetSpec {
    /// One line for people: `s3 http://host:port/bucket/prefix` or `dir /path`.
    pub fn describe(&self) -> String {
        match self {
            TargetSpec::S3 {
                endpoint,
                bucket,
                prefix,
                ..
            } => {
                let p = if prefix.is_empty() {
                    String::new()
                } else {
                    format!("/{prefix}")
                };
                format!("s3 {}/{bucket}{p}", endpoint.trim_end_matches('/'))
            }
            TargetSpec::Dir { path } => format!("dir {path}"),
        }
    }
}

/// An S3 access key on its way from the operator to the controller, or from the controller to
/// the node that runs a backup (over TLS). `Debug` hides the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Key {
    pub access_key_id: String,
    /// base64 of the secret access key.
    pub secret_access_key: Secret,
}

/// `POST /v1/backup-targets`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddBackupTarget {
    pub name: String,
    pub spec: TargetSpec,
    /// For S3: kept by the controller in a 0600 file of its data directory, never in the store.
    #[serde(default)]
    pub credentials: Option<S3Key>,
}

/// A target as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupTarget {
    pub name: String,
    pub spec: TargetSpec,
    /// Whether this controller holds credentials for it.
    pub credentials: bool,
}

/// `POST /v1/backups`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBackup {
    pub volume: String,
    pub target: String,
    /// Back up this existing snapshot of the volume; otherwise one is taken (the usual
    /// crash-consistent pause) and deleted when the backup ends.
    #[serde(default)]
    pub snapshot: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupState {
    /// Blocks are being stored; no manifest yet.
    Running,
    /// The manifest is on the target: the backup is complete.
    Ready,
    /// It stopped; `error` says why. Blocks it stored are reused by the next backup.
    Failed,
}

/// How far a running backup or restore is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressView {
    /// Bytes of the volume to go through.
    pub total_bytes: u64,
    /// Bytes gone through (read and stored, or checked and written).
    pub done_bytes: u64,
    /// Bytes that crossed the network to or from the target (compressed).
    pub transferred_bytes: u64,
    /// Of the volume, per second, since the start.
    pub bytes_per_sec: u64,
    /// At that rate (None before there is one).
    pub eta_secs: Option<u64>,
    /// Requests to the target answered with a 5xx, 429 or SlowDown, or not at all, and
    /// retried: above 0, the target is throttling or failing (docs/backup.md).
    #[serde(default)]
    pub retries: u64,
}

/// What making a backup cost (also in its manifest).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupStats {
    /// Bytes of the snapshot read.
    pub read_bytes: u64,
    /// Compressed bytes this backup stored (blocks the target did not have).
    pub stored_bytes: u64,
    pub new_blocks: u64,
    /// Blocks already on the target (in the previous backup, or left by an interrupted run).
    pub reused_blocks: u64,
    /// Of `reused_blocks`, those the previous backup did not name but a look-up found on the
    /// target: left there by an interrupted backup, or by another volume's.
    #[serde(default)]
    pub found_blocks: u64,
    pub zero_blocks: u64,
    pub micros: u64,
    /// Requests to the target that were retried (5xx, 429, SlowDown, dropped connections).
    #[serde(default)]
    pub retries: u64,
}

/// A backup as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backup {
    pub name: String,
    pub volume: String,
    pub target: String,
    pub state: BackupState,
    /// The snapshot it reads (taken for it, unless the request named one).
    pub snapshot: String,
    /// The recovery point: when the snapshot was taken, ms since the Unix epoch.
    pub taken_ms: u64,
    pub size_bytes: u64,
    /// The node whose replica it reads.
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub progress: Option<ProgressView>,
    #[serde(default)]
    pub stats: Option<BackupStats>,
    #[serde(default)]
    pub error: Option<String>,
    pub created_ms: u64,
    #[serde(default)]
    pub finished_ms: Option<u64>,
}

/// An encrypted volume's key as a backup carries it (wrapped under the cluster's KEK).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupKey {
    /// The KEK it is wrapped under.
    pub kek: u32,
    /// Nonce, ciphertext and tag, base64 (docs/encryption.md).
    pub wrapped: String,
    /// The data key's check value, hex.
    pub check: String,
}

/// `POST /v1/backup-jobs` on the agent: back up one replica's snapshot.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartBackupJob {
    pub backup: String,
    pub volume: String,
    pub cluster: Option<String>,
    pub replica: String,
    pub snapshot: String,
    pub taken_ms: u64,
    pub size_bytes: u64,
    pub target: String,
    pub spec: TargetSpec,
    #[serde(default)]
    pub credentials: Option<S3Key>,
    /// The volume's last complete backup on this target, to send only what changed since.
    #[serde(default)]
    pub previous: Option<String>,
    #[serde(default)]
    pub encryption: Option<BackupKey>,
    /// The most the job reads per second (0: no limit).
    pub bytes_per_sec: u64,
    /// How long one request to the target is retried before the backup fails (None: the
    /// agent's default, `hawser_backup::constants::RETRY_TIMEOUT_SECS`).
    #[serde(default)]
    pub retry_secs: Option<u64>,
}

/// `POST /v1/restore-jobs` on the agent: fill a new, blank replica from a backup. The job is
/// named `restore-<replica>`; `GET /v1/backup-jobs/{that name}` follows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRestoreJob {
    pub replica: String,
    pub backup: String,
    pub target: String,
    pub spec: TargetSpec,
    #[serde(default)]
    pub credentials: Option<S3Key>,
    /// The most the job writes per second (0: no limit).
    pub bytes_per_sec: u64,
    /// The backup the replica holds already (a standby volume applying the next one): only
    /// the blocks that differ from it are written. None: the replica is blank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The replica holds parts of `base` over an older backup, so no one backup: every block
    /// is written, zeros too. (`base` then names a backup deleted from the target, so an
    /// agent older than this field finds no base and does the same.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub base_unknown: bool,
}

impl StartRestoreJob {
    /// The name its job goes by: one per replica for a restore into a blank replica, one per
    /// replica and backup for a standby's apply.
    pub fn job(&self) -> String {
        match &self.base {
            None => format!("restore-{}", self.replica),
            Some(_) => format!("apply-{}-{}", self.replica, self.backup),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Running,
    Done,
    Failed,
}

/// `GET /v1/backup-jobs/{backup}` on the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupJob {
    pub backup: String,
    pub state: JobState,
    pub progress: ProgressView,
    #[serde(default)]
    pub stats: Option<BackupStats>,
    #[serde(default)]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn specs_serialize_with_their_kind_and_describe_themselves() {
        let spec = TargetSpec::Dir { path: "/b".into() };
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(json, r#"{"kind":"dir","path":"/b"}"#);
        assert_eq!(serde_json::from_str::<TargetSpec>(&json).unwrap(), spec);
        let s3 = TargetSpec::S3 {
            endpoint: "http://h:1/".into(),
            bucket: "b".into(),
            prefix: "p".into(),
            region: None,
        };
        assert_eq!(s3.describe(), "s3 http://h:1/b/p");
        let bad = r#"{"kind":"s3","endpoint":"x","bucket":"b","junk":1}"#;
        assert!(serde_json::from_str::<TargetSpec>(bad).is_err());
    }

    #[test]
    fn keys_hide_their_secret() {
        let k = S3Key {
            access_key_id: "AK".into(),
            secret_access_key: Secret::new(b"sk"),
        };
        assert!(!format!("{k:?}").contains("c2s"), "{k:?}");
    }
}

/// A standby volume (docs/backup.md): a copy of another cluster's volume kept from its
/// backups on a target, each new backup applied as it lands. It cannot be attached until
/// `hawser volume activate` makes it a normal volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standby {
    pub target: String,
    /// The volume it follows, by the name its backups carry.
    pub source: String,
    /// The backup every replica holds: its snapshot's time is the recovery point. None until
    /// the first restore is done.
    #[serde(default)]
    pub applied: Option<AppliedBackup>,
    /// The backup being written over `applied` (or into blank replicas). An apply that fails
    /// or stops is started again: writing the same blocks again ends in the same bytes.
    #[serde(default)]
    pub applying: Option<String>,
    /// `hawser volume activate` was asked: the newest backup is applied, then the volume
    /// becomes a normal one.
    #[serde(default)]
    pub activating: bool,
    /// When the target was last read for new backups (ms since the Unix epoch).
    #[serde(default)]
    pub checked_ms: Option<u64>,
    /// Why the last check or apply failed (cleared by the next that works).
    #[serde(default)]
    pub error: Option<String>,
    /// A backup that vanished from the target while it was being applied (deleted and
    /// pruned at its source): the replicas may hold parts of it over `applied`, so they hold
    /// no one backup. The next apply, of the newest backup, compares every block, and
    /// `activate --as-is` waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed: Option<String>,
}

impl Standby {
    /// What `restoring` says of a standby volume.
    pub fn label(&self) -> String {
        format!("standby of {}/{}", self.target, self.source)
    }
}

/// A backup a standby volume holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedBackup {
    pub backup: String,
    /// Its snapshot's time (ms since the Unix epoch): the standby's recovery point.
    pub taken_ms: u64,
    /// When every replica held it.
    pub applied_ms: u64,
}

/// `POST /v1/volumes/{name}/activate`: a standby volume becomes a normal one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivateVolume {
    /// Do not read the target: keep the backup applied last (refused while an apply is half
    /// done, whose replicas hold neither backup). For a target that cannot be reached.
    #[serde(default)]
    pub as_is: bool,
}

/// A volume's backups on a schedule (docs/backup.md), kept in the volume's record (so on
/// Kubernetes it is the `backup_schedules` field of the HawserVolume's spec). One per target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupSchedule {
    pub target: String,
    /// When to back up: a cron expression in UTC, five fields (minute hour day-of-month month
    /// day-of-week), or six with seconds first.
    pub cron: String,
    /// How many of the backups this schedule made are kept on the target; older ones are
    /// deleted, then their blocks pruned. Backups made by hand are never deleted by it.
    pub retain: u32,
    /// The time the schedule last ran (or was first seen, for one that has not run): the
    /// next run is the first cron time after it. A controller that was down across several
    /// cron times runs once when it is back, not once for each.
    #[serde(default)]
    pub last_run_ms: Option<u64>,
    /// The backup it last started.
    #[serde(default)]
    pub last_backup: Option<String>,
    /// Why its last run did not start a backup (cleared by the next run that starts one).
    #[serde(default)]
    pub error: Option<String>,
    /// When it runs next (ms since the Unix epoch): shown by the API, not stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_ms: Option<u64>,
}

/// `PUT /v1/volumes/{name}/backup-schedules/{target}`: sets (or replaces) the volume's
/// schedule for that target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetBackupSchedule {
    pub cron: String,
    pub retain: u32,
}

/// A schedule a volume is created with (`CreateVolume.backup_schedules`; on Kubernetes a
/// StorageClass's `backupTarget`, `backupCron` and `backupRetain`): the same checks as
/// [`SetBackupSchedule`], made before the volume exists, so a typo creates nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewBackupSchedule {
    pub target: String,
    pub cron: String,
    pub retain: u32,
}

/// `POST /v1/backup-targets/{name}/prune`: what a prune of a target did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    /// Backups on the target (their manifests), all kept.
    pub backups: u64,
    /// Block objects on the target before the prune.
    pub blocks: u64,
    /// Named by no manifest, and deleted.
    pub deleted_blocks: u64,
    /// Their stored (compressed) bytes.
    pub freed_bytes: u64,
    /// Named by no manifest but written too recently to be sure no backup names them: kept
    /// for a later prune.
    pub young_blocks: u64,
    /// Deleted backups a restore or a standby still reads: their blocks are kept until it
    /// ends (0 from a controller older than reader locks).
    #[serde(default)]
    pub held_backups: u64,
    /// Manifests of deleted backups that no one reads any more, deleted with their blocks.
    #[serde(default)]
    pub retired_deleted: u64,
}
