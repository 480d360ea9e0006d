//! Typed access to the controller's records in the cluster store, including the
//! read-modify-write loop every volume change goes through.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hawser_store::{get_json, list_json, put_json, Expect, Store, StoreError};

use crate::constants::MAX_CAS_RETRIES;
use crate::errors::ControllerError;
use crate::store::model::{
    node_key, node_settings_key, node_settings_prefix, nodes_prefix, volume_key, volumes_prefix,
    NodeRecord, NodeSettings, VolumeRecord,
};
use crate::store::volume_cache::{VolumeCache, Written};

/// How long a list waits for the watch-fed copy to show this controller's own writes
/// before it lists the store instead. The watch delivers in milliseconds; this is for a
/// store that is slow or failing.
pub const OWN_WRITES_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Clone)]
pub struct Records {
    store: Arc<dyn Store>,
    /// Every volume record as the last list decoded it, by key, with its version. Several
    /// loops list every volume every few seconds (reconcile, engine watch, self-heal,
    /// catch-up, standbys, failover), and 10,000 records are 5 MiB of JSON: a list decodes
    /// only the records whose version changed since. A key's version changes with every
    /// write (it is the store's revision), so a version names one content.
    decoded: Arc<Mutex<HashMap<String, (u64, VolumeRecord)>>>,
    /// The watch-fed copy the loops read (`volumes_seen`), kept while `follow_volumes` runs.
    seen: Arc<VolumeCache>,
}

impl Records {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Records {
            store,
            decoded: Arc::default(),
            seen: Arc::default(),
        }
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

    /// All volumes, sorted by name, including every write this controller made before the
    /// call: from the watch-fed copy once it shows them (within [`OWN_WRITES_WAIT`]), else
    /// from a list of the store (see `store/volume_cache.rs`).
    pub async fn volumes(&self) -> Result<Arc<Vec<VolumeRecord>>, ControllerError> {
        match self.seen.view_with_own_writes(OWN_WRITES_WAIT).await {
            Some(view) => Ok(view),
            None => Ok(Arc::new(self.volumes_listed().await?)),
        }
    }

    /// All volumes, sorted by name, from a list of the store made now: for a read that
    /// must see every write made before it by anyone (reconcile's orphans).
    pub async fn volumes_listed(&self) -> Result<Vec<VolumeRecord>, ControllerError> {
        let list = self.store.list(volumes_prefix()).await?;
        // No await below: the lock is held only while the list is matched to the cache.
        let mut cache = self.decoded.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(list.len());
        let mut seen = HashMap::with_capacity(list.len());
        for (key, v) in list {
            let record = match cache.remove(&key) {
                Some((version, record)) if version == v.version => record,
                _ => serde_json::from_slice::<VolumeRecord>(&v.value).map_err(|source| {
                    StoreError::Decode {
                        key: key.clone(),
                        source,
                    }
                })?,
            };
            out.push(record.clone());
            seen.insert(key, (v.version, record));
        }
        // What this list did not see was deleted.
        *cache = seen;
        Ok(out)
    }

    /// All volumes, sorted by name, as the watch-fed copy last saw them: for loops that
    /// choose work from the list and re-read each record they act on. A read that must see
    /// every write made before it uses [`Records::volumes`] (see `store/volume_cache.rs`).
    /// While the copy is not live (before `follow_volumes` has listed, or with the store
    /// failing) this is `volumes`.
    pub async fn volumes_seen(&self) -> Result<Arc<Vec<VolumeRecord>>, ControllerError> {
        match self.seen.view() {
            Some(view) => Ok(view),
            None => Ok(Arc::new(self.volumes_listed().await?)),
        }
    }

    /// Keeps the copy `volumes_seen` reads, until the task is aborted.
    pub fn follow_volumes(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.seen.clone().follow(self.store.clone())
    }

    /// Creates a volume record; fails with `VolumeExists` if the name is taken. A conflict
    /// that turns out to be this very record (a retried write whose first attempt landed,
    /// see `store/retry.rs`) is success.
    pub async fn create_volume(&self, volume: &VolumeRecord) -> Result<(), ControllerError> {
        let key = volume_key(&volume.name);
        match put_json(&*self.store, &key, volume, Expect::Absent).await {
            Ok(version) => {
                self.seen.wrote(&key, Written::Put(version));
                Ok(())
            }
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
                Ok(()) => {
                    self.seen.wrote(&key, Written::Delete(version));
                    return Ok(());
                }
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
                    self.seen.wrote(&key, Written::Put(version));
                    return Ok((current, out));
                }
            }
            let mut next = current.clone();
            let out = change(&mut next)?;
            if next == current {
                return Ok((next, out));
            }
            match put_json(&*self.store, &key, &next, Expect::Version(version)).await {
                Ok(written) => {
                    self.seen.wrote(&key, Written::Put(written));
                    return Ok((next, out));
                }
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

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::model::volume_key;

    /// A detached one-replica volume record of `size` bytes with no replicas.
    pub(crate) fn record(name: &str, size: u64) -> VolumeRecord {
        VolumeRecord::new(name, size, 1)
    }

    async fn sizes(r: &Records) -> Vec<(String, u64)> {
        let list = r.volumes().await.unwrap();
        list.iter()
            .map(|v| (v.name.clone(), v.size_bytes))
            .collect()
    }

    fn want(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    /// Lists through the decoded records see every write another client makes: a changed
    /// record, a deleted one, one made again under its old name, and one that does not
    /// decode (an error naming it, and the next list is right again).
    #[tokio::test]
    async fn volume_lists_see_every_change_through_the_decoded_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let store: Arc<dyn Store> = Arc::new(hawser_store::EmbeddedStore::open(path).unwrap());
        let records = Records::new(store.clone());
        for n in ["a", "b", "c"] {
            records.create_volume(&record(n, 1)).await.unwrap();
        }
        assert_eq!(sizes(&records).await, want(&[("a", 1), ("b", 1), ("c", 1)]));
        put_json(&*store, &volume_key("b"), &record("b", 2), Expect::Any)
            .await
            .unwrap();
        store.delete(&volume_key("c"), Expect::Any).await.unwrap();
        assert_eq!(sizes(&records).await, want(&[("a", 1), ("b", 2)]));
        put_json(&*store, &volume_key("c"), &record("c", 3), Expect::Absent)
            .await
            .unwrap();
        assert_eq!(sizes(&records).await, want(&[("a", 1), ("b", 2), ("c", 3)]));
        store
            .put(&volume_key("d"), b"{".to_vec(), Expect::Absent)
            .await
            .unwrap();
        let e = records.volumes().await.unwrap_err();
        assert!(format!("{e:?}").contains("volumes/d"), "{e:?}");
        store.delete(&volume_key("d"), Expect::Any).await.unwrap();
        assert_eq!(sizes(&records).await, want(&[("a", 1), ("b", 2), ("c", 3)]));
    }
}
