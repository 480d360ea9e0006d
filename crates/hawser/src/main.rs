//! The `hawser` binary: the daemons (`controller`, `agent`, `csi`), the client commands (`volume`,
//! `node`, `pool`, `replica`, `status`) and `bench`, in one executable.
//!
//! Exit codes: 0 success, 1 the operation failed (the controller refused it or could not be
//! reached), 2 bad command line (clap's usage errors, including invalid sizes and names, which
//! are checked before any request is sent).

mod cli;

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::cli::client::Client;
use crate::cli::output::OutputArg;
use crate::cli::{backup, cluster, device, events, node, pool, replica, snapshot, status, volume};

/// Marks the bytes of [`BUILD_NOTE`] in the executable; what follows it is the note.
const NOTE_MARKER: &[u8] = b"@@hawser-build-note@@";

/// What `--version` says after the version: nothing in a build, a note in a copy of the
/// executable that `scripts/build-note.sh` wrote one into (these bytes, after the marker).
/// The upgrade test (e2e kernel_devices) replaces a running agent with such a copy, a second
/// executable that says it is one, without compiling the crate a second time.
#[used]
static BUILD_NOTE: [u8; 64] = {
    let mut b = [0u8; 64];
    let mut i = 0;
    while i < NOTE_MARKER.len() {
        b[i] = NOTE_MARKER[i];
        i += 1;
    }
    b
};

/// The version, with the build note if the executable carries one.
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        // Read through black_box: the bytes are a constant to the compiler, not to the script.
        let note = &std::hint::black_box(&BUILD_NOTE)[NOTE_MARKER.len()..];
        let note = note.split(|b| *b == 0).next().unwrap_or_default();
        match std::str::from_utf8(note) {
            Ok(n) if !n.is_empty() => format!("{} ({n})", env!("CARGO_PKG_VERSION")),
            _ => env!("CARGO_PKG_VERSION").to_string(),
        }
    })
}

#[derive(Debug, Parser)]
#[command(
    name = "hawser",
    version = version(),
    about = "Replicated block storage for Kubernetes"
)]
struct Cli {
    /// Controller URL for the client commands; several, comma-separated, when controllers
    /// share etcd (the leader is found and followed).
    #[arg(long, env = "HAWSER_CONTROLLER", default_value = hawser_api::DEFAULT_CONTROLLER_URL)]
    controller: String,
    /// File with the admin API token for the client commands [default: $HAWSER_TOKEN, else
    /// ~/.config/hawser/admin.token]. The controller writes it to <data-dir>/admin.token at
    /// cluster init.
    #[arg(long, env = "HAWSER_TOKEN_FILE", value_name = "PATH", global = true)]
    token_file: Option<std::path::PathBuf>,
    /// The cluster's CA certificate, to check an https:// controller [default:
    /// ~/.config/hawser/ca.pem when it exists]. The controller writes it to <data-dir>/ca.pem.
    /// The agent takes it to join with the agent token instead of a join token.
    #[arg(long, env = "HAWSER_CA_FILE", value_name = "PATH", global = true)]
    ca_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller (cluster state, placement, REST API).
    Controller(hawser_controller::ControllerArgs),
    /// Run the node agent (pools, replicas, engines, NBD).
    Agent(hawser_agent::AgentArgs),
    /// Run the CSI driver (Identity, Controller and Node services) for Kubernetes.
    Csi(hawser_csi::CsiArgs),
    /// Run the standard fio comparison of block targets.
    Bench(hawser_bench::BenchArgs),
    /// Manage volumes.
    #[command(subcommand)]
    Volume(volume::VolumeCmd),
    /// Cluster health: nodes down, degraded volumes, resyncs with progress and ETA.
    Status {
        #[command(flatten)]
        out: OutputArg,
    },
    /// What happened lately: outdates, resyncs, failovers, replicas replaced, nodes silent
    /// or back (the leader's memory, newest first).
    Events(events::EventsArgs),
    /// Take, list and delete crash-consistent snapshots of volumes.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCmd),
    /// Back volumes up off the cluster, to S3 or a directory (docs/backup.md).
    #[command(subcommand)]
    Backup(backup::BackupCmd),
    /// Inspect, evacuate and restore nodes.
    #[command(subcommand)]
    Node(node::NodeCmd),
    /// Inspect storage pools.
    #[command(subcommand)]
    Pool(pool::PoolCmd),
    /// Inspect replicas.
    #[command(subcommand)]
    Replica(replica::ReplicaCmd),
    /// The cluster's identity; recover the volumes after the store was lost.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// On a node: kernel block devices (/dev/nbdN) of volumes attached there, served by the
    /// agent so that they outlive its restarts.
    #[command(subcommand)]
    Device(device::DeviceCmd),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let daemon = matches!(
        cli.command,
        Command::Controller(_) | Command::Agent(_) | Command::Csi(_)
    );
    init_logging(if daemon { "info" } else { "warn" });
    let conn = Conn {
        url: cli.controller,
        token_file: cli.token_file,
        ca_file: cli.ca_file,
    };
    match cli.command {
        Command::Controller(args) => daemon_exit(run_async(hawser_controller::run(args))),
        Command::Agent(mut args) => {
            args.ca_file = conn.ca_file.clone();
            daemon_exit(run_async(hawser_agent::run(args)))
        }
        Command::Bench(args) => daemon_exit(hawser_bench::run(args)),
        Command::Csi(args) => daemon_exit(run_csi(args, &conn)),
        Command::Volume(cmd) => client_exit(&conn, |c| volume::run(c, cmd)),
        Command::Node(cmd) => client_exit(&conn, |c| node::run(c, cmd)),
        Command::Pool(cmd) => client_exit(&conn, |c| pool::run(c, cmd)),
        Command::Replica(cmd) => client_exit(&conn, |c| replica::run(c, cmd)),
        Command::Cluster(cmd) => {
            let ca = cli::token::resolve_ca_path(conn.ca_file.as_deref());
            client_exit(&conn, |c| cluster::run(c, cmd, ca.as_deref()))
        }
        Command::Status { out } => client_exit(&conn, |c| status::run(c, out)),
        Command::Events(args) => client_exit(&conn, |c| events::run(c, args)),
        Command::Snapshot(cmd) => client_exit(&conn, |c| snapshot::run(c, cmd)),
        Command::Backup(cmd) => client_exit(&conn, |c| backup::run(c, cmd)),
        Command::Device(cmd) => daemon_exit(device::run(cmd)),
    }
}

