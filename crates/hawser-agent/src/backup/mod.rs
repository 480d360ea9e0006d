//! Backups run on this node (docs/backup.md): the controller picks a node whose replica holds
//! the volume's snapshot and asks it to send that snapshot to a target
//! (`POST /v1/backup-jobs`), then follows the job (`GET /v1/backup-jobs/{backup}`) until it
//! ends. The data goes from the replica's snapshot file to the target without passing through
//! the controller. Jobs live in memory: after an agent restart the controller finds none and
//! marks the backup failed; the blocks it stored are reused by the next one.
//!
//! A volume created from a backup is filled the same way, the other way round: each of its
//! new replicas' nodes reads the backup from the target into its replica
//! (`POST /v1/restore-jobs`).

mod jobs;

pub use jobs::{get_job, start_job, start_restore, BackupJobs};
