//! A Hawser cluster of real processes on loopback: one controller (or several sharing a real
//! etcd, which then elect a leader) and N agents, each with its own data directory and
//! ports. Dropping it stops every process it started (SIGTERM, then SIGKILL after a
//! deadline) and removes its directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use hawser_api::agent::AgentStatus;
use hawser_api::controller::{Node, Volume};
use hawser_testkit::apiserver_process::ApiserverProcess;
use hawser_testkit::etcd_process::EtcdProcess;
use hawser_testkit::test_ports::free_loopback_port;

use crate::run::{wait_until, TempDir};
use crate::tokens::TokenFiles;

pub struct AgentProc {
    pub name: String,
    pools: Vec<String>,
    pub child: Child,
    pub admin: String,
    pub replica: String,
    pub nbd: String,
    pub socket: PathBuf,
    pub data_dir: PathBuf,
}

pub struct ControllerProc {
    /// `controller`, or `controller-N` when there are several (also its log's name).
    pub name: String,
    pub url: String,
    pub child: Child,
}

impl ControllerProc {
    /// The port it listens on (a restart listens there again).
    fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("controller port")
    }
}

pub struct Cluster {
    pub dir: TempDir,
    /// Every controller's URL, comma-separated (what the CLI and the agents are given).
    pub url: String,
    pub controllers: Vec<ControllerProc>,
    pub agents: Vec<AgentProc>,
    /// Dropped after the processes that use it.
    pub etcd: Option<EtcdProcess>,
    /// The Kubernetes store's API server (`HAWSER_E2E_STORE=kubernetes`), dropped after the
    /// controller.
    pub apiserver: Option<ApiserverProcess>,
    /// The cluster's tokens and CA, shared by every controller, agent and CLI run.
    pub tokens: TokenFiles,
    /// Plaintext (`--insecure`) rather than mutual TLS.
    pub insecure: bool,
    /// What every controller was started with past its own (its store, the test's flags).
    controller_args: Vec<String>,
    /// Extra arguments every agent is started (and restarted) with.
    pub agent_args: Vec<String>,
}

#[derive(Default)]
pub struct ClusterOptions {
    /// Extra `--pool` specs per agent index (replacing the default pool).
    pub pools: Vec<Vec<String>>,
    /// When > 0: start a real etcd and this many controllers on it (leader election);
    /// else one controller on the store [`STORE_ENV`] selects (embedded by default).
    pub etcd_controllers: usize,
    /// Run the cluster in plaintext (`--insecure` controller and agents, agent token).
    pub insecure: bool,
    /// Extra arguments for every agent (e.g. a slow `--resync-rate` a test wants to watch).
    pub agent_args: Vec<String>,
    /// Extra arguments for every controller (e.g. a short `--replace-after-secs`).
    pub controller_args: Vec<String>,
}

/// Environment variable that selects the store of clusters that do not ask for etcd
/// themselves: `embedded` (or unset), `etcd` (a real etcd and one controller on it), or
/// `kubernetes` (a real kube-apiserver with Hawser's CRDs, and one controller on it).
/// `make test` runs the "Replicated volumes over NBD" tests once with each, so the etcd
/// backend is held to the same end-to-end behaviour as the embedded one.
pub const STORE_ENV: &str = "HAWSER_E2E_STORE";

/// How many controllers on etcd a cluster gets: `opts` asks, else [`STORE_ENV`] decides.
/// Panics on an unknown value rather than silently testing the embedded store.
fn etcd_controllers(opts: &ClusterOptions) -> usize {
    if opts.etcd_controllers > 0 {
        return opts.etcd_controllers;
    }
    match std::env::var(STORE_ENV).as_deref() {
        Err(_) | Ok("") | Ok("embedded") | Ok("kubernetes") => 0,
        Ok("etcd") => 1,
        Ok(other) => {
            panic!("{STORE_ENV}={other:?}: expected \"embedded\", \"etcd\" or \"kubernetes\"")
        }
    }
}

