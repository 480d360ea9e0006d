//! The pools of this node and the lookups across them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hawser_api::agent::{HeldReplica, ReplicaStatus};
use hawser_api::controller::PoolInfo;
use hawser_storage::{NewReplica, Pool, Replica, StorageError};

pub struct NodeStorage {
    node: String,
    pools: Vec<Arc<Pool>>,
    /// The cluster this node's replicas belong to: learned from the first replica the
    /// controller creates here, kept in `cluster_file`, and sent with every heartbeat so that
    /// a controller of another cluster (a wiped or wrong store) refuses this node instead of
    /// taking its replicas for orphans.
    cluster: Mutex<Option<String>>,
    cluster_file: Option<PathBuf>,
    /// The cluster's public key for epoch grants (`replica/grants.rs`), learned at registration and
    /// kept beside `cluster_file`. While there is none (a node that never joined a cluster)
    /// the replica server accepts Hellos without grants.
    grant_key: Mutex<Option<Vec<u8>>>,
}

/// Beside the cluster id file: the cluster's grant key, base64.
const KEY_FILE: &str = "cluster-key";

impl NodeStorage {
    /// The cluster is the one most of the replicas' metadata names, if any.
    pub fn new(node: String, pools: Vec<Pool>) -> NodeStorage {
        let pools: Vec<Arc<Pool>> = pools.into_iter().map(Arc::new).collect();
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        for r in pools.iter().flat_map(|p| p.list()) {
            if let Some(c) = r.cluster() {
                *seen.entry(c).or_default() += 1;
            }
        }
        if seen.len() > 1 {
            tracing::warn!(clusters = ?seen, "replicas of more than one cluster on this node");
        }
        let cluster = seen.into_iter().max_by_key(|(_, n)| *n).map(|(c, _)| c);
        NodeStorage {
            node,
            pools,
            cluster: Mutex::new(cluster),
            cluster_file: None,
            grant_key: Mutex::new(None),
        }
    }

