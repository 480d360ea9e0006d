//! One replica: a data file (`<id>.data`, O_DIRECT) holding the volume's bytes at their own
//! offsets, and a metadata record (`<id>.meta`) replaced atomically.
//!
//! Fencing lives here: every data operation carries the epoch of the engine that sent it, and
//! is refused when that epoch is older than the replica's. Data operations hold a ticket of
//! `epoch_gate` across the check *and* the I/O (on the io_uring, until its completion), and
//! raising the epoch waits until no ticket is out, so once a newer engine's Hello has been
//! answered no write of an older engine can still land.

pub(crate) mod replica_sums;
pub mod snapshot;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hawser_wire::constants::{BLOCK_BYTES, SECTOR_BYTES};
use hawser_wire::frame::{CHECKSUM_BLOCK_BYTES, CHECKSUM_DIGEST_BYTES, MAX_CHECKSUM_BYTES};
use hawser_wire::journal::{Journal, ACTIVITY_EXTENT_BYTES};
use hawser_wire::meta::{ReplicaDiskState, ReplicaMeta, WrappedKey};
use sha2::{Digest, Sha256};

use self::replica_sums::Cover;
use crate::aligned::{is_aligned, AlignedBuf};
use crate::chunk_bits::ChunkBits;
use crate::error::{ReplicaIoError, StorageError};
use crate::file_ops;
use crate::gate::{EpochGate, Ticket};
use crate::journal_file::{JournalFile, Stored};
use crate::ring::{self, Kind, Op, Reserved};
use crate::sums::{is_whole, Sums};

/// `CHECKSUM_BLOCK_BYTES` as a slice length (64 KiB fits any usize).
#[allow(clippy::cast_possible_truncation)]
const CHECKSUM_BLOCK_USIZE: usize = CHECKSUM_BLOCK_BYTES as usize;

/// The digests `Op::Checksum` answers with: one truncated SHA-256 per 64 KiB block of `data`
/// (the last block may be short).
pub fn digests(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len().div_ceil(CHECKSUM_BLOCK_USIZE) * 16);
    for block in data.chunks(CHECKSUM_BLOCK_USIZE) {
        out.extend_from_slice(&Sha256::digest(block)[..CHECKSUM_DIGEST_BYTES]);
    }
    out
}

/// Largest zero buffer written when the filesystem cannot zero a range by itself.
const ZERO_CHUNK_BYTES: usize = 1 << 20;

/// Thin replicas allocate space in chunks of this size. An O_DIRECT write into a hole makes
/// ext4/xfs allocate blocks under the inode's exclusive lock, which serialises small random
/// writes (measured: 4k QD128 random writes 5.7x slower than into allocated space). So the
/// first write into a chunk fallocates the whole chunk (an unwritten extent, cheap to
/// convert), and later writes into it run in parallel. Thin-ness is kept at 1 MiB granularity.
pub const THIN_ALLOC_CHUNK_BYTES: u64 = 1 << 20;

pub struct Replica {
    id: String,
    volume: String,
    /// Bytes served. Grows in place (`grow`) while sessions use the replica, so every
    /// operation loads it once (Acquire) and checks against what it loaded; `grow` stores it
    /// (Release) only after the files and the allocation bitmap cover the new range.
    size: AtomicU64,
    thin: bool,
    pool: String,
    data_path: PathBuf,
    meta_path: PathBuf,
    file: File,
    /// Highest epoch accepted; mirrors `meta.epoch` for lock-free reads.
    epoch: AtomicU64,
    /// Data operations against epoch changes. See the module doc.
    epoch_gate: Arc<EpochGate>,
    meta: Mutex<ReplicaMeta>,
    /// The volume journal as the engines writing to this replica left it.
    journal: JournalFile,
    failed: AtomicBool,
    /// Thin replicas: one bit per chunk known to be allocated (see THIN_ALLOC_CHUNK_BYTES);
    /// `None` for thick ones. Starts clear; a spurious fallocate of an allocated chunk is
    /// harmless. Grows without a lock (`chunk_bits.rs` says why).
    allocated: Option<ChunkBits>,
    /// Held by a grow from start to end: two grows of one replica run one after the other.
    growing: Mutex<()>,
    /// Block checksums (`sums.rs`), for a replica created with them.
    sums: Option<Sums>,
    /// What the stored journal covers (`replica_sums.rs`).
    cover: Mutex<Cover>,
}

