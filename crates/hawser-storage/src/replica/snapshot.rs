//! A replica's snapshots: read-only copies of its data file at a moment, kept beside it as
//! `<replica>.snaps/<snapshot>.snap` in the pool's directory.
//!
//! Taking one is a flush of the data file and a [`clone_file`] of it: shared extents where the
//! filesystem has reflinks (instant, no space until either side is written), else a copy of
//! its allocated ranges (ext4: takes time and space in proportion to the data; see
//! docs/snapshots.md). The replica's writes must be held meanwhile: the engine does that for
//! an attached volume (no request in flight, every replica flushed), and a detached volume has
//! no writer. A snapshot file exists complete or not at all (made under a temporary name).
//!
//! Like data operations, taking a snapshot carries the engine's epoch and is refused from an
//! engine older than the replica's: a fenced engine cannot record a snapshot.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::clone::{clone_file, CloneKind};
use crate::error::StorageError;
use crate::file_ops;
// The snapshot part of `Replica`'s impl, a child module of replica.rs, which calls it.
use crate::replica::Replica;

/// One snapshot of a replica, as its file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFile {
    pub id: String,
    pub size: u64,
    /// Bytes its file occupies on disk (extents it shares with others included).
    pub allocated_bytes: u64,
}

/// A snapshot just taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub file: SnapshotFile,
    /// How the copy was made; `None` when it existed already (a retry).
    pub kind: Option<CloneKind>,
    /// Time the flush and the copy took.
    pub micros: u64,
}

const EXT: &str = "snap";

/// `<data dir>/<id>.snaps`.
pub(crate) fn snaps_dir(data_path: &Path) -> PathBuf {
    data_path.with_extension("snaps")
}

impl Replica {
    fn snapshot_path(&self, snapshot: &str) -> PathBuf {
        snaps_dir(self.data_path()).join(format!("{snapshot}.{EXT}"))
    }

    /// Where snapshot `snapshot` is, if the replica has it.
    pub fn snapshot_file(&self, snapshot: &str) -> Result<PathBuf, StorageError> {
        let p = self.snapshot_path(snapshot);
        if crate::file_ops::valid_id(snapshot) && p.exists() {
            Ok(p)
        } else {
            Err(StorageError::SnapshotNotFound {
                replica: self.id().into(),
                snapshot: snapshot.into(),
            })
        }
    }

    /// Takes snapshot `snapshot` of the data as it is now, for an engine of `epoch`. Taking
    /// one that exists already returns it unchanged (a retried request).
    pub fn take_snapshot(&self, epoch: u64, snapshot: &str) -> Result<Taken, StorageError> {
        if !crate::file_ops::valid_id(snapshot) {
            return Err(StorageError::InvalidId {
                id: snapshot.into(),
            });
        }
        let current = self.epoch();
        if epoch < current {
            return Err(StorageError::StaleEpoch {
                id: self.id().into(),
                epoch,
                current,
            });
        }
        if self.is_failed() {
            return Err(StorageError::Failed {
                id: self.id().into(),
            });
        }
        let path = self.snapshot_path(snapshot);
        if path.exists() {
            return Ok(Taken {
                file: self.describe(snapshot, &path)?,
                kind: None,
                micros: 0,
            });
        }
        let started = Instant::now();
        let dir = snaps_dir(self.data_path());
        std::fs::create_dir_all(&dir)
            .map_err(|e| StorageError::io("create snapshot directory", &dir, e))?;
        file_ops::sync_dir(&dir).map_err(|e| StorageError::io("sync pool directory", &dir, e))?;
        self.sync_data()
            .map_err(|e| StorageError::io("flush replica data file", self.data_path(), e))?;
        let kind = clone_file(self.data_path(), &path, self.size())
            .map_err(|e| StorageError::io("copy replica data file to snapshot", &path, e))?;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        tracing::info!(
            replica = %self.id(), snapshot, how = kind.name(), micros, "snapshot taken"
        );
        Ok(Taken {
            file: self.describe(snapshot, &path)?,
            kind: Some(kind),
            micros,
        })
    }

    /// The replica's snapshots, by id.
    pub fn snapshots(&self) -> Vec<SnapshotFile> {
        let dir = snaps_dir(self.data_path());
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out: Vec<SnapshotFile> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let id = name.strip_suffix(&format!(".{EXT}"))?.to_string();
                self.describe(&id, &e.path()).ok()
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Deletes snapshot `snapshot`; one the replica does not have is deleted already.
    pub fn delete_snapshot(&self, snapshot: &str) -> Result<(), StorageError> {
        if !crate::file_ops::valid_id(snapshot) {
            return Err(StorageError::InvalidId {
                id: snapshot.into(),
            });
        }
        let path = self.snapshot_path(snapshot);
        match std::fs::remove_file(&path) {
            Ok(()) => file_ops::sync_dir(&path)
                .map_err(|e| StorageError::io("sync snapshot directory", &path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StorageError::io("delete snapshot", &path, e)),
        }
    }

    fn describe(&self, id: &str, path: &Path) -> Result<SnapshotFile, StorageError> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).map_err(|e| StorageError::io("stat snapshot", path, e))?;
        Ok(SnapshotFile {
            id: id.into(),
            size: m.len(),
            allocated_bytes: m.blocks().saturating_mul(512),
        })
    }
}