    /// Keeps the cluster id in `path` (the agent's data directory); an id found there wins
    /// over the replicas' (a node whose replicas are all gone still knows its cluster).
    pub fn with_cluster_file(mut self, path: PathBuf) -> std::io::Result<NodeStorage> {
        match std::fs::read_to_string(&path) {
            Ok(id) if !id.trim().is_empty() => {
                let id = id.trim().to_owned();
                let mine = self.cluster.get_mut().unwrap_or_else(|p| p.into_inner());
                if mine.as_ref().is_some_and(|m| *m != id) {
                    tracing::warn!(file = %id, replicas = ?mine, "cluster id file and replicas disagree; the file wins");
                }
                *mine = Some(id);
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let key_file = path.with_file_name(KEY_FILE);
        match std::fs::read_to_string(&key_file) {
            Ok(k) => {
                use base64::Engine as _;
                let key = base64::engine::general_purpose::STANDARD
                    .decode(k.trim())
                    .map_err(|e| std::io::Error::other(format!("{}: {e}", key_file.display())))?;
                *self.grant_key.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(key);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.cluster_file = Some(path);
        Ok(self)
    }

    /// The cluster's grant key, if this node has joined a cluster.
    pub fn grant_key(&self) -> Option<Vec<u8>> {
        self.grant_key
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What a registration answer says of the cluster: joins it if this node has none yet,
    /// and takes its grant key (a recovered cluster signs with a new one). An answer for
    /// another cluster is ignored (the controller refuses such nodes; this is a guard).
    pub fn learn_cluster(&self, join: &hawser_api::controller::ClusterJoin) {
        use base64::Engine as _;
        if let Err(e) = self.join_cluster(&join.id) {
            return tracing::error!(error = %e, "registration answer of another cluster ignored");
        }
        let Ok(key) = base64::engine::general_purpose::STANDARD.decode(&join.grant_key) else {
            return tracing::error!("registration answer with a malformed grant key ignored");
        };
        let mut mine = self.grant_key.lock().unwrap_or_else(|p| p.into_inner());
        if mine.as_deref() == Some(&key[..]) {
            return;
        }
        if let Some(path) = &self.cluster_file {
            let file = path.with_file_name(KEY_FILE);
            if let Err(e) = hawser_storage::file_ops::replace_file(&file, join.grant_key.as_bytes())
            {
                return tracing::error!(error = %e, "cannot keep the cluster's grant key");
            }
        }
        tracing::info!(cluster = %join.id, first = mine.is_none(), "the cluster's grant key");
        *mine = Some(key);
    }

    pub fn cluster_id(&self) -> Option<String> {
        self.cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Takes `id` as this node's cluster if it has none yet; refuses another one.
    fn join_cluster(&self, id: &str) -> Result<(), StorageError> {
        let mut mine = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
        match mine.as_deref() {
            Some(m) if m == id => return Ok(()),
            Some(m) => {
                return Err(StorageError::OtherCluster {
                    mine: m.into(),
                    asked: id.into(),
                })
            }
            None => {}
        }
        if let Some(path) = &self.cluster_file {
            hawser_storage::file_ops::replace_file(path, id.as_bytes())
                .map_err(|e| StorageError::io("write the cluster id", path, e))?;
        }
        tracing::info!(cluster = id, "this node joined its cluster");
        *mine = Some(id.to_owned());
        Ok(())
    }

    /// How many replicas this node holds, over every pool.
    pub fn replica_count(&self) -> usize {
        self.pools.iter().map(|p| p.count()).sum()
    }

    pub fn replica(&self, id: &str) -> Option<Arc<Replica>> {
        self.pools.iter().find_map(|p| p.get(id))
    }

    pub fn pool(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|p| p.name() == name)
    }

    /// Create a replica; refuses an id that exists in any pool of this node.
    pub fn create(&self, pool: &str, new: &NewReplica) -> Result<Arc<Replica>, StorageError> {
        self.create_from(pool, new, None)
    }

    /// Create a replica, its data a copy of snapshot `from` of a replica on this node when
    /// given (any pool: shared extents within one filesystem, a copy across).
    pub fn create_from(
        &self,
        pool: &str,
        new: &NewReplica,
        from: Option<&hawser_api::agent::SnapshotRef>,
    ) -> Result<Arc<Replica>, StorageError> {
        if let Some(c) = &new.cluster {
            self.join_cluster(c)?;
        }
        let broken = |p: &Arc<Pool>| p.broken().iter().any(|b| b.id == new.id);
        if self.replica(&new.id).is_some() || self.pools.iter().any(broken) {
            return Err(StorageError::ReplicaExists {
                pool: pool.into(),
                id: new.id.clone(),
            });
        }
        let p = self
            .pool(pool)
            .ok_or_else(|| StorageError::ReplicaNotFound {
                id: format!("pool {pool}"),
            })?;
        let source = match from {
            Some(f) => {
                let original = self.existing(&f.replica_id)?;
                // A copy of ciphertext is readable only with its key: the copy must record the
                // key check it was written with (a clone re-wraps its source's data key).
                if original.key_check() != new.key_check {
                    return Err(StorageError::KeyMismatch {
                        id: new.id.clone(),
                        source_id: f.replica_id.clone(),
                    });
                }
                Some(original.snapshot_file(&f.snapshot)?)
            }
            None => None,
        };
        p.create_replica_from(new, source.as_deref())
    }

    fn existing(&self, id: &str) -> Result<Arc<Replica>, StorageError> {
        self.replica(id)
            .ok_or_else(|| StorageError::ReplicaNotFound { id: id.into() })
    }

    /// Takes a snapshot of a replica; see `Replica::take_snapshot`.
    pub fn take_snapshot(
        &self,
        id: &str,
        epoch: u64,
        snapshot: &str,
    ) -> Result<hawser_storage::Taken, StorageError> {
        self.existing(id)?.take_snapshot(epoch, snapshot)
    }

    pub fn snapshots(&self, id: &str) -> Result<Vec<hawser_storage::SnapshotFile>, StorageError> {
        Ok(self.existing(id)?.snapshots())
    }

    pub fn delete_snapshot(&self, id: &str, snapshot: &str) -> Result<(), StorageError> {
        self.existing(id)?.delete_snapshot(snapshot)
    }

    /// Replaces a replica's data with one of its snapshots; see `Pool::restore_replica`.
    pub fn restore(&self, id: &str, snapshot: &str) -> Result<Arc<Replica>, StorageError> {
        let pool = self
            .pools
            .iter()
            .find(|p| p.get(id).is_some())
            .ok_or_else(|| StorageError::ReplicaNotFound { id: id.into() })?;
        pool.restore_replica(id, snapshot)
    }

    /// Records a replica's wrapped data key anew (a key rotation); see
    /// `Replica::set_wrapped_key`.
    pub fn set_wrapped_key(
        &self,
        id: &str,
        w: &hawser_wire::meta::WrappedKey,
    ) -> Result<Arc<Replica>, StorageError> {
        let replica = self.existing(id)?;
        replica.set_wrapped_key(w)?;
        Ok(replica)
    }

    /// Grows a replica; see `Pool::grow_replica`.
    pub fn grow(&self, id: &str, size: u64) -> Result<Arc<Replica>, StorageError> {
        let pool = self
            .pools
            .iter()
            .find(|p| p.get(id).is_some())
            .ok_or_else(|| StorageError::ReplicaNotFound { id: id.into() })?;
        pool.grow_replica(id, size)
    }

    /// Deletes a replica; a broken one (see `Pool::broken`) goes to the trash instead: its
    /// files could not be read, so whether it holds anything of value is unknown.
    pub fn delete(&self, id: &str) -> Result<(), StorageError> {
        if let Some(pool) = self.pools.iter().find(|p| p.get(id).is_some()) {
            return pool.delete_replica(id);
        }
        self.trash(id)
    }

    /// Moves a replica (loaded or broken) to its pool's trash; see `Pool::trash_replica`.
    pub fn trash(&self, id: &str) -> Result<(), StorageError> {
        let holds = |p: &&Arc<Pool>| p.get(id).is_some() || p.broken().iter().any(|b| b.id == id);
        let pool = self
            .pools
            .iter()
            .find(holds)
            .ok_or_else(|| StorageError::ReplicaNotFound { id: id.into() })?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        pool.trash_replica(id, now)
    }

    /// Every pool's trash.
    pub fn trash_list(&self) -> Vec<hawser_api::agent::TrashedReplica> {
        self.pools
            .iter()
            .flat_map(|p| p.trash())
            .map(|t| hawser_api::agent::TrashedReplica {
                replica_id: t.id,
                volume: t.volume,
                pool: t.pool,
                trashed_at_secs: t.trashed_at_secs,
                bytes: t.bytes,
            })
            .collect()
    }

    /// Purges what every pool's trash has held for `keep_secs` or longer.
    pub fn purge_trash(&self, keep_secs: u64) -> usize {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.pools
            .iter()
            .map(|p| p.purge_trash(now, keep_secs))
            .sum()
    }

    /// Every loaded replica with a summary of its newest journal (reads the journals).
    pub fn inventory(&self) -> Vec<hawser_api::agent::ReplicaInventory> {
        use hawser_api::agent::{JournalSummary, ReplicaInventory};
        self.pools
            .iter()
            .flat_map(|p| p.list())
            .map(|r| ReplicaInventory {
                status: status(&r),
                journal: match r.get_journal(r.epoch()) {
                    Ok(hawser_storage::StoredJournal::Found { journal: j, .. }) => {
                        Some(JournalSummary {
                            epoch: j.epoch,
                            seq: j.seq,
                            size_bytes: j.size,
                            lacking: j.out.into_iter().map(|o| o.replica).collect(),
                        })
                    }
                    _ => None,
                },
            })
            .collect()
    }

    pub fn pool_infos(&self) -> Vec<PoolInfo> {
        self.pools
            .iter()
            .filter_map(|p| match p.usage() {
                Ok(u) => Some(PoolInfo {
                    node: self.node.clone(),
                    name: p.name().into(),
                    path: p.path().display().to_string(),
                    capacity_bytes: u.capacity_bytes,
                    free_bytes: u.free_bytes,
                    provisioned_bytes: u.provisioned_bytes,
                    overprovision_ratio: p.overprovision_ratio(),
                    replicas: u.replicas,
                    snapshots: u.snapshots,
                    snapshot_bytes: u.snapshot_bytes,
                    kind: p.kind(),
                }),
                Err(e) => {
                    tracing::error!(pool = p.name(), error = %e, "cannot read pool usage");
                    None
                }
            })
            .collect()
    }

    /// Every replica of every pool with its volume and whether it failed (the broken ones
    /// are), from memory: no file is read. Sorted by id, so an unchanged set is the same
    /// list, byte for byte (`GET /v1/replicas/held` tags it with its digest).
    pub fn held(&self) -> Vec<HeldReplica> {
        let mut held: Vec<HeldReplica> = self
            .pools
            .iter()
            .flat_map(|p| {
                let loaded = p.list().into_iter().map(|r| HeldReplica {
                    replica_id: r.id().into(),
                    volume: r.volume().into(),
                    failed: r.is_failed(),
                });
                let broken = p.broken().into_iter().map(|b| HeldReplica {
                    replica_id: b.id,
                    volume: b.volume,
                    failed: true,
                });
                loaded.chain(broken).collect::<Vec<_>>()
            })
            .collect();
        held.sort_by(|a, b| a.replica_id.cmp(&b.replica_id));
        held
    }

    /// Every replica of every pool, the broken ones (see `Pool::broken`) as failed.
    pub fn replica_statuses(&self) -> Vec<ReplicaStatus> {
        let broken = self.pools.iter().flat_map(|p| {
            p.broken().into_iter().map(|b| ReplicaStatus {
                replica_id: b.id,
                volume: b.volume,
                pool: p.name().into(),
                size_bytes: 0,
                thin: false,
                epoch: 0,
                allocated_bytes: 0,
                data_path: b.meta_path.with_extension("data").display().to_string(),
                failed: true,
                error: Some(b.reason),
                cluster_id: None,
                key_check: None,
                checksums: false,
                wrapped_key: None,
                volume_uid: None,
            })
        });
        self.pools
            .iter()
            .flat_map(|p| p.list())
            .map(|r| status(&r))
            .chain(broken)
            .collect()
    }
}

pub fn status(r: &Replica) -> ReplicaStatus {
    ReplicaStatus {
        replica_id: r.id().into(),
        volume: r.volume().into(),
        pool: r.pool().into(),
        size_bytes: r.size(),
        thin: r.thin(),
        epoch: r.epoch(),
        allocated_bytes: r.allocated_bytes(),
        data_path: r.data_path().display().to_string(),
        failed: r.is_failed(),
        error: None,
        cluster_id: r.cluster(),
        key_check: r.key_check().map(hawser_api::KeyCheck),
        checksums: r.checksums(),
        wrapped_key: wrapped_key(r),
        volume_uid: r.volume_uid().map(|u| hawser_api::uid::uid_text(&u)),
    }
}

/// A replica's wrapped data key as the API carries it (with its key check).
fn wrapped_key(r: &Replica) -> Option<hawser_api::WrappedKey> {
    let w = r.wrapped_key()?;
    let check = hawser_api::KeyCheck(r.key_check()?);
    Some(hawser_api::WrappedKey::from_sealed(w.kek, &w.sealed, check))
}

/// The sealed form of an API wrapping for replica metadata; refused if it is not base64, or
/// names another key check than `key_check` (the replica's, or the one it is created with).
pub fn sealed_key(
    w: &hawser_api::WrappedKey,
    key_check: Option<hawser_api::KeyCheck>,
) -> Result<hawser_wire::meta::WrappedKey, hawser_api::ApiError> {
    if key_check != Some(w.check) {
        return Err(hawser_api::ApiError::invalid(
            "the wrapped data key names another key check than the replica's",
        ));
    }
    let sealed = w
        .sealed()
        .filter(|b| !b.is_empty() && b.len() <= hawser_wire::meta::MAX_WRAPPED_KEY_BYTES)
        .ok_or_else(|| {
            hawser_api::ApiError::invalid(format!(
                "the wrapped data key is not base64 of 1 to {} bytes",
                hawser_wire::meta::MAX_WRAPPED_KEY_BYTES
            ))
        })?;
    Ok(hawser_wire::meta::WrappedKey { kek: w.kek, sealed })
}
