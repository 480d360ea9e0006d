//! The retry rules on a store that loses answers or is down, and the records' recognition
//! of their own lost writes. (A real etcd cannot be made to lose one chosen answer; the e2e
//! test `etcd_restart` kills a real one.)
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use hawser_api::controller::{Replica, ReplicaState, VolumeState};
use hawser_store::EmbeddedStore;

use super::*;
use crate::errors::ControllerError;
use crate::store::model::VolumeRecord;
use crate::store::records::Records;

const TEST_POLICY: RetryPolicy = RetryPolicy {
    deadline: Duration::from_millis(400),
    first_backoff: Duration::from_millis(10),
    max_backoff: Duration::from_millis(50),
};

/// An embedded store with faults: `down` fails every call unsent; `lose_next` applies the
/// next write and then reports it failed (its answer lost); `fence_writes` refuses writes
/// as a deposed leader's.
struct FaultyStore {
    inner: EmbeddedStore,
    _dir: tempfile::TempDir,
    down: AtomicBool,
    lose_next: AtomicBool,
    fence_writes: AtomicBool,
    calls: AtomicU32,
}

impl FaultyStore {
    fn new() -> Arc<FaultyStore> {
        let dir = tempfile::tempdir().unwrap();
        Arc::new(FaultyStore {
            inner: EmbeddedStore::open(dir.path().join("s.json")).unwrap(),
            _dir: dir,
            down: AtomicBool::new(false),
            lose_next: AtomicBool::new(false),
            fence_writes: AtomicBool::new(false),
            calls: AtomicU32::new(0),
        })
    }

    fn unavailable(op: &'static str, key: &str) -> StoreError {
        StoreError::Unavailable {
            endpoint: "test".into(),
            op,
            key: key.into(),
            reason: "injected".into(),
        }
    }

    /// The fault of a call, if any, before it runs.
    fn before(&self, op: &'static str, key: &str, write: bool) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(Self::unavailable(op, key));
        }
        if write && self.fence_writes.load(Ordering::SeqCst) {
            return Err(StoreError::Fenced {
                key: key.into(),
                fence_key: "leader".into(),
                expected: 1,
                found: Some(2),
            });
        }
        Ok(())
    }

    /// A write's answer, or its loss.
    fn after<T>(&self, op: &'static str, key: &str, r: Result<T>) -> Result<T> {
        if r.is_ok() && self.lose_next.swap(false, Ordering::SeqCst) {
            return Err(Self::unavailable(op, key));
        }
        r
    }
}

#[async_trait]
impl Store for FaultyStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        self.before("get", key, false)?;
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>> {
        self.before("list", prefix, false)?;
        self.inner.list(prefix).await
    }
    async fn list_at(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64)> {
        self.before("list", prefix, false)?;
        self.inner.list_at(prefix).await
    }
    async fn put_with(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Expect,
        opts: &WriteOptions,
    ) -> Result<u64> {
        self.before("put", key, true)?;
        let r = self.inner.put_with(key, value, expect, opts).await;
        self.after("put", key, r)
    }
    async fn delete_with(&self, key: &str, expect: Expect, opts: &WriteOptions) -> Result<()> {
        self.before("delete", key, true)?;
        let r = self.inner.delete_with(key, expect, opts).await;
        self.after("delete", key, r)
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.inner.revoke_lease(lease).await
    }
    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch> {
        self.inner.watch(prefix, after).await
    }
    async fn revision(&self) -> Result<u64> {
        self.inner.revision().await
    }
    fn describe(&self) -> String {
        "faulty test store".into()
    }
}

const OWN_URL: &str = "http://me";

fn records_on(store: &Arc<FaultyStore>, leadership: Leadership) -> Records {
    let inner: Arc<dyn Store> = store.clone();
    let retrying = RetryingStore::new(inner, leadership, OWN_URL.into(), TEST_POLICY);
    Records::new(Arc::new(retrying))
}

fn volume(name: &str) -> VolumeRecord {
    let replica = |n: u32| Replica {
        id: format!("{name}-r{n}-abcdef"),
        node: format!("n{n}"),
        pool: "default".into(),
        state: ReplicaState::InSync,
        blank: false,
        engine: None,
    };
    VolumeRecord {
        replicas: vec![replica(0), replica(1)],
        ..VolumeRecord::new(name, 1 << 20, 2)
    }
}

/// Attach's change: only from Detached, one epoch up.
fn attach(v: &mut VolumeRecord) -> std::result::Result<(), ControllerError> {
    if v.state != VolumeState::Detached {
        return Err(ControllerError::Busy {
            volume: v.name.clone(),
            state: v.state,
        });
    }
    v.state = VolumeState::Attached;
    v.epoch += 1;
    Ok(())
}

/// A compare-and-swap whose answer was lost is sent again, fails as a conflict (it had
/// landed), and is recognised as this call's own write: done once, not refused as
/// "attached" and not applied twice.
#[tokio::test]
async fn a_lost_answer_of_an_update_counts_as_done_once() {
    let store = FaultyStore::new();
    let records = records_on(&store, Leadership::sole());
    records.create_volume(&volume("v")).await.unwrap();
    store.lose_next.store(true, Ordering::SeqCst);
    let (rec, ()) = records.update_volume("v", attach).await.unwrap();
    assert_eq!((rec.state, rec.epoch), (VolumeState::Attached, 1));
    assert_eq!(records.existing_volume("v").await.unwrap(), rec);
}

