//! The Hawser controller: keeps the cluster state (nodes, pools, volumes) in the cluster
//! store, places replicas, drives the agents through a volume's lifecycle, and serves the
//! REST API described in `hawser_api::controller`.
//!
//! `hawser controller` calls [`run`]; tests use [`Controller::bind`] and
//! [`Controller::serve`] to run one on an ephemeral port.
//!
//! The store is a file (one controller) or etcd (several controllers, one elected leader
//! serves the API; see `store/leader.rs`).

mod api;
mod auth;
mod cluster;
mod constants;
mod errors;
mod ha;
mod healing;
mod snapshots;
mod state;
mod store;
mod volumes;

use hawser_listen::HttpLimits;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use hawser_kube::{KubeStore, KubeStoreUrl};
use hawser_store::{EmbeddedStore, EtcdStore, Store};

pub use crate::api::route_table;
pub use crate::healing::placement::{place, Candidate, Placement, PlacementError};
pub use crate::store::etcd_access::EtcdArgs;
pub use constants::{
    DEFAULT_ENGINE_CHECK_SECS, DEFAULT_FAILOVER_AFTER_SECS, DEFAULT_FAILOVER_CONFIRM_SECS,
    DEFAULT_HEAL_CHECK_SECS, DEFAULT_MAX_REBUILDS, DEFAULT_NODE_TIMEOUT_SECS,
    DEFAULT_REPLACE_AFTER_SECS, DEFAULT_SCRUB_INTERVAL_SECS, ELECTION_TICK, LEADER_TTL,
    MAX_BODY_BYTES, MAX_REPLICAS,
};
pub use errors::ControllerError;
// The modules the integration tests reach, at the paths they had before the folders.
pub use crate::auth::ca_home;
pub use crate::ha::kube;
pub use crate::volumes::keys as volume_keys;

use crate::auth::ClusterTokens;
use crate::cluster::agent_client::AgentClient;
use crate::state::AppState;
use crate::store::leader::{Election, FencedStore, Leadership};
use crate::store::records::Records;
use crate::store::retry::{RetryPolicy, RetryingStore};

/// Name of the store file inside `--data-dir`.
pub const STORE_FILE: &str = "store.json";

