//! `hawser agent`: opens the pools, starts the replica server, the NBD frontends and the admin
//! API, registers with the controller (and keeps doing so as a heartbeat), and on SIGINT or
//! SIGTERM flushes and stops every engine before exiting.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use hawser_api::controller::{validate_label, validate_labels, Labels, RegisterNode};
use hawser_storage::{Pool, PoolConfig, PoolKind};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use crate::constants::{
    DEFAULT_KERNEL_DEAD_CONN_TIMEOUT, DEFAULT_KERNEL_NBD_CONNECTIONS,
    DEFAULT_KERNEL_NBD_IO_TIMEOUT, DEFAULT_RESYNC_BUSY_RATE, DEFAULT_RESYNC_RATE,
    HEARTBEAT_INTERVAL,
};
use crate::control::admin_api::{self, AdminState};
use crate::control::device_api;
use crate::control::link::{ControllerLink, LinkAuth};
use crate::engine::rate_limit::{parse_rate, ResyncRates};
use crate::engine::registry::Engines;
use crate::frontends::devices::Devices;
use crate::frontends::kernel::Settings as KernelSettings;
use crate::frontends::kernel_nbd::KernelNbdSettings;
use crate::frontends::ublk::UblkSettings;
use crate::observe::metrics::AgentMetrics;
use crate::storage::pools::NodeStorage;
use crate::tls::node::NodeTls;
use crate::{nbd, replica};

