//! Two controllers on one real etcd, and on one real kube-apiserver: exactly one leads, the other answers `not_leader` with
//! the leader's URL and changes nothing; when the leader crashes (its task dropped without
//! resigning) the other takes over within 10 s and sees everything written before; a leader
//! that shuts down cleanly hands over at once. The tests fail if `etcd` or the Kubernetes
//! binaries (scripts/k8s/build.sh) are missing.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use crate::common::{client_with_token, controller_args, pool, FakeAgent, GIB};
use hawser_controller::{Controller, ControllerArgs};
use hawser_kube::install_crds;
use hawser_testkit::apiserver_process::ApiserverProcess;
use hawser_testkit::etcd_process::EtcdProcess;
use serde_json::{json, Value};

struct Running {
    url: String,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The tokens every cluster here is initialised with: the test seeds the token files before
/// the first controller starts, and the controllers adopt them at cluster init.
const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef0123456789";
const AGENT_TOKEN: &str = "test-agent-token-0123456789abcdef0123456789";

/// A controller on `store` whose token files are in `dir`'s parent, shared by the cluster's
/// controllers (seeded with [`ADMIN_TOKEN`] and [`AGENT_TOKEN`]).
async fn start_controller(store: &str, dir: &std::path::Path) -> Running {
    let shared = dir.parent().unwrap();
    for (file, token) in [("admin.token", ADMIN_TOKEN), ("agent.token", AGENT_TOKEN)] {
        if !shared.join(file).exists() {
            std::fs::write(shared.join(file), token).unwrap();
        }
    }
    let args = ControllerArgs {
        node_timeout_secs: 60,
        ..controller_args(dir, Some(store.to_string()), dir.parent())
    };
    let controller = Controller::bind(args).await.unwrap();
    let url = format!("http://{}", controller.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller.serve(async move {
        let _ = rx.await;
    }));
    Running {
        url,
        task,
        shutdown: Some(tx),
    }
}

async fn send(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = client_with_token(ADMIN_TOKEN).request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    match req.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let body = resp.json::<Value>().await.unwrap_or(Value::Null);
            (status, body)
        }
        Err(e) => (0, json!({ "transport": e.to_string() })),
    }
}

async fn get(base: &str, path: &str) -> (u16, Value) {
    send(reqwest::Method::GET, &format!("{base}{path}"), None).await
}

