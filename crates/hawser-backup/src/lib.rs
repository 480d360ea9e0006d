//! Backups that leave the cluster (docs/backup.md). A backup is a volume's snapshot cut into
//! blocks, each stored once on a target (an S3-compatible store or a directory) under the
//! SHA-256 of its content, zstd-compressed, and a manifest naming them, written last.
//! Backups of one volume share every block they have in common, so a second backup stores
//! only what changed; a restore checks each block against its name before it writes it.
//!
//! This crate owns the format and the transfer; which node runs a backup, and the records
//! of targets and backups, belong to the controller and the agent.

pub mod block;
pub mod constants;
mod error;
pub mod health;
pub mod locks;
pub mod manifest;
pub mod names;
pub mod progress;
pub mod prune;
pub mod readers;
pub mod restore;
pub mod target;
pub mod upload;

pub use error::BackupError;
pub use manifest::{BackupKey, BackupStats, Manifest};
pub use progress::{Progress, ProgressView};
pub use readers::{read_held_manifest, retire, ReadHold};
pub use restore::{
    latest_backup, list_backups, read_manifest, restore, restore_over, Before, Chunk, Dest,
};
pub use target::{S3Credentials, Target, TargetSpec};
pub use upload::{back_up, BackupPlan};
