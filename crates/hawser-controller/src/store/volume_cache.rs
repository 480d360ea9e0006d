//! The controller's copy of every volume record, kept by a watch: what its loops choose
//! their work from.
//!
//! Why: reconcile, the engine watch, self-healing, snapshot catch-up, standbys, schedules
//! and failover's 500 ms round each read every volume, every few seconds. At 10,000 volumes
//! one list is 5 MiB from the store, and a controller with nothing to do spent 8-19% of a
//! core listing (docs/performance.md). The copy costs nothing while nothing changes.
//!
//! What it may be used for: the copy lags the store by a watch's delivery, milliseconds. A
//! loop picks candidates from it, and every action re-reads the record it changes (the
//! compare-and-swap of `Records::update_volume`, or a re-read under the volume's lock), so
//! a copy a moment old costs at most a wasted step, as a list read a moment earlier would.
//! A read that must see every write anyone made before it (reconcile's check that a
//! replica is an orphan) lists the store instead: `Records::volumes_listed`.
//!
//! Until the first list, while the watch is broken, and while a stored record does not
//! decode, [`VolumeCache::view`] answers `None` and readers list the store instead; they
//! then see what a list sees, including that record's decode error.
//!
//! The API's lists read the copy too, once it shows every write this controller made
//! before the request ([`VolumeCache::view_with_own_writes`]): every volume write goes
//! through `Records`, which tells the copy what it wrote. So a client that created a
//! volume finds it in the next list, as with a list of the store, and a list of 10,000
//! volumes on the Kubernetes store is not a 10,000-object request to the API server. A
//! write by another process (a deposed leader, an operator's `kubectl edit`) shows as soon
//! as the watch delivers it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hawser_store::{Store, StoreError, Versioned, WatchEvent};

use crate::store::model::{volumes_prefix, VolumeRecord};

/// The wait before listing again after the store failed a list or a watch.
const RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct VolumeCache {
    state: Mutex<State>,
    /// The store revision the copy has caught up to, for those waiting for a write to show.
    revision: tokio::sync::watch::Sender<u64>,
    /// `follow` runs: only then are this controller's writes waited for.
    following: AtomicBool,
}

/// A write of this controller to a volume record, by the version it wrote or deleted.
#[derive(Clone, Copy, Debug)]
pub enum Written {
    Put(u64),
    Delete(u64),
}

#[derive(Default)]
struct State {
    /// A list has been read and its watch is running.
    live: bool,
    /// Each record by key, with its version.
    records: BTreeMap<String, (u64, VolumeRecord)>,
    /// Keys whose stored value does not decode.
    undecodable: BTreeSet<String>,
    /// The records in key order, built at the first read after a change.
    view: Option<Arc<Vec<VolumeRecord>>>,
    /// The store revision the copy has caught up to.
    at: u64,
    /// This controller's writes the copy does not show yet, by key.
    unseen: HashMap<String, Written>,
}

impl VolumeCache {
    /// Every volume record in name order, or `None` while the copy cannot be trusted (see
    /// the module doc).
    pub fn view(&self) -> Option<Arc<Vec<VolumeRecord>>> {
        let mut st = self.lock();
        if !st.live || !st.undecodable.is_empty() {
            return None;
        }
        let State { records, view, .. } = &mut *st;
        let view = view
            .get_or_insert_with(|| Arc::new(records.values().map(|(_, r)| r.clone()).collect()));
        Some(view.clone())
    }