/// Arguments of `hawser controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// Address to listen on (loopback by default). Every request needs a cluster token or
    /// a node certificate (see --admin-token-file, --insecure).
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub listen: SocketAddr,
    /// Directory for the controller's state (the cluster store file); created if missing.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The cluster store: a file path; etcd://HOST:PORT[,HOST:PORT...][/PREFIX] to share
    /// the state among several controllers that elect a leader; or k8s://[NAMESPACE][?kubeconfig=PATH]
    /// for the same with the state in Hawser's custom resources (credentials: the pod's
    /// service account, else $KUBECONFIG) [default: <data-dir>/store.json].
    #[arg(long, value_name = "PATH|URL")]
    pub store: Option<String>,
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Seconds without a heartbeat after which a node is offline.
    #[arg(long, default_value_t = DEFAULT_NODE_TIMEOUT_SECS)]
    pub node_timeout_secs: u64,
    /// URL agents reach this controller at, given to engines for their reports
    /// [default: http://<bound listen address>].
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// Seconds between checks that every attached volume's engine runs (restarting it after
    /// its agent restarted); 0 disables them.
    #[arg(long, default_value_t = DEFAULT_ENGINE_CHECK_SECS)]
    pub engine_check_secs: u64,
    /// Seconds between scrub passes of each attached volume (every block of every replica
    /// checked against its checksum, bad ones repaired: docs/checksums.md); 0 disables the
    /// schedule (`hawser volume scrub` still starts one).
    #[arg(long, default_value_t = DEFAULT_SCRUB_INTERVAL_SECS)]
    pub scrub_interval_secs: u64,
    /// The most a backup reads per second on its node, in bytes (0: no limit), so that a
    /// backup does not crowd the volumes' own I/O (docs/backup.md).
    #[arg(long, env = "HAWSER_BACKUP_RATE", default_value_t = crate::constants::DEFAULT_BACKUP_RATE)]
    pub backup_rate: u64,
    /// Seconds one request to a backup target is retried (5xx, 429, SlowDown, no answer),
    /// with a backoff growing to 10 s, before the backup fails saying why: longer rides out a
    /// store that throttles for minutes, shorter fails a backup sooner (docs/backup.md).
    #[arg(
        long,
        env = "HAWSER_BACKUP_RETRY_SECS",
        default_value_t = hawser_backup::constants::RETRY_TIMEOUT_SECS
    )]
    pub backup_retry_secs: u64,
    /// Seconds between reads of a standby volume's target for a newer backup to apply
    /// (docs/backup.md).
    #[arg(long, env = "HAWSER_STANDBY_POLL_SECS", default_value_t = crate::constants::DEFAULT_STANDBY_POLL_SECS)]
    pub standby_poll_secs: u64,
    /// Seconds since the target wrote it before a block that no backup names is pruned: a
    /// backup the prune cannot see (an agent older than target locks) may be about to name
    /// a fresh one (docs/backup.md). Lower it only where every agent takes target locks.
    #[arg(
        long,
        env = "HAWSER_BACKUP_PRUNE_GRACE_SECS",
        default_value_t = hawser_backup::constants::LOCK_STALE_SECS
    )]
    pub backup_prune_grace_secs: u64,
    /// Seconds a node may stay offline before its replicas are replaced by new ones on
    /// other nodes (LINSTOR waits 3600, Longhorn 600).
    #[arg(long, default_value_t = DEFAULT_REPLACE_AFTER_SECS)]
    pub replace_after_secs: u64,
    /// Replicas being rebuilt (replaced or moved) at once, cluster-wide.
    #[arg(long, default_value_t = DEFAULT_MAX_REBUILDS)]
    pub max_rebuilds: usize,
    /// Seconds between self-healing rounds (replacements, evacuations, deleting replicas
    /// that were replaced); 0 disables self-healing.
    #[arg(long, default_value_t = DEFAULT_HEAL_CHECK_SECS)]
    pub heal_check_secs: u64,
    /// The admin token file (CLI and operators). At cluster init (no tokens in the store)
    /// an existing file is adopted, a missing one is generated (mode 0600)
    /// [default: <data-dir>/admin.token].
    #[arg(long, value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
    /// Seconds a node's agent may be silent before the pods on it that use Hawser volumes
    /// are failed over to other nodes (Kubernetes store only; 0 disables failover).
    #[arg(long, default_value_t = DEFAULT_FAILOVER_AFTER_SECS)]
    pub failover_after_secs: u64,
    /// Seconds a node's agent may be silent before other nodes are asked whether its host
    /// answers them; if none does (a dead host, a cut link, but not a restarting agent), its
    /// pods are failed over then, before --failover-after-secs. 0 waits for that timeout.
    #[arg(long, default_value_t = DEFAULT_FAILOVER_CONFIRM_SECS)]
    pub failover_confirm_secs: u64,
    /// The CSI driver name of this installation's PersistentVolumes (failover finds the
    /// pods of a volume through them).
    #[arg(long, default_value = "csi.hawser.dev")]
    pub csi_driver: String,
    /// The agent token file: agents' token, also sent to agents' admin API. Created like
    /// the admin token at cluster init; a controller joining an initialised cluster needs a
    /// copy [default: <data-dir>/agent.token].
    #[arg(long, value_name = "PATH")]
    pub agent_token_file: Option<PathBuf>,
    /// The metrics token file: the read-only credential for `GET /metrics` of controllers
    /// and agents. Created at cluster init (or by the first controller with metrics); every
    /// controller adopts it if it exists and the store has none [default:
    /// <data-dir>/metrics.token].
    #[arg(long, value_name = "PATH")]
    pub metrics_token_file: Option<PathBuf>,
    /// Serve the API in plaintext, without the cluster CA: agents then authenticate with
    /// the shared agent token (--agent-token-file) and every token crosses the network in
    /// clear. Only for a network you trust entirely; logged as a warning at every start.
    /// Without it (the default) the controller is the cluster's certificate authority (CA
    /// in <data-dir>/ca.pem and ca.key, made at first start), serves mutual TLS, and nodes
    /// join with a join token (`hawser cluster join-token`).
    #[arg(long)]
    pub insecure: bool,
    /// Keep the cluster CA in this Secret of the store's namespace (a `k8s://` store only)
    /// instead of <data-dir>: the first controller makes it, every controller loads it, and
    /// it outlives pods and `helm uninstall`. The key-encryption keys of encrypted volumes
    /// then live in Secret `<NAME>-volume-keys` beside it. The Helm chart sets it.
    #[arg(long, value_name = "NAME")]
    pub ca_secret: Option<String>,
    /// Another name users dial this controller by, added to its certificate for clients that
    /// check names (curl, Prometheus): a DNS name or an IP address; repeat for several (k3s's
    /// flag). The certificate always covers `localhost`, 127.0.0.1, ::1 and the --listen
    /// address unless it is a wildcard.
    #[arg(long = "tls-san", value_name = "NAME|IP")]
    pub tls_san: Vec<String>,
    /// How long the certificates the CA issues are valid; holders renew at two thirds.
    #[arg(long, default_value_t = hawser_tls::NODE_CERT_LIFETIME.as_secs(), hide = true)]
    pub cert_lifetime_secs: u64,
}

