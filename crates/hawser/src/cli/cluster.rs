//! `hawser cluster show|recover`: the cluster's identity, the nodes refused as of another
//! cluster, and getting the volumes back after the store was lost.

use hawser_api::controller::{
    ClusterInfo, CreateJoinToken, JoinTokenCreated, RecoverCluster, RecoverReport, RotateToken,
    TokenRotated, VolumeKeyRotated,
};

use crate::cli::client::{CliError, Client};
use crate::cli::output::{print_json, Format, OutputArg, Table};

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// The cluster id, and the nodes refused because their replicas name another cluster
    /// (what a wiped or restored store looks like).
    Show {
        #[command(flatten)]
        out: OutputArg,
    },
    /// After the store was lost: adopt the waiting nodes' cluster (only into a store without
    /// volumes) and rebuild every volume the nodes' replicas hold but the store does not
    /// know, from the replicas' metadata and journals. Volumes come back detached.
    Recover {
        /// Seconds to wait for the adopted nodes to register again.
        #[arg(long, default_value_t = 30)]
        wait_secs: u64,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Make a join token for new nodes (a controller without --insecure): an agent given it with
    /// --join-token-file gets its node certificate at first start. Prints the token only.
    JoinToken {
        /// Seconds the token stays valid.
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
        /// How many nodes may join with it.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// Only a node of this name may join with it, and it may replace a node of that name
        /// that is still online (a reinstalled machine).
        #[arg(long, value_parser = crate::cli::args::parse_node_name)]
        node: Option<String>,
    },
    /// Replace the cluster's CA without a detach: trust a new CA beside the old one, reissue
    /// every certificate from it, retire the old one. Waits for the nodes before each step
    /// and updates this CLI's CA file. NBD client certificates of the old CA stop working at
    /// `retire`; nodes offline meanwhile rejoin with a join token.
    RotateCa(crate::cli::rotate_ca::RotateCaArgs),
    /// Replace the admin token with a new random one. The previous token keeps working for
    /// --grace-secs, while you hand the new one to the CLIs and CSI drivers that use it.
    RotateAdminToken {
        /// Seconds the previous token still works (0: not at all).
        #[arg(long, default_value_t = 3600)]
        grace_secs: u64,
        /// Write the new token to this file (mode 0600, replaced atomically) instead of
        /// printing it.
        #[arg(long, value_name = "PATH")]
        write: Option<std::path::PathBuf>,
    },
    /// Replace the agent token (what nodes join with when they are not given a join token,
    /// e.g. the Helm chart's Secret) with a new random one; joined nodes keep their
    /// certificates. The previous token still lets nodes join for --grace-secs. TLS clusters
    /// only.
    RotateAgentToken {
        /// Seconds the previous token still works (0: not at all).
        #[arg(long, default_value_t = 3600)]
        grace_secs: u64,
        /// Write the new token to this file (mode 0600, replaced atomically) instead of
        /// printing it.
        #[arg(long, value_name = "PATH")]
        write: Option<std::path::PathBuf>,
    },
    /// Make a new key-encryption key and re-wrap every encrypted volume's data key under it.
    /// The data is not re-encrypted and attached volumes keep running. Prints how many
    /// volumes each key-encryption key wraps afterwards: a key file (volume-keys/kek-<n>.key)
    /// that wraps none may be deleted.
    RotateVolumeKey {
        #[command(flatten)]
        out: OutputArg,
    },
    /// Replace the metrics token (the read-only credential Prometheus scrapes `/metrics` of
    /// the controllers and agents with) with a new random one. Agents take the new one with
    /// their next heartbeat; the previous one works for --grace-secs.
    RotateMetricsToken {
        /// Seconds the previous token still works (0: not at all).
        #[arg(long, default_value_t = 3600)]
        grace_secs: u64,
        /// Write the new token to this file (mode 0600, replaced atomically) instead of
        /// printing it.
        #[arg(long, value_name = "PATH")]
        write: Option<std::path::PathBuf>,
    },
}

/// Rotates the `kind` (admin, agent or metrics) token; prints the new one or writes it to `write`.
fn rotate(
    client: &Client,
    kind: &str,
    grace_secs: u64,
    write: Option<std::path::PathBuf>,
) -> Result<(), CliError> {
    let req = RotateToken {
        grace_secs: Some(grace_secs),
    };
    let r: TokenRotated = client.post(&format!("/v1/cluster/{kind}-token"), &req)?;
    match write {
        Some(path) => {
            write_private(&path, &r.token)?;
            eprintln!(
                "new {kind} token written to {}; the previous one works for {grace_secs} s",
                path.display()
            );
        }
        None => println!("{}", r.token),
    }
    Ok(())
}

