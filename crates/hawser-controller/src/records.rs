//! Typed access to the controller's records in the cluster store, including the
//! read-modify-write loop every volume change goes through.

use std::sync::Arc;

use hawser_store::{get_json, list_json, put_json, Expect, Store, StoreError};

use crate::constants::MAX_CAS_RETRIES;
use crate::errors::ControllerError;
use crate::model::{
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
        let list = self.store.list(crate::leader::CONTROLLERS_PREFIX).await?;
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

    /// Creates a volume record; fails with `VolumeExists` if the name is taken.
    pub async fn create_volume(&self, volume: &VolumeRecord) -> Result<(), ControllerError> {
        match put_json(
            &*self.store,
            &volume_key(&volume.name),
            volume,
            Expect::Absent,
        )
        .await
        {
            Ok(_) => Ok(()),
            Err(StoreError::Conflict { .. }) => Err(ControllerError::VolumeExists {
                volume: volume.name.clone(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn delete_volume(&self, name: &str) -> Result<(), ControllerError> {
        self.store.delete(&volume_key(name), Expect::Any).await?;
        Ok(())
    }

    /// Reads the volume, lets `change` edit it, and writes it back only if nobody wrote it in
    /// between (compare-and-swap on its version); on a lost race it starts over with the new
    /// record. `change` returning an error aborts without writing; leaving the record as it
    /// was skips the write. Returns the record as stored.
    pub async fn update_volume<T>(
        &self,
        name: &str,
        mut change: impl FnMut(&mut VolumeRecord) -> Result<T, ControllerError>,
    ) -> Result<(VolumeRecord, T), ControllerError> {
        let key = volume_key(name);
        for _ in 0..MAX_CAS_RETRIES {
            let Some((current, version)) = get_json::<VolumeRecord>(&*self.store, &key).await?
            else {
                return Err(ControllerError::VolumeNotFound {
                    volume: name.into(),
                });
            };
            let mut next = current.clone();
            let out = change(&mut next)?;
            if next == current {
                return Ok((next, out));
            }
            match put_json(&*self.store, &key, &next, Expect::Version(version)).await {
                Ok(_) => return Ok((next, out)),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ControllerError::Contention {
            key,
            retries: MAX_CAS_RETRIES,
        })
    }
}