#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// This node's name (unique in the cluster).
    #[arg(long)]
    pub node: String,
    /// Directory for the agent's state; the default pool lives in `<data-dir>/pool-default`.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// A storage pool: NAME=PATH[,overprovision=RATIO][,capacity=SIZE][,kind=thin|thick|any].
    /// Repeatable. Without any, one pool `default` in the data dir. `kind` limits the pool to
    /// thin or thick replicas (default any).
    #[arg(long = "pool", value_name = "SPEC")]
    pub pools: Vec<String>,
    /// A node label, KEY=VALUE, sent to the controller with every heartbeat. Repeatable.
    /// `zone=...` is the failure domain: replicas of a volume go to distinct zones.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Controller URL; several, comma-separated, when controllers share etcd (the agent
    /// and its engines follow the leader).
    #[arg(long, env = "HAWSER_CONTROLLER", default_value = hawser_api::DEFAULT_CONTROLLER_URL)]
    pub controller: String,
    /// Admin API listen address.
    #[arg(long, default_value = "127.0.0.1:9500")]
    pub admin_listen: String,
    /// Replica server listen address.
    #[arg(long, default_value = "127.0.0.1:9600")]
    pub replica_listen: String,
    /// NBD TCP listen address ("none" to disable). In a TLS cluster it requires NBD TLS
    /// (STARTTLS with a certificate of the cluster's CA; `nbds://` URIs) on any address; local
    /// clients without one use the unix socket.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub nbd_listen: String,
    /// Another name clients dial this node by, added to its certificate for clients that
    /// check names (libnbd, Prometheus): a DNS name or an IP address; repeat for several. The
    /// certificate always covers `localhost`, 127.0.0.1, ::1 and each listen address that is
    /// not a wildcard.
    #[arg(long = "tls-san", value_name = "NAME|IP")]
    pub tls_san: Vec<String>,
    /// NBD unix socket path (default `<data-dir>/nbd.sock`), mode 0600: only root (or the
    /// agent's user) may connect.
    #[arg(long)]
    pub nbd_socket: Option<PathBuf>,
    /// Allow what is refused by default because nothing authenticates it on the network: a
    /// plaintext controller (an `http://` URL, a controller run with `--insecure`; the
    /// admin API, the replica port and NBD over TCP are then plaintext too, guarded by the
    /// shared agent token and epoch grants, NBD by nothing). Logged as a warning at every
    /// start.
    #[arg(long)]
    pub insecure: bool,
    /// How long a replica moved to a pool's trash (an orphan, by the controller's word) is
    /// kept before it is deleted, in seconds.
    #[arg(long, default_value_t = 86_400)]
    pub trash_keep_secs: u64,
    /// The cluster's agent token (the controller writes it to `<its data-dir>/agent.token`
    /// at cluster init). With an `--insecure` controller (`http://`) it is sent on every
    /// call and the admin API requires it; with TLS it serves only to join (with --ca-file).
    #[arg(long, env = "HAWSER_AGENT_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// A join token (`hawser cluster join-token`), for a controller with TLS (an `https://`
    /// URL): used once, when the node has no certificate yet (`<data-dir>/tls/`). Without
    /// one, a node joins with the agent token (--token-file) and the CA (--ca-file).
    #[arg(long, env = "HAWSER_JOIN_TOKEN_FILE", value_name = "PATH")]
    pub join_token_file: Option<PathBuf>,
    /// The cluster CA's certificate, for joining with the agent token rather than a join
    /// token: the global `--ca-file` (`hawser --ca-file PATH agent ...`, or HAWSER_CA_FILE).
    #[arg(skip)]
    pub ca_file: Option<PathBuf>,
    /// Resync copy rate of each volume engine, bytes per second ("200MiB", "1GiB/s"); 0 means
    /// unlimited. Bounds how much of the disks and network a resync takes from client I/O.
    #[arg(long, env = "HAWSER_RESYNC_RATE", default_value_t = DEFAULT_RESYNC_RATE,
        value_parser = parse_rate)]
    pub resync_rate: u64,
    /// Resync copy rate of a volume while it has client I/O (any request in the last 250 ms),
    /// bytes per second; 0 means only `--resync-rate` applies. Like DRBD's c-min-rate: a
    /// resync under load leaves the disk to the client, one of an idle volume runs at full
    /// rate.
    #[arg(long, env = "HAWSER_RESYNC_BUSY_RATE", default_value_t = DEFAULT_RESYNC_BUSY_RATE,
        value_parser = parse_rate)]
    pub resync_busy_rate: u64,
    /// The node-local device API's socket (default `<data-dir>/device.sock`), mode 0600:
    /// `hawser device attach` and the CSI node service make volumes kernel block devices
    /// through it.
    #[arg(long)]
    pub device_socket: Option<PathBuf>,
    /// Connections per kernel NBD device.
    #[arg(long, default_value_t = DEFAULT_KERNEL_NBD_CONNECTIONS)]
    pub kernel_nbd_connections: usize,
    /// Seconds a kernel NBD request may go unanswered before the kernel resends it on a new
    /// connection (the agent hands it one at once). It bounds the pause after the agent is
    /// killed with requests in flight.
    #[arg(long, default_value_t = DEFAULT_KERNEL_NBD_IO_TIMEOUT.as_secs())]
    pub kernel_nbd_io_timeout: u64,
    /// Seconds a kernel device holds I/O while no agent serves it (a restart, an upgrade)
    /// before failing it with EIO.
    #[arg(long, default_value_t = DEFAULT_KERNEL_DEAD_CONN_TIMEOUT.as_secs())]
    pub kernel_dead_conn_timeout: u64,
    /// Seconds a kernel device left by the agent's last life waits, its I/O held, for a
    /// controller to confirm it is still its volume's (the same uid, attached here, in the
    /// same attachment) and for that volume's engine to start here; then it is failed with
    /// EIO. It is never served on a guess.
    #[arg(long, default_value_t = 600)]
    pub device_confirm_timeout: u64,
    /// Seconds between the questions to the controller meanwhile.
    #[arg(long, default_value_t = 2)]
    pub device_confirm_retry: u64,
    /// Queues per ublk device, each served by a thread of its own (cut to the CPU count:
    /// the kernel refuses more). 2 and 64 by measurement (docs/performance.md, "ublk queues
    /// and depth"): depth 16 halves deep-queue reads, 128 gains nothing over 64, and a second
    /// queue gives four-job reads 1.7x on two CPUs.
    #[arg(long, default_value_t = crate::frontends::ublk::UblkSettings::DEFAULT.queues)]
    pub ublk_queues: u16,
    /// Requests in flight per ublk queue.
    #[arg(long, default_value_t = crate::frontends::ublk::UblkSettings::DEFAULT.depth)]
    pub ublk_queue_depth: u16,
}

/// Parse `KEY=VALUE` (a node label).
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("label {s:?} is not KEY=VALUE"))?;
    validate_label(k, v).map_err(|e| e.message)?;
    Ok((k.to_string(), v.to_string()))
}

/// The labels of `--label` options; a key given twice is an error, not a silent override.
pub fn labels(pairs: &[(String, String)]) -> anyhow::Result<Labels> {
    let mut labels = Labels::new();
    for (k, v) in pairs {
        if let Some(old) = labels.insert(k.clone(), v.clone()) {
            anyhow::bail!("label {k:?} given twice ({old:?} and {v:?})");
        }
    }
    validate_labels(&labels).map_err(|e| anyhow::anyhow!(e.message))?;
    Ok(labels)
}

