//! What can go wrong with a backup or a restore, with enough context to act on: the target,
//! the backup, and the block (its index and hash) where it happened.

/// One error kind per way a backup can fail; each carries what a human needs to find it.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("backup target {target}: {what}: {source}")]
    Target {
        target: String,
        what: String,
        #[source]
        source: object_store::Error,
    },
    #[error("backup target {target} is not usable: {why}")]
    BadTarget { target: String, why: String },
    #[error("backup {backup} not found on target {target}")]
    NotFound { target: String, backup: String },
    #[error("backup {backup} already exists on target {target}")]
    Exists { target: String, backup: String },
    #[error("manifest of backup {backup} is invalid: {why}")]
    BadManifest { backup: String, why: String },
    #[error(
        "backup {backup}: block {index} (offset {offset}) is missing: object {object} is not on \
         target {target}"
    )]
    MissingBlock {
        target: String,
        backup: String,
        index: u64,
        offset: u64,
        object: String,
    },
    #[error(
        "backup {backup}: block {index} (offset {offset}) is corrupt: object {object} on target \
         {target}: {why}"
    )]
    CorruptBlock {
        target: String,
        backup: String,
        index: u64,
        offset: u64,
        object: String,
        why: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Invalid { what: String },
}

impl BackupError {
    pub(crate) fn io(what: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        BackupError::Io {
            what,
            path: path.display().to_string(),
            source,
        }
    }
}
