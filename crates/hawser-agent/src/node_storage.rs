//! The pools of this node and the lookups across them.

use std::sync::Arc;

use hawser_api::agent::ReplicaStatus;
use hawser_api::controller::{PoolInfo, PoolKind};
use hawser_storage::{NewReplica, Pool, Replica, StorageError};

pub struct NodeStorage {
    node: String,
    pools: Vec<Arc<Pool>>,
}

impl NodeStorage {
    pub fn new(node: String, pools: Vec<Pool>) -> NodeStorage {
        NodeStorage {
            node,
            pools: pools.into_iter().map(Arc::new).collect(),
        }
    }

    pub fn replica(&self, id: &str) -> Option<Arc<Replica>> {
        self.pools.iter().find_map(|p| p.get(id))
    }

    pub fn pool(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|p| p.name() == name)
    }

    /// Create a replica; refuses an id that exists in any pool of this node.
    pub fn create(&self, pool: &str, new: &NewReplica) -> Result<Arc<Replica>, StorageError> {
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
        p.create_replica(new)
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

    pub fn delete(&self, id: &str) -> Result<(), StorageError> {
        let pool = self
            .pools
            .iter()
            .find(|p| p.get(id).is_some())
            .ok_or_else(|| StorageError::ReplicaNotFound { id: id.into() })?;
        pool.delete_replica(id)
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
                    kind: match p.kind() {
                        hawser_storage::PoolKind::Any => PoolKind::Any,
                        hawser_storage::PoolKind::Thin => PoolKind::Thin,
                        hawser_storage::PoolKind::Thick => PoolKind::Thick,
                    },
                }),
                Err(e) => {
                    tracing::error!(pool = p.name(), error = %e, "cannot read pool usage");
                    None
                }
            })
            .collect()
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
    }
}