/// A kube-apiserver (and its etcd) under `dir`, with Hawser's CRDs and the namespace
/// `hawser`: what the Kubernetes store needs, without kubelets.
fn start_apiserver(dir: &Path) -> ApiserverProcess {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let api = ApiserverProcess::start(&dir.join("apiserver"))
            .await
            .unwrap_or_else(|e| panic!("start kube-apiserver: {e}"));
        hawser_kube::install_crds(&api.config(), Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("install the CRDs: {e}"));
        api.create_namespace("hawser")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        api
    })
}

pub fn hawser_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HAWSER_BIN") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = root.join("target/release/hawser");
    assert!(
        p.exists(),
        "no hawser binary at {}: run `make build` or set HAWSER_BIN",
        p.display()
    );
    p
}

/// A free loopback port (bound and released; fine for tests that run one at a time), outside
/// the range outgoing connections take their local ports from (see `free_loopback_port`).
pub fn free_port() -> u16 {
    free_loopback_port().unwrap_or_else(|e| panic!("{e}"))
}

impl Cluster {
    pub fn start(name: &str, agents: usize) -> Cluster {
        Self::start_with(name, agents, ClusterOptions::default())
    }

    pub fn start_with(name: &str, agents: usize, opts: ClusterOptions) -> Cluster {
        let dir = TempDir::new(name);
        let on_etcd = etcd_controllers(&opts);
        // etcd as production runs it: TLS, client certificates, authentication.
        let etcd = (on_etcd > 0).then(|| {
            EtcdProcess::start_secure(dir.path()).unwrap_or_else(|e| panic!("start etcd: {e}"))
        });
        let on_kubernetes =
            on_etcd == 0 && std::env::var(STORE_ENV).is_ok_and(|v| v == "kubernetes");
        let apiserver = on_kubernetes.then(|| start_apiserver(dir.path()));
        let mut store: Vec<String> = etcd
            .as_ref()
            .map(|e| {
                let mut a = vec!["--store".to_string(), e.store_url("hawser")];
                a.extend(e.controller_args());
                a
            })
            .unwrap_or_default();
        if let Some(api) = &apiserver {
            store = vec![
                "--store".to_string(),
                format!("k8s://hawser?kubeconfig={}", api.kubeconfig().display()),
            ];
        }
        eprintln!(
            "cluster {name}: {} controller(s) on {}",
            on_etcd.max(1),
            store.get(1).map_or("the embedded store", String::as_str)
        );
        store.extend(opts.controller_args.iter().cloned());
        let tokens = TokenFiles::seed(dir.path());
        let count = on_etcd.max(1);
        let controllers: Vec<ControllerProc> = (0..count)
            .map(|i| {
                let name = if count == 1 {
                    "controller".to_string()
                } else {
                    format!("controller-{}", i + 1)
                };
                spawn_controller(dir.path(), &name, &store, &tokens, opts.insecure)
            })
            .collect();
        let url = controllers
            .iter()
            .map(|c| c.url.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            dir,
            url,
            controllers,
            agents: Vec::new(),
            etcd,
            apiserver,
            tokens,
            insecure: opts.insecure,
            agent_args: opts.agent_args,
            controller_args: store,
        };
        // Until one leads, every API call (agent registrations included) is refused.
        c.wait_leader(Duration::from_secs(20));
        if !c.insecure {
            // One token for every agent of the cluster (restarted agents keep their
            // certificates and do not use it again).
            let token = c.cli_ok(&["cluster", "join-token", "--uses", "100"]);
            std::fs::write(&c.tokens.join, token.trim()).expect("write the join token");
        }
        for i in 0..agents {
            let pools = opts.pools.get(i).cloned().unwrap_or_default();
            c.spawn_agent(&format!("n{}", i + 1), &pools);
        }
        c.wait_nodes_online(agents);
        c
    }

    fn spawn_agent(&mut self, name: &str, pools: &[String]) {
        let addrs = (
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
        );
        let agent = self.launch_agent(name, pools, addrs);
        self.agents.push(agent);
    }

