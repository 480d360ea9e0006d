//! The store conformance suite: one set of checks every backend must pass. hawser-store's
//! tests run it on the embedded file and etcd through [`conformance_tests!`] (imported by
//! name: `use hawser_testkit::conformance_tests;`), hawser-kube's on a kube-apiserver
//! through [`all`].
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_store::{Expect, Fence, Store, StoreError, Watch, WatchEvent, WriteOptions};

/// Calls `$m!(<args> ; <every check>)`: the one list of the suite's checks.
#[macro_export]
macro_rules! with_checks {
    ($m:ident ! ($($args:tt)*)) => {
        $m! {$($args)* ;
            cas_semantics, delete_conditions, list_order, list_larger_than_one_reply, versions_grow,
            concurrent_cas_exactly_one_wins, lease_expiry_removes_key, lease_revoke_and_keep_alive,
            fenced_writes, watch_sees_changes_in_order, watch_from_the_past, list_at_then_watch,
            binary_values}
    };
}

/// Generates one `#[tokio::test]` per check; `$fixture` is an async fn returning
/// `(guard, Arc<dyn Store>)` (the guard keeps the backend alive).
#[macro_export]
macro_rules! conformance_tests {
    ($fixture:path) => {
        $crate::with_checks!(conformance_tests!(@each $fixture));
    };
    (@each $fixture:path ; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (_guard, store) = $fixture().await;
                $crate::store_conformance::$name(store).await;
            }
        )*
    };
}

/// One check of the suite, boxed.
pub type Check =
    fn(Arc<dyn Store>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

macro_rules! list_checks {
    (; $($name:ident),*) => {
        /// Every check with its name, for a backend that runs them all in one test.
        pub fn all() -> Vec<(&'static str, Check)> {
            vec![$((stringify!($name), |s| Box::pin($name(s)) as _)),*]
        }
    };
}
with_checks!(list_checks!());

/// How long any backend may take to notice an expired lease (etcd checks about every
/// 500 ms, and its minimum TTL is about 2 s).
const EXPIRY_SLACK: Duration = Duration::from_secs(5);

pub async fn cas_semantics(s: Arc<dyn Store>) {
    let v1 = s
        .put("volumes/a", b"1".to_vec(), Expect::Absent)
        .await
        .unwrap();
    let err = s
        .put("volumes/a", b"2".to_vec(), Expect::Absent)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { ref key, expected: Expect::Absent, found: Some(f) }
            if key == "volumes/a" && f == v1),
        "{err:?}"
    );
    let v2 = s
        .put("volumes/a", b"2".to_vec(), Expect::Version(v1))
        .await
        .unwrap();
    assert!(v2 > v1);
    let err = s
        .put("volumes/a", b"3".to_vec(), Expect::Version(v1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { found: Some(f), .. } if f == v2),
        "{err:?}"
    );
    let err = s
        .put("volumes/b", b"x".to_vec(), Expect::Version(v1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { found: None, .. }),
        "{err:?}"
    );
    assert_eq!(
        s.get("volumes/b").await.unwrap(),
        None,
        "a failed CAS wrote nothing"
    );
    let got = s.get("volumes/a").await.unwrap().unwrap();
    assert_eq!((got.value.as_slice(), got.version), (&b"2"[..], v2));
    let v3 = s
        .put("volumes/a", b"4".to_vec(), Expect::Any)
        .await
        .unwrap();
    assert!(v3 > v2);
}

pub async fn delete_conditions(s: Arc<dyn Store>) {
    let v1 = s.put("k", b"1".to_vec(), Expect::Any).await.unwrap();
    let v2 = s
        .put("k", b"2".to_vec(), Expect::Version(v1))
        .await
        .unwrap();
    assert!(s
        .delete("k", Expect::Version(v1))
        .await
        .unwrap_err()
        .is_conflict());
    assert!(s
        .delete("k", Expect::Absent)
        .await
        .unwrap_err()
        .is_conflict());
    assert!(
        s.get("k").await.unwrap().is_some(),
        "failed deletes deleted nothing"
    );
    s.delete("k", Expect::Version(v2)).await.unwrap();
    assert_eq!(s.get("k").await.unwrap(), None);
    // Deleting a missing key is a no-op unless a version was expected.
    s.delete("k", Expect::Any).await.unwrap();
    s.delete("k", Expect::Absent).await.unwrap();
    let err = s.delete("k", Expect::Version(v2)).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { found: None, .. }),
        "{err:?}"
    );
    let v3 = s.put("k", b"3".to_vec(), Expect::Absent).await.unwrap();
    assert!(v3 > v2, "a recreated key never reuses a version");
    s.delete("k", Expect::Any).await.unwrap();
    assert_eq!(s.get("k").await.unwrap(), None);
}

