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
    /// The target kept answering "slow down" (503 SlowDown, 429) past the retry time.
    #[error(
        "backup target {target} is throttling requests ({answer}; {answers} error answers): \
         {what}: {source}"
    )]
    Throttled {
        target: String,
        what: String,
        answer: String,
        /// Error answers of the target so far (each retried, but the last).
        answers: u64,
        /// Boxed: the variant would be the enum's largest by far.
        #[source]
        source: Box<object_store::Error>,
    },
    /// The target has no space left (ENOSPC, or a quota: EDQUOT).
    #[error("backup target {target} is full: {what}: {source}")]
    Full {
        target: String,
        what: String,
        /// Boxed, as in `Throttled`: the enum stays as small as before the two were added.
        #[source]
        source: Box<object_store::Error>,
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
    /// A backup and a prune of one target would overlap (`locks.rs`).
    #[error("backup target {target} is busy: {why}")]
    Busy { target: String, why: String },
    /// This holder's lock went unwritten long enough to look dead to others.
    #[error(
        "backup target {target}: lock {lock} could not be rewritten for {secs} s, so a prune \
         may have run meanwhile; stopped before anything relies on it (try again)"
    )]
    LockLapsed {
        target: String,
        lock: String,
        secs: u64,
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

/// Whether `e`, or an error it was caused by, is a disk full (ENOSPC) or a quota (EDQUOT).
pub(crate) fn is_out_of_space(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
                || io.kind() == std::io::ErrorKind::StorageFull
                || io.kind() == std::io::ErrorKind::QuotaExceeded
            {
                return true;
            }
        }
        at = err.source();
    }
    false
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
