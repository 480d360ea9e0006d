//! A storage pool: a directory on a local filesystem holding replicas, with capacity
//! accounting. Thick replicas must fit in the free space; thin ones must keep the sum of
//! replica sizes within `capacity * overprovision_ratio`. A pool may take only thin or only
//! thick replicas. The check and the create run under one lock so two creates cannot both
//! take the last room.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Which replicas a pool takes: the API's type, so what the agent reports is what the pool
/// enforces.
pub use hawser_api::pool::PoolKind;

use crate::error::StorageError;
use crate::file_ops;
use crate::replica::{check_size, NewReplica, Replica};

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub name: String,
    pub path: PathBuf,
    /// Thin replicas may be placed while their total size <= capacity * ratio.
    pub overprovision_ratio: f64,
    /// Treat the pool as this big even if the filesystem is larger.
    pub capacity_limit: Option<u64>,
    /// Which replicas the pool takes.
    pub kind: PoolKind,
    /// The node's boot id (`node_boot_id`), stamped on the journals its replicas store so
    /// that recovery can tell a replica whose node rebooted since.
    pub boot_id: u64,
}

/// This node's boot, from the kernel's random boot id (0 if unreadable: a node that cannot
/// tell its boots apart then never looks rebooted to recovery, as before boot ids existed).
pub fn node_boot_id() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            s.trim().hash(&mut h);
            h.finish()
        })
        .unwrap_or(0)
}

/// A snapshot of a pool's space.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolUsage {
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub provisioned_bytes: u64,
    pub replicas: u32,
    /// Snapshot copies held by the pool's replicas, and the bytes their files occupy
    /// (extents shared by reflinks counted in full: an upper bound on what deleting them
    /// frees; exact where copies are made by copying, as on ext4).
    pub snapshots: u32,
    pub snapshot_bytes: u64,
}

/// A restore's copy of a snapshot, before it replaces the data file.
const RESTORED_EXT: &str = "restored";

pub struct Pool {
    config: PoolConfig,
    dir: PathBuf,
    replicas: Mutex<BTreeMap<String, Arc<Replica>>>,
    /// Replicas found at open that could not be loaded, by id. Kept on disk untouched (an
    /// operator or a newer version may still read them) and reported as failed.
    broken: Mutex<BTreeMap<String, BrokenReplica>>,
}

/// A replica whose files are in the pool but cannot be served: unreadable or corrupt
/// metadata, a missing data file, or a data file shorter than its metadata says (a thin
/// replica's size that never reached the disk before a crash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokenReplica {
    pub id: String,
    /// From the metadata when it could be read, else empty.
    pub volume: String,
    pub meta_path: PathBuf,
    pub reason: String,
}