impl ControllerArgs {
    /// Where the token files are, defaults applied.
    pub fn token_files(&self) -> crate::auth::TokenFiles {
        crate::auth::TokenFiles {
            admin: self
                .admin_token_file
                .clone()
                .unwrap_or_else(|| self.data_dir.join(hawser_api::auth::ADMIN_TOKEN_FILE)),
            agent: self
                .agent_token_file
                .clone()
                .unwrap_or_else(|| self.data_dir.join(hawser_api::auth::AGENT_TOKEN_FILE)),
            metrics: self
                .metrics_token_file
                .clone()
                .unwrap_or_else(|| self.data_dir.join(hawser_api::auth::METRICS_TOKEN_FILE)),
        }
    }
}

/// A controller bound to its address, not yet serving.
pub struct Controller {
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    /// Present with etcd: campaigns while the controller lives.
    election: Option<Election>,
    engine_check: std::time::Duration,
    scrub_interval: std::time::Duration,
    heal_check: std::time::Duration,
    standby_poll: std::time::Duration,
    heal: crate::healing::plan::HealConfig,
    /// Failover on Kubernetes, when the store is there and it is enabled.
    ha: Option<(Arc<crate::ha::kube::Kube>, crate::ha::HaConfig)>,
}

/// An opened store: whether controllers share it (and elect a leader), and the Kubernetes
/// credentials when it lives there.
struct OpenedStore {
    store: Arc<dyn Store>,
    shared: bool,
    kube: Option<hawser_kube::KubeConfig>,
    /// The namespace of a `k8s://` store.
    namespace: Option<String>,
}

/// The Kubernetes client and namespace for `--ca-secret`: the store's when it is Kubernetes,
/// else the pod's own (in-cluster credentials, else $KUBECONFIG).
fn secret_access(
    kube: Option<Arc<crate::ha::kube::Kube>>,
    namespace: Option<String>,
    args: &ControllerArgs,
) -> anyhow::Result<(Arc<crate::ha::kube::Kube>, String)> {
    let no_ns = || {
        anyhow::anyhow!("--ca-secret: no namespace (set one in the kubeconfig, or run in a pod)")
    };
    if let Some(k) = kube {
        return Ok((k, namespace.ok_or_else(no_ns)?));
    }
    let target = KubeStoreUrl::parse("k8s://").map_err(|e| anyhow::anyhow!(e))?;
    let cfg = target
        .config()
        .map_err(|e| anyhow::anyhow!("--ca-secret needs access to Kubernetes: {e}"))?;
    let ns = target
        .namespace
        .or(cfg.namespace.clone())
        .ok_or_else(no_ns)?;
    let k = crate::ha::kube::Kube::new(&cfg, &args.csi_driver).map_err(|e| anyhow::anyhow!(e))?;
    Ok((Arc::new(k), ns))
}

