//! The Hawser controller: keeps the cluster state (nodes, pools, volumes) in the cluster
//! store, places replicas, drives the agents through a volume's lifecycle, and serves the
//! REST API described in `hawser_api::controller`.
//!
//! `hawser controller` calls [`run`]; tests use [`Controller::bind`] and
//! [`Controller::serve`] to run one on an ephemeral port.

mod agent_client;
mod api_nodes;
mod api_pools;
mod api_volumes;
mod constants;
mod errors;
mod locks;
mod model;
mod placement;
mod records;
mod reservations;
mod server;
mod state;
mod volume_attach;
mod volume_create;
mod volume_delete;
mod volume_outdate;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use hawser_store::{EmbeddedStore, Store};

pub use constants::{DEFAULT_NODE_TIMEOUT_SECS, MAX_BODY_BYTES, MAX_REPLICAS};
pub use errors::ControllerError;
pub use placement::{place, Candidate, Placement, PlacementError};

use crate::agent_client::AgentClient;
use crate::records::Records;
use crate::state::AppState;

/// Name of the store file inside `--data-dir`.
pub const STORE_FILE: &str = "store.json";

/// Arguments of `hawser controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// Address to listen on. Loopback by default: the API has no authentication yet.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub listen: SocketAddr,
    /// Directory for the controller's state (the cluster store file); created if missing.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Seconds without a heartbeat after which a node is offline.
    #[arg(long, default_value_t = DEFAULT_NODE_TIMEOUT_SECS)]
    pub node_timeout_secs: u64,
    /// URL agents reach this controller at, given to engines for their reports
    /// [default: http://<bound listen address>].
    #[arg(long)]
    pub advertise_url: Option<String>,
}

/// A controller bound to its address, not yet serving.
pub struct Controller {
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
}

impl Controller {
    /// Opens the store under `args.data_dir` and binds `args.listen`.
    pub async fn bind(args: ControllerArgs) -> anyhow::Result<Controller> {
        std::fs::create_dir_all(&args.data_dir)
            .with_context(|| format!("create data directory {}", args.data_dir.display()))?;
        let store_path = args.data_dir.join(STORE_FILE);
        let store = EmbeddedStore::open(&store_path).context("open the cluster store")?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listen on {}", args.listen))?;
        let addr = listener.local_addr().context("read the bound address")?;
        let controller_url = match args.advertise_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                if addr.ip().is_unspecified() {
                    tracing::warn!(
                        %addr,
                        "listening on all interfaces without --advertise-url: engines will be \
                         told to report to an unspecified address"
                    );
                }
                format!("http://{addr}")
            }
        };
        let state = AppState {
            records: Records::new(Arc::new(store) as Arc<dyn Store>),
            agents: AgentClient::new().context("build the agent HTTP client")?,
            volume_locks: Default::default(),
            reservations: Default::default(),
            node_timeout_ms: args.node_timeout_secs.saturating_mul(1000),
            controller_url,
        };
        Ok(Controller {
            listener,
            state: Arc::new(state),
        })
    }

    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listener.local_addr().context("read the bound address")
    }

    /// Serves the API until `shutdown` completes, then finishes in-flight requests.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let app = server::router(self.state);
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .context("serve the controller API")
    }
}

/// Runs `hawser controller` until SIGINT or SIGTERM.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let data_dir = args.data_dir.clone();
    let controller = Controller::bind(args).await?;
    let addr = controller.local_addr()?;
    tracing::info!(%addr, data_dir = %data_dir.display(), "controller listening");
    controller.serve(shutdown_signal()).await?;
    tracing::info!("controller stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops it");
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
