//! Errors of pools and replicas. Control-path errors ([`StorageError`]) carry the names and
//! numbers a human needs; data-path errors ([`ReplicaIoError`]) are small and map one to one to
//! wire statuses.

use std::path::PathBuf;

use hawser_wire::meta::MetaError;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(
        "pool {pool:?} has no room for a {kind} replica of {need} bytes \
         ({available} bytes available)"
    )]
    NoRoom {
        pool: String,
        kind: &'static str,
        need: u64,
        available: u64,
    },
    #[error("pool {pool:?} does not take {kind} replicas")]
    WrongKind { pool: String, kind: &'static str },
    #[error("replica {id:?} already exists in pool {pool:?}")]
    ReplicaExists { pool: String, id: String },
    #[error("replica {id:?} not found")]
    ReplicaNotFound { id: String },
    #[error(
        "replica {id:?} would be a copy of {source_id:?}, whose data is encrypted with another \
         key (or is not encrypted where the copy would be, or the reverse)"
    )]
    KeyMismatch { id: String, source_id: String },
    #[error("replica {id:?} is not an encrypted volume's: it keeps no wrapped data key")]
    NotEncrypted { id: String },
    #[error("invalid replica size {size}: must be a positive multiple of 4096")]
    InvalidSize { size: u64 },
    #[error(
        "replica {id:?} is {size} bytes; shrinking to {asked} is not supported (data past \
         the new end would be lost)"
    )]
    Shrink { id: String, size: u64, asked: u64 },
    #[error(
        "replica {id:?} is in use by an engine (an attached volume's, or one still connected); \
         detach its volume first"
    )]
    InUse { id: String },
    #[error(
        "this node's replicas belong to cluster {mine}, not to cluster {asked}: a controller \
         of another cluster (a wiped, restored or wrong store?) may not create replicas here"
    )]
    OtherCluster { mine: String, asked: String },
    #[error("invalid replica, volume or snapshot id {id:?}")]
    InvalidId { id: String },
    #[error("snapshot {snapshot:?} of replica {replica:?} not found")]
    SnapshotNotFound { replica: String, snapshot: String },
    #[error("replica {replica:?} already holds snapshot {snapshot:?}")]
    SnapshotExists { replica: String, snapshot: String },
    #[error(
        "replica {id:?} is at epoch {current}; a request of epoch {epoch} comes from an \
         engine that was replaced (fenced)"
    )]
    StaleEpoch {
        id: String,
        epoch: u64,
        current: u64,
    },
    #[error("replica {id:?} is marked failed")]
    Failed { id: String },
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("replica metadata {path} is unreadable: {source}")]
    Meta { path: PathBuf, source: MetaError },
}

impl StorageError {
    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            context,
            path: path.into(),
            source,
        }
    }
}

/// Why a data-path operation on a replica failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaIoError {
    #[error("request epoch {request} is older than the replica's epoch {replica}")]
    StaleEpoch { request: u64, replica: u64 },
    #[error("offset/length out of range or not 512-byte aligned")]
    OutOfRange,
    #[error("no space left on the pool's filesystem")]
    NoSpace,
    #[error("disk I/O error (errno {errno})")]
    Io { errno: i32 },
    #[error("replica is marked failed")]
    Failed,
    #[error("{blocks} block(s) from byte {offset} fail their checksum: the disk returned other data than was written")]
    Corrupt { offset: u64, blocks: u32 },
}

impl ReplicaIoError {
    pub fn from_io(e: &std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ReplicaIoError::NoSpace,
            Some(errno) => ReplicaIoError::Io { errno },
            None => ReplicaIoError::Io { errno: libc::EIO },
        }
    }
}