/// The same for a create (`Expect::Absent`) and for a delete of an expected record.
#[tokio::test]
async fn lost_answers_of_a_create_and_a_delete_count_as_done() {
    let store = FaultyStore::new();
    let records = records_on(&store, Leadership::sole());
    store.lose_next.store(true, Ordering::SeqCst);
    records.create_volume(&volume("v")).await.unwrap();
    assert_eq!(records.existing_volume("v").await.unwrap(), volume("v"));
    // Someone else's record of the same name is still "exists".
    let mut other = volume("w");
    other.name = "v".into();
    let err = records.create_volume(&other).await.unwrap_err();
    assert!(matches!(err, ControllerError::VolumeExists { .. }), "{err}");

    store.lose_next.store(true, Ordering::SeqCst);
    records
        .delete_volume_if("v", |v| *v == volume("v"))
        .await
        .unwrap();
    assert!(records.volume("v").await.unwrap().is_none());
}

/// A delete leaves a record that is not the one the caller worked on.
#[tokio::test]
async fn a_replaced_record_is_not_deleted() {
    let store = FaultyStore::new();
    let records = records_on(&store, Leadership::sole());
    records.create_volume(&volume("v")).await.unwrap();
    let err = records
        .delete_volume_if("v", |v| v.state == VolumeState::Deleting)
        .await
        .unwrap_err();
    assert!(matches!(err, ControllerError::Changed { .. }), "{err}");
    assert!(records.volume("v").await.unwrap().is_some());
}

/// A store that stays down: retried with backoff, then the error, near the deadline.
#[tokio::test]
async fn an_unreachable_store_is_given_up_on_at_the_deadline() {
    let store = FaultyStore::new();
    let records = records_on(&store, Leadership::sole());
    store.down.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let err = records.volume("v").await.unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(err, ControllerError::Store(StoreError::Unavailable { .. })),
        "{err}"
    );
    let calls = store.calls.load(Ordering::SeqCst);
    assert!(calls > 3, "only {calls} attempts");
    assert!(calls < 40, "{calls} attempts: no backoff");
    assert!(took >= TEST_POLICY.deadline / 2, "gave up after {took:?}");
    assert!(took < TEST_POLICY.deadline * 2, "gave up after {took:?}");
}

/// An outage that ends within the deadline is not seen by the caller.
#[tokio::test]
async fn a_short_outage_is_ridden_out() {
    let store = FaultyStore::new();
    let records = records_on(&store, Leadership::sole());
    records.create_volume(&volume("v")).await.unwrap();
    store.down.store(true, Ordering::SeqCst);
    let s = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(TEST_POLICY.deadline / 4).await;
        s.down.store(false, Ordering::SeqCst);
    });
    let (rec, ()) = records.update_volume("v", attach).await.unwrap();
    assert_eq!(rec.epoch, 1);
}

/// Refused for leadership: waited out while nobody else leads (this controller stepped down
/// for an etcd outage and may lead again), given up at once when another controller leads.
#[tokio::test]
async fn fenced_writes_wait_only_while_no_other_controller_leads() {
    let store = FaultyStore::new();
    let (role, leadership) = Leadership::for_test(Role::Follower {
        leader_url: Some("http://other".into()),
    });
    let records = records_on(&store, leadership);
    store.fence_writes.store(true, Ordering::SeqCst);
    let err = records.create_volume(&volume("v")).await.unwrap_err();
    assert!(
        matches!(err, ControllerError::Store(StoreError::Fenced { .. })),
        "{err}"
    );
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        1,
        "retried under another leader"
    );

    // Stepped down, the stale leader key still naming this controller; then leading again.
    role.send_replace(Role::Follower {
        leader_url: Some(format!("{OWN_URL}/")),
    });
    let s = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(TEST_POLICY.deadline / 4).await;
        s.fence_writes.store(false, Ordering::SeqCst);
        role.send_replace(Role::Sole);
    });
    records.create_volume(&volume("v")).await.unwrap();
    assert!(records.volume("v").await.unwrap().is_some());
}

/// Every call is timed, retries included, and one that fails for good is counted; a lost
/// compare-and-swap is not a failure of the store and is not counted.
#[tokio::test]
async fn store_calls_are_timed_and_failures_counted_but_not_lost_swaps() {
    let store = FaultyStore::new();
    let metrics = crate::state::metrics::ControllerMetrics::default();
    let inner: Arc<dyn Store> = store.clone();
    let retrying = RetryingStore::new(inner, Leadership::sole(), OWN_URL.into(), TEST_POLICY)
        .with_metrics(metrics.store.clone());
    retrying
        .put("k", b"1".to_vec(), Expect::Absent)
        .await
        .unwrap();
    let lost = retrying.put("k", b"2".to_vec(), Expect::Absent).await;
    assert!(lost.unwrap_err().is_conflict());
    store.down.store(true, Ordering::SeqCst);
    assert!(retrying.get("k").await.is_err());
    let r = crate::api::metrics::registry(&metrics, None);
    let (_, body) = hawser_api::metrics::render(&r, None);
    for line in [
        r#"hawser_store_request_duration_seconds_count{op="put"} 2"#,
        r#"hawser_store_request_duration_seconds_count{op="get"} 1"#,
        r#"hawser_store_errors_total{op="get"} 1"#,
    ] {
        assert!(body.lines().any(|l| l == line), "{line} not in:\n{body}");
    }
    assert!(
        !body.contains(r#"hawser_store_errors_total{op="put"}"#),
        "{body}"
    );
}
