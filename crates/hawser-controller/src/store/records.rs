//! Typed access to the controller's records in the cluster store, including the
//! read-modify-write loop every volume change goes through.

use std::sync::Arc;

use hawser_store::{get_json, list_json, put_json, Expect, Store, StoreError};

use crate::constants::MAX_CAS_RETRIES;
use crate::errors::ControllerError;
use crate::store::model::{
    node_key, node_settings_key, node_settings_prefix, nodes_prefix, volume_key, volumes_prefix,
    NodeRecord, NodeSettings, VolumeRecord,
};

#[derive(Clone)]
pub struct Records {
    store: Arc<dyn Store>,
}

impl Records {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Records { store }
    }

    /// The store itself, for records kept outside this module (`cluster/mod.rs`).
    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    pub async fn node(&self, name: &str) -> Result<Option<NodeRecord>, ControllerError> {
        Ok(get_json(&*self.store, &node_key(name))
            .await?
            .map(|(n, _)| n))
    }

    /// All nodes, sorted by name.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, ControllerError> {
        let list = list_json(&*self.store, nodes_prefix()).await?;
        Ok(list.into_iter().map(|(_, n, _)| n).collect())
    }

    /// The URLs of the live controllers (each registered under its election lease).
    pub async fn controller_urls(&self) -> Result<Vec<String>, ControllerError> {
        let list = self
            .store
            .list(crate::store::leader::CONTROLLERS_PREFIX)
            .await?;
        Ok(list
            .into_iter()
            .filter_map(|(_, v)| String::from_utf8(v.value).ok())
            .collect())
    }

    /// Heartbeats of one node come one at a time from its agent, so the last one wins.
    pub async fn put_node(&self, node: &NodeRecord) -> Result<(), ControllerError> {
        put_json(&*self.store, &node_key(&node.name), node, Expect::Any).await?;
        Ok(())
    }

    /// The operator's settings of every node that has any, by node name.
    pub async fn node_settings(
        &self,
    ) -> Result<std::collections::BTreeMap<String, NodeSettings>, ControllerError> {
        let list = list_json::<NodeSettings>(&*self.store, node_settings_prefix()).await?;
        let prefix = node_settings_prefix();
        Ok(list
            .into_iter()
            .map(|(k, s, _)| (k.strip_prefix(prefix).unwrap_or(&k).to_string(), s))
            .collect())
    }

    /// Only the operator writes these, one request at a time: the last one wins.
    pub async fn put_node_settings(
        &self,
        node: &str,
        settings: &NodeSettings,
    ) -> Result<(), ControllerError> {
        put_json(
            &*self.store,
            &node_settings_key(node),
            settings,
            Expect::Any,
        )
        .await?;
        Ok(())
    }

    pub async fn volume(&self, name: &str) -> Result<Option<VolumeRecord>, ControllerError> {
        Ok(get_json(&*self.store, &volume_key(name))
            .await?
            .map(|(v, _)| v))
    }

    /// A volume, or `VolumeNotFound`.
    pub async fn existing_volume(&self, name: &str) -> Result<VolumeRecord, ControllerError> {
        self.volume(name)
            .await?
            .ok_or_else(|| ControllerError::VolumeNotFound {
                volume: name.into(),
            })
    }

    /// All volumes, sorted by name.
    pub async fn volumes(&self) -> Result<Vec<VolumeRecord>, ControllerError> {
        let list = list_json(&*self.store, volumes_prefix()).await?;
        Ok(list.into_iter().map(|(_, v, _)| v).collect())
    }

    /// Creates a volume record; fails with `VolumeExists` if the name is taken. A conflict
    /// that turns out to be this very record (a retried write whose first attempt landed,
    /// see `store/retry.rs`) is success.
    pub async fn create_volume(&self, volume: &VolumeRecord) -> Result<(), ControllerError> {
        let key = volume_key(&volume.name);
        match put_json(&*self.store, &key, volume, Expect::Absent).await {
            Ok(_) => Ok(()),
            Err(StoreError::Conflict { .. }) => match self.volume(&volume.name).await? {
                Some(found) if found == *volume => Ok(()),
                _ => Err(ControllerError::VolumeExists {
                    volume: volume.name.clone(),
                }),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the volume record if `is_ours` says the stored one is the record the caller
    /// worked on (compare-and-swap on its version, so a record that another leader replaced
    /// meanwhile is never deleted by mistake). Already gone is success: a retried delete
    /// whose first attempt landed, or another leader finished it.
    pub async fn delete_volume_if(
        &self,
        name: &str,
        is_ours: impl Fn(&VolumeRecord) -> bool,
    ) -> Result<(), ControllerError> {
        let key = volume_key(name);
        for _ in 0..MAX_CAS_RETRIES {
            let Some((current, version)) = get_json::<VolumeRecord>(&*self.store, &key).await?
            else {
                return Ok(());
            };
            if !is_ours(&current) {
                return Err(ControllerError::Changed {
                    volume: name.into(),
                });
            }
            match self.store.delete(&key, Expect::Version(version)).await {
                Ok(()) => return Ok(()),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ControllerError::Contention {
            key,
            retries: MAX_CAS_RETRIES,
        })
    }

    /// Reads the volume, lets `change` edit it, and writes it back only if nobody wrote it in
    /// between (compare-and-swap on its version); on a lost race it starts over with the new
    /// record. `change` returning an error aborts without writing; leaving the record as it
    /// was skips the write. Returns the record as stored.
    ///
    /// A lost race whose winner wrote exactly what this call wanted to write is this call's
    /// own write: a retried write whose first answer was lost in a store outage
    /// (`store/retry.rs`). It counts as done rather than running `change` on its own result.
    pub async fn update_volume<T>(
        &self,
        name: &str,
        mut change: impl FnMut(&mut VolumeRecord) -> Result<T, ControllerError>,
    ) -> Result<(VolumeRecord, T), ControllerError> {
        let key = volume_key(name);
        let mut lost_write: Option<(VolumeRecord, T)> = None;
        for _ in 0..MAX_CAS_RETRIES {
            let Some((current, version)) = get_json::<VolumeRecord>(&*self.store, &key).await?
            else {
                return Err(ControllerError::VolumeNotFound {
                    volume: name.into(),
                });
            };
            if let Some((wanted, out)) = lost_write.take() {
                if wanted == current {
                    return Ok((current, out));
                }
            }
            let mut next = current.clone();
            let out = change(&mut next)?;
            if next == current {
                return Ok((next, out));
            }
            match put_json(&*self.store, &key, &next, Expect::Version(version)).await {
                Ok(_) => return Ok((next, out)),
                Err(StoreError::Conflict { .. }) => lost_write = Some((next, out)),
                Err(e) => return Err(e.into()),
            }
        }
        Err(ControllerError::Contention {
            key,
            retries: MAX_CAS_RETRIES,
        })
    }
}
