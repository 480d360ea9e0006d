//! A multi-host Hawser cluster for fault tests: a controller and N agents, each in its own
//! network namespace, joined by a bridge (see `topology`). Faults are real: `kill9` sends
//! SIGKILL to the agent process, `partition` drops every packet but loopback in a host's
//! namespace with iptables (INPUT and OUTPUT), `heal` removes those rules.
//!
//! Layout: the switch namespace `…-sw` holds bridge `br0`; the controller runs in `…-ctl` at
//! `10.77.X.2:9400`; host `nI` runs in `…-nI` at `10.77.X.(10+I)`, with the agent's admin API on
//! port 9500, replica server on 9600 and NBD/TCP on 10809 of that address (each namespace has
//! its own ports, so they are fixed). Every process starts as `ip netns exec NS hawser ...`;
//! `ip netns exec` execs in place, and `spawn_in` checks that the PID held is the hawser
//! process itself, so `kill9` hits the agent and not a wrapper.
//!
//! How the test process reaches things: the CLI runs inside the controller's namespace
//! (`ip netns exec …-ctl hawser …`), so no address of the root namespace is ever used. NBD
//! clients (the verifying writer, fio with `nbd+unix://`) connect from the root namespace to
//! the agent's unix socket `<data-dir>/nbd.sock`: unix sockets are files, not network
//! addresses, so they work across network namespaces (and are unaffected by partitions).
//!
//! Cleanup: dropping the cluster SIGKILLs every process it started (by PID), deletes its
//! namespaces and removes its directory. The first cluster of a test process also removes the
//! namespaces and directories left by earlier runs that crashed (their pid is gone).

mod topology;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::Duration;

use hawser_api::controller::{Node, Replica, ReplicaState, Volume};

use crate::cluster::{
    cli_stdout, hawser_bin, last_seen, log_file, print_log_tails, stop, wait_online,
    wait_registered,
};
use crate::run::{run_ok, test_base_dir, wait_until, TempDir};
use crate::tokens::TokenFiles;
use topology::{owner_gone, remove_leftover_namespaces, run_prefix, Topology};

const CONTROLLER_PORT: u16 = 9400;
const ADMIN_PORT: u16 = 9500;
const REPLICA_PORT: u16 = 9600;
const CONTROLLER_OCTET: u8 = 2;
const FIRST_HOST_OCTET: u8 = 10;
/// How long `ip netns exec` may take to become the hawser process.
const EXEC_TIMEOUT: Duration = Duration::from_secs(10);
/// iptables rules of a partition: everything but loopback, both directions.
const PARTITION_RULES: [[&str; 4]; 2] = [["INPUT", "!", "-i", "lo"], ["OUTPUT", "!", "-o", "lo"]];

static CLUSTERS: AtomicU32 = AtomicU32::new(0);
static LEFTOVERS: Once = Once::new();

/// One agent host: a namespace, an address, a data directory and (while running) the agent.
pub struct NetHost {
    /// Node name, `n1`, `n2`, ...
    pub name: String,
    pub netns: String,
    pub addr: String,
    pub data_dir: PathBuf,
    agent: Option<Child>,
    partitioned: bool,
}

impl NetHost {
    /// The agent's NBD unix socket (reachable from the root namespace).
    pub fn nbd_socket(&self) -> PathBuf {
        self.data_dir.join("nbd.sock")
    }
}

pub struct NetCluster {
    pub dir: TempDir,
    /// Controller URL, valid inside the cluster's namespaces only.
    pub url: String,
    ctl_ns: String,
    controller: Option<Child>,
    pub hosts: Vec<NetHost>,
    bin: PathBuf,
    topology: Topology,
    /// The cluster's token files (controller, agents and CLI).
    pub tokens: TokenFiles,
}

impl NetCluster {
    /// Why these tests cannot run here (not root, no `ip netns`, no iptables), if they cannot.
    pub fn unavailable() -> Option<String> {
        topology::unavailable()
    }

    /// For a test's first line: true (after printing SKIP) when network-namespace tests cannot
    /// run here; panics instead when `HAWSER_REQUIRE_NETNS` is set, so CI cannot skip them.
    pub fn skip() -> bool {
        let Some(why) = Self::unavailable() else {
            return false;
        };
        assert!(
            std::env::var_os("HAWSER_REQUIRE_NETNS").is_none(),
            "HAWSER_REQUIRE_NETNS is set but network-namespace tests cannot run: {why}"
        );
        eprintln!("SKIP: {why}");
        true
    }