/// Parse `NAME=PATH[,overprovision=R][,capacity=SIZE][,kind=thin|thick|any]`.
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
        boot_id: hawser_storage::node_boot_id(),
    };
    for opt in parts {
        match opt.split_once('=') {
            Some(("overprovision", v)) => {
                cfg.overprovision_ratio = v.parse().with_context(|| format!("bad ratio {v:?}"))?;
                anyhow::ensure!(cfg.overprovision_ratio > 0.0, "overprovision must be > 0");
            }
            Some(("capacity", v)) => cfg.capacity_limit = Some(hawser_api::parse_size(v)?),
            Some(("kind", v)) => {
                cfg.kind = match v {
                    "any" => PoolKind::Any,
                    "thin" => PoolKind::Thin,
                    "thick" => PoolKind::Thick,
                    _ => anyhow::bail!("pool kind must be thin, thick or any, not {v:?}"),
                }
            }
            _ => anyhow::bail!("unknown pool option {opt:?}"),
        }
    }
    Ok(cfg)
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let labels = labels(&args.labels)?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    let tls_cluster = args
        .controller
        .split(',')
        .any(|u| u.trim().starts_with("https://"));
    let (token, node_tls, link) = if tls_cluster {
        let with = crate::tls::node::JoinWith {
            join_token_file: args.join_token_file.as_deref(),
            agent_token_file: args.token_file.as_deref(),
            ca_file: args.ca_file.as_deref(),
        };
        let listen: Vec<std::net::SocketAddr> =
            [&args.admin_listen, &args.replica_listen, &args.nbd_listen]
                .into_iter()
                .filter_map(|a| a.parse().ok())
                .collect();
        let names = hawser_tls::server_names(&listen, &args.tls_san);
        let (dir, node, ctl) = (&args.data_dir, &args.node, &args.controller);
        let t = NodeTls::load_or_join(dir, node, names, ctl, &with).await?;
        let t = Arc::new(t);
        let link = LinkAuth {
            token: None,
            tls: Some(t.controller_client()?),
            node: Some(t.clone()),
        };
        (None, Some(t), link)
    } else {
        if !args.insecure {
            anyhow::bail!(
                "--controller {}: a plaintext (http://) controller is refused without \
                 --insecure; use the controller's https:// URL with a join token \
                 (--join-token-file), or pass --insecure to run without TLS",
                args.controller
            );
        }
        let path = args
            .token_file
            .as_deref()
            .context("a controller without TLS (http://) needs the agent token: --token-file")?;
        let token: Arc<str> = hawser_api::auth::read_token_file(path)
            .context("read the agent token (--token-file)")?
            .into();
        tracing::warn!(
            "INSECURE (--insecure): the controller link, the admin API and the replica port \
             are plaintext (http:// controller URL); use a TLS controller (https://) on any \
             network you do not trust entirely"
        );
        let link = LinkAuth {
            token: Some(token.clone()),
            tls: None,
            node: None,
        };
        (Some(token), None, link)
    };
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
    let cluster_file = args.data_dir.join("cluster-id");
    let storage = Arc::new(
        NodeStorage::new(args.node.clone(), pools)
            .with_cluster_file(cluster_file.clone())
            .with_context(|| format!("read {}", cluster_file.display()))?,
    );
    let engines = Arc::new(Engines::default());
    let metrics = AgentMetrics::new(engines.clone(), storage.clone());
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
        let l = TcpListener::bind(&args.nbd_listen)
            .await
            .with_context(|| format!("bind NBD to {}", args.nbd_listen))?;
        let ip = l.local_addr().context("NBD listen address")?.ip();
        // In a TLS cluster the TCP listener requires NBD TLS with a cluster certificate,
        // whatever its address; plaintext NBD exists only in an --insecure agent.
        if node_tls.is_none() && !ip.is_loopback() {
            tracing::warn!(
                addr = %args.nbd_listen,
                "INSECURE: NBD serves this node's volumes unauthenticated on a non-loopback address"
            );
        }
        Some(l)
    };
    let sock = args
        .nbd_socket
        .clone()
        .unwrap_or_else(|| args.data_dir.join("nbd.sock"));
    let _ = std::fs::remove_file(&sock);
    let unix_l =
        UnixListener::bind(&sock).with_context(|| format!("bind NBD socket {}", sock.display()))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("make NBD socket {} mode 0600", sock.display()))?;
    }

    let mut tasks = tokio::task::JoinSet::new();
    let replica_tls = match &node_tls {
        Some(t) => Some(t.replica_server()?),
        None => None,
    };
    tasks.spawn(replica::server::serve(
        replica_l,
        storage.clone(),
        replica_tls,
        metrics.refusals(),
        stop_rx.clone(),
    ));
    if let Some(l) = nbd_l {
        let nbd_tls = match &node_tls {
            Some(t) => Some(nbd::server::NbdTls::new(t.nbd_server()?, &args.node)),
            None => None,
        };
        tasks.spawn(nbd::server::serve_tcp(
            l,
            engines.clone(),
            nbd_tls,
            metrics.refusals(),
            stop_rx.clone(),
        ));
    }
    tasks.spawn(nbd::server::serve_unix(
        unix_l,
        engines.clone(),
        metrics.refusals(),
        stop_rx.clone(),
    ));
    // Kernel devices stop being served before the engines stop (their requests in flight
    // answered), so a device sees its connections close, never an error: the next agent
    // takes it back.
    let (devices_stop_tx, devices_stop_rx) = watch::channel(false);
    let devices = Arc::new(
        Devices::new(
            &args.data_dir,
            &args.node,
            engines.clone(),
            Arc::new(ControllerLink::new(&args.controller).with_auth(&link)),
            KernelSettings {
                nbd: KernelNbdSettings {
                    connections: args.kernel_nbd_connections.clamp(1, 16),
                    io_timeout: std::time::Duration::from_secs(args.kernel_nbd_io_timeout.max(1)),
                    dead_conn_timeout: std::time::Duration::from_secs(
                        args.kernel_dead_conn_timeout.max(1),
                    ),
                },
                ublk: UblkSettings {
                    queues: args
                        .ublk_queues
                        .clamp(1, crate::frontends::devices::MAX_UBLK_QUEUES),
                    depth: args
                        .ublk_queue_depth
                        .clamp(1, crate::frontends::devices::MAX_UBLK_QUEUE_DEPTH),
                    ..UblkSettings::default()
                },
            },
            devices_stop_rx.clone(),
            metrics.devices(),
        )
        .confirming(crate::frontends::devices::Confirming {
            retry: std::time::Duration::from_secs(args.device_confirm_retry.max(1)),
            timeout: std::time::Duration::from_secs(args.device_confirm_timeout.max(1)),
        }),
    );
    let state = AdminState {
        node: args.node.clone(),
        storage: storage.clone(),
        engines: engines.clone(),
        metrics: metrics.clone(),
        token,
        link: link.clone(),
        resync_rate: ResyncRates {
            max: args.resync_rate,
            busy: args.resync_busy_rate,
        },
        devices: Some(devices.clone()),
        backups: Default::default(),
    };
    let mut admin_stop = stop_rx.clone();
    let admin_tls = match &node_tls {
        Some(t) => Some(t.admin_server()?),
        None => None,
    };
    if let Some(t) = node_tls.clone() {
        let controllers = args.controller.clone();
        let mut stop = stop_rx.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = t.renew_forever(controllers) => {}
                _ = stop.changed() => {}
            }
        });
    }
    tasks.spawn(async move {
        let serve = hawser_listen::serve(
            admin_l,
            admin_api::router(state),
            hawser_listen::HttpLimits::default(),
            admin_tls,
            async move {
                let _ = admin_stop.changed().await;
            },
        );
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "admin API failed");
        }
    });
    let device_sock = args
        .device_socket
        .clone()
        .unwrap_or_else(|| args.data_dir.join("device.sock"));
    tasks.spawn(device_api::serve(
        device_api::bind(&device_sock)?,
        devices.clone(),
        devices_stop_rx,
    ));
    tasks.spawn(devices.clone().recover());
    let register = RegisterNode {
        admin_addr: args.admin_listen.clone(),
        replica_addr: args.replica_listen.clone(),
        nbd_addr: (args.nbd_listen != "none").then(|| args.nbd_listen.clone()),
        nbd_socket: Some(sock.display().to_string()),
        nbd_tls: node_tls.is_some(),
        pools: vec![],
        labels,
        cluster_id: None,
        tls: None,
    };
    tasks.spawn(purge_trash(
        storage.clone(),
        args.trash_keep_secs,
        stop_rx.clone(),
    ));
    tasks.spawn(heartbeat(
        args.node.clone(),
        args.controller.clone(),
        register,
        link,
        storage.clone(),
        metrics,
        stop_rx.clone(),
    ));
    tracing::info!(node = %args.node, replica = %args.replica_listen, nbd = %args.nbd_listen, socket = %sock.display(), labels = ?args.labels, "agent running");

    shutdown_signal().await;
    tracing::info!("stopping: ending kernel device connections");
    let _ = devices_stop_tx.send(true);
    devices.drain().await;
    tracing::info!("stopping: flushing engines");
    for e in engines.all() {
        e.stop().await;
    }
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(&device_sock);
    tracing::info!("agent stopped");
    Ok(())
}