/// Opens the store `args.store` names (default: the file in the data directory).
async fn open_store(args: &ControllerArgs) -> anyhow::Result<OpenedStore> {
    if !args
        .store
        .as_deref()
        .is_some_and(|u| u.starts_with("etcd://"))
    {
        args.etcd.check_unused(args.store.as_deref())?;
    }
    match args.store.as_deref() {
        Some(url) if url.starts_with("etcd://") => {
            let cfg = args.etcd.config(url, args.insecure)?;
            let store = EtcdStore::connect(cfg)
                .await
                .context("connect to the etcd cluster store")?;
            Ok(OpenedStore {
                store: Arc::new(store),
                shared: true,
                kube: None,
                namespace: None,
            })
        }
        Some(url) if url.starts_with("k8s://") => {
            let target = KubeStoreUrl::parse(url).map_err(|e| anyhow::anyhow!(e))?;
            let cfg = target.config().map_err(|e| anyhow::anyhow!(e))?;
            // Names this controller in the Leases it holds: the pod's name in a cluster.
            let identity = std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "hawser-controller".into());
            let store = KubeStore::connect(
                &cfg,
                &target,
                &identity,
                hawser_kube::DEFAULT_REQUEST_TIMEOUT,
            )
            .await
            .with_context(|| format!("connect to the Kubernetes cluster store ({})", cfg.source))?;
            Ok(OpenedStore {
                store: Arc::new(store),
                shared: true,
                namespace: target.namespace.clone().or(cfg.namespace.clone()),
                kube: Some(cfg),
            })
        }
        other => {
            let path = match other {
                Some(p) => PathBuf::from(p),
                None => args.data_dir.join(STORE_FILE),
            };
            let store = EmbeddedStore::open(&path)
                .with_context(|| format!("open the cluster store {}", path.display()))?;
            Ok(OpenedStore {
                store: Arc::new(store),
                shared: false,
                kube: None,
                namespace: None,
            })
        }
    }
}

