//! `hawser csi`: serves the CSI services on a unix socket, in one of three modes (the Helm
//! chart runs `controller` in a Deployment and `node` in a DaemonSet; `all` is for tests and
//! single-node setups), and the kubelet registration socket in the node modes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use hawser_api::client::Client;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use crate::api::Api;
use crate::controller::ControllerService;
use crate::identity::IdentityService;
use crate::inflight::InFlight;
use crate::proto::csi::controller_server::ControllerServer;
use crate::proto::csi::identity_server::IdentityServer;
use crate::proto::registration::registration_server::RegistrationServer;
use crate::registration::{self, RegistrationService};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Identity + Controller + Node (tests, one-node setups).
    All,
    /// Identity + Controller (the chart's Deployment, beside the CSI sidecars).
    Controller,
    /// Identity + Node, and the kubelet registration (the chart's DaemonSet).
    Node,
}

#[derive(Debug, clap::Args)]
pub struct CsiArgs {
    /// Where to serve CSI: `unix:///path/csi.sock` (or a plain path).
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: String,
    #[arg(long, value_enum, default_value_t = Mode::All)]
    pub mode: Mode,
    /// This node's Hawser name (its agent's `--node`); required by the node modes.
    #[arg(long, env = "HAWSER_NODE")]
    pub node: Option<String>,
    /// The kubelet's root directory: target and staging paths must be inside it, and the
    /// registration socket goes to its `plugins_registry`.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// Where the node service keeps what it staged (so a restart finds it again).
    #[arg(long, default_value = "/var/lib/hawser/csi")]
    pub state_dir: PathBuf,
    /// Do not serve the kubelet registration socket (csi-sanity, no kubelet).
    #[arg(long)]
    pub no_register: bool,
    /// `--mode=node`: reach the controller with this node's own certificate, from its
    /// agent's TLS directory (`<agent data-dir>/tls`), instead of the admin token: it reads
    /// only this node and the volumes attached to it. The Helm chart sets it.
    #[arg(long, value_name = "DIR")]
    pub node_identity_dir: Option<PathBuf>,
    /// The node agent's device API socket (`<agent data-dir>/device.sock`): the agent makes
    /// staged volumes kernel block devices that survive its restarts.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/lib/hawser/agent/device.sock"
    )]
    pub agent_device_socket: PathBuf,
    /// How volumes become block devices on this node when their StorageClass does not say
    /// (`frontend` parameter): auto (a kernel device from the agent when this kernel has
    /// one, else nbdfuse), ublk, nbd or fuse.
    #[arg(long, default_value = "auto")]
    pub frontend: crate::params::Frontend,
}

/// `unix:///a/b` or `/a/b` → `/a/b`.
fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') {
        bail!("--endpoint {endpoint:?}: give an absolute unix socket path, unix:///path/csi.sock");
    }
    Ok(PathBuf::from(path))
}

/// Binds a unix socket, replacing a stale one left by a previous run.
fn bind(path: &Path) -> anyhow::Result<UnixListenerStream> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove stale {}", path.display())),
    }
    let l = UnixListener::bind(path).with_context(|| format!("listen on {}", path.display()))?;
    Ok(UnixListenerStream::new(l))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Serves until SIGTERM or Ctrl-C. `client` talks to the Hawser controller.
pub async fn run(args: CsiArgs, client: Arc<Client>) -> anyhow::Result<()> {
    let endpoint = socket_path(&args.endpoint)?;
    let api = Api::new(client);
    let inflight = InFlight::default();
    let controller = args.mode != Mode::Node;
    let node = args.mode != Mode::Controller;
    let mut router =
        Server::builder().add_service(IdentityServer::new(IdentityService { controller }));
    if controller {
        router = router.add_service(ControllerServer::new(ControllerService {
            api: api.clone(),
            inflight: inflight.clone(),
        }));
    }
    if node {
        let Some(name) = args.node.clone() else {
            bail!(
                "--node NAME (this node's agent name) is required in {:?} mode",
                args.mode
            );
        };
        let service = crate::node::NodeService::new(
            name,
            api.clone(),
            inflight.clone(),
            &args.kubelet_dir,
            crate::node_device::DeviceManager::new(
                args.state_dir.clone(),
                args.agent_device_socket.clone(),
                args.frontend,
            ),
        )?;
        router = router.add_service(crate::proto::csi::node_server::NodeServer::new(service));
        if !args.no_register {
            spawn_registration(&args.kubelet_dir, &endpoint)?;
        }
    }
    let incoming = bind(&endpoint)?;
    tracing::info!(endpoint = %endpoint.display(), mode = ?args.mode, "serving CSI");
    router
        .serve_with_incoming_shutdown(incoming, shutdown_signal())
        .await
        .context("serve CSI")?;
    let _ = std::fs::remove_file(&endpoint);
    tracing::info!("CSI stopped");
    Ok(())
}

/// Serves the registration socket for the kubelet, in the background, each connection
/// through `authority::relay` (the kubelet's registration client sends an invalid HTTP/2
/// authority). When the kubelet refuses the registration the socket is made anew after a
/// backoff (2 s doubling to 30 s), which the kubelet takes for a new plugin and asks again.
fn spawn_registration(kubelet_dir: &Path, endpoint: &Path) -> anyhow::Result<()> {
    use tokio_stream::StreamExt;
    let path = registration::socket_path(kubelet_dir);
    let mut listener = Some(bind(&path)?);
    let endpoint = endpoint.to_path_buf();
    tracing::info!(socket = %path.display(), "serving the kubelet plugin registration");
    tokio::spawn(async move {
        let mut backoff = Duration::from_secs(2);
        loop {
            let incoming = match listener.take().map_or_else(|| bind(&path), Ok) {
                Ok(l) => l.map(|conn| conn.map(crate::authority::relay)),
                Err(e) => {
                    tracing::error!(error = %e, "cannot offer the kubelet registration socket");
                    tokio::time::sleep(backoff).await;
                    continue;
                }
            };
            let refused = Arc::new(tokio::sync::Notify::new());
            let service = RegistrationServer::new(RegistrationService {
                refused: refused.clone(),
                csi_endpoint: endpoint.clone(),
            });
            let served = Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, refused.notified())
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the kubelet registration socket stopped");
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
            tracing::info!(socket = %path.display(), "offering the kubelet registration again");
        }
    });
    Ok(())
}
