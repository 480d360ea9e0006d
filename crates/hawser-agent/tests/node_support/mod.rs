//! Shared fixtures for engine tests without the control plane: a temporary directory removed
//! on drop, one node's storage with a replica `vol-<node>` of volume `vol`, and that node's
//! admin API on a loopback port.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hawser_agent::agent::parse_pool;
use hawser_agent::control::admin_api::{self, AdminState};
use hawser_agent::engine::registry::Engines;
use hawser_agent::observe::metrics::AgentMetrics;
use hawser_agent::storage::pools::NodeStorage;
use hawser_storage::{NewReplica, Pool};

pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory under the system's temp dir, named by `label` and the process id.
    pub fn new(label: &str) -> TempDir {
        TempDir(std::env::temp_dir().join(format!("hawser-{label}-{}", std::process::id())))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Node `name`'s storage (one pool under `dir`) holding a thin replica `vol-<name>` of `size`.
#[allow(dead_code)] // not every test binary uses it
pub fn node(dir: &Path, name: &str, size: u64) -> Arc<NodeStorage> {
    node_keyed(dir, name, size, None)
}

/// [`node`] whose replica records `key_check` (an encrypted volume's).
pub fn node_keyed(
    dir: &Path,
    name: &str,
    size: u64,
    key_check: Option<hawser_api::KeyCheck>,
) -> Arc<NodeStorage> {
    let cfg = parse_pool(&format!("default={}", dir.join(name).display())).expect("pool spec");
    let pool = Pool::open(cfg).expect("open pool");
    let s = Arc::new(NodeStorage::new(name.into(), vec![pool]));
    let new = NewReplica {
        id: format!("vol-{name}"),
        volume: "vol".into(),
        size,
        thin: true,
        cluster: None,
        key_check: key_check.map(|k| k.0),
        checksums: false,
        wrapped_key: None,
        volume_uid: None,
    };
    s.create("default", &new).expect("create replica");
    s
}

/// Node `name`'s storage under `dir` opened again as after a reboot of the node: boot id
/// `boot`.
#[allow(dead_code)] // not every test binary reboots a node
pub fn reopen(dir: &Path, name: &str, boot: u64) -> Arc<NodeStorage> {
    let mut cfg = parse_pool(&format!("default={}", dir.join(name).display())).expect("pool spec");
    cfg.boot_id = boot;
    let pool = Pool::open(cfg).expect("open pool");
    Arc::new(NodeStorage::new(name.into(), vec![pool]))
}

/// Two nodes' storage (`a`, `b`), a replica server for b's, and an engine on a of volume
/// `vol` (epoch 1) with replica `vol-a` local and `vol-b` remote, both in sync.
#[allow(dead_code)] // not every test binary runs an engine
pub struct TwoNodes {
    pub dir: TempDir,
    pub a: Arc<NodeStorage>,
    pub b: Arc<NodeStorage>,
    pub req: hawser_api::agent::StartEngine,
    pub engines: Arc<hawser_agent::engine::registry::Engines>,
    /// Stops the replica server (and whatever else a test serves with it).
    pub stop: tokio::sync::watch::Sender<bool>,
}

#[allow(dead_code)]
pub async fn two_nodes(label: &str, size: u64) -> TwoNodes {
    two_nodes_with(label, size, None).await
}

/// [`two_nodes`] of an encrypted volume when `data_key` is given.
#[allow(dead_code)]
pub async fn two_nodes_with(
    label: &str,
    size: u64,
    data_key: Option<hawser_api::Secret>,
) -> TwoNodes {
    use hawser_api::agent::{EngineReplica, StartEngine};
    use hawser_api::controller::ReplicaState;
    let dir = TempDir::new(label);
    let check = data_key
        .as_ref()
        .and_then(|k| k.bytes())
        .map(|k| hawser_api::KeyCheck::of(&k));
    let a = node_keyed(&dir.0, "a", size, check);
    let b = node_keyed(&dir.0, "b", size, check);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let rl = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind replica");
    let raddr = rl.local_addr().expect("addr").to_string();
    tokio::spawn(hawser_agent::replica::server::serve(
        rl,
        b.clone(),
        None,
        Default::default(),
        stop_rx,
    ));
    let replica = |id: &str, node: &str, addr: String| EngineReplica {
        replica_id: id.into(),
        node: node.into(),
        replica_addr: addr,
        state: ReplicaState::InSync,
        blank: false,
    };
    let req = StartEngine {
        volume: "vol".into(),
        size_bytes: size,
        epoch: 1,
        replicas: vec![
            replica("vol-a", "a", String::new()),
            replica("vol-b", "b", raddr),
        ],
        controller_url: "http://127.0.0.1:1".into(),
        on_quorum_loss: Default::default(),
        export: true,
        grant: None,
        qos: Default::default(),
        data_key,
        uid: None,
    };
    let engines = Arc::new(hawser_agent::engine::registry::Engines::default());
    let engine = engines
        .start(
            &req,
            "a",
            &a,
            hawser_agent::engine::rate_limit::ResyncRates::default(),
            &Default::default(),
        )
        .await
        .expect("start engine");
    assert_eq!(engine.status().in_sync.len(), 2);
    TwoNodes {
        dir,
        a,
        b,
        req,
        engines,
        stop,
    }
}

/// Node `a` (1 MiB, a replica `vol-a`, no engine) with its admin API on a loopback port,
/// taking the agent token `token`: the directory (removed on drop), the storage, the engines,
/// the API's base URL, and its metrics (whose scrape tokens a test may set).
pub async fn admin_node(
    label: &str,
    token: &str,
) -> (
    TempDir,
    Arc<NodeStorage>,
    Arc<Engines>,
    String,
    Arc<AgentMetrics>,
) {
    let dir = TempDir::new(label);
    let storage = node(&dir.0, "a", 1 << 20);
    let engines = Arc::new(Engines::default());
    let metrics = AgentMetrics::new(engines.clone(), storage.clone());
    let state = AdminState {
        devices: None,
        backups: Default::default(),
        node: "a".into(),
        storage: storage.clone(),
        engines: engines.clone(),
        metrics: metrics.clone(),
        token: Some(token.into()),
        link: Default::default(),
        resync_rate: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, admin_api::router(state)).await });
    (dir, storage, engines, base, metrics)
}
