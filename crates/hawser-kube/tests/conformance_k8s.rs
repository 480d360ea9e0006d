//! The store conformance suite against a real kube-apiserver (v1.33, built by
//! scripts/k8s/build.sh; the test fails if it is missing). One API server for the whole
//! suite, every check in a namespace of its own, all at once; then what only this backend
//! has: missing CRDs, `kubectl get` columns, orphaned and abandoned leases.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use hawser_kube::{install_crds, KubeStore, KubeStoreUrl};
use hawser_store::{Expect, Store, WriteOptions};
use hawser_testkit::apiserver_process::ApiserverProcess;

type Extra = fn(
    Arc<ApiserverProcess>,
    KubeStore,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Runs kubectl (from the Kubernetes build) against the test API server.
fn kubectl(api: &ApiserverProcess, args: &[&str]) -> String {
    let bin = hawser_testkit::apiserver_process::k8s_bin_dir().join("kubectl");
    let out = std::process::Command::new(&bin)
        .arg("--kubeconfig")
        .arg(api.kubeconfig())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `kubectl get` shows a volume's size, state and replica states as columns, and any record's
/// key, even one whose object name had to be hashed.
async fn kubectl_shows_records(api: Arc<ApiserverProcess>, s: KubeStore) {
    let volume = br#"{"name":"pvc-1","size_bytes":1073741824,"replica_count":2,"thin":true,
        "state":"attached","epoch":7,"attached_node":"n1","placement":{"ratio":1.5},
        "replicas":[{"id":"r1","node":"n1","pool":"p","state":"in_sync"},
                    {"id":"r2","node":"n2","pool":"p","state":"outdated"}]}"#;
    s.put("volumes/pvc-1", volume.to_vec(), Expect::Absent)
        .await
        .unwrap();
    s.put("auth/tokens", b"digest".to_vec(), Expect::Absent)
        .await
        .unwrap();
    let ns = "x-kubectl-shows-records";
    let out = tokio::task::spawn_blocking({
        let api = api.clone();
        move || kubectl(&api, &["get", "hawservolumes", "-n", ns, "-o", "wide"])
    })
    .await
    .unwrap();
    let header = out.lines().next().unwrap();
    for col in [
        "NAME", "SIZE", "STATE", "NODE", "EPOCH", "IN-SYNC", "REPLICAS", "DEGRADED",
    ] {
        assert!(header.contains(col), "{out}");
    }
    let row = out.lines().nth(1).unwrap();
    for cell in [
        "pvc-1",
        "1073741824",
        "attached",
        "n1",
        "7",
        "1/2",
        "n1=in_sync,n2=outdated",
        "True",
    ] {
        assert!(
            row.split_whitespace().any(|c| c == cell),
            "{cell} missing: {out}"
        );
    }
    // The record reads back as the same JSON (the float included).
    let got = s.get("volumes/pvc-1").await.unwrap().unwrap().value;
    let want: serde_json::Value = serde_json::from_slice(volume).unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got).unwrap(),
        want
    );
    let out =
        tokio::task::spawn_blocking(move || kubectl(&api, &["get", "hawserrecords", "-n", ns]))
            .await
            .unwrap();
    assert!(
        out.contains("auth/tokens") && out.contains("digest"),
        "{out}"
    );
}

/// Keys whose Lease was deleted behind the store's back (or that were written as their lease
/// expired) are swept.
async fn orphans_of_a_deleted_lease_go(api: Arc<ApiserverProcess>, s: KubeStore) {
    let lease = s.grant_lease(Duration::from_secs(60)).await.unwrap();
    let opts = WriteOptions {
        lease: Some(lease),
        fence: None,
    };
    s.put_with("controllers/a", b"x".to_vec(), Expect::Any, &opts)
        .await
        .unwrap();
    s.put("controllers/b", b"y".to_vec(), Expect::Any)
        .await
        .unwrap();
    let name = format!("hawser-lease-{lease:016x}");
    tokio::task::spawn_blocking(move || {
        kubectl(
            &api,
            &[
                "delete",
                "lease",
                &name,
                "-n",
                "x-orphans-of-a-deleted-lease-go",
            ],
        )
    })
    .await
    .unwrap();
    let start = std::time::Instant::now();
    while s.get("controllers/a").await.unwrap().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "orphan not swept in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        s.get("controllers/b").await.unwrap().is_some(),
        "unleased key kept"
    );
}

/// A client that dies holding a lease (its reaper gone with it) has the lease expired by
/// another client, which never compared clocks with it.
async fn another_client_expires_a_dead_clients_lease(api: Arc<ApiserverProcess>, s: KubeStore) {
    let url = KubeStoreUrl::parse("k8s://x-another-client-expires-a-dead-clients-lease").unwrap();
    let dying = KubeStore::connect(&api.config(), &url, "dying", Duration::from_secs(5))
        .await
        .unwrap();
    let lease = dying.grant_lease(Duration::from_secs(2)).await.unwrap();
    let opts = WriteOptions {
        lease: Some(lease),
        fence: None,
    };
    dying
        .put_with("leader", b"dying".to_vec(), Expect::Absent, &opts)
        .await
        .unwrap();
    drop(dying);
    let start = std::time::Instant::now();
    while s.get("leader").await.unwrap().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not expired in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "expired early: {:?}",
        start.elapsed()
    );
}

async fn store(api: &ApiserverProcess, namespace: &str) -> KubeStore {
    api.create_namespace(namespace).await.unwrap();
    let url = KubeStoreUrl::parse(&format!("k8s://{namespace}")).unwrap();
    KubeStore::connect(&api.config(), &url, "conformance", Duration::from_secs(5))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_kube_apiserver() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiserverProcess::start(dir.path())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Without the CRDs, connecting says what is missing and how to install it.
    let err = KubeStore::connect(
        &api.config(),
        &KubeStoreUrl::parse("k8s://default").unwrap(),
        "t",
        Duration::from_secs(5),
    )
    .await
    .err()
    .expect("connected without CRDs");
    let msg = err.to_string();
    assert!(
        msg.contains("hawservolumes") && msg.contains("helm install"),
        "{msg}"
    );
    install_crds(&api.config(), Duration::from_secs(30))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for (name, check) in hawser_testkit::store_conformance::all() {
        let s: Arc<dyn Store> =
            Arc::new(store(&api, &format!("c-{}", name.replace('_', "-"))).await);
        tasks.push((name, tokio::spawn(check(s))));
    }
    let extra: [(&str, Extra); 3] = [
        ("kubectl_shows_records", |a, s| {
            Box::pin(kubectl_shows_records(a, s))
        }),
        ("orphans_of_a_deleted_lease_go", |a, s| {
            Box::pin(orphans_of_a_deleted_lease_go(a, s))
        }),
        ("another_client_expires_a_dead_clients_lease", |a, s| {
            Box::pin(another_client_expires_a_dead_clients_lease(a, s))
        }),
    ];
    let api = Arc::new(api);
    for (name, check) in extra {
        let ns = format!("x-{}", name.replace('_', "-"));
        let s = store(&api, &ns).await;
        tasks.push((name, tokio::spawn(check(api.clone(), s))));
    }
    let mut failed = Vec::new();
    for (name, t) in tasks {
        if let Err(e) = t.await {
            eprintln!("check {name} failed: {e}");
            failed.push(name);
        }
    }
    assert!(
        failed.is_empty(),
        "failed checks: {failed:?}\napiserver log tail:\n{}",
        api.log_tail()
    );
}