async fn heartbeat(
    node: String,
    controller: String,
    mut body: RegisterNode,
    auth: LinkAuth,
    storage: Arc<NodeStorage>,
    metrics: Arc<AgentMetrics>,
    mut stop: watch::Receiver<bool>,
) {
    let link = Arc::new(ControllerLink::new(&controller).with_auth(&auth));
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    let (mut failing, mut asked_engines) = (false, false);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let s = storage.clone();
        body.pools = tokio::task::spawn_blocking(move || s.pool_infos())
            .await
            .unwrap_or_default();
        body.cluster_id = storage.cluster_id();
        body.tls = auth.node.as_ref().map(|t| t.report());
        let answer = link.register(&node, &body).await;
        if let Some(join) = answer.as_ref().ok().and_then(|n| n.cluster.as_ref()) {
            storage.learn_cluster(join);
            metrics.set_scrape_tokens(&join.metrics_sha256);
            if let (Some(t), Some(ca)) = (&auth.node, &join.ca) {
                t.learn(ca);
            }
        }
        if answer.is_ok() && !asked_engines {
            // The first registration of this agent's life: its engines are wanted now.
            asked_engines = true;
            let (link, node) = (link.clone(), node.clone());
            tokio::spawn(async move {
                if let Err(e) = link.start_engines(&node).await {
                    tracing::info!(error = %e, "the controller did not start this node's engines at once; its engine watch will");
                }
            });
        }
        match answer {
            Ok(_) if failing => {
                tracing::info!("controller reachable again");
                failing = false;
            }
            Ok(_) => {}
            Err(e) if !failing => {
                tracing::warn!(error = %e, "cannot register with the controller; I/O continues");
                failing = true;
            }
            Err(_) => {}
        }
    }
}