    /// Stop agent `name` (SIGTERM, as a node shutdown) and start it again on the same data
    /// directory and ports; waits until it has registered again.
    pub fn restart_agent(&mut self, name: &str) {
        self.restart_agent_from(name, &hawser_bin(), true);
    }

    /// Start agent `name` again from `bin` (another build: an upgrade) on the same data
    /// directory and ports, after stopping it with SIGTERM if `stop_first` (else it must be
    /// dead already: [`Self::kill_agent`]); waits until it has registered again.
    pub fn restart_agent_from(&mut self, name: &str, bin: &Path, stop_first: bool) {
        let before = last_seen(&self.nodes(), name);
        self.relaunch_agent(name, bin, stop_first);
        wait_registered(name, before, || self.nodes());
    }

    /// [`Self::restart_agent_from`] without waiting for the agent to register: for a test
    /// whose controller is down meanwhile.
    pub fn relaunch_agent(&mut self, name: &str, bin: &Path, stop_first: bool) {
        let i = self
            .agents
            .iter()
            .position(|a| a.name == name)
            .expect("agent by name");
        if stop_first {
            stop(&mut self.agents[i].child);
        }
        let a = &self.agents[i];
        let (pools, addrs) = (
            a.pools.clone(),
            (a.admin.clone(), a.replica.clone(), a.nbd.clone()),
        );
        self.agents[i] = self.launch_agent_from(bin, name, &pools, addrs);
    }

    fn launch_agent(
        &self,
        name: &str,
        pools: &[String],
        addrs: (String, String, String),
    ) -> AgentProc {
        self.launch_agent_from(&hawser_bin(), name, pools, addrs)
    }