pub async fn list_order(s: Arc<dyn Store>) {
    for k in [
        "volumes/b",
        "nodes/n1",
        "volumes/a",
        "volumesx",
        "w",
        "volumes/a/x",
    ] {
        s.put(k, k.as_bytes().to_vec(), Expect::Any).await.unwrap();
    }
    let list = s.list("volumes/").await.unwrap();
    let keys: Vec<&str> = list.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["volumes/a", "volumes/a/x", "volumes/b"]);
    for (k, v) in &list {
        assert_eq!(v.value, k.as_bytes());
        assert_eq!(s.get(k).await.unwrap().unwrap().version, v.version);
    }
    let all: Vec<String> = s
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(all, sorted);
    assert_eq!(all.len(), 6);
    assert!(s.list("zzz").await.unwrap().is_empty());
}

/// A list of more than 4 MiB (a gRPC client's default message limit) and more keys than
/// one etcd range page: every key once, in order, with its value, as for a small one. 10,000
/// volume records are about this large.
pub async fn list_larger_than_one_reply(s: Arc<dyn Store>) {
    const KEYS: usize = 1_100;
    let value = |i: usize| {
        let mut v = format!("{i:05}").into_bytes();
        v.resize(4096, b'x');
        v
    };
    for i in 0..KEYS {
        s.put(&format!("many/{i:05}"), value(i), Expect::Any)
            .await
            .unwrap();
    }
    s.put("many0", b"outside".to_vec(), Expect::Any)
        .await
        .unwrap();
    let list = s.list("many/").await.unwrap();
    assert_eq!(list.len(), KEYS);
    for (i, (k, v)) in list.iter().enumerate() {
        assert_eq!(*k, format!("many/{i:05}"));
        assert_eq!(v.value, value(i), "{k}");
    }
}

pub async fn versions_grow(s: Arc<dyn Store>) {
    let r0 = s.revision().await.unwrap();
    let a = s.put("a", b"1".to_vec(), Expect::Any).await.unwrap();
    let b = s.put("b", b"1".to_vec(), Expect::Any).await.unwrap();
    s.delete("a", Expect::Any).await.unwrap();
    let r1 = s.revision().await.unwrap();
    assert!(r0 < a && a < b && b < r1, "{r0} {a} {b} {r1}");
    // A failed write changes nothing. (Whether it moves the revision is not asked: on
    // Kubernetes the revision is the whole cluster's and moves with any object.)
    assert!(s.put("b", vec![], Expect::Absent).await.is_err());
    assert_eq!(s.get("b").await.unwrap().unwrap().version, b);
    assert!(s.revision().await.unwrap() >= r1);
}

pub async fn concurrent_cas_exactly_one_wins(s: Arc<dyn Store>) {
    for round in 0..5 {
        let v = s
            .put("k", format!("base{round}").into_bytes(), Expect::Any)
            .await
            .unwrap();
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    s.put("k", format!("w{i}").into_bytes(), Expect::Version(v))
                        .await
                })
            })
            .collect();
        let mut wins = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await.unwrap() {
                Ok(_) => wins.push(i),
                Err(e) => assert!(e.is_conflict(), "{e:?}"),
            }
        }
        assert_eq!(wins.len(), 1, "round {round}: winners {wins:?}");
        let got = s.get("k").await.unwrap().unwrap();
        assert_eq!(got.value, format!("w{}", wins[0]).into_bytes());
    }
}

fn leased(lease: i64) -> WriteOptions {
    WriteOptions {
        lease: Some(lease),
        fence: None,
    }
}

