//! `hawser csi` for tests: one process serving Identity, Controller and Node for a node of a
//! test [`Cluster`], a gRPC client over its unix socket, and where the Kubernetes test tools
//! (csi-sanity, kubelet, ...) are: `scripts/k8s/build.sh` builds them into one cache.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hawser_csi::proto::csi::controller_client::ControllerClient;
use hawser_csi::proto::csi::identity_client::IdentityClient;
use hawser_csi::proto::csi::node_client::NodeClient;
use tonic::transport::{Channel, Endpoint};

use crate::cluster::{hawser_bin, print_log_tails, stop};
use crate::run::wait_until;
use crate::Cluster;

/// The directory with csi-sanity, helm, kubelet, ...: `HAWSER_K8S_BIN`, else
/// `~/.cache/hawser-k8s/bin` (where `scripts/k8s/build.sh`, run by `make test`, puts them).
pub fn k8s_tool(name: &str) -> PathBuf {
    let dir = std::env::var_os("HAWSER_K8S_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home =
                std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
            home.join(".cache/hawser-k8s/bin")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "no {name} at {}: run scripts/k8s/build.sh (make test does) or set HAWSER_K8S_BIN",
        p.display()
    );
    p
}

/// How to run `hawser csi`; the default is `--mode all`, no kubelet registration, the
/// kubelet dir and socket inside the process's own directory.
#[derive(Clone, Debug)]
pub struct CsiOptions {
    pub mode: &'static str,
    pub kubelet_dir: Option<PathBuf>,
    pub endpoint: Option<PathBuf>,
    pub register: bool,
    /// Run inside this network namespace (a node of its own).
    pub netns: Option<String>,
    /// The cluster CA (`--ca-file`), for a controller with TLS.
    pub ca_file: Option<PathBuf>,
    /// A node plugin that reaches the controller with its node's certificate from this
    /// directory (`--node-identity-dir`, the agent's `tls/`) rather than the admin token,
    /// as the Helm chart runs it.
    pub node_identity: Option<PathBuf>,
    /// The node agent's device API socket (`--agent-device-socket`); by default the one of
    /// the cluster's agent of the same node name, when started from a `Cluster`.
    pub agent_device_socket: Option<PathBuf>,
    /// `--frontend` (the node's choice when a volume's context has none): auto by default.
    pub frontend: Option<&'static str>,
}

impl Default for CsiOptions {
    fn default() -> Self {
        CsiOptions {
            mode: "all",
            kubelet_dir: None,
            endpoint: None,
            register: false,
            netns: None,
            ca_file: None,
            node_identity: None,
            agent_device_socket: None,
            frontend: None,
        }
    }
}

pub struct CsiProc {
    child: Child,
    node: String,
    opts: CsiOptions,
    /// Its own directory: the socket, the log, the kubelet dir and the node state.
    pub dir: PathBuf,
    pub endpoint: PathBuf,
    /// Stands in for `/var/lib/kubelet`: staging and target paths must be inside it.
    pub kubelet_dir: PathBuf,
    pub state_dir: PathBuf,
    url: String,
    token: PathBuf,
}

impl CsiProc {
    /// Starts `hawser csi --mode all` for `node` of `cluster` under `dir`; waits until it
    /// serves.
    pub fn start(cluster: &Cluster, node: &str, dir: &Path) -> CsiProc {
        Self::start_with(cluster, node, dir, CsiOptions::default())
    }

    pub fn start_with(cluster: &Cluster, node: &str, dir: &Path, opts: CsiOptions) -> CsiProc {
        let agent_socket = cluster
            .agents
            .iter()
            .find(|a| a.name == node)
            .map(|a| a.data_dir.join("device.sock"));
        let opts = CsiOptions {
            ca_file: opts.ca_file.or(Some(cluster.tokens.ca_file.clone())),
            agent_device_socket: opts.agent_device_socket.or(agent_socket),
            ..opts
        };
        Self::start_for(&cluster.url, &cluster.tokens.admin, node, dir, opts)
    }

    /// The same for a controller at `url` with the token in `token`.
    pub fn start_for(url: &str, token: &Path, node: &str, dir: &Path, opts: CsiOptions) -> CsiProc {
        std::fs::create_dir_all(dir).expect("create csi dir");
        let kubelet_dir = opts
            .kubelet_dir
            .clone()
            .unwrap_or_else(|| dir.join("kubelet"));
        std::fs::create_dir_all(&kubelet_dir).expect("create kubelet dir");
        let mut p = CsiProc {
            child: spawn_placeholder(),
            node: node.to_string(),
            dir: dir.to_path_buf(),
            endpoint: opts
                .endpoint
                .clone()
                .unwrap_or_else(|| dir.join("csi.sock")),
            opts,
            kubelet_dir,
            state_dir: dir.join("state"),
            url: url.to_string(),
            token: token.to_path_buf(),
        };
        p.child = p.spawn();
        p
    }

