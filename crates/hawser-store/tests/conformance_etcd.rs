//! The store conformance suite against a real etcd (one server per test, started here; the
//! tests fail if the `etcd` binary is missing), and what only etcd can do: die and come back.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_store::{EtcdConfig, EtcdStore, EtcdUrlError, Expect, Store, StoreError};
use hawser_testkit::conformance_tests;
use hawser_testkit::etcd_process::EtcdProcess;

struct Guard {
    _etcd: EtcdProcess,
    _dir: tempfile::TempDir,
}

async fn start_etcd() -> (tempfile::TempDir, EtcdProcess) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let etcd = tokio::task::spawn_blocking(move || EtcdProcess::start(&path))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    (dir, etcd)
}

async fn connect(etcd: &EtcdProcess, prefix: &str) -> EtcdStore {
    let mut cfg = EtcdConfig::parse(&etcd.store_url(prefix)).unwrap();
    cfg.request_timeout = Duration::from_secs(1);
    cfg.connect_timeout = Duration::from_millis(500);
    EtcdStore::connect(cfg).await.unwrap()
}

async fn etcd() -> (Guard, Arc<dyn Store>) {
    let (dir, etcd) = start_etcd().await;
    let store = connect(&etcd, "conformance").await;
    (
        Guard {
            _etcd: etcd,
            _dir: dir,
        },
        Arc::new(store),
    )
}

conformance_tests!(etcd);

#[test]
fn urls_parse() {
    let c = EtcdConfig::parse("etcd://a:1,b:2/x/y/").unwrap();
    assert_eq!(c.endpoints, ["http://a:1", "http://b:2"]);
    assert_eq!(c.prefix, "/x/y/");
    assert_eq!(EtcdConfig::parse("etcd://a:1").unwrap().prefix, "/hawser/");
    for bad in [
        "http://a:1",
        "etcd://",
        "etcd://a",
        "etcd://a:x",
        "etcd://:1",
        "etcd://a:1,",
    ] {
        assert!(EtcdConfig::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(
        EtcdConfig::parse("http://a:1").unwrap_err(),
        EtcdUrlError::Scheme {
            url: "http://a:1".into()
        }
    );
    let err = EtcdConfig::parse("etcd://a:1,b").unwrap_err();
    assert_eq!(
        err,
        EtcdUrlError::Endpoint {
            endpoint: "b".into(),
            url: "etcd://a:1,b".into()
        }
    );
    assert_eq!(
        err.to_string(),
        r#"endpoint "b" in "etcd://a:1,b" is not host:port"#
    );
}

/// Two prefixes on one etcd are two separate stores.
#[tokio::test]
async fn prefixes_are_separate() {
    let (_dir, etcd) = start_etcd().await;
    let a = connect(&etcd, "a").await;
    let b = connect(&etcd, "a2").await;
    a.put("k", b"a".to_vec(), Expect::Absent).await.unwrap();
    b.put("k", b"b".to_vec(), Expect::Absent).await.unwrap();
    assert_eq!(a.list("").await.unwrap().len(), 1);
    assert_eq!(a.get("k").await.unwrap().unwrap().value, b"a");
}

/// Polls `op` until it succeeds; fails after `within`.
async fn until_ok<T, F: std::future::Future<Output = Result<T, StoreError>>>(
    within: Duration,
    mut op: impl FnMut() -> F,
) -> T {
    let start = Instant::now();
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(e.is_unavailable(), "unexpected error while waiting: {e:?}");
                assert!(
                    start.elapsed() < within,
                    "still failing after {within:?}: {e}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// kill -9 etcd mid-test: every operation fails with `Unavailable` (naming the endpoint and
/// the operation) while it is down, none of them takes effect, and after a restart on the
/// same data directory the state is exactly what was acknowledged before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_and_restarted() {
    let (_dir, mut etcd) = start_etcd().await;
    let s = connect(&etcd, "outage").await;
    let v1 = s
        .put("counter", b"1".to_vec(), Expect::Absent)
        .await
        .unwrap();
    let other = s.put("other", b"x".to_vec(), Expect::Any).await.unwrap();
    let lease = s.grant_lease(Duration::from_secs(60)).await.unwrap();
    let mut watch = s.watch("", s.revision().await.unwrap()).await.unwrap();

    tokio::task::block_in_place(|| etcd.kill());
    let endpoint = etcd.endpoint();
    let started = Instant::now();
    let errors = vec![
        s.get("counter").await.map(|_| ()).unwrap_err(),
        s.list("").await.map(|_| ()).unwrap_err(),
        s.put("counter", b"2".to_vec(), Expect::Version(v1))
            .await
            .map(|_| ())
            .unwrap_err(),
        s.put("new", b"n".to_vec(), Expect::Absent)
            .await
            .map(|_| ())
            .unwrap_err(),
        s.delete("other", Expect::Any).await.unwrap_err(),
        s.grant_lease(Duration::from_secs(5))
            .await
            .map(|_| ())
            .unwrap_err(),
        s.keep_alive(lease).await.unwrap_err(),
    ];
    for e in &errors {
        assert!(e.is_unavailable(), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains(&endpoint),
            "error does not name the endpoint: {msg}"
        );
    }
    assert!(
        errors[2].to_string().contains("put \"counter\""),
        "{}",
        errors[2]
    );
    // Each failed within its deadline instead of hanging.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    // The watch reports the outage rather than going quiet forever.
    match tokio::time::timeout(Duration::from_secs(15), watch.next()).await {
        Ok(Some(Err(e))) => assert!(e.is_unavailable(), "{e:?}"),
        Ok(None) => {}
        other => panic!(
            "watch did not report the outage: {:?}",
            other.map(|o| o.map(|r| r.map(|_| ())))
        ),
    }

    tokio::task::block_in_place(|| etcd.restart()).unwrap();
    let got = until_ok(Duration::from_secs(20), || s.get("counter"))
        .await
        .unwrap();
    assert_eq!(
        (got.value.as_slice(), got.version),
        (&b"1"[..], v1),
        "the failed CAS did not apply"
    );
    assert_eq!(
        s.get("other").await.unwrap().unwrap().version,
        other,
        "the failed delete did not apply"
    );
    assert_eq!(
        s.get("new").await.unwrap(),
        None,
        "the failed create did not apply"
    );
    s.keep_alive(lease).await.unwrap();
    // The CAS that failed during the outage now succeeds exactly once.
    let v2 = s
        .put("counter", b"2".to_vec(), Expect::Version(v1))
        .await
        .unwrap();
    assert!(v2 > other);
    assert!(s
        .put("counter", b"3".to_vec(), Expect::Version(v1))
        .await
        .unwrap_err()
        .is_conflict());
    assert_eq!(s.get("counter").await.unwrap().unwrap().value, b"2");
    // A new watch from before the outage sees exactly that one change.
    let mut w = s.watch("counter", v1).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(Ok(e))) => assert_eq!(e.revision(), v2),
        other => panic!("{:?}", other.map(|o| o.map(|r| r.map(|_| ())))),
    }
    s.revoke_lease(lease).await.unwrap();
}