/// What a new replica looks like.
#[derive(Clone, Debug)]
pub struct NewReplica {
    pub id: String,
    pub volume: String,
    pub size: u64,
    pub thin: bool,
    /// The cluster it is created for (recorded in its metadata).
    pub cluster: Option<String>,
    /// An encrypted volume's key check (recorded in its metadata).
    pub key_check: Option<[u8; hawser_wire::meta::KEY_CHECK_BYTES]>,
    /// Keep a checksum per 4 KiB block and check every read (`sums.rs`).
    pub checksums: bool,
    /// An encrypted volume's wrapped data key (recorded in its metadata, beside the key
    /// check, so that a controller that lost its store can rebuild the volume's record).
    pub wrapped_key: Option<WrappedKey>,
    /// The uid of its volume (recorded in its metadata; None for a volume without one).
    pub volume_uid: Option<[u8; hawser_wire::meta::VOLUME_UID_BYTES]>,
}

impl Replica {
    pub(crate) fn paths(dir: &Path, id: &str) -> (PathBuf, PathBuf) {
        (
            dir.join(format!("{id}.data")),
            dir.join(format!("{id}.meta")),
        )
    }

    /// Create the data file (sparse, or fully allocated when thick) and then its metadata.
    /// The metadata is written last: a data file without metadata is an unfinished create
    /// and is removed when the pool is opened.
    /// With `source` (a snapshot file), the data file starts as a copy of it (shared extents
    /// where the filesystem can), `new.size` long.
    pub(crate) fn create(
        dir: &Path,
        pool: &str,
        new: &NewReplica,
        boot: u64,
        source: Option<&Path>,
    ) -> Result<Replica, StorageError> {
        let (data_path, meta_path) = Self::paths(dir, &new.id);
        if let Some(src) = source {
            crate::clone::clone_file(src, &data_path, new.size).map_err(|e| {
                StorageError::io("copy a snapshot into replica data file", &data_path, e)
            })?;
        }
        let (file, _) = file_ops::open_data(&data_path, source.is_none())
            .map_err(|e| StorageError::io("create replica data file", &data_path, e))?;
        // Made durable before the metadata exists: otherwise a power loss could leave the
        // metadata with a data file of the wrong size, which `open` refuses.
        let sized = if new.thin {
            file.set_len(new.size)
        } else {
            file_ops::fallocate(&file, 0, 0, new.size)
        }
        .and_then(|()| file.sync_all());
        if let Err(e) = sized {
            drop(file);
            let _ = std::fs::remove_file(&data_path);
            return Err(StorageError::io("size replica data file", &data_path, e));
        }
        let meta = ReplicaMeta {
            volume: new.volume.clone(),
            replica: new.id.clone(),
            size: new.size,
            epoch: 0,
            generation: 1,
            state: ReplicaDiskState::Ok,
            thin: new.thin,
            cluster: new.cluster.clone(),
            key_check: new.key_check,
            checksums: new.checksums,
            wrapped_key: new.wrapped_key.clone(),
            volume_uid: new.volume_uid,
        };
        // A new replica starts with an empty journal: nothing can differ yet. (No journal at
        // all means a replica from before journals, which recovery treats as unknown.)
        let journal = JournalFile::new(meta_path.with_extension("journal"), boot);
        let empty = Journal {
            epoch: 0,
            seq: 0,
            size: new.size,
            extent_bytes: ACTIVITY_EXTENT_BYTES,
            chunk_bytes: CHECKSUM_BLOCK_BYTES,
            active: Vec::new(),
            out: Vec::new(),
        };
        let stored = empty
            .encode()
            .map_err(std::io::Error::other)
            .and_then(|b| journal.put(&b));
        if let Err(e) = stored {
            let _ = std::fs::remove_file(&data_path);
            let _ = std::fs::remove_file(journal.path());
            return Err(StorageError::io("write replica journal", journal.path(), e));
        }
        // A copy of a snapshot is summed in full; a new replica holds zeroes, whose sums are
        // a hole.
        let sums = if new.checksums {
            let made = match source {
                Some(_) => Sums::build(&file, &data_path, new.size),
                None => Sums::empty(&data_path, new.size),
            };
            match made {
                Ok(s) => Some(s),
                Err(e) => {
                    let path = Sums::path_for(&data_path);
                    for p in [&data_path, journal.path(), &path] {
                        let _ = std::fs::remove_file(p);
                    }
                    return Err(StorageError::io("write replica checksums", &path, e));
                }
            }
        } else {
            None
        };
        if let Err(e) = write_meta(&meta_path, &meta) {
            let _ = std::fs::remove_file(&data_path);
            let _ = std::fs::remove_file(journal.path());
            let _ = std::fs::remove_file(Sums::path_for(&data_path));
            return Err(e);
        }
        Ok(Self::from_parts(
            pool,
            data_path,
            meta_path,
            file,
            meta,
            boot,
            sums,
            Cover::default(),
        ))
    }

