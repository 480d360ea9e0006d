//! Storage pools (a directory on a local filesystem) and replicas (a data file plus a metadata
//! record) on one node. Blocking I/O only: callers run it on a thread pool.

pub mod aligned;
mod chunk_bits;
pub mod clone;
pub mod error;
pub mod file_ops;
pub mod gate;
pub mod journal_file;
pub mod pool;
pub mod replica;
pub mod ring;
pub mod snapshot_fetch;
pub mod sums;

pub use aligned::AlignedBuf;
pub use error::{ReplicaIoError, StorageError};
pub use journal_file::Stored as StoredJournal;
pub use pool::{
    node_boot_id, BrokenReplica, Pool, PoolConfig, PoolKind, PoolUsage, TrashedReplica,
};
pub use replica::snapshot::{SnapshotFile, Taken};
pub use replica::{NewReplica, Replica};

#[cfg(test)]
mod grow_tests;
#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod sums_tests;
#[cfg(test)]
mod tests;