    /// [`VolumeCache::view`] once it shows every write [`VolumeCache::wrote`] was told of;
    /// `None` if it does not within `within` (the store is slow to deliver, or the watch
    /// broke), and then the caller lists the store.
    pub async fn view_with_own_writes(&self, within: Duration) -> Option<Arc<Vec<VolumeRecord>>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut rx = self.revision.subscribe();
        loop {
            if self.lock().unseen.is_empty() {
                return self.view();
            }
            if !self.lock().live {
                return None;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }

    /// This controller wrote `key`: readers of [`VolumeCache::view_with_own_writes`] wait
    /// until the copy shows it.
    pub fn wrote(&self, key: &str, written: Written) {
        if !self.following.load(Ordering::Relaxed) {
            return;
        }
        let mut st = self.lock();
        if !st.shows(key, written) {
            st.unseen.insert(key.to_string(), written);
        }
    }

    /// Waits until the copy has caught up to store revision `at`.
    #[cfg(test)]
    pub async fn caught_up(&self, at: u64) {
        let mut rx = self.revision.subscribe();
        // The sender lives in `self`, so the wait ends only when the revision comes.
        let _ = rx.wait_for(|r| *r >= at).await;
    }

    /// Keeps the copy until the task is aborted: a list, then a watch from the list's
    /// revision; after the watch ends, a watch from the last revision seen; after a store
    /// error, a list again a second later.
    pub async fn follow(self: Arc<Self>, store: Arc<dyn Store>) {
        self.following.store(true, Ordering::Relaxed);
        // Says so once per outage, not once a second.
        let mut quiet = false;
        loop {
            let (was_live, e) = self.follow_once(&*store).await;
            self.lock().live = false;
            if was_live || !quiet {
                tracing::warn!(error = %e, "the copy of the volume records stopped; the \
                    controller's loops list the store until it is back");
            }
            quiet = !was_live;
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }

    /// Lists and watches until the store fails; returns whether the copy went live, and
    /// the error.
    async fn follow_once(&self, store: &dyn Store) -> (bool, StoreError) {
        let prefix = volumes_prefix();
        let (list, mut at) = match store.list_at(prefix).await {
            Ok(l) => l,
            Err(e) => return (false, e),
        };
        let mut watch = match store.watch(prefix, at).await {
            Ok(w) => w,
            Err(e) => return (false, e),
        };
        self.replace(list, at);
        tracing::debug!(revision = at, "the copy of the volume records is live");
        loop {
            match watch.next().await {
                Some(Ok(event)) => {
                    at = at.max(event.revision());
                    self.apply(event, at);
                    self.revision.send_replace(at);
                }
                Some(Err(e)) => return (true, e),
                // The backend ended the watch (Kubernetes does every few minutes): go on
                // from the last revision seen, without listing again.
                None => match store.watch(prefix, at).await {
                    Ok(w) => watch = w,
                    Err(e) => return (true, e),
                },
            }
        }
    }

    /// Takes a fresh list, keeping the decoded records whose version did not change.
    fn replace(&self, list: Vec<(String, Versioned)>, at: u64) {
        let mut st = self.lock();
        let mut old = std::mem::take(&mut st.records);
        st.undecodable.clear();
        for (key, v) in list {
            match old.remove(&key) {
                Some((version, record)) if version == v.version => {
                    st.records.insert(key, (version, record));
                }
                _ => st.put(key, v),
            }
        }
        st.view = None;
        st.live = true;
        st.at = at;
        st.forget_seen();
        drop(st);
        self.revision.send_replace(at);
    }

    fn apply(&self, event: WatchEvent, at: u64) {
        let mut st = self.lock();
        match event {
            WatchEvent::Put { key, value } => st.put(key, value),
            WatchEvent::Delete { key, .. } => {
                st.records.remove(&key);
                st.undecodable.remove(&key);
            }
        }
        st.view = None;
        st.at = at;
        st.forget_seen();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// Whether the copy shows `written` to `key` (or a later change).
    fn shows(&self, key: &str, written: Written) -> bool {
        let have = self.records.get(key).map(|(v, _)| *v);
        match written {
            // Absent, once the copy is past the write: deleted since.
            Written::Put(v) => have.map_or(self.at >= v, |h| h >= v),
            // Absent once past the deleted version, or made again since.
            Written::Delete(v) => have.map_or(self.at >= v, |h| h > v),
        }
    }

    fn forget_seen(&mut self) {
        if self.unseen.is_empty() {
            return;
        }
        let seen: Vec<String> = self
            .unseen
            .iter()
            .filter(|(k, w)| self.shows(k, **w))
            .map(|(k, _)| k.clone())
            .collect();
        for k in seen {
            self.unseen.remove(&k);
        }
    }

    fn put(&mut self, key: String, v: Versioned) {
        match serde_json::from_slice::<VolumeRecord>(&v.value) {
            Ok(record) => {
                self.undecodable.remove(&key);
                self.records.insert(key, (v.version, record));
            }
            Err(_) => {
                self.records.remove(&key);
                self.undecodable.insert(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::model::volume_key;
    use crate::store::records::tests::record;
    use hawser_store::{put_json, EmbeddedStore, Expect};

    fn sizes(view: &[VolumeRecord]) -> Vec<(&str, u64)> {
        view.iter()
            .map(|v| (v.name.as_str(), v.size_bytes))
            .collect()
    }

    async fn put(store: &dyn Store, name: &str, size: u64) -> u64 {
        put_json(store, &volume_key(name), &record(name, size), Expect::Any)
            .await
            .unwrap()
    }

    /// The copy shows every change another client makes, once the watch delivered it: a
    /// changed record, a deleted one, one made again under its old name; and while a record
    /// does not decode it steps aside, so that readers list the store and see that error.
    #[tokio::test]
    async fn the_copy_follows_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(dir.path().join("s.json")).unwrap());
        for n in ["a", "b", "c"] {
            put(&*store, n, 1).await;
        }
        let cache = Arc::new(VolumeCache::default());
        assert!(cache.view().is_none(), "live before its first list");
        let task = tokio::spawn(cache.clone().follow(store.clone()));
        cache.caught_up(store.revision().await.unwrap()).await;
        assert_eq!(
            sizes(&cache.view().unwrap()),
            [("a", 1), ("b", 1), ("c", 1)]
        );

        put(&*store, "b", 2).await;
        store.delete(&volume_key("c"), Expect::Any).await.unwrap();
        cache.caught_up(store.revision().await.unwrap()).await;
        assert_eq!(sizes(&cache.view().unwrap()), [("a", 1), ("b", 2)]);
        let at = put(&*store, "c", 3).await;
        cache.caught_up(at).await;
        assert_eq!(
            sizes(&cache.view().unwrap()),
            [("a", 1), ("b", 2), ("c", 3)]
        );

        let at = store
            .put(&volume_key("d"), b"{".to_vec(), Expect::Absent)
            .await
            .unwrap();
        cache.caught_up(at).await;
        assert!(
            cache.view().is_none(),
            "serves a copy without an undecodable record"
        );
        store.delete(&volume_key("d"), Expect::Any).await.unwrap();
        cache.caught_up(store.revision().await.unwrap()).await;
        assert_eq!(
            sizes(&cache.view().unwrap()),
            [("a", 1), ("b", 2), ("c", 3)]
        );
        task.abort();
    }

    fn put_event(name: &str, size: u64, version: u64) -> WatchEvent {
        WatchEvent::Put {
            key: volume_key(name),
            value: Versioned {
                value: serde_json::to_vec(&record(name, size)).unwrap(),
                version,
            },
        }
    }

    /// A list waits for this controller's own writes to show in the copy (and no longer
    /// than told); a write the copy already shows, or one made again, is not waited for.
    #[tokio::test]
    async fn lists_wait_for_this_controllers_own_writes() {
        let cache = VolumeCache::default();
        cache.following.store(true, Ordering::Relaxed);
        let a = serde_json::to_vec(&record("a", 1)).unwrap();
        let listed = vec![(
            volume_key("a"),
            Versioned {
                value: a,
                version: 5,
            },
        )];
        cache.replace(listed, 7);
        let wait = Duration::from_millis(50);
        assert_eq!(
            sizes(&cache.view_with_own_writes(wait).await.unwrap()),
            [("a", 1)]
        );

        // Written at 8, not delivered yet: no answer from the copy.
        cache.wrote(&volume_key("b"), Written::Put(8));
        assert!(cache.view_with_own_writes(wait).await.is_none());
        // Delivered while a reader waits.
        let reader = cache.view_with_own_writes(Duration::from_secs(30));
        let deliver = async {
            tokio::task::yield_now().await;
            cache.apply(put_event("b", 2, 8), 8);
            cache.revision.send_replace(8);
        };
        let (view, ()) = tokio::join!(reader, deliver);
        assert_eq!(sizes(&view.unwrap()), [("a", 1), ("b", 2)]);

        // A delete of version 5 shows once the copy has it gone.
        cache.wrote(&volume_key("a"), Written::Delete(5));
        assert!(cache.view_with_own_writes(wait).await.is_none());
        cache.apply(
            WatchEvent::Delete {
                key: volume_key("a"),
                revision: 9,
            },
            9,
        );
        assert_eq!(
            sizes(&cache.view_with_own_writes(wait).await.unwrap()),
            [("b", 2)]
        );
        // Writes the copy shows already leave nothing to wait for.
        cache.wrote(&volume_key("b"), Written::Put(8));
        cache.wrote(&volume_key("a"), Written::Delete(5));
        assert!(cache.view_with_own_writes(wait).await.is_some());
    }

    /// A store that fails its first list: the copy is not live, then lists again and is.
    #[tokio::test]
    async fn the_copy_lists_again_after_the_store_failed() {
        let dir = tempfile::tempdir().unwrap();
        let inner = EmbeddedStore::open(dir.path().join("s.json")).unwrap();
        put(&inner, "a", 1).await;
        let store = Arc::new(FailsFirstList {
            inner,
            failed: std::sync::atomic::AtomicBool::new(false),
        });
        let cache = Arc::new(VolumeCache::default());
        let task = tokio::spawn(cache.clone().follow(store.clone()));
        let at = put(&*store, "b", 1).await;
        cache.caught_up(at).await;
        assert!(store.failed.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(sizes(&cache.view().unwrap()), [("a", 1), ("b", 1)]);
        task.abort();
    }

    struct FailsFirstList {
        inner: EmbeddedStore,
        failed: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl Store for FailsFirstList {
        async fn get(&self, key: &str) -> hawser_store::Result<Option<Versioned>> {
            self.inner.get(key).await
        }
        async fn list(&self, prefix: &str) -> hawser_store::Result<Vec<(String, Versioned)>> {
            self.inner.list(prefix).await
        }
        async fn list_at(
            &self,
            prefix: &str,
        ) -> hawser_store::Result<(Vec<(String, Versioned)>, u64)> {
            if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Unavailable {
                    endpoint: self.describe(),
                    op: "list",
                    key: prefix.into(),
                    reason: "injected".into(),
                });
            }
            self.inner.list_at(prefix).await
        }
        async fn put_with(
            &self,
            key: &str,
            value: Vec<u8>,
            expect: Expect,
            opts: &hawser_store::WriteOptions,
        ) -> hawser_store::Result<u64> {
            self.inner.put_with(key, value, expect, opts).await
        }
        async fn delete_with(
            &self,
            key: &str,
            expect: Expect,
            opts: &hawser_store::WriteOptions,
        ) -> hawser_store::Result<()> {
            self.inner.delete_with(key, expect, opts).await
        }
        async fn grant_lease(&self, ttl: Duration) -> hawser_store::Result<hawser_store::LeaseId> {
            self.inner.grant_lease(ttl).await
        }
        async fn keep_alive(&self, lease: hawser_store::LeaseId) -> hawser_store::Result<()> {
            self.inner.keep_alive(lease).await
        }
        async fn revoke_lease(&self, lease: hawser_store::LeaseId) -> hawser_store::Result<()> {
            self.inner.revoke_lease(lease).await
        }
        async fn watch(
            &self,
            prefix: &str,
            after: u64,
        ) -> hawser_store::Result<hawser_store::Watch> {
            self.inner.watch(prefix, after).await
        }
        async fn revision(&self) -> hawser_store::Result<u64> {
            self.inner.revision().await
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
    }
}