impl Pool {
    /// Open (creating the directory if needed) and load every replica in it. A data file
    /// without metadata is the leftover of a create that crashed, and is removed. A replica
    /// that cannot be loaded is kept on disk and listed by [`Pool::broken`]: one bad replica
    /// must not take the node's other replicas down with it.
    pub fn open(config: PoolConfig) -> Result<Pool, StorageError> {
        let dir = config.path.join("replicas");
        std::fs::create_dir_all(&dir)
            .map_err(|e| StorageError::io("create pool directory", &dir, e))?;
        let mut replicas = BTreeMap::new();
        let mut broken = BTreeMap::new();
        let entries =
            std::fs::read_dir(&dir).map_err(|e| StorageError::io("list pool", &dir, e))?;
        for entry in entries {
            let path = entry
                .map_err(|e| StorageError::io("list pool", &dir, e))?
                .path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("meta") => match Replica::open(&config.name, path.clone(), config.boot_id) {
                    Ok(r) => {
                        replicas.insert(r.id().to_owned(), Arc::new(r));
                    }
                    Err(e) => {
                        let b = BrokenReplica::new(&path, &e);
                        tracing::error!(
                            pool = %config.name, replica = %b.id, error = %e,
                            "cannot load a replica; it is reported failed and left on disk"
                        );
                        broken.insert(b.id.clone(), b);
                    }
                },
                Some("data") if !path.with_extension("meta").exists() => {
                    tracing::warn!(path = %path.display(), "removing data file of an unfinished create");
                    std::fs::remove_file(&path)
                        .map_err(|e| StorageError::io("remove orphan data file", &path, e))?;
                }
                Some("journal" | "sums") if !path.with_extension("meta").exists() => {
                    let _ = std::fs::remove_file(&path);
                }
                // A snapshot that stopped half-copied left its temporary there.
                Some("snaps") => {
                    for tmp in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                        if tmp.path().extension().is_some_and(|e| e == "clonetmp") {
                            let _ = std::fs::remove_file(tmp.path());
                        }
                    }
                }
                // Temporaries of a write, a clone or a restore that stopped.
                Some("tmp" | "clonetmp" | "sums-tmp" | RESTORED_EXT) => {
                    let _ = std::fs::remove_file(&path);
                }
                _ => {}
            }
        }
        Ok(Pool {
            config,
            dir,
            replicas: Mutex::new(replicas),
            broken: Mutex::new(broken),
        })
    }

    /// Replicas that could not be loaded at open (see [`BrokenReplica`]).
    pub fn broken(&self) -> Vec<BrokenReplica> {
        self.broken_map().values().cloned().collect()
    }

    fn broken_map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BrokenReplica>> {
        self.broken.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn trash_dir(&self) -> PathBuf {
        self.config.path.join("trash")
    }

    /// Moves a replica's files (a loaded one no engine uses, or a broken one) into the
    /// pool's trash, `trash/<id>.<unix seconds>.{data,journal,meta}`, instead of deleting
    /// them: a controller may be wrong about a replica being an orphan (a wiped or rolled
    /// back store), and the trash keeps it for [`Pool::purge_trash`]'s grace period. The
    /// metadata moves last, so a crash in between leaves a replica the next open reports
    /// broken (its data file is gone), never a data file it would remove.
    pub fn trash_replica(&self, id: &str, now_secs: u64) -> Result<(), StorageError> {
        let mut map = self.lock();
        let mut broken = self.broken_map();
        if let Some(r) = map.get(id) {
            if Arc::strong_count(r) > 1 {
                return Err(StorageError::InUse { id: id.into() });
            }
        } else if !broken.contains_key(id) {
            return Err(StorageError::ReplicaNotFound { id: id.into() });
        }
        let trash = self.trash_dir();
        std::fs::create_dir_all(&trash)
            .map_err(|e| StorageError::io("create pool trash", &trash, e))?;
        let (data, meta) = Replica::paths(&self.dir, id);
        let snaps = crate::replica::snapshot::snaps_dir(&data);
        let sums = crate::sums::Sums::path_for(&data);
        for from in [snaps, data, sums, meta.with_extension("journal"), meta] {
            let ext = from.extension().and_then(|e| e.to_str()).unwrap_or("x");
            let to = trash.join(format!("{id}.{now_secs}.{ext}"));
            match std::fs::rename(&from, &to) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("move to the pool trash", &from, e)),
            }
        }
        for dir in [&self.dir, &trash] {
            file_ops::sync_dir(&dir.join("x"))
                .map_err(|e| StorageError::io("sync pool directory", dir, e))?;
        }
        map.remove(id);
        broken.remove(id);
        Ok(())
    }

    /// What the trash holds: one entry per trashed replica.
    pub fn trash(&self) -> Vec<TrashedReplica> {
        let Ok(entries) = std::fs::read_dir(self.trash_dir()) else {
            return Vec::new();
        };
        let mut found = BTreeMap::<(String, u64), TrashedReplica>::new();
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            let Some((id, secs, ext)) = trash_name(&path) else {
                continue;
            };
            let t = found.entry((id.clone(), secs)).or_insert(TrashedReplica {
                id,
                pool: self.name().into(),
                trashed_at_secs: secs,
                volume: String::new(),
                bytes: 0,
            });
            t.bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if ext == "meta" {
                t.volume = std::fs::read(&path)
                    .ok()
                    .and_then(|raw| hawser_wire::meta::ReplicaMeta::decode(&raw).ok())
                    .map(|m| m.volume)
                    .unwrap_or_default();
            }
        }
        found.into_values().collect()
    }

    /// Deletes what went to the trash more than `keep_secs` before `now_secs`; returns how
    /// many replicas it removed.
    pub fn purge_trash(&self, now_secs: u64, keep_secs: u64) -> usize {
        let Ok(entries) = std::fs::read_dir(self.trash_dir()) else {
            return 0;
        };
        let mut gone = std::collections::BTreeSet::new();
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            let Some((id, secs, _)) = trash_name(&path) else {
                continue;
            };
            if now_secs.saturating_sub(secs) >= keep_secs {
                // A replica's snapshots went to the trash as one directory.
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                match removed {
                    Ok(()) => {
                        gone.insert((id, secs));
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "cannot purge from the trash")
                    }
                }
            }
        }
        for (id, secs) in &gone {
            tracing::info!(pool = self.name(), replica = %id, trashed_at = secs, "purged from the trash");
        }
        gone.len()
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn path(&self) -> &Path {
        &self.config.path
    }

    pub fn overprovision_ratio(&self) -> f64 {
        self.config.overprovision_ratio
    }

    pub fn kind(&self) -> PoolKind {
        self.config.kind
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Replica>>> {
        self.replicas.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn usage(&self) -> Result<PoolUsage, StorageError> {
        let map = self.lock();
        let mut usage = self.usage_locked(&map)?;
        let replicas: Vec<Arc<Replica>> = map.values().cloned().collect();
        drop(map);
        // Snapshot space is reported, never checked by placement: its directories are read
        // here, outside the pool's lock, and not on every create.
        let snaps: Vec<_> = replicas.iter().flat_map(|r| r.snapshots()).collect();
        usage.snapshots = u32::try_from(snaps.len()).unwrap_or(u32::MAX);
        usage.snapshot_bytes = snaps.iter().map(|s| s.allocated_bytes).sum();
        Ok(usage)
    }

    fn usage_locked(
        &self,
        map: &BTreeMap<String, Arc<Replica>>,
    ) -> Result<PoolUsage, StorageError> {
        let (fs_size, fs_free) = file_ops::fs_space(&self.dir)
            .map_err(|e| StorageError::io("statvfs pool", &self.dir, e))?;
        let capacity = self
            .config
            .capacity_limit
            .map_or(fs_size, |l| l.min(fs_size));
        let provisioned: u64 = map.values().map(|r| r.size()).sum();
        // Under a capacity limit the pool's own replicas count against the limit; the
        // filesystem's free space alone would let thick replicas fill it past the limit.
        let free = match self.config.capacity_limit {
            Some(_) => {
                let used: u64 = map.values().map(|r| r.allocated_bytes()).sum();
                fs_free.min(capacity.saturating_sub(used))
            }
            None => fs_free.min(capacity),
        };
        Ok(PoolUsage {
            capacity_bytes: capacity,
            free_bytes: free,
            provisioned_bytes: provisioned,
            replicas: u32::try_from(map.len()).unwrap_or(u32::MAX),
            // Filled by `usage` (only the creates call this directly).
            snapshots: 0,
            snapshot_bytes: 0,
        })
    }

    /// Bytes a thin (`thin`) or thick replica may still take; see the module doc for the rule.
    fn room(&self, map: &BTreeMap<String, Arc<Replica>>, thin: bool) -> Result<u64, StorageError> {
        let usage = self.usage_locked(map)?;
        Ok(if thin {
            // Float-to-int casts saturate in Rust, which is the wanted bound here.
            #[allow(clippy::cast_possible_truncation)]
            let limit = (usage.capacity_bytes as f64 * self.config.overprovision_ratio) as u64;
            limit.saturating_sub(usage.provisioned_bytes)
        } else {
            usage.free_bytes
        })
    }

    /// Create a replica if it fits; see the module doc for the rule.
    pub fn create_replica(&self, new: &NewReplica) -> Result<Arc<Replica>, StorageError> {
        self.create_replica_from(new, None)
    }

    /// Create a replica if it fits, its data a copy of the snapshot file `source` when there
    /// is one (a clone: instant where the filesystem shares extents; see `clone.rs`). The
    /// copy may be longer than the snapshot (a clone to a bigger volume), not shorter.
    pub fn create_replica_from(
        &self,
        new: &NewReplica,
        source: Option<&Path>,
    ) -> Result<Arc<Replica>, StorageError> {
        check_size(new.size)?;
        for id in [&new.id, &new.volume] {
            if !file_ops::valid_id(id) {
                return Err(StorageError::InvalidId { id: id.clone() });
            }
        }
        let kind = if new.thin { "thin" } else { "thick" };
        if !self.config.kind.allows(new.thin) {
            return Err(StorageError::WrongKind {
                pool: self.name().into(),
                kind,
            });
        }
        let mut map = self.lock();
        if map.contains_key(&new.id) || self.broken_map().contains_key(&new.id) {
            return Err(StorageError::ReplicaExists {
                pool: self.name().into(),
                id: new.id.clone(),
            });
        }
        let available = self.room(&map, new.thin)?;
        if new.size > available {
            return Err(StorageError::NoRoom {
                pool: self.name().into(),
                kind,
                need: new.size,
                available,
            });
        }
        let replica = Arc::new(Replica::create(
            &self.dir,
            self.name(),
            new,
            self.config.boot_id,
            source,
        )?);
        map.insert(new.id.clone(), replica.clone());
        Ok(replica)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Replica>> {
        self.lock().get(id).cloned()
    }

    pub fn list(&self) -> Vec<Arc<Replica>> {
        self.lock().values().cloned().collect()
    }

    /// How many replicas the pool holds.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// Grows replica `id` to `size` bytes (to its size or less is a no-op), if the pool has
    /// room for the growth. The replica grows in place (`Replica::grow`), so the sessions
    /// that hold it, an attached volume's, see the new size at once. The map's lock is held
    /// throughout: the room checked is the room taken, as in a create. Returns the replica.
    pub fn grow_replica(&self, id: &str, size: u64) -> Result<Arc<Replica>, StorageError> {
        check_size(size)?;
        let map = self.lock();
        let replica = map
            .get(id)
            .cloned()
            .ok_or(StorageError::ReplicaNotFound { id: id.into() })?;
        // Already that big: an expand that stopped after growing this replica may be retried
        // to any size between the volume's and this one. Replicas never shrink.
        let old = replica.size();
        if size <= old {
            return Ok(replica);
        }
        let need = size - old;
        let kind = if replica.thin() { "thin" } else { "thick" };
        let available = self.room(&map, replica.thin())?;
        if need > available {
            return Err(StorageError::NoRoom {
                pool: self.name().into(),
                kind,
                need,
                available,
            });
        }
        replica.grow(size)?;
        Ok(replica)
    }

    /// Replaces replica `id`'s data with its snapshot `snapshot` (the volume is detached: no
    /// engine may hold the replica). The copy is made beside the data file and renamed over
    /// it, so a crash leaves the old data or the restored data, never a mix. Returns the
    /// replica, opened again.
    pub fn restore_replica(&self, id: &str, snapshot: &str) -> Result<Arc<Replica>, StorageError> {
        let mut map = self.lock();
        let old = map
            .get(id)
            .cloned()
            .ok_or(StorageError::ReplicaNotFound { id: id.into() })?;
        if Arc::strong_count(&old) > 2 {
            return Err(StorageError::InUse { id: id.into() });
        }
        let source = old.snapshot_file(snapshot)?;
        let (data, meta_path) = Replica::paths(&self.dir, id);
        let restored = data.with_extension(RESTORED_EXT);
        let _ = std::fs::remove_file(&restored);
        crate::clone::clone_file(&source, &restored, old.size())
            .map_err(|e| StorageError::io("copy snapshot for a restore", &restored, e))?;
        // The sums go before the data is replaced: a crash in between leaves old data
        // without sums, which the next open sums again, never new data with old sums.
        if old.checksums() {
            let sums = crate::sums::Sums::path_for(&data);
            std::fs::remove_file(&sums)
                .or_else(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Ok(()),
                    _ => Err(e),
                })
                .and_then(|()| file_ops::sync_dir(&sums))
                .map_err(|e| StorageError::io("drop checksums for a restore", &sums, e))?;
        }
        std::fs::rename(&restored, &data)
            .and_then(|()| file_ops::sync_dir(&data))
            .map_err(|e| StorageError::io("replace replica data with a snapshot", &data, e))?;
        drop(old);
        let reopened = Arc::new(Replica::open(self.name(), meta_path, self.config.boot_id)?);
        map.insert(id.to_owned(), reopened.clone());
        tracing::warn!(
            pool = self.name(),
            replica = id,
            snapshot,
            "replica restored to a snapshot"
        );
        Ok(reopened)
    }

    /// Remove a replica's files. Operations still holding the `Arc` keep working on the
    /// unlinked file until they drop it.
    pub fn delete_replica(&self, id: &str) -> Result<(), StorageError> {
        let mut map = self.lock();
        let replica = map
            .get(id)
            .cloned()
            .ok_or(StorageError::ReplicaNotFound { id: id.into() })?;
        replica.remove_files()?;
        map.remove(id);
        Ok(())
    }
}

/// A replica in a pool's trash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrashedReplica {
    pub id: String,
    pub pool: String,
    pub trashed_at_secs: u64,
    /// From its metadata, if readable.
    pub volume: String,
    /// Bytes its files hold (their lengths).
    pub bytes: u64,
}

/// `<id>.<secs>.<ext>` of a file in the trash.
fn trash_name(path: &Path) -> Option<(String, u64, String)> {
    let name = path.file_name()?.to_str()?;
    let (rest, ext) = name.rsplit_once('.')?;
    let (id, secs) = rest.rsplit_once('.')?;
    Some((id.to_owned(), secs.parse().ok()?, ext.to_owned()))
}

impl BrokenReplica {
    fn new(meta_path: &Path, error: &StorageError) -> BrokenReplica {
        let id = meta_path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The volume, if the metadata itself is fine (the data file is what is wrong).
        let volume = std::fs::read(meta_path)
            .ok()
            .and_then(|raw| hawser_wire::meta::ReplicaMeta::decode(&raw).ok())
            .map(|m| m.volume)
            .unwrap_or_default();
        BrokenReplica {
            id,
            volume,
            meta_path: meta_path.to_owned(),
            reason: error.to_string(),
        }
    }
}