/// Polls until exactly one of `urls` serves `GET /v1/nodes`; returns its index.
async fn wait_for_leader(urls: &[&str], within: Duration) -> usize {
    let start = Instant::now();
    loop {
        let mut leaders = Vec::new();
        for (i, u) in urls.iter().enumerate() {
            if get(u, "/v1/nodes").await.0 == 200 {
                leaders.push(i);
            }
        }
        assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
        if let [one] = leaders[..] {
            return one;
        }
        assert!(start.elapsed() < within, "no leader within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_etcd(dir: &std::path::Path) -> EtcdProcess {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || EtcdProcess::start(&dir))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn register(base: &str, agent: &FakeAgent) -> (u16, Value) {
    let body = json!({
        "admin_addr": agent.addr.to_string(),
        "replica_addr": "127.0.0.1:1",
        "nbd_addr": "127.0.0.1:10809",
        "nbd_socket": null,
        "pools": [pool(&agent.node, 100 * GIB, 100 * GIB)],
    });
    let url = format!("{base}/v1/nodes/{}", agent.node);
    send(reqwest::Method::PUT, &url, Some(body)).await
}

/// A Kubernetes API server with Hawser's CRDs and the store URL of a namespace in it.
async fn start_apiserver(dir: &std::path::Path) -> (ApiserverProcess, String) {
    let api = ApiserverProcess::start(&dir.join("k8s"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    install_crds(&api.config(), Duration::from_secs(30))
        .await
        .unwrap();
    api.create_namespace("hawser-test").await.unwrap();
    let url = format!(
        "k8s://hawser-test?kubeconfig={}",
        api.kubeconfig().display()
    );
    (api, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_refuses_and_takes_over_when_the_leader_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = start_etcd(dir.path()).await;
    crash_takeover(dir.path(), &etcd.store_url("hawser-test")).await;
    drop(etcd);
}

/// The same on Kubernetes: the election runs on Leases and the state in custom resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_takes_over_when_the_leader_crashes_on_kubernetes() {
    let dir = tempfile::tempdir().unwrap();
    let (api, store) = start_apiserver(dir.path()).await;
    crash_takeover(dir.path(), &store).await;
    drop(api);
}

async fn crash_takeover(dir: &std::path::Path, store: &str) {
    let a = start_controller(store, &dir.join("a")).await;
    let b = start_controller(store, &dir.join("b")).await;
    let leader_idx = wait_for_leader(&[&a.url, &b.url], Duration::from_secs(15)).await;
    let (leader, follower) = if leader_idx == 0 { (a, b) } else { (b, a) };

    // The follower says who leads (once it has looked), and does nothing.
    crate::common::eventually(10, || async {
        let (status, e) = get(&follower.url, "/v1/volumes").await;
        assert_eq!(
            (status, e["code"].as_str()),
            (503, Some("not_leader")),
            "{e}"
        );
        e["leader_url"].as_str() == Some(leader.url.as_str())
            && e["message"].as_str().unwrap().contains(&leader.url)
    })
    .await;
    let n1 = FakeAgent::start("n1").await;
    let n2 = FakeAgent::start("n2").await;
    assert_eq!(register(&follower.url, &n1).await.0, 503);
    let create = json!({"name": "v", "size_bytes": GIB, "replicas": 2});
    let url = format!("{}/v1/volumes", follower.url);
    let (status, _) = send(reqwest::Method::POST, &url, Some(create.clone())).await;
    assert_eq!(status, 503);

    // The leader serves.
    for agent in [&n1, &n2] {
        let (status, body) = register(&leader.url, agent).await;
        assert_eq!(status, 200, "{body}");
    }
    let url = format!("{}/v1/volumes", leader.url);
    let (status, created) = send(reqwest::Method::POST, &url, Some(create)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!((n1.replicas().len(), n2.replicas().len()), (1, 1));

    // Crash: the serve task is dropped, nothing resigns; the lease must expire.
    let crashed = Instant::now();
    leader.task.abort();
    let _ = leader.task.await;
    let mut answers = Vec::new();
    loop {
        let (status, body) = get(&follower.url, "/v1/volumes/v").await;
        if status == 200 {
            assert_eq!(body["replicas"], created["replicas"], "{body}");
            break;
        }
        // Until it leads, it says so; it never serves stale or partial state.
        assert_eq!(
            (status, body["code"].as_str()),
            (503, Some("not_leader")),
            "{body}"
        );
        answers.push(body["leader_url"].clone());
        assert!(
            crashed.elapsed() < Duration::from_secs(10),
            "no takeover in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = crashed.elapsed();
    println!("takeover after a leader crash: {took:?}");
    let (status, nodes) = get(&follower.url, "/v1/nodes").await;
    assert_eq!(status, 200);
    assert_eq!(nodes.as_array().unwrap().len(), 2, "{nodes}");

    // The new leader hands engines its own URL first.
    let url = format!("{}/v1/volumes/v/attach", follower.url);
    let (status, body) = send(reqwest::Method::POST, &url, Some(json!({"node": "n1"}))).await;
    assert_eq!(status, 200, "{body}");
    let engine = n1.engine("v").unwrap();
    let expected = Some(format!("Bearer {AGENT_TOKEN}"));
    assert!(
        n1.authorizations().iter().all(|a| *a == expected),
        "the new leader calls agents with the adopted agent token"
    );
    let urls: Vec<&str> = engine.controller_url.split(',').collect();
    assert_eq!(urls[0], follower.url, "{urls:?}");
    assert!(
        !urls.contains(&leader.url.as_str()),
        "the crashed controller expired: {urls:?}"
    );
    drop(follower.shutdown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdown_hands_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = start_etcd(dir.path()).await;
    clean_handover(dir.path(), &etcd.store_url("hawser-test")).await;
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdown_hands_over_at_once_on_kubernetes() {
    let dir = tempfile::tempdir().unwrap();
    let (api, store) = start_apiserver(dir.path()).await;
    clean_handover(dir.path(), &store).await;
    drop(api);
}

async fn clean_handover(dir: &std::path::Path, store: &str) {
    let a = start_controller(store, &dir.join("a")).await;
    let leader_idx = wait_for_leader(&[&a.url], Duration::from_secs(15)).await;
    assert_eq!(leader_idx, 0);
    let b = start_controller(store, &dir.join("b")).await;
    // b sees a as the leader.
    crate::common::eventually(10, || async {
        let (_, e) = get(&b.url, "/v1/nodes").await;
        e["leader_url"].as_str() == Some(a.url.as_str())
    })
    .await;
    let stopped = Instant::now();
    let mut a = a;
    let _ = a.shutdown.take().unwrap().send(());
    a.task.await.unwrap().unwrap();
    wait_for_leader(&[&b.url], Duration::from_secs(5)).await;
    let took = stopped.elapsed();
    println!("takeover after a clean shutdown: {took:?}");
    assert!(
        took < Duration::from_secs(3),
        "resigning should hand over within a tick: {took:?}"
    );
}
