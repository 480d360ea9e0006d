//! Snapshot copies moved between replicas: a replica that lacks a snapshot (rebuilt after the
//! snapshot was taken, or outdated then) gets it from one that holds it, sending only what
//! differs.
//!
//! The holder serves its copy read-only ([`SnapshotReader`]: reads and 64 KiB digests, the
//! replica protocol's `Checksum`). The lacking replica starts its copy as a copy of its own
//! data file ([`SnapshotFetch`]: a reflink where the pool has them), which is usually close to
//! the snapshot (the volume changed only by what was written since), compares digests block
//! by block with the holder's, overwrites the blocks that differ with the holder's bytes, and
//! links the result into place. Its own data may change while it is copied (the volume is in
//! use): that only makes more blocks differ, and every block ends as the holder's. The copy
//! is made under a temporary name and linked only once complete and durable, so a crash
//! leaves either no copy or a whole one.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use bytes::Bytes;
use hawser_wire::constants::MAX_PAYLOAD_BYTES;
use hawser_wire::frame::MAX_CHECKSUM_BYTES;

use crate::error::{ReplicaIoError, StorageError};
use crate::file_ops;
use crate::replica::snapshot::{snaps_dir, SnapshotFile};
use crate::replica::{digests, Replica};

/// A snapshot copy opened to be read by another replica.
pub struct SnapshotReader {
    file: File,
    size: u64,
}

impl SnapshotReader {
    pub fn size(&self) -> u64 {
        self.size
    }

    fn range(&self, offset: u64, len: u32, most: u32) -> Result<(), ReplicaIoError> {
        let end = offset.checked_add(u64::from(len));
        if len > most || end.is_none_or(|e| e > self.size) {
            return Err(ReplicaIoError::OutOfRange);
        }
        Ok(())
    }

    /// `len` bytes at `offset` (at most a payload).
    pub fn read(&self, offset: u64, len: u32) -> Result<Bytes, ReplicaIoError> {
        self.range(offset, len, MAX_PAYLOAD_BYTES)?;
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| ReplicaIoError::from_io(&e))?;
        Ok(Bytes::from(buf))
    }

    /// Digests of `[offset, offset+len)`, as `Op::Checksum` gives a replica's.
    pub fn checksum(&self, offset: u64, len: u32) -> Result<Bytes, ReplicaIoError> {
        self.range(offset, len, MAX_CHECKSUM_BYTES)?;
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| ReplicaIoError::from_io(&e))?;
        Ok(Bytes::from(digests(&buf)))
    }
}

/// A snapshot copy being fetched: a temporary file beside the replica's snapshots.
pub struct SnapshotFetch {
    replica: String,
    snapshot: String,
    tmp: PathBuf,
    dst: PathBuf,
    file: File,
    size: u64,
    committed: bool,
}

impl Replica {
    /// Opens snapshot `snapshot` for reading.
    pub fn open_snapshot(&self, snapshot: &str) -> Result<SnapshotReader, StorageError> {
        let path = self.snapshot_file(snapshot)?;
        let file = File::open(&path).map_err(|e| StorageError::io("open snapshot", &path, e))?;
        let size = file
            .metadata()
            .map_err(|e| StorageError::io("stat snapshot", &path, e))?
            .len();
        Ok(SnapshotReader { file, size })
    }

    /// Starts fetching snapshot `snapshot` (`size` bytes): a copy of this replica's data as
    /// it is now, cut or extended to `size`, under a temporary name. Refused if the replica
    /// already holds the snapshot.
    pub fn begin_snapshot_fetch(
        &self,
        snapshot: &str,
        size: u64,
    ) -> Result<SnapshotFetch, StorageError> {
        if !crate::file_ops::valid_id(snapshot) {
            return Err(StorageError::InvalidId {
                id: snapshot.into(),
            });
        }
        if self.is_failed() {
            return Err(StorageError::Failed {
                id: self.id().into(),
            });
        }
        let dir = snaps_dir(self.data_path());
        let dst = dir.join(format!("{snapshot}.snap"));
        if dst.exists() {
            return Err(StorageError::SnapshotExists {
                replica: self.id().into(),
                snapshot: snapshot.into(),
            });
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| StorageError::io("create snapshot directory", &dir, e))?;
        file_ops::sync_dir(&dir).map_err(|e| StorageError::io("sync pool directory", &dir, e))?;
        let tmp = dir.join(format!("{snapshot}.fetch"));
        let _ = std::fs::remove_file(&tmp);
        let data = self.data_path();
        let from = File::open(data).map_err(|e| StorageError::io("open replica data", data, e))?;
        let from_len = from
            .metadata()
            .map_err(|e| StorageError::io("stat replica data", data, e))?
            .len();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| StorageError::io("create snapshot fetch file", &tmp, e))?;
        let fetch = SnapshotFetch {
            replica: self.id().into(),
            snapshot: snapshot.into(),
            tmp,
            dst,
            file,
            size,
            committed: false,
        };
        crate::clone::clone_into(&from, &fetch.file, from_len)
            .and_then(|_| fetch.file.set_len(size))
            .map_err(|e| StorageError::io("copy replica data as a base", &fetch.tmp, e))?;
        Ok(fetch)
    }
}

impl SnapshotFetch {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Digests of `[offset, offset+len)` of the copy as it is now.
    pub fn digests(&self, offset: u64, len: u32) -> Result<Vec<u8>, StorageError> {
        let end = offset.checked_add(u64::from(len));
        if len > MAX_CHECKSUM_BYTES || end.is_none_or(|e| e > self.size) {
            return Err(StorageError::io(
                "digest a snapshot fetch",
                &self.tmp,
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| StorageError::io("read snapshot fetch file", &self.tmp, e))?;
        Ok(digests(&buf))
    }

    /// Overwrites `[offset, offset+data.len())` with the holder's bytes.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(StorageError::io(
                "write a snapshot fetch",
                &self.tmp,
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        self.file
            .write_all_at(data, offset)
            .map_err(|e| StorageError::io("write snapshot fetch file", &self.tmp, e))
    }

    /// Makes the copy durable and links it into place as the replica's snapshot.
    pub fn commit(mut self) -> Result<SnapshotFile, StorageError> {
        self.file
            .sync_all()
            .map_err(|e| StorageError::io("flush snapshot fetch file", &self.tmp, e))?;
        // A link, not a rename: a copy that appeared meanwhile is not replaced.
        std::fs::hard_link(&self.tmp, &self.dst)
            .map_err(|e| StorageError::io("link fetched snapshot", &self.dst, e))?;
        self.committed = true;
        let _ = std::fs::remove_file(&self.tmp);
        file_ops::sync_dir(&self.dst)
            .map_err(|e| StorageError::io("sync snapshot directory", &self.dst, e))?;
        tracing::info!(
            replica = %self.replica, snapshot = %self.snapshot, "snapshot fetched"
        );
        Ok(SnapshotFile {
            id: self.snapshot.clone(),
            size: self.size,
            allocated_bytes: 0,
        })
    }
}

impl Drop for SnapshotFetch {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