/// Polls until `key` is gone; returns how long it took.
async fn wait_gone(s: &dyn Store, key: &str, within: Duration) -> Duration {
    let start = Instant::now();
    while s.get(key).await.unwrap().is_some() {
        assert!(
            start.elapsed() < within,
            "{key} still there after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

pub async fn lease_expiry_removes_key(s: Arc<dyn Store>) {
    let ttl = Duration::from_secs(2);
    let lease = s.grant_lease(ttl).await.unwrap();
    s.put_with("leader", b"me".to_vec(), Expect::Absent, &leased(lease))
        .await
        .unwrap();
    s.put("plain", b"stays".to_vec(), Expect::Any)
        .await
        .unwrap();
    // Renewed for longer than the TTL, the key stays.
    let start = Instant::now();
    while start.elapsed() < ttl + Duration::from_secs(1) {
        s.keep_alive(lease).await.unwrap();
        assert!(
            s.get("leader").await.unwrap().is_some(),
            "expired while renewed"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Not renewed, it goes, and only it.
    let took = wait_gone(&*s, "leader", ttl + EXPIRY_SLACK).await;
    assert!(
        took + Duration::from_millis(300) >= ttl / 2,
        "expired too early: {took:?}"
    );
    assert!(s.get("plain").await.unwrap().is_some());
    let err = s.keep_alive(lease).await.unwrap_err();
    assert!(matches!(err, StoreError::LeaseExpired { .. }), "{err:?}");
    let err = s
        .put_with("again", vec![], Expect::Any, &leased(lease))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseExpired { lease: l } if l == lease),
        "{err:?}"
    );
    assert_eq!(s.get("again").await.unwrap(), None);
}

pub async fn lease_revoke_and_keep_alive(s: Arc<dyn Store>) {
    let lease = s.grant_lease(Duration::from_secs(30)).await.unwrap();
    let other = s.grant_lease(Duration::from_secs(30)).await.unwrap();
    assert_ne!(lease, other);
    s.put_with("a", b"1".to_vec(), Expect::Any, &leased(lease))
        .await
        .unwrap();
    s.put_with("b", b"1".to_vec(), Expect::Any, &leased(lease))
        .await
        .unwrap();
    s.put_with("c", b"1".to_vec(), Expect::Any, &leased(other))
        .await
        .unwrap();
    // Re-putting a key without a lease detaches it from the lease.
    s.put("b", b"2".to_vec(), Expect::Any).await.unwrap();
    s.keep_alive(lease).await.unwrap();
    s.revoke_lease(lease).await.unwrap();
    assert_eq!(s.get("a").await.unwrap(), None, "revoke deletes at once");
    assert_eq!(s.get("b").await.unwrap().unwrap().value, b"2");
    assert!(s.get("c").await.unwrap().is_some());
    s.revoke_lease(lease).await.unwrap();
    s.revoke_lease(other).await.unwrap();
    assert_eq!(s.get("c").await.unwrap(), None);
}

pub async fn fenced_writes(s: Arc<dyn Store>) {
    let lease = s.grant_lease(Duration::from_secs(30)).await.unwrap();
    let fv = s
        .put_with("leader", b"me".to_vec(), Expect::Absent, &leased(lease))
        .await
        .unwrap();
    let fence = WriteOptions {
        lease: None,
        fence: Some(Fence {
            key: "leader".into(),
            version: fv,
        }),
    };
    let v = s
        .put_with("volumes/a", b"1".to_vec(), Expect::Absent, &fence)
        .await
        .unwrap();
    s.delete_with("volumes/a", Expect::Version(v), &fence)
        .await
        .unwrap();
    let v = s
        .put_with("volumes/a", b"2".to_vec(), Expect::Any, &fence)
        .await
        .unwrap();
    // Keep-alives do not change the fence key's version.
    s.keep_alive(lease).await.unwrap();
    s.put_with("volumes/a", b"3".to_vec(), Expect::Version(v), &fence)
        .await
        .unwrap();
    // Another leader took over: fenced, whether or not the CAS itself would hold.
    let other = s
        .put("leader", b"other".to_vec(), Expect::Any)
        .await
        .unwrap();
    let cur = s.get("volumes/a").await.unwrap().unwrap();
    let err = s
        .put_with(
            "volumes/a",
            b"4".to_vec(),
            Expect::Version(cur.version),
            &fence,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Fenced { ref fence_key, expected, found: Some(f), .. }
            if fence_key == "leader" && expected == fv && f == other),
        "{err:?}"
    );
    let err = s
        .delete_with("volumes/a", Expect::Any, &fence)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err:?}");
    assert_eq!(
        s.get("volumes/a").await.unwrap().unwrap(),
        cur,
        "fenced writes changed nothing"
    );
    // The lease is gone: the fence key is absent.
    s.delete("leader", Expect::Any).await.unwrap();
    let err = s
        .put_with("volumes/b", b"1".to_vec(), Expect::Absent, &fence)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Fenced { found: None, .. }),
        "{err:?}"
    );
    assert_eq!(s.get("volumes/b").await.unwrap(), None);
    // A CAS conflict under a holding fence is still a conflict.
    let fv2 = s
        .put("leader", b"me".to_vec(), Expect::Absent)
        .await
        .unwrap();
    let fence2 = WriteOptions {
        lease: None,
        fence: Some(Fence {
            key: "leader".into(),
            version: fv2,
        }),
    };
    let err = s
        .put_with("volumes/a", b"5".to_vec(), Expect::Absent, &fence2)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    s.revoke_lease(lease).await.unwrap();
}

/// The next event, or a failure after 10 s.
async fn next_event(w: &mut Watch) -> WatchEvent {
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(Ok(e))) => e,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch event within 10 s"),
    }
}

fn put_event(key: &str, value: &[u8], version: u64) -> WatchEvent {
    WatchEvent::Put {
        key: key.into(),
        value: hawser_store::Versioned {
            value: value.to_vec(),
            version,
        },
    }
}