impl Controller {
    /// Opens the store and binds `args.listen`. With etcd, starts campaigning for
    /// leadership; the API answers `not_leader` until this controller leads.
    pub async fn bind(args: ControllerArgs) -> anyhow::Result<Controller> {
        std::fs::create_dir_all(&args.data_dir)
            .with_context(|| format!("create data directory {}", args.data_dir.display()))?;
        let OpenedStore {
            store,
            shared,
            kube,
            namespace,
        } = open_store(&args).await?;
        let kube = match kube {
            Some(cfg) => Some(Arc::new(
                crate::ha::kube::Kube::new(&cfg, &args.csi_driver)
                    .map_err(|e| anyhow::anyhow!(e))?,
            )),
            None => None,
        };
        let ha = match &kube {
            Some(k) if args.failover_after_secs > 0 => {
                let c = crate::ha::HaConfig {
                    after_ms: args.failover_after_secs.saturating_mul(1000),
                    confirm_ms: args.failover_confirm_secs.saturating_mul(1000),
                };
                Some((k.clone(), c))
            }
            _ => None,
        };
        let tokens = ClusterTokens::init(&*store, &args.token_files(), args.insecure).await?;
        // Beside the CA's Secret, a Secret of the volumes' key-encryption keys: a controller
        // pod's data directory does not outlive the pod (volume_keys/shared.rs).
        let keks = match (&args.ca_secret, args.insecure) {
            (Some(ca), false) => {
                let (kube, namespace) = secret_access(kube.clone(), namespace.clone(), &args)?;
                let secret = crate::volumes::keys::KekSecret {
                    kube,
                    namespace,
                    name: format!("{ca}-volume-keys"),
                };
                let keks = crate::volumes::keys::Keks::with_secret(&args.data_dir, secret);
                if let Err(e) = keks.sync().await {
                    tracing::warn!(error = %e, "could not sync the volume key-encryption keys now; encrypted volumes retry when they need them");
                }
                keks
            }
            _ => crate::volumes::keys::Keks::new(&args.data_dir),
        };
        let tls = if !args.insecure {
            let lifetime = std::time::Duration::from_secs(args.cert_lifetime_secs.max(3));
            let names = hawser_tls::server_names(&[args.listen], &args.tls_san);
            let home = match &args.ca_secret {
                None => crate::auth::ca_home::CaHome::Files(args.data_dir.clone()),
                Some(name) => {
                    let (kube, namespace) = secret_access(kube.clone(), namespace.clone(), &args)?;
                    crate::auth::ca_home::CaHome::Secret {
                        kube,
                        namespace,
                        name: name.clone(),
                        data_dir: args.data_dir.clone(),
                    }
                }
            };
            let hint = match &args.ca_secret {
                None => args.data_dir.display().to_string(),
                Some(name) => name.clone(),
            };
            let t = crate::auth::tls::ControllerTls::load(home, &hint, lifetime, names).await?;
            Some(Arc::new(t))
        } else {
            tracing::warn!(
                "INSECURE (--insecure): the API is plaintext HTTP without the cluster CA; \
                 tokens and volume metadata cross the network in clear and any holder of the \
                 agent token can act as any node; use only on a network you trust entirely"
            );
            None
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listen on {}", args.listen))?;
        let addr = listener.local_addr().context("read the bound address")?;
        let controller_url = match args.advertise_url {
            Some(url) => {
                let host = url.split_once("://").map_or("", |(_, rest)| rest);
                if host.is_empty() || host.starts_with(':') || host.starts_with('/') {
                    anyhow::bail!("--advertise-url {url:?} has no host (in a pod: is POD_IP set?)");
                }
                url.trim_end_matches('/').to_string()
            }
            None => {
                if addr.ip().is_unspecified() {
                    tracing::warn!(
                        %addr,
                        "listening on all interfaces without --advertise-url: engines will be \
                         told to report to an unspecified address"
                    );
                }
                format!("{scheme}://{addr}")
            }
        };
        let (election, leadership) = if shared {
            let (e, l) = Election::start(store.clone(), controller_url.clone());
            (Some(e), l)
        } else {
            (None, Leadership::sole())
        };
        tracing::info!(store = %store.describe(), "cluster store");
        let fenced = FencedStore::new(store, leadership.clone());
        let metrics = crate::state::metrics::ControllerMetrics::default();
        let retrying = RetryingStore::new(
            Arc::new(fenced),
            leadership.clone(),
            controller_url.clone(),
            RetryPolicy::STORE,
        )
        .with_metrics(metrics.store.clone());
        let state = AppState {
            records: Records::new(Arc::new(retrying)),
            agents: AgentClient::new(tokens.agent_token(), tls.clone())
                .context("build the agent HTTP client")?,
            tls,
            tokens,
            volume_locks: Default::default(),
            reservations: Default::default(),
            node_timeout_ms: args.node_timeout_secs.saturating_mul(1000),
            controller_url,
            leadership,
            events: match &kube {
                Some(k) => crate::cluster::events::ClusterEvents::start(k.clone()),
                None => crate::cluster::events::ClusterEvents::none(),
            },
            waiting: Default::default(),
            metrics,
            keks,
            backups: crate::snapshots::backup_settings::BackupSettings {
                prune_grace_secs: args.backup_prune_grace_secs,
                ..crate::snapshots::backup_settings::BackupSettings::new(
                    &args.data_dir,
                    args.backup_rate,
                    args.backup_retry_secs,
                )
            },
        };
        Ok(Controller {
            listener,
            state: Arc::new(state),
            election,
            engine_check: std::time::Duration::from_secs(args.engine_check_secs),
            scrub_interval: std::time::Duration::from_secs(args.scrub_interval_secs),
            heal_check: std::time::Duration::from_secs(args.heal_check_secs),
            standby_poll: std::time::Duration::from_secs(args.standby_poll_secs.max(1)),
            heal: crate::healing::plan::HealConfig {
                replace_after_ms: args.replace_after_secs.saturating_mul(1000),
                max_rebuilds: args.max_rebuilds,
            },
            ha,
        })
    }

    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listener.local_addr().context("read the bound address")
    }