    /// Start a controller and `hosts` agents, each in its own namespace; waits until all
    /// agents are online.
    pub fn start(label: &str, hosts: usize) -> NetCluster {
        Self::start_with(label, hosts, &[])
    }

    /// As [`NetCluster::start`], with extra arguments for `hawser controller`.
    pub fn start_with(label: &str, hosts: usize, controller_args: &[&str]) -> NetCluster {
        LEFTOVERS.call_once(remove_leftovers);
        let k = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let mut topology = Topology::create(k);
        let dir = test_base_dir().join(format!(
            "{}{}-{k}-{label}",
            run_prefix(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create test dir");
        let ctl_ns = topology.add("ctl", CONTROLLER_OCTET);
        let ctl_addr = topology.addr(CONTROLLER_OCTET);
        let bin = std::fs::canonicalize(hawser_bin()).expect("canonical hawser path");
        let tokens = TokenFiles::seed(&dir);
        let mut c = NetCluster {
            tokens,
            dir: TempDir(dir),
            url: format!("https://{ctl_addr}:{CONTROLLER_PORT}"),
            ctl_ns,
            controller: None,
            hosts: Vec::new(),
            bin,
            topology,
        };
        let listen = format!("{ctl_addr}:{CONTROLLER_PORT}");
        let data_dir = c.dir.path().join("controller");
        c.tokens.install_ca(&data_dir);
        let data = data_dir.display().to_string();
        let mut args = vec!["controller", "--listen", &listen, "--data-dir", &data];
        let token_args = c.tokens.controller_args();
        args.extend(token_args.iter().map(String::as_str));
        args.extend_from_slice(controller_args);
        c.controller = Some(c.spawn_in(&c.ctl_ns, "controller", &args));
        wait_until("the controller to serve", Duration::from_secs(30), || {
            c.cli(&["node", "list"]).status.success()
        });
        let join = c.cli_ok(&["cluster", "join-token", "--uses", "100"]);
        std::fs::write(&c.tokens.join, join.trim()).expect("write the join token");
        for i in 1..=hosts {
            let octet = FIRST_HOST_OCTET + u8::try_from(i).expect("at most 200 hosts");
            let name = format!("n{i}");
            let netns = c.topology.add(&name, octet);
            c.hosts.push(NetHost {
                data_dir: c.dir.path().join(&name),
                addr: c.topology.addr(octet),
                name,
                netns,
                agent: None,
                partitioned: false,
            });
            c.launch_agent(i - 1);
        }
        wait_online(hosts, || c.nodes());
        c
    }

    /// Run `hawser ARGS` inside namespace `ns`, stderr to `<dir>/<log>.log`. Returns once the
    /// child PID is the hawser process itself (`ip netns exec` has exec'd).
    fn spawn_in(&self, ns: &str, log: &str, args: &[&str]) -> Child {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&self.bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(self.dir.path(), log))
            .spawn()
            .expect("spawn ip netns exec");
        let exe = PathBuf::from(format!("/proc/{}/exe", child.id()));
        wait_until(&format!("{log} to exec in {ns}"), EXEC_TIMEOUT, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{log} exited at start ({status}):\n{}", self.log(log));
            }
            std::fs::read_link(&exe).is_ok_and(|p| p == self.bin)
        });
        child
    }

    fn launch_agent(&mut self, i: usize) {
        let h = &self.hosts[i];
        let admin = format!("{}:{ADMIN_PORT}", h.addr);
        let replica = format!("{}:{REPLICA_PORT}", h.addr);
        let data = h.data_dir.display().to_string();
        let join = self.tokens.join.display().to_string();
        let args = [
            "agent",
            "--node",
            &h.name,
            "--controller",
            &self.url,
            "--admin-listen",
            &admin,
            "--replica-listen",
            &replica,
            "--nbd-listen",
            "none",
            "--data-dir",
            &data,
            "--join-token-file",
            &join,
        ];
        let child = self.spawn_in(&h.netns, &h.name, &args);
        self.hosts[i].agent = Some(child);
    }

    fn index(&self, host: &str) -> usize {
        self.hosts
            .iter()
            .position(|h| h.name == host)
            .unwrap_or_else(|| panic!("no host {host}"))
    }

    pub fn host(&self, host: &str) -> &NetHost {
        &self.hosts[self.index(host)]
    }

    /// SIGKILL the agent of `host` (its PID is the hawser process) and reap it.
    pub fn kill9(&mut self, host: &str) {
        let i = self.index(host);
        let mut child = self.hosts[i].agent.take().expect("agent running");
        kill9(&mut child);
    }

