//! Snapshots: taking one on every in-sync replica at one cut of the write stream
//! (`create`), bringing a replica that missed a snapshot up to it (`catchup`), and sending
//! one off the cluster as a backup (`backups`, to the targets of `backup_targets`, with what
//! the jobs share in `backup_settings`) and making a volume from one (`restores`, tried again
//! by `retries`), or keeping a standby of another cluster's volume from its backups
//! (`standby`); backups on a schedule (`schedules`), and what they keep and prune
//! (`retention`). The routes are in `api::snapshots` and `api::backups`; restoring a volume
//! from a snapshot is `volumes::restore`.

pub(crate) mod backup_settings;
pub(crate) mod backup_targets;
pub(crate) mod backups;
pub(crate) mod catchup;
pub(crate) mod create;
pub(crate) mod cron;
pub(crate) mod prune_locks;
pub(crate) mod prune_runs;
pub(crate) mod restore_holds;
pub(crate) mod restores;
pub(crate) mod retention;
pub(crate) mod retries;
pub(crate) mod schedules;
pub(crate) mod standby;