    /// Serves the API until `shutdown` completes, then finishes in-flight requests and
    /// resigns leadership. Dropping the future instead (as a crash would) does not resign:
    /// the others take over when the lease expires.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let seen = tokio::spawn(self.state.records.follow_volumes());
        let watch = tokio::spawn(crate::cluster::engine_watch::run(
            self.state.clone(),
            self.engine_check,
            self.scrub_interval,
        ));
        let heal = tokio::spawn(crate::healing::self_heal::run(
            self.state.clone(),
            self.heal_check,
            self.heal,
        ));
        let reconcile = tokio::spawn(crate::cluster::reconcile::run(self.state.clone()));
        let catchup = tokio::spawn(crate::snapshots::catchup::run(
            self.state.clone(),
            self.heal_check,
        ));
        let backups = tokio::spawn(crate::snapshots::backups::run(
            self.state.clone(),
            std::time::Duration::from_secs(10),
        ));
        let standby = tokio::spawn(crate::snapshots::standby::run(
            self.state.clone(),
            self.standby_poll,
        ));
        let schedules = tokio::spawn(crate::snapshots::schedules::run(self.state.clone()));
        let prune_locks = {
            let st = self.state.clone();
            tokio::spawn(async move { crate::snapshots::prune_locks::clear_left(&st).await })
        };
        let node_events =
            tokio::spawn(crate::cluster::node_events::watch_nodes(self.state.clone()));
        let tokens = tokio::spawn(crate::api::tokens::refresh_forever(self.state.clone()));
        let failover = self
            .ha
            .map(|(k, c)| tokio::spawn(crate::ha::run(self.state.clone(), k, c)));
        let renew = self
            .state
            .tls
            .clone()
            .map(|t| tokio::spawn(t.renew_forever()));
        let follow_ca = tokio::spawn(crate::auth::ca_rotation::follow_forever(self.state.clone()));
        let server_tls = self.state.tls.as_ref().map(|t| t.server_config());
        let app = crate::api::router(self.state);
        let result = hawser_listen::serve(
            self.listener,
            app,
            HttpLimits::default(),
            server_tls,
            shutdown,
        )
        .await
        .context("serve the controller API");
        seen.abort();
        watch.abort();
        heal.abort();
        reconcile.abort();
        catchup.abort();
        backups.abort();
        standby.abort();
        schedules.abort();
        prune_locks.abort();
        node_events.abort();
        tokens.abort();
        follow_ca.abort();
        if let Some(r) = renew {
            r.abort();
        }
        if let Some(f) = failover {
            f.abort();
        }
        if let Some(e) = self.election {
            e.resign().await;
        }
        result
    }
}

/// Runs `hawser controller` until SIGINT or SIGTERM.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    // Watch the signals before the API answers anything: a SIGTERM sent as soon as the
    // controller responds must stop it gracefully (and resign), not kill it.
    let shutdown = shutdown_signal()?;
    let data_dir = args.data_dir.clone();
    let controller = Controller::bind(args).await?;
    let addr = controller.local_addr()?;
    tracing::info!(%addr, data_dir = %data_dir.display(), "controller listening");
    controller.serve(shutdown).await?;
    tracing::info!("controller stopped");
    Ok(())
}

/// Registers SIGINT and SIGTERM handlers now; the future completes on either.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("watch SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("watch SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}