/// `hawser csi`: the controller client is made (and dropped) outside the async runtime, as
/// the blocking HTTP client requires.
fn run_csi(args: hawser_csi::CsiArgs, conn: &Conn) -> anyhow::Result<()> {
    let client = match &args.node_identity_dir {
        Some(dir) => {
            anyhow::ensure!(
                args.mode == hawser_csi::Mode::Node,
                "--node-identity-dir is for --mode=node: the controller service needs the \
                 admin token"
            );
            // The agent beside this plugin writes it when it joins.
            wait_for_file(&dir.join("node.pem"), std::time::Duration::from_secs(600))?;
            Client::with_node_identity(&conn.url, dir)?
        }
        None => {
            if let Some(ca) = &conn.ca_file {
                wait_for_file(ca, std::time::Duration::from_secs(600))?;
            }
            conn.client()?
        }
    };
    let client = std::sync::Arc::new(client);
    let result = run_async(hawser_csi::run(args, client.clone()));
    drop(client);
    result
}

/// Waits (bounded) for a file another process writes at its start: the cluster CA's
/// certificate, which the controller beside the CSI controller writes once it has it, or
/// the node certificate the agent beside the CSI node plugin gets when it joins.
fn wait_for_file(path: &std::path::Path, limit: std::time::Duration) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let mut said = false;
    while !path.exists() {
        anyhow::ensure!(
            start.elapsed() < limit,
            "{} did not appear within {limit:?}",
            path.display()
        );
        if !said {
            tracing::info!(path = %path.display(), "waiting for a file another process writes at its start");
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    Ok(())
}

/// Logs go to stderr; `RUST_LOG` overrides the default level.
fn init_logging(default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn run_async(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("start the async runtime")?;
    rt.block_on(fut)
}

fn daemon_exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How client commands reach the controller.
struct Conn {
    url: String,
    token_file: Option<std::path::PathBuf>,
    ca_file: Option<std::path::PathBuf>,
}

impl Conn {
    fn client(&self) -> Result<Client, cli::client::CliError> {
        let token = cli::token::resolve(self.token_file.as_deref())?;
        let ca = cli::token::resolve_ca_path(self.ca_file.as_deref());
        Client::with_ca_file(&self.url, &token, ca.as_deref())
    }
}

/// A client command prints tables and JSON: when its stdout is a pipe whose reader is gone
/// (`hawser volume list | head -1`, `grep -q`), it ends at once, killed by SIGPIPE as Unix
/// tools are, rather than panicking in `println!`. Only client commands: the daemons keep
/// Rust's default (SIGPIPE ignored), and sockets are written with MSG_NOSIGNAL anyway.
fn quiet_on_closed_stdout() {
    // SAFETY: signal(2) with the default action, from the main thread before the command
    // starts any other; no handler of ours is replaced.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Runs a client command against the controller(s) `conn` names.
fn client_exit(
    conn: &Conn,
    f: impl FnOnce(&Client) -> Result<(), cli::client::CliError>,
) -> ExitCode {
    quiet_on_closed_stdout();
    match conn.client().and_then(|c| f(&c)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