    fn launch_agent_from(
        &self,
        bin: &Path,
        name: &str,
        pools: &[String],
        addrs: (String, String, String),
    ) -> AgentProc {
        let (admin, replica, nbd) = addrs;
        let data_dir = self.dir.path().join(name);
        let socket = data_dir.join("nbd.sock");
        let mut cmd = Command::new(bin);
        cmd.args(["agent", "--node", name, "--controller", &self.url])
            .args([
                "--admin-listen",
                &admin,
                "--replica-listen",
                &replica,
                "--nbd-listen",
                &nbd,
            ])
            .arg("--data-dir")
            .arg(&data_dir);
        if self.insecure {
            cmd.arg("--insecure")
                .arg("--token-file")
                .arg(&self.tokens.agent);
        } else {
            cmd.arg("--join-token-file").arg(&self.tokens.join);
        }
        for p in pools {
            cmd.args(["--pool", p]);
        }
        cmd.args(&self.agent_args);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log_file(self.dir.path(), name))
            .spawn()
            .expect("start agent");
        AgentProc {
            name: name.into(),
            pools: pools.to_vec(),
            child,
            admin,
            replica,
            nbd,
            socket,
            data_dir,
        }
    }

    /// The index of the controller that leads now (the only one that serves the API), if
    /// exactly one does.
    pub fn leader(&self) -> Option<usize> {
        let http = self.controller_http();
        let serving: Vec<usize> = self
            .controllers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                http.get(format!("{}/v1/nodes", c.url))
                    .header("authorization", self.tokens.admin_bearer())
                    .send()
                    .is_ok_and(|r| r.status().is_success())
            })
            .map(|(i, _)| i)
            .collect();
        assert!(serving.len() <= 1, "several controllers serve: {serving:?}");
        serving.first().copied()
    }

    /// Waits until one controller leads; returns its index.
    pub fn wait_leader(&self, timeout: Duration) -> usize {
        let mut found = None;
        wait_until("a leading controller", timeout, || {
            found = self.leader();
            found.is_some()
        });
        found.expect("a leader")
    }

    /// kill -9 of controller `i` (by the PID this fixture started).
    pub fn kill_controller(&mut self, i: usize) {
        let c = &mut self.controllers[i].child;
        let _ = c.kill();
        let _ = c.wait();
    }

    /// kill -9 of controller `i`, then a start on the same address, data directory and
    /// flags (a crash, or an upgrade that did not wait): its log goes on in the same file.
    pub fn restart_controller(&mut self, i: usize) {
        self.kill_controller(i);
        let c = &self.controllers[i];
        let port = c.port();
        let name = c.name.clone();
        self.controllers[i] = spawn_controller_on(
            self.dir.path(),
            &name,
            &self.controller_args,
            &self.tokens,
            self.insecure,
            port,
        );
    }

    /// The operator's worst day: the (single, embedded-store) controller stops, its store
    /// file is lost, and it starts again on the same address with an empty store (its token
    /// files are kept).
    pub fn restart_controller_with_empty_store(&mut self) {
        assert!(
            self.etcd.is_none() && self.controllers.len() == 1,
            "one controller on the embedded store"
        );
        let c = &mut self.controllers[0];
        stop(&mut c.child);
        let data = self.dir.path().join(&c.name);
        std::fs::remove_file(data.join("store.json")).expect("remove the store file");
        // Its log of the changes since the snapshot goes with it (a log without its
        // snapshot is refused).
        match std::fs::remove_file(data.join("store.json.log")) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove the store's log: {e}"),
        }
        let port = c.port();
        let name = c.name.clone();
        self.controllers[0] = spawn_controller_on(
            self.dir.path(),
            &name,
            &[],
            &self.tokens,
            self.insecure,
            port,
        );
    }

    /// SIGKILL agent `name` (by the PID this fixture started) and reap it: to the others its
    /// node is gone. [`Self::restart_agent`] starts it again.
    pub fn kill_agent(&mut self, name: &str) {
        let a = self
            .agents
            .iter_mut()
            .find(|a| a.name == name)
            .expect("agent by name");
        signal(&a.child, libc::SIGKILL);
        let _ = a.child.wait();
    }

    /// SIGSTOP agent `name` (by the PID this fixture started): it keeps its connections but
    /// answers nothing, as a hung node would, until [`Self::resume_agent`].
    pub fn pause_agent(&self, name: &str) {
        signal(&self.agent(name).child, libc::SIGSTOP);
    }

    /// SIGCONT agent `name`: it handles what it was sent meanwhile.
    pub fn resume_agent(&self, name: &str) {
        signal(&self.agent(name).child, libc::SIGCONT);
    }

    pub fn wait_nodes_online(&self, n: usize) {
        wait_online(n, || self.nodes());
    }

    /// Run the CLI against this cluster.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_command(args).output().expect("run hawser")
    }

    /// The CLI against this cluster, to start in the background (a request that a test
    /// kills the controller under).
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(hawser_bin());
        cmd.env("HAWSER_CONTROLLER", &self.url)
            .env("HAWSER_TOKEN_FILE", &self.tokens.admin)
            .env("HAWSER_CA_FILE", &self.tokens.ca_file)
            .args(args);
        cmd
    }

    /// Run the CLI and require success; returns stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        cli_stdout(args, self.cli(args))
    }

    /// Run the CLI and require it to fail with `want` in its error output.
    pub fn cli_fails(&self, args: &[&str], want: &str) {
        let out = self.cli(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "hawser {args:?} succeeded");
        assert!(err.contains(want), "hawser {args:?}: {err}");
    }

    pub fn snapshot(&self, name: &str) -> hawser_api::controller::Snapshot {
        let out = self.cli_ok(&["snapshot", "show", name, "-o", "json"]);
        serde_json::from_str(&out).expect("snapshot JSON")
    }

    pub fn nodes(&self) -> Vec<Node> {
        let out = self.cli(&["node", "list", "-o", "json"]);
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }

    pub fn volume(&self, name: &str) -> Volume {
        let out = self.cli_ok(&["volume", "show", name, "-o", "json"]);
        serde_json::from_str(&out).expect("volume JSON")
    }

    pub fn volumes(&self) -> Vec<Volume> {
        let out = self.cli_ok(&["volume", "list", "-o", "json"]);
        serde_json::from_str(&out).expect("volume list JSON")
    }

    /// Create and attach a volume on agent `node`; returns the NBD unix-socket URI.
    pub fn attached_volume(&self, name: &str, size: &str, replicas: u32, node: &str) -> String {
        self.cli_ok(&[
            "volume",
            "create",
            name,
            "--size",
            size,
            "--replicas",
            &replicas.to_string(),
        ]);
        self.cli_ok(&["volume", "attach", name, "--node", node]);
        let v = self.volume(name);
        v.nbd_unix_uri.expect("attached volume has a unix URI")
    }

    /// Volume `volume`'s replica on `node`.
    pub fn replica_on(&self, volume: &str, node: &str) -> hawser_api::controller::Replica {
        self.volume(volume)
            .replicas
            .into_iter()
            .find(|r| r.node == node)
            .unwrap_or_else(|| panic!("{volume} has no replica on {node}"))
    }

    pub fn agent(&self, name: &str) -> &AgentProc {
        self.agents
            .iter()
            .find(|a| a.name == name)
            .expect("agent by name")
    }

    pub fn agent_status(&self, name: &str) -> AgentStatus {
        self.agent_request(reqwest::Method::GET, name, "/v1/status")
            .send()
            .and_then(|r| r.json())
            .expect("agent status")
    }

    /// A request to agent `name`'s admin API at `path`, as the controller makes it (its
    /// certificate; the agent token in an `--insecure` cluster).
    pub fn agent_request(
        &self,
        method: reqwest::Method,
        name: &str,
        path: &str,
    ) -> reqwest::blocking::RequestBuilder {
        let a = self.agent(name);
        if self.insecure {
            reqwest::blocking::Client::new()
                .request(method, format!("http://{}{path}", a.admin))
                .header("authorization", self.tokens.agent_bearer())
        } else {
            self.tokens
                .http(hawser_tls::Peer::Node(name.into()))
                .request(method, format!("https://{}{path}", a.admin))
        }
    }

    /// An HTTP client for the controllers' API (send the admin token with it). Calls time
    /// out after 5 s: a controller that still leads but cannot reach its store holds a call
    /// for its store retries (20 s), and a probe must not wait that out.
    pub fn controller_http(&self) -> reqwest::blocking::Client {
        let timeout = Duration::from_secs(5);
        if self.insecure {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .build()
                .expect("HTTP client")
        } else {
            self.tokens
                .http_within(hawser_tls::Peer::Controller, timeout)
        }
    }

    /// The data file of replica `id`, wherever it lives.
    /// Where replica `id`'s data file is, as the agent holding it says (agents that do not
    /// answer, killed ones, are skipped).
    pub fn replica_path(&self, id: &str) -> PathBuf {
        for a in &self.agents {
            let status: Option<AgentStatus> = self
                .agent_request(reqwest::Method::GET, &a.name, "/v1/status")
                .send()
                .and_then(|r| r.json())
                .ok();
            for r in status.map(|s| s.replicas).unwrap_or_default() {
                if r.replica_id == id {
                    return PathBuf::from(r.data_path);
                }
            }
        }
        panic!("replica {id} not found on any agent");
    }

    /// Whether the agent process is still running.
    pub fn agent_alive(&mut self, name: &str) -> bool {
        let a = self
            .agents
            .iter_mut()
            .find(|a| a.name == name)
            .expect("agent");
        matches!(a.child.try_wait(), Ok(None))
    }

    /// What a refused request must not change, one line each: every volume's node, epoch
    /// and replicas with their states, and every node's state.
    pub fn state_summary(&self) -> String {
        let mut out = String::new();
        for v in self.volumes() {
            let replicas: Vec<String> = v
                .replicas
                .iter()
                .map(|r| format!("{}@{}:{:?}", r.id, r.node, r.state))
                .collect();
            out.push_str(&format!(
                "{} on {:?} epoch {} {replicas:?}\n",
                v.name, v.attached_node, v.epoch
            ));
        }
        for n in self.nodes() {
            out.push_str(&format!("node {} {:?}\n", n.name, n.state));
        }
        out
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

/// Starts `hawser controller` named `name` on a free port, on the store `store_args` name
/// (`--store` and its flags) or, with none, its own embedded store.
fn spawn_controller(
    dir: &Path,
    name: &str,
    store_args: &[String],
    tokens: &TokenFiles,
    insecure: bool,
) -> ControllerProc {
    spawn_controller_on(dir, name, store_args, tokens, insecure, free_port())
}

fn spawn_controller_on(
    dir: &Path,
    name: &str,
    store_args: &[String],
    tokens: &TokenFiles,
    insecure: bool,
    port: u16,
) -> ControllerProc {
    let scheme = if insecure { "http" } else { "https" };
    let url = format!("{scheme}://127.0.0.1:{port}");
    let data_dir = dir.join(name);
    let mut cmd = Command::new(hawser_bin());
    cmd.args(["controller", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(&data_dir)
        .args(tokens.controller_args());
    if insecure {
        cmd.arg("--insecure");
    } else {
        tokens.install_ca(&data_dir);
    }
    let child = cmd
        .args(store_args)
        .stdout(Stdio::null())
        .stderr(log_file(dir, name))
        .spawn()
        .expect("start controller");
    ControllerProc {
        name: name.into(),
        url,
        child,
    }
}

/// The stdout of a CLI run that must have succeeded; panics with both streams otherwise.
pub(crate) fn cli_stdout(args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "hawser {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Wait until at least `n` of the nodes `nodes` lists are online.
pub(crate) fn wait_online(n: usize, nodes: impl Fn() -> Vec<Node>) {
    wait_until(
        &format!("{n} nodes online"),
        Duration::from_secs(30),
        || {
            nodes()
                .iter()
                .filter(|n| n.state == hawser_api::controller::NodeState::Online)
                .count()
                >= n
        },
    );
}

/// When node `name` last registered, as the controller says.
pub(crate) fn last_seen(nodes: &[Node], name: &str) -> Option<u64> {
    nodes
        .iter()
        .find(|n| n.name == name)
        .map(|n| n.last_seen_ms)
}

/// Wait until node `name` registers after `before` (its earlier `last_seen`).
pub(crate) fn wait_registered(name: &str, before: Option<u64>, nodes: impl Fn() -> Vec<Node>) {
    wait_until(
        &format!("{name} to register again"),
        Duration::from_secs(30),
        || {
            nodes()
                .iter()
                .any(|n| n.name == name && Some(n.last_seen_ms) > before)
        },
    );
}

/// Append-mode log file `<dir>/<name>.log` for a process's stderr (null if it cannot be made).
pub(crate) fn log_file(dir: &Path, name: &str) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .map(Stdio::from)
        .unwrap_or(Stdio::null())
}

/// Sends `sig` to a child we spawned and have not reaped.
pub(crate) fn signal(child: &Child, sig: libc::c_int) {
    // Only our own child, by its PID.
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) with a PID we spawned and have not reaped; no memory involved.
    unsafe { libc::kill(pid, sig) };
}

/// Stop a child we spawned: SIGTERM, then SIGKILL after 10 s; reaps it.
pub(crate) fn stop(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    // Only our own child, by its PID.
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) with a PID we spawned and have not reaped; no memory involved.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for a in &mut self.agents {
            // A paused agent would sit out SIGTERM's deadline.
            signal(&a.child, libc::SIGCONT);
            stop(&mut a.child);
        }
        for c in &mut self.controllers {
            stop(&mut c.child);
        }
        if let Some(mut e) = self.etcd.take() {
            e.kill();
        }
        drop(self.apiserver.take());
        if std::thread::panicking() {
            let names = self
                .controllers
                .iter()
                .map(|c| c.name.clone())
                .chain(self.agents.iter().map(|a| a.name.clone()));
            print_log_tails(self.dir.path(), names);
        }
    }
}

/// Print the last 30 lines of each `<dir>/<name>.log` to stderr (for a failing test).
pub(crate) fn print_log_tails(dir: &Path, names: impl IntoIterator<Item = String>) {
    for name in names {
        let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        eprintln!("--- last lines of {name}.log ---");
        for l in tail.iter().rev() {
            eprintln!("{l}");
        }
    }
}