/// Empties the pools' trash of what it held for `keep_secs`, once a minute.
async fn purge_trash(storage: Arc<NodeStorage>, keep_secs: u64, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let s = storage.clone();
        let _ = tokio::task::spawn_blocking(move || s.purge_trash(keep_secs)).await;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pool_specs() {
        let p = parse_pool("fast=/srv/fast,overprovision=2.5,capacity=10GiB,kind=thin").unwrap();
        assert_eq!(p.name, "fast");
        assert_eq!(p.path, PathBuf::from("/srv/fast"));
        assert_eq!(p.overprovision_ratio, 2.5);
        assert_eq!(p.capacity_limit, Some(10 << 30));
        assert_eq!(p.kind, PoolKind::Thin);
        assert_eq!(parse_pool("p=/x").unwrap().kind, PoolKind::Any);
        for bad in [
            "p=/x,kind=fat",
            "p=/x,overprovision=0",
            "p=",
            "P=/x",
            "p=/x,colour=red",
        ] {
            assert!(parse_pool(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_args() {
        assert_eq!(parse_label("zone=a"), Ok(("zone".into(), "a".into())));
        assert!(parse_label("zone").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_label("zone=").is_err());
        assert!(parse_label("=a").is_err());
        let pairs = [
            ("zone".to_string(), "a".to_string()),
            ("rack".into(), "r1".into()),
        ];
        let l = labels(&pairs).unwrap();
        assert_eq!(l.get("zone").map(String::as_str), Some("a"));
        let twice = [
            ("zone".to_string(), "a".to_string()),
            ("zone".into(), "b".into()),
        ];
        assert!(labels(&twice)
            .unwrap_err()
            .to_string()
            .contains("given twice"));
    }
}