    fn spawn(&self) -> Child {
        let _ = std::fs::remove_file(&self.endpoint);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("csi-{}.log", self.opts.mode)))
            .expect("open csi log");
        let err = log.try_clone().expect("clone log handle");
        let mut cmd = match &self.opts.netns {
            // Only the network namespace (`ip netns exec` would make a mount namespace too,
            // and the node service's mounts must be the host's).
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(hawser_bin());
                c
            }
            None => Command::new(hawser_bin()),
        };
        cmd.args(["--controller", &self.url]);
        match &self.opts.node_identity {
            Some(dir) => {
                cmd.args(["csi", "--node-identity-dir"]).arg(dir);
            }
            None => {
                if let Some(ca) = &self.opts.ca_file {
                    cmd.arg("--ca-file").arg(ca);
                }
                cmd.arg("--token-file").arg(&self.token).arg("csi");
            }
        }
        let mut child = cmd
            .args(["--mode", self.opts.mode, "--node", &self.node])
            .args(if self.opts.register {
                &[][..]
            } else {
                &["--no-register"][..]
            })
            .arg("--endpoint")
            .arg(format!("unix://{}", self.endpoint.display()))
            .arg("--kubelet-dir")
            .arg(&self.kubelet_dir)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--agent-device-socket")
            .arg(self.agent_socket())
            .args(["--frontend", self.opts.frontend.unwrap_or("auto")])
            .env("RUST_LOG", "info,hawser_csi=debug")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .expect("spawn hawser csi");
        let endpoint = self.endpoint.clone();
        wait_until("hawser csi to listen", Duration::from_secs(20), || {
            assert!(
                !matches!(child.try_wait(), Ok(Some(_))),
                "hawser csi exited at start; see {}/csi-{}.log",
                self.dir.display(),
                self.opts.mode
            );
            endpoint.exists()
        });
        child
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process (SIGTERM, as a pod restart) and starts it again on the same state.
    pub fn restart(&mut self) {
        stop(&mut self.child);
        self.child = self.spawn();
    }

    /// A gRPC channel to the socket (in the caller's tokio runtime).
    pub async fn channel(&self) -> Channel {
        unix_channel(self.endpoint.clone()).await
    }

    pub async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel().await)
    }

    pub async fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel().await)
    }

    pub async fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel().await)
    }
}

/// A gRPC channel to a unix socket (in the caller's tokio runtime).
pub async fn unix_channel(path: PathBuf) -> Channel {
    Endpoint::from_static("http://csi.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .expect("connect to the CSI socket")
}

/// A process handle to fill the field before the real one starts (`true` exits at once).
fn spawn_placeholder() -> Child {
    Command::new("true").spawn().expect("spawn true")
}

/// Unmounts whatever is mounted under `dir`, deepest first, and removes the devices a node
/// service staged in `state_dir`: a failed test leaves no mount, loop device or nbdfuse.
pub fn clean_node_state(dir: &Path, state_dir: &Path, agent_socket: &Path) {
    let mut under: Vec<PathBuf> = hawser_csi::mounts::mount_entries()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir) && !p.starts_with(state_dir))
        .collect();
    under.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in under {
        let _ = Command::new("umount").arg("-l").arg(&p).status();
    }
    let devices = hawser_csi::node_device::DeviceManager::new(
        state_dir.to_path_buf(),
        agent_socket.to_path_buf(),
        hawser_csi::params::Frontend::Auto,
    );
    for id in devices.recorded() {
        if let Err(e) = devices.disconnect(&id) {
            eprintln!("cleaning up staged volume {id}: {e}");
        }
    }
}

impl CsiProc {
    /// The agent device API socket the node service is given (a path that does not exist
    /// when no agent of that name was known: the node then stages through nbdfuse).
    fn agent_socket(&self) -> PathBuf {
        self.opts
            .agent_device_socket
            .clone()
            .unwrap_or_else(|| self.dir.join("no-agent-device.sock"))
    }
}

impl Drop for CsiProc {
    fn drop(&mut self) {
        stop(&mut self.child);
        if self.opts.mode != "controller" {
            clean_node_state(&self.kubelet_dir, &self.state_dir, &self.agent_socket());
        }
        if std::thread::panicking() {
            print_log_tails(&self.dir, [format!("csi-{}", self.opts.mode)]);
        }
    }
}
