//! `hawser agent`: opens the pools, starts the replica server, the NBD frontends and the admin
//! API, registers with the controller (and keeps doing so as a heartbeat), and on SIGINT or
//! SIGTERM flushes and stops every engine before exiting.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use hawser_api::controller::RegisterNode;
use hawser_storage::{Pool, PoolConfig, PoolKind};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use crate::admin_api::{self, AdminState};
use crate::constants::HEARTBEAT_INTERVAL;
use crate::controller_link::ControllerLink;
use crate::engines::Engines;
use crate::node_storage::NodeStorage;
use crate::{nbd_server, replica_server};

#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// This node's name (unique in the cluster).
    #[arg(long)]
    pub node: String,
    /// Directory for the agent's state; the default pool lives in `<data-dir>/pool-default`.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// A storage pool: NAME=PATH[,overprovision=RATIO][,capacity=SIZE]. Repeatable.
    /// Without any, one pool `default` in the data dir.
    #[arg(long = "pool", value_name = "SPEC")]
    pub pools: Vec<String>,
    /// Controller URL.
    #[arg(long, env = "HAWSER_CONTROLLER", default_value = hawser_api::DEFAULT_CONTROLLER_URL)]
    pub controller: String,
    /// Admin API listen address.
    #[arg(long, default_value = "127.0.0.1:9500")]
    pub admin_listen: String,
    /// Replica server listen address.
    #[arg(long, default_value = "127.0.0.1:9600")]
    pub replica_listen: String,
    /// NBD TCP listen address ("none" to disable).
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub nbd_listen: String,
    /// NBD unix socket path (default `<data-dir>/nbd.sock`).
    #[arg(long)]
    pub nbd_socket: Option<PathBuf>,
}

/// Parse `NAME=PATH[,overprovision=R][,capacity=SIZE]`.
pub fn parse_pool(spec: &str) -> anyhow::Result<PoolConfig> {
    let (name, rest) = spec
        .split_once('=')
        .context("pool spec must be NAME=PATH[,...]")?;
    hawser_api::validate_name("pool", name).map_err(|e| anyhow::anyhow!(e.message))?;
    let mut parts = rest.split(',');
    let path = parts
        .next()
        .filter(|p| !p.is_empty())
        .context("pool spec has no path")?;
    let mut cfg = PoolConfig {
        name: name.into(),
        path: path.into(),
        overprovision_ratio: 1.0,
        capacity_limit: None,
        kind: PoolKind::Any,
    };
    for opt in parts {
        match opt.split_once('=') {
            Some(("overprovision", v)) => {
                cfg.overprovision_ratio = v.parse().with_context(|| format!("bad ratio {v:?}"))?;
                anyhow::ensure!(cfg.overprovision_ratio > 0.0, "overprovision must be > 0");
            }
            Some(("capacity", v)) => cfg.capacity_limit = Some(hawser_api::parse_size(v)?),
            _ => anyhow::bail!("unknown pool option {opt:?}"),
        }
    }
    Ok(cfg)
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    let mut configs: Vec<PoolConfig> = args
        .pools
        .iter()
        .map(|s| parse_pool(s))
        .collect::<anyhow::Result<_>>()?;
    if configs.is_empty() {
        configs.push(parse_pool(&format!(
            "default={}",
            args.data_dir.join("pool-default").display()
        ))?);
    }
    let pools = configs
        .into_iter()
        .map(|c| Pool::open(c.clone()).with_context(|| format!("open pool {}", c.name)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let storage = Arc::new(NodeStorage::new(args.node.clone(), pools));
    let engines = Arc::new(Engines::default());
    let (stop_tx, stop_rx) = watch::channel(false);

    let replica_l = TcpListener::bind(&args.replica_listen)
        .await
        .with_context(|| format!("bind replica server to {}", args.replica_listen))?;
    let admin_l = TcpListener::bind(&args.admin_listen)
        .await
        .with_context(|| format!("bind admin API to {}", args.admin_listen))?;
    let nbd_l = if args.nbd_listen == "none" {
        None
    } else {
        Some(
            TcpListener::bind(&args.nbd_listen)
                .await
                .with_context(|| format!("bind NBD to {}", args.nbd_listen))?,
        )
    };
    let sock = args
        .nbd_socket
        .clone()
        .unwrap_or_else(|| args.data_dir.join("nbd.sock"));
    let _ = std::fs::remove_file(&sock);
    let unix_l =
        UnixListener::bind(&sock).with_context(|| format!("bind NBD socket {}", sock.display()))?;

    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(replica_server::serve(
        replica_l,
        storage.clone(),
        stop_rx.clone(),
    ));
    if let Some(l) = nbd_l {
        tasks.spawn(nbd_server::serve_tcp(l, engines.clone(), stop_rx.clone()));
    }
    tasks.spawn(nbd_server::serve_unix(
        unix_l,
        engines.clone(),
        stop_rx.clone(),
    ));
    let state = AdminState {
        node: args.node.clone(),
        storage: storage.clone(),
        engines: engines.clone(),
    };
    let mut admin_stop = stop_rx.clone();
    tasks.spawn(async move {
        let serve =
            axum::serve(admin_l, admin_api::router(state)).with_graceful_shutdown(async move {
                let _ = admin_stop.changed().await;
            });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "admin API failed");
        }
    });
    let register = RegisterNode {
        admin_addr: args.admin_listen.clone(),
        replica_addr: args.replica_listen.clone(),
        nbd_addr: (args.nbd_listen != "none").then(|| args.nbd_listen.clone()),
        nbd_socket: Some(sock.display().to_string()),
        pools: vec![],
    };
    tasks.spawn(heartbeat(
        args.node.clone(),
        args.controller.clone(),
        register,
        storage.clone(),
        stop_rx.clone(),
    ));
    tracing::info!(node = %args.node, replica = %args.replica_listen, nbd = %args.nbd_listen, socket = %sock.display(), "agent running");

    shutdown_signal().await;
    tracing::info!("stopping: flushing engines");
    for e in engines.all() {
        e.stop().await;
    }
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    let _ = std::fs::remove_file(&sock);
    tracing::info!("agent stopped");
    Ok(())
}

async fn heartbeat(
    node: String,
    controller: String,
    mut body: RegisterNode,
    storage: Arc<NodeStorage>,
    mut stop: watch::Receiver<bool>,
) {
    let link = ControllerLink::new(&controller);
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let s = storage.clone();
        body.pools = tokio::task::spawn_blocking(move || s.pool_infos())
            .await
            .unwrap_or_default();
        match link.register(&node, &body).await {
            Ok(()) if failing => {
                tracing::info!("controller reachable again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::warn!(error = %e, "cannot register with the controller; I/O continues");
                failing = true;
            }
            Err(_) => {}
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