pub fn run(
    client: &Client,
    cmd: ClusterCmd,
    ca_file: Option<&std::path::Path>,
) -> Result<(), CliError> {
    match cmd {
        ClusterCmd::Show { out } => {
            let c: ClusterInfo = client.get("/v1/cluster")?;
            match out.format {
                Format::Json => print_json(&c),
                Format::Table => {
                    println!("cluster {}", c.id);
                    if c.waiting.is_empty() {
                        println!("no node is waiting");
                    } else {
                        println!(
                            "nodes refused as of another cluster (run `hawser cluster recover` \
                             if this store was wiped or restored):"
                        );
                        let mut t = Table::new(&["NODE", "THEIR CLUSTER", "ADMIN"]);
                        for w in &c.waiting {
                            t.row(vec![
                                w.node.clone(),
                                w.cluster_id.clone(),
                                w.admin_addr.clone(),
                            ]);
                        }
                        t.print();
                    }
                }
            }
        }
        ClusterCmd::JoinToken {
            ttl_secs,
            uses,
            node,
        } => {
            let req = CreateJoinToken {
                ttl_secs: Some(ttl_secs),
                uses: Some(uses),
                node,
            };
            let t: JoinTokenCreated = client.post("/v1/join-tokens", &req)?;
            println!("{}", t.token);
        }
        ClusterCmd::RotateCa(args) => crate::cli::rotate_ca::run(client, args, ca_file)?,
        ClusterCmd::RotateAdminToken { grace_secs, write } => {
            rotate(client, "admin", grace_secs, write)?;
        }
        ClusterCmd::RotateAgentToken { grace_secs, write } => {
            rotate(client, "agent", grace_secs, write)?;
        }
        ClusterCmd::RotateMetricsToken { grace_secs, write } => {
            rotate(client, "metrics", grace_secs, write)?;
        }
        ClusterCmd::RotateVolumeKey { out } => {
            let r: VolumeKeyRotated =
                client.post("/v1/cluster/volume-key", &serde_json::json!({}))?;
            match out.format {
                Format::Json => print_json(&r),
                Format::Table => {
                    println!(
                        "key-encryption key {} made; {} data keys re-wrapped under it",
                        r.kek,
                        r.rewrapped.len()
                    );
                    let mut t = Table::new(&["KEY-ENCRYPTION KEY", "VOLUMES"]);
                    for (kek, n) in &r.wrapping {
                        t.row(vec![kek.to_string(), n.to_string()]);
                    }
                    t.print();
                    if !r.behind.is_empty() {
                        println!(
                            "{} replicas keep their copy under an older key (rotate again once \
                             their nodes are back; delete no older key until then):",
                            r.behind.len()
                        );
                        for why in &r.behind {
                            println!("  {why}");
                        }
                    }
                }
            }
        }
        ClusterCmd::Recover { wait_secs, out } => {
            let req = RecoverCluster {
                wait_secs: Some(wait_secs),
            };
            let r: RecoverReport = client.post("/v1/cluster/recover", &req)?;
            match out.format {
                Format::Json => print_json(&r),
                Format::Table => {
                    let how = if r.adopted { "adopted" } else { "kept" };
                    println!("cluster {} ({how})", r.cluster_id);
                    let mut t = Table::new(&["VOLUME", "SIZE", "EPOCH", "REPLICAS"]);
                    for v in &r.volumes {
                        let reps: Vec<String> = v
                            .replicas
                            .iter()
                            .map(|x| format!("{}@{}:{:?}", x.id, x.node, x.state))
                            .collect();
                        t.row(vec![
                            v.name.clone(),
                            hawser_api::format_size(v.size_bytes),
                            v.epoch.to_string(),
                            reps.join(" "),
                        ]);
                    }
                    t.print();
                    for s in &r.skipped {
                        println!("skipped: {s}");
                    }
                }
            }
        }
    }
    Ok(())
}

/// Writes `token` to `path` (mode 0600) through a temporary file and a rename, so a reader
/// never sees half a token.
/// Writes `text` to a new file of mode 0600 renamed over `path`.
pub(crate) fn write_private(path: &std::path::Path, token: &str) -> Result<(), CliError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let fail = |e: std::io::Error| CliError::Token(format!("write {}: {e}", path.display()));
    let tmp = path.with_extension("tmp-rotate");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(fail)?;
    writeln!(f, "{token}")
        .and_then(|()| f.sync_all())
        .map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}