pub async fn watch_sees_changes_in_order(s: Arc<dyn Store>) {
    let r0 = s.revision().await.unwrap();
    let mut w = s.watch("volumes/", r0).await.unwrap();
    let a1 = s
        .put("volumes/a", b"1".to_vec(), Expect::Absent)
        .await
        .unwrap();
    s.put("nodes/n1", b"x".to_vec(), Expect::Any).await.unwrap();
    let b1 = s
        .put("volumes/b", b"1".to_vec(), Expect::Any)
        .await
        .unwrap();
    let a2 = s
        .put("volumes/a", b"2".to_vec(), Expect::Version(a1))
        .await
        .unwrap();
    // Failed writes are not events.
    assert!(s.put("volumes/a", vec![], Expect::Absent).await.is_err());
    s.delete("volumes/b", Expect::Any).await.unwrap();
    let b_deleted = s.revision().await.unwrap();
    let lease = s.grant_lease(Duration::from_secs(2)).await.unwrap();
    let c1 = s
        .put_with("volumes/c", b"l".to_vec(), Expect::Any, &leased(lease))
        .await
        .unwrap();
    assert_eq!(next_event(&mut w).await, put_event("volumes/a", b"1", a1));
    assert_eq!(next_event(&mut w).await, put_event("volumes/b", b"1", b1));
    assert_eq!(next_event(&mut w).await, put_event("volumes/a", b"2", a2));
    // The delete's revision lies between the last put and the revision read after it
    // (equal to the latter when nothing else wrote to the store meanwhile).
    match next_event(&mut w).await {
        WatchEvent::Delete { key, revision } => {
            assert_eq!(key, "volumes/b");
            assert!(
                a2 < revision && revision <= b_deleted,
                "{a2} {revision} {b_deleted}"
            );
        }
        other => panic!("expected the delete of volumes/b, got {other:?}"),
    }
    assert_eq!(next_event(&mut w).await, put_event("volumes/c", b"l", c1));
    // Lease expiry is a delete event too.
    match next_event(&mut w).await {
        WatchEvent::Delete { key, revision } => {
            assert_eq!(key, "volumes/c");
            assert!(revision > c1);
        }
        other => panic!("expected the expiry of volumes/c, got {other:?}"),
    }
}

pub async fn watch_from_the_past(s: Arc<dyn Store>) {
    let r0 = s.revision().await.unwrap();
    let a1 = s
        .put("volumes/a", b"1".to_vec(), Expect::Any)
        .await
        .unwrap();
    let a2 = s
        .put("volumes/a", b"2".to_vec(), Expect::Any)
        .await
        .unwrap();
    // Starting after a1 replays only a2, then live changes follow.
    let mut w = s.watch("volumes/", a1).await.unwrap();
    let mut all = s.watch("volumes/", r0).await.unwrap();
    assert_eq!(next_event(&mut w).await, put_event("volumes/a", b"2", a2));
    let a3 = s
        .put("volumes/a", b"3".to_vec(), Expect::Any)
        .await
        .unwrap();
    assert_eq!(next_event(&mut w).await, put_event("volumes/a", b"3", a3));
    for (v, rev) in [(b"1", a1), (b"2", a2), (b"3", a3)] {
        assert_eq!(next_event(&mut all).await, put_event("volumes/a", v, rev));
    }
}

/// A list and the revision it was read at: a watch from there starts with the first change
/// after the list, neither repeating what the list showed nor missing what came after.
/// (A controller's copy of the volume records is kept this way, `store/volume_cache.rs`.)
pub async fn list_at_then_watch(s: Arc<dyn Store>) {
    let a1 = s
        .put("volumes/a", b"1".to_vec(), Expect::Any)
        .await
        .unwrap();
    s.put("volumes/b", b"1".to_vec(), Expect::Any)
        .await
        .unwrap();
    s.delete("volumes/b", Expect::Any).await.unwrap();
    let (list, at) = s.list_at("volumes/").await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].0.as_str(), list[0].1.version), ("volumes/a", a1));
    assert!(at >= a1, "{at} {a1}");
    let mut w = s.watch("volumes/", at).await.unwrap();
    let a2 = s
        .put("volumes/a", b"2".to_vec(), Expect::Version(a1))
        .await
        .unwrap();
    assert_eq!(next_event(&mut w).await, put_event("volumes/a", b"2", a2));
}

pub async fn binary_values(s: Arc<dyn Store>) {
    let bytes: Vec<u8> = (0..=255).collect();
    let v = s.put("bin", bytes.clone(), Expect::Any).await.unwrap();
    let got = s.get("bin").await.unwrap().unwrap();
    assert_eq!((got.value, got.version), (bytes, v));
    s.put("empty", vec![], Expect::Any).await.unwrap();
    assert_eq!(
        s.get("empty").await.unwrap().unwrap().value,
        Vec::<u8>::new()
    );
}