    /// Whether the agent of `host` is running.
    pub fn agent_alive(&mut self, host: &str) -> bool {
        let i = self.index(host);
        let agent = self.hosts[i].agent.as_mut();
        agent.is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Start the agent of `host` again with the same data directory and addresses (stopping it
    /// first with SIGTERM if it still runs). Unless the host is partitioned, waits until it
    /// has registered with the controller again.
    pub fn restart_agent(&mut self, host: &str) {
        let i = self.index(host);
        if let Some(mut child) = self.hosts[i].agent.take() {
            stop(&mut child);
        }
        let before = last_seen(&self.nodes(), host);
        self.launch_agent(i);
        if !self.hosts[i].partitioned {
            wait_registered(host, before, || self.nodes());
        }
    }

    /// Drop every packet in and out of `host`'s namespace except on loopback.
    pub fn partition(&mut self, host: &str) {
        let i = self.index(host);
        assert!(!self.hosts[i].partitioned, "{host} is already partitioned");
        self.iptables(i, "-I");
        self.hosts[i].partitioned = true;
    }

    /// Undo `partition`.
    pub fn heal(&mut self, host: &str) {
        let i = self.index(host);
        assert!(self.hosts[i].partitioned, "{host} is not partitioned");
        self.iptables(i, "-D");
        self.hosts[i].partitioned = false;
    }

    fn iptables(&self, i: usize, op: &str) {
        let ns = self.hosts[i].netns.as_str();
        for [chain, not, dir, lo] in PARTITION_RULES {
            let args = [
                "netns", "exec", ns, "iptables", "-w", op, chain, not, dir, lo,
            ];
            run_ok("ip", &[&args[..], &["-j", "DROP"]].concat());
        }
    }

    /// Run the CLI against the controller, inside the controller's namespace.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ctl_ns])
            .arg(&self.bin)
            .env("HAWSER_CONTROLLER", &self.url)
            .env("HAWSER_TOKEN_FILE", &self.tokens.admin)
            .env("HAWSER_CA_FILE", &self.tokens.ca_file)
            .args(args)
            .output()
            .expect("run hawser in the controller namespace")
    }

    /// Run the CLI and require success; returns stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        cli_stdout(args, self.cli(args))
    }

    pub fn nodes(&self) -> Vec<Node> {
        let out = self.cli(&["node", "list", "-o", "json"]);
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }

    pub fn volume(&self, name: &str) -> Volume {
        let out = self.cli_ok(&["volume", "show", name, "-o", "json"]);
        serde_json::from_str(&out).expect("volume JSON")
    }

    /// The state the controller gives replica `id` of `volume`.
    pub fn replica_state(&self, volume: &str, id: &str) -> ReplicaState {
        let v = self.volume(volume);
        let r = v.replicas.iter().find(|r| r.id == id);
        r.unwrap_or_else(|| panic!("{volume} has no replica {id}: {v:?}"))
            .state
    }

    /// The data file of `replica`, found under its host's data directory.
    pub fn replica_file(&self, replica: &Replica) -> PathBuf {
        let h = self.host(&replica.node);
        self.find_replica_file(replica)
            .unwrap_or_else(|| panic!("no {}.data under {}", replica.id, h.data_dir.display()))
    }

    /// The data file of `replica` if it (still) exists on its host.
    pub fn find_replica_file(&self, replica: &Replica) -> Option<PathBuf> {
        let h = self.host(&replica.node);
        find_file(&h.data_dir, &format!("{}.data", replica.id))
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

fn kill9(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        // SAFETY: kill(2) on a PID this fixture spawned and has not reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    }
    let _ = child.wait();
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if let Some(found) = find_file(&p, name) {
                return Some(found);
            }
        }
    }
    None
}

/// Namespaces, then directories, of earlier runs of this pid namespace whose pid is gone.
fn remove_leftovers() {
    remove_leftover_namespaces();
    let prefix = run_prefix();
    let Ok(entries) = std::fs::read_dir(test_base_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && owner_gone(&name, &prefix) {
            eprintln!("removing leftover test directory {}", e.path().display());
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            if let Some(mut c) = h.agent.take() {
                kill9(&mut c);
            }
        }
        if let Some(mut c) = self.controller.take() {
            kill9(&mut c);
        }
        if std::thread::panicking() {
            let names = std::iter::once("controller".to_owned())
                .chain(self.hosts.iter().map(|h| h.name.clone()));
            print_log_tails(self.dir.path(), names);
        }
        // The namespaces go with `topology` and the directory with `dir`, dropped next.
    }
}