    /// Open an existing replica from its metadata file, on a node in boot `boot`.
    pub(crate) fn open(pool: &str, meta_path: PathBuf, boot: u64) -> Result<Replica, StorageError> {
        let raw = std::fs::read(&meta_path)
            .map_err(|e| StorageError::io("read replica metadata", &meta_path, e))?;
        let meta = ReplicaMeta::decode(&raw).map_err(|source| StorageError::Meta {
            path: meta_path.clone(),
            source,
        })?;
        let data_path = meta_path.with_extension("data");
        let (file, _) = file_ops::open_data(&data_path, false)
            .map_err(|e| StorageError::io("open replica data file", &data_path, e))?;
        let len = file
            .metadata()
            .map_err(|e| StorageError::io("stat replica data file", &data_path, e))?
            .len();
        if len > meta.size {
            // A grow that stopped between the data file and the metadata (`grow_files`): the
            // range past the recorded size was never served, so it goes back.
            tracing::warn!(path = %data_path.display(), len, size = meta.size, "undoing an unfinished grow");
            file.set_len(meta.size)
                .and_then(|()| file.sync_all())
                .map_err(|e| StorageError::io("undo unfinished grow of", &data_path, e))?;
        } else if len != meta.size {
            let e = std::io::Error::other(format!(
                "data file is {len} bytes, metadata says {}",
                meta.size
            ));
            return Err(StorageError::io("check replica data file", &data_path, e));
        }
        // Only a replica with sums needs what its journal covers (`replica_sums.rs`).
        let (sums, cover) = if meta.checksums {
            let journal = JournalFile::new(meta_path.with_extension("journal"), boot);
            let stored = journal
                .get()
                .map_err(|e| StorageError::io("read replica journal", journal.path(), e))?;
            let cover = Cover::of_stored(&stored, &meta.replica, meta.size);
            let opened = Self::open_sums(&file, &data_path, meta.size, &cover)
                .map_err(|e| StorageError::io("sum replica data", Sums::path_for(&data_path), e))?;
            (Some(opened), cover)
        } else {
            (None, Cover::default())
        };
        Ok(Self::from_parts(
            pool, data_path, meta_path, file, meta, boot, sums, cover,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        pool: &str,
        data_path: PathBuf,
        meta_path: PathBuf,
        file: File,
        meta: ReplicaMeta,
        boot: u64,
        sums: Option<Sums>,
        cover: Cover,
    ) -> Replica {
        let meta_path_journal = meta_path.with_extension("journal");
        Replica {
            id: meta.replica.clone(),
            volume: meta.volume.clone(),
            size: AtomicU64::new(meta.size),
            thin: meta.thin,
            pool: pool.to_owned(),
            data_path,
            meta_path,
            file,
            epoch: AtomicU64::new(meta.epoch),
            epoch_gate: Arc::default(),
            failed: AtomicBool::new(meta.state == ReplicaDiskState::Failed),
            allocated: meta
                .thin
                .then(|| ChunkBits::new(meta.size.div_ceil(THIN_ALLOC_CHUNK_BYTES))),
            growing: Mutex::new(()),
            meta: Mutex::new(meta),
            journal: JournalFile::new(meta_path_journal, boot),
            sums,
            cover: Mutex::new(cover),
        }
    }

    pub(crate) fn sums(&self) -> Option<&Sums> {
        self.sums.as_ref()
    }
    /// Whether the replica keeps block checksums.
    pub fn checksums(&self) -> bool {
        self.sums.is_some()
    }
    pub(crate) fn file(&self) -> &File {
        &self.file
    }
    pub(crate) fn cover_lock(&self) -> std::sync::MutexGuard<'_, Cover> {
        self.cover.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Whether the stored journal covers `[offset, offset+len)` (`replica_sums.rs`).
    pub(crate) fn covered(&self, offset: u64, len: u64) -> bool {
        self.cover_lock().contains(offset, len)
    }

    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn volume(&self) -> &str {
        &self.volume
    }
    /// Bytes served now; may grow between two calls (never shrinks).
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    pub fn thin(&self) -> bool {
        self.thin
    }
    pub fn pool(&self) -> &str {
        &self.pool
    }
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
    /// The cluster recorded in its metadata (None: created before clusters had ids).
    pub fn cluster(&self) -> Option<String> {
        self.meta.lock().ok().and_then(|m| m.cluster.clone())
    }
    /// The key check recorded in its metadata (None: the volume is not encrypted).
    pub fn key_check(&self) -> Option<[u8; hawser_wire::meta::KEY_CHECK_BYTES]> {
        // Through a poisoned lock too: `None` would let a plain engine open an encrypted
        // replica.
        self.meta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .key_check
    }
    /// The wrapped data key recorded in its metadata (None: a plain volume, or one created
    /// before replicas kept it).
    pub fn wrapped_key(&self) -> Option<WrappedKey> {
        self.meta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .wrapped_key
            .clone()
    }

    /// The uid of its volume recorded in its metadata (None: a volume created before volumes
    /// had uids).
    pub fn volume_uid(&self) -> Option<[u8; hawser_wire::meta::VOLUME_UID_BYTES]> {
        self.meta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .volume_uid
    }

    /// Records `w` as the wrapped data key (a key rotation: the same data key under a newer
    /// KEK). Only on an encrypted volume's replica. A no-op when the one recorded is `w` or
    /// under a newer KEK, so a late or repeated rotation never takes a copy back to a KEK
    /// that may already be deleted: the caller reads [`Replica::wrapped_key`] to see which.
    pub fn set_wrapped_key(&self, w: &WrappedKey) -> Result<(), StorageError> {
        let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        if meta.key_check.is_none() {
            return Err(StorageError::NotEncrypted {
                id: self.id.clone(),
            });
        }
        if let Some(held) = &meta.wrapped_key {
            if held == w || held.kek > w.kek {
                return Ok(());
            }
        }
        let mut next = meta.clone();
        next.wrapped_key = Some(w.clone());
        next.generation += 1;
        write_meta(&self.meta_path, &next)?;
        *meta = next;
        Ok(())
    }

    pub fn generation(&self) -> u64 {
        self.meta.lock().map(|m| m.generation).unwrap_or(0)
    }
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
    pub fn allocated_bytes(&self) -> u64 {
        file_ops::allocated_bytes(&self.file).unwrap_or(0)
    }

    /// Make the data file's completed writes durable (no epoch check: for snapshots).
    pub(crate) fn sync_data(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Grows the replica to `size` bytes in place, while sessions read and write it; to its
    /// size or less is a no-op (an expand retried after it stopped half way). In the order
    /// that keeps a crash safe:
    /// 1. the data file (sparse, or allocated for a thick replica), made durable;
    /// 2. the sums file (the new blocks are holes, whose sum is 0), made durable;
    /// 3. the metadata, replaced atomically: from here a reopen serves the new size;
    /// 4. the allocation bitmap, then the size in memory, last: no operation is accepted
    ///    into the new range before the files cover it.
    ///
    /// A crash before 3 leaves a data file longer than its metadata, which `open` cuts back;
    /// a failure before 3 puts the data file back to its length before. Grows of one replica
    /// run one at a time. The caller checks the pool's room.
    pub(crate) fn grow(&self, size: u64) -> Result<(), StorageError> {
        check_size(size)?;
        let _one = self.growing.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.size();
        if size <= old {
            return Ok(());
        }
        // Longer than `old` after a grow whose metadata write failed (which may have reached
        // the disk anyway): never cut below that, or the metadata could outgrow the data.
        let before = self
            .file
            .metadata()
            .map_err(|e| StorageError::io("stat replica data file", &self.data_path, e))?
            .len();
        if let Err(e) = self.grow_files(old, before, size) {
            // Nothing was accepted past `old`, and the metadata says at most `before`.
            let undo = self
                .file
                .set_len(before)
                .and_then(|()| self.file.sync_all());
            if let Err(undo) = undo {
                tracing::warn!(
                    replica = %self.id, error = %undo,
                    "cannot cut back a failed grow; the next open does"
                );
            }
            return Err(e);
        }
        {
            let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
            let mut next = meta.clone();
            next.size = size;
            // On failure the data file stays long: the metadata on disk may already say
            // `size` (renamed, directory not synced), and a longer data file is always safe.
            write_meta(&self.meta_path, &next)?;
            *meta = next;
        }
        if let Some(bits) = &self.allocated {
            bits.cover(size.div_ceil(THIN_ALLOC_CHUNK_BYTES));
            // A last chunk cut by the old end was allocated only up to it.
            if !old.is_multiple_of(THIN_ALLOC_CHUNK_BYTES) {
                bits.clear(old / THIN_ALLOC_CHUNK_BYTES);
            }
        }
        self.size.store(size, Ordering::Release);
        Ok(())
    }

    /// Steps 1 and 2 of `grow` from `old` bytes served in a data file of `len` bytes: the data
    /// file, then the sums file, each made durable. Neither is ever cut.
    fn grow_files(&self, old: u64, len: u64, size: u64) -> Result<(), StorageError> {
        let grown = if self.thin {
            self.file.set_len(size.max(len))
        } else {
            file_ops::fallocate(&self.file, 0, old, size - old)
        };
        grown
            .and_then(|()| self.file.sync_all())
            .map_err(|e| StorageError::io("grow replica data file", &self.data_path, e))?;
        if let Some(sums) = &self.sums {
            sums.grow(size)
                .map_err(|e| StorageError::io("grow replica checksums", sums.path(), e))?;
        }
        Ok(())
    }

    /// Accept `epoch` as the newest: persist it if it is higher, refuse it if it is lower.
    /// Waits for in-flight data operations (of any epoch) to finish first.
    pub fn raise_epoch(&self, epoch: u64) -> Result<(), StorageError> {
        let _gate = self.epoch_gate.raise();
        let current = self.epoch();
        if epoch < current {
            let e = std::io::Error::other(format!("epoch {epoch} is older than {current}"));
            return Err(StorageError::io("raise replica epoch", &self.meta_path, e));
        }
        if epoch == current {
            return Ok(());
        }
        let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = meta.clone();
        next.epoch = epoch;
        next.generation += 1;
        write_meta(&self.meta_path, &next)?;
        *meta = next;
        self.epoch.store(epoch, Ordering::Release);
        Ok(())
    }

    /// Run a data operation under the epoch gate after checking `epoch` and the range.
    fn gated<T>(
        &self,
        epoch: u64,
        offset: u64,
        len: u64,
        op: impl FnOnce() -> Result<T, ReplicaIoError>,
    ) -> Result<T, ReplicaIoError> {
        let _ticket = self.epoch_gate.enter();
        self.check(epoch, offset, len, self.size())?;
        op()
    }

    /// What every data operation checks, holding a ticket of the epoch gate: its epoch, the
    /// replica's health, and its range within `size` (the size the operation loaded once).
    fn check(&self, epoch: u64, offset: u64, len: u64, size: u64) -> Result<(), ReplicaIoError> {
        let current = self.epoch();
        if epoch < current {
            return Err(ReplicaIoError::StaleEpoch {
                request: epoch,
                replica: current,
            });
        }
        if self.is_failed() {
            return Err(ReplicaIoError::Failed);
        }
        let aligned = offset.is_multiple_of(SECTOR_BYTES) && len.is_multiple_of(SECTOR_BYTES);
        let end = offset.checked_add(len);
        if !aligned || end.is_none_or(|end| end > size) {
            return Err(ReplicaIoError::OutOfRange);
        }
        Ok(())
    }

    /// A slot on the process's io_uring and a ticket of the epoch gate, or `None` when the
    /// ring cannot take an operation now: no ring, a full one, or an epoch change waiting.
    fn ring_slot(&self) -> Option<(Reserved<'static>, Ticket)> {
        let slot = ring::global()?.reserve()?;
        let ticket = self.epoch_gate.try_enter()?;
        Some((slot, ticket))
    }

    /// Submit a checked operation in `slot`, or answer its refusal at once.
    fn submit(
        self: &Arc<Self>,
        (slot, ticket): (Reserved<'static>, Ticket),
        offset: u64,
        kind: Result<Kind, ReplicaIoError>,
        done: impl FnOnce(Result<Option<AlignedBuf>, ReplicaIoError>) + Send + 'static,
    ) {
        match kind {
            Err(e) => {
                drop((slot, ticket));
                done(Err(e));
            }
            Ok(kind) => slot.submit(Op {
                fd: self.file.as_raw_fd(),
                offset,
                kind,
                keep: self.clone(),
                ticket,
                finish: Box::new(move |o| done(o.map_err(|e| ReplicaIoError::from_io(&e)))),
            }),
        }
    }

    /// [`Replica::read`] on the io_uring: `done` gets the result on the ring's completion
    /// thread (or at once on this one if the request is refused). `Err(done)`: the ring
    /// cannot take it now (see `ring_slot`); run `read` elsewhere.
    pub fn start_read<F>(
        self: &Arc<Self>,
        epoch: u64,
        offset: u64,
        len: u32,
        done: F,
    ) -> Result<(), F>
    where
        F: FnOnce(Result<Bytes, ReplicaIoError>) + Send + 'static,
    {
        // A read of part of a block is checked whole, by `read` on the pool.
        if self.sums.is_some() && !is_whole(offset, u64::from(len)) {
            return Err(done);
        }
        let Some(held) = self.ring_slot() else {
            return Err(done);
        };
        let kind = self
            .check(epoch, offset, u64::from(len), self.size())
            .map(|()| Kind::Read(AlignedBuf::for_overwrite(len as usize)));
        // Only a replica with sums needs itself in the completion.
        let summed = self.sums.is_some().then(|| self.clone());
        self.submit(held, offset, kind, move |r| {
            done(r.and_then(|b| {
                let b = b.map(AlignedBuf::into_bytes).unwrap_or_default();
                if let Some(me) = summed {
                    me.check_sums(offset, &b)?;
                }
                Ok(b)
            }))
        });
        Ok(())
    }

    /// [`Replica::write`] on the io_uring; as [`Replica::start_read`].
    pub fn start_write<F>(
        self: &Arc<Self>,
        epoch: u64,
        offset: u64,
        data: Bytes,
        fua: bool,
        done: F,
    ) -> Result<(), F>
    where
        F: FnOnce(Result<(), ReplicaIoError>) + Send + 'static,
    {
        // A write into a chunk of a thin replica not yet allocated fallocates it first, which
        // can wait for the filesystem's journal: not on the caller's thread (an async task
        // that answers pings), but on the pool.
        let len = data.len() as u64;
        let size = self.size();
        let in_range = offset.checked_add(len).is_some_and(|end| end <= size);
        if in_range && !self.is_allocated(offset, len) {
            return Err(done);
        }
        // Part of a block is summed from a read-back, and a FUA write the journal does not
        // cover syncs its sums: both by `write` on the pool.
        if self.sums.is_some() && (!is_whole(offset, len) || (fua && !self.covered(offset, len))) {
            return Err(done);
        }
        let Some(held) = self.ring_slot() else {
            return Err(done);
        };
        let kind = self.check(epoch, offset, len, size).and_then(|()| {
            let data = if is_aligned(&data) {
                data
            } else {
                AlignedBuf::copy_from(&data).into_bytes()
            };
            self.ensure_allocated(offset, data.len() as u64)?;
            Ok(Kind::Write { data, dsync: fua })
        });
        // Only a replica with sums needs itself and the data in the completion.
        let written = kind.as_ref().ok().and_then(|k| match k {
            Kind::Write { data, .. } if self.sums.is_some() => Some((self.clone(), data.clone())),
            _ => None,
        });
        self.submit(held, offset, kind, move |r| {
            done(r.and_then(|_| match written {
                Some((me, data)) => me.sum_written(offset, &data, fua, &[]),
                None => Ok(()),
            }))
        });
        Ok(())
    }

    pub fn read(&self, epoch: u64, offset: u64, len: u32) -> Result<Bytes, ReplicaIoError> {
        self.gated(epoch, offset, u64::from(len), || {
            if self.sums.is_some() {
                return self.read_checked(offset, len);
            }
            let mut buf = AlignedBuf::for_overwrite(len as usize);
            file_ops::read_at(&self.file, buf.as_mut_slice(), offset)
                .map_err(|e| ReplicaIoError::from_io(&e))?;
            Ok(buf.into_bytes())
        })
    }

    pub fn write(
        &self,
        epoch: u64,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), ReplicaIoError> {
        self.gated(epoch, offset, data.len() as u64, || {
            let copy;
            let data = if is_aligned(data) {
                data
            } else {
                copy = AlignedBuf::copy_from(data);
                copy.as_slice()
            };
            self.ensure_allocated(offset, data.len() as u64)?;
            let rotten = self.rotten_edges(offset, data.len() as u64)?;
            file_ops::write_at(&self.file, data, offset, fua)
                .map_err(|e| ReplicaIoError::from_io(&e))?;
            self.sum_written(offset, data, fua, &rotten)
        })
    }

    /// The chunks `[offset, offset+len)` touches, for a thin replica (`None`: thick, or empty).
    fn chunks(&self, offset: u64, len: u64) -> Option<(&ChunkBits, std::ops::RangeInclusive<u64>)> {
        let bits = self.allocated.as_ref().filter(|_| len > 0)?;
        let first = offset / THIN_ALLOC_CHUNK_BYTES;
        let last = (offset + len - 1) / THIN_ALLOC_CHUNK_BYTES;
        Some((bits, first..=last))
    }

    /// Thin replicas: fallocate every chunk of [offset, offset+len) not yet known allocated.
    /// The range was checked against a size no larger than the one loaded here (sizes only
    /// grow, and the file covers a size before it is published).
    fn ensure_allocated(&self, offset: u64, len: u64) -> Result<(), ReplicaIoError> {
        let Some((bits, chunks)) = self.chunks(offset, len) else {
            return Ok(());
        };
        let size = self.size();
        for chunk in chunks {
            if bits.get(chunk) {
                continue;
            }
            let start = chunk * THIN_ALLOC_CHUNK_BYTES;
            let n = THIN_ALLOC_CHUNK_BYTES.min(size - start);
            file_ops::fallocate(&self.file, libc::FALLOC_FL_KEEP_SIZE, start, n)
                .map_err(|e| ReplicaIoError::from_io(&e))?;
            bits.set(chunk);
        }
        Ok(())
    }

    /// Whether every chunk of [offset, offset+len) is known allocated (always, for a thick
    /// replica).
    fn is_allocated(&self, offset: u64, len: u64) -> bool {
        self.chunks(offset, len)
            .is_none_or(|(bits, mut chunks)| chunks.all(|c| bits.get(c)))
    }

    /// Forget the allocation of every chunk [offset, offset+len) touches (after a punch).
    fn forget_allocated(&self, offset: u64, len: u64) {
        if let Some((bits, chunks)) = self.chunks(offset, len) {
            chunks.for_each(|c| bits.clear(c));
        }
    }

    /// Replace the volume journal (an encoded `Journal` of an engine of `epoch`), durably.
    pub fn put_journal(&self, epoch: u64, encoded: &[u8]) -> Result<(), ReplicaIoError> {
        self.gated(epoch, 0, 0, || {
            // A journal of a volume smaller than the replica fits: a replica grown by an
            // expand that stopped before the volume record (docs/protocol.md) serves the
            // volume's size until the expand is retried.
            let size = self.size();
            let journal = match Journal::decode(encoded) {
                Ok(j) if j.epoch == epoch && j.size <= size => j,
                _ => return Err(ReplicaIoError::OutOfRange),
            };
            let cover = Cover::of(&journal, &self.id, size);
            self.sums_before_journal(&cover)?;
            self.journal
                .put(encoded)
                .map_err(|e| ReplicaIoError::from_io(&e))?;
            *self.cover_lock() = cover;
            Ok(())
        })
    }

    /// The newest journal stored here.
    pub fn get_journal(&self, epoch: u64) -> Result<Stored, ReplicaIoError> {
        self.gated(epoch, 0, 0, || {
            self.journal.get().map_err(|e| ReplicaIoError::from_io(&e))
        })
    }

    /// Digests of `[offset, offset+len)`, one per `CHECKSUM_BLOCK_BYTES` (see `Op::Checksum`).
    pub fn checksum(&self, epoch: u64, offset: u64, len: u32) -> Result<Bytes, ReplicaIoError> {
        if len > MAX_CHECKSUM_BYTES {
            return Err(ReplicaIoError::OutOfRange);
        }
        self.gated(epoch, offset, u64::from(len), || {
            let mut buf = AlignedBuf::for_overwrite(len as usize);
            file_ops::read_at(&self.file, buf.as_mut_slice(), offset)
                .map_err(|e| ReplicaIoError::from_io(&e))?;
            Ok(Bytes::from(digests(buf.as_slice())))
        })
    }

    /// Make every completed write durable.
    pub fn flush(&self, epoch: u64) -> Result<(), ReplicaIoError> {
        self.gated(epoch, 0, 0, || {
            self.file
                .sync_data()
                .map_err(|e| ReplicaIoError::from_io(&e))
        })
    }

    /// Discard a range. Thin replicas give the space back; thick ones keep it allocated.
    pub fn trim(&self, epoch: u64, offset: u64, len: u32) -> Result<(), ReplicaIoError> {
        self.write_zeroes(epoch, offset, len, false, true)
    }

    /// Zero a range. With `may_trim` a thin replica deallocates it.
    pub fn write_zeroes(
        &self,
        epoch: u64,
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    ) -> Result<(), ReplicaIoError> {
        let len64 = u64::from(len);
        self.gated(epoch, offset, len64, || {
            // Nothing to zero (fallocate(2) refuses a zero length; a zero-length read or
            // write succeeds, and so does this. Found by the replica_session fuzz target).
            if len64 == 0 {
                return Ok(());
            }
            let rotten = self.rotten_edges(offset, len64)?;
            let fast = if self.thin && may_trim {
                self.forget_allocated(offset, len64);
                file_ops::punch_hole(&self.file, offset, len64)
            } else {
                file_ops::zero_range(&self.file, offset, len64)
            };
            match fast {
                Ok(()) => {}
                Err(e) if file_ops::is_unsupported(&e) => self.write_zero_buffers(offset, len64)?,
                Err(e) => return Err(ReplicaIoError::from_io(&e)),
            }
            if fua {
                self.file
                    .sync_data()
                    .map_err(|e| ReplicaIoError::from_io(&e))?;
            }
            self.sum_zeroed(offset, len64, fua, &rotten)
        })
    }

    fn write_zero_buffers(&self, offset: u64, len: u64) -> Result<(), ReplicaIoError> {
        let zeroes = AlignedBuf::zeroed(ZERO_CHUNK_BYTES);
        let mut at = 0u64;
        while at < len {
            let n = usize::try_from((len - at).min(ZERO_CHUNK_BYTES as u64))
                .unwrap_or(ZERO_CHUNK_BYTES);
            file_ops::write_at(&self.file, &zeroes.as_slice()[..n], offset + at, false)
                .map_err(|e| ReplicaIoError::from_io(&e))?;
            at += n as u64;
        }
        Ok(())
    }

    pub(crate) fn remove_files(&self) -> Result<(), StorageError> {
        let sums = Sums::path_for(&self.data_path);
        for p in [&self.meta_path, &self.data_path, self.journal.path(), &sums] {
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("remove replica file", p, e)),
            }
        }
        let snaps = crate::replica::snapshot::snaps_dir(&self.data_path);
        match std::fs::remove_dir_all(&snaps) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::io("remove replica snapshots", &snaps, e)),
        }
        file_ops::sync_dir(&self.meta_path)
            .map_err(|e| StorageError::io("sync pool directory", &self.meta_path, e))
    }
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id)
            .field("volume", &self.volume)
            .field("size", &self.size())
            .field("epoch", &self.epoch())
            .finish_non_exhaustive()
    }
}

/// A replica's size must be a positive multiple of `BLOCK_BYTES` (creates and grows).
pub(crate) fn check_size(size: u64) -> Result<(), StorageError> {
    if size == 0 || !size.is_multiple_of(BLOCK_BYTES) {
        return Err(StorageError::InvalidSize { size });
    }
    Ok(())
}

fn write_meta(path: &Path, meta: &ReplicaMeta) -> Result<(), StorageError> {
    let bytes = meta.encode().map_err(|source| StorageError::Meta {
        path: path.to_owned(),
        source,
    })?;
    file_ops::replace_file(path, &bytes)
        .map_err(|e| StorageError::io("write replica metadata", path, e))
}
