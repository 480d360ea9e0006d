//! `hawser replica list|show`: every replica with its volume, node, pool and state, including
//! retired ones (replaced or moved off a node, deleted when their node answers).

use hawser_api::controller::{OrphanReplica, ReplicaInfo};

use crate::cli::args::{parse_node_name, parse_volume_name};
use crate::cli::client::{CliError, Client};
use crate::cli::output::{print_json, Format, OutputArg, Table};
use crate::cli::volume::snake;

#[derive(Debug, clap::Subcommand)]
pub enum ReplicaCmd {
    /// List replicas, optionally of one volume or on one node.
    List {
        /// Only this volume's replicas.
        #[arg(long, value_parser = parse_volume_name)]
        volume: Option<String>,
        /// Only replicas on this node.
        #[arg(long, value_parser = parse_node_name)]
        node: Option<String>,
        /// List the orphans in the nodes' pool trash instead (replicas no volume named,
        /// moved there rather than deleted, and purged after the agents' grace period).
        #[arg(long)]
        orphans: bool,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Show one replica.
    Show {
        id: String,
        #[command(flatten)]
        out: OutputArg,
    },
}

pub fn run(client: &Client, cmd: ReplicaCmd) -> Result<(), CliError> {
    match cmd {
        ReplicaCmd::List {
            volume,
            node,
            orphans: true,
            out,
        } => {
            let all: Vec<OrphanReplica> = client.get("/v1/trash")?;
            let shown: Vec<OrphanReplica> = all
                .into_iter()
                .filter(|r| volume.as_ref().is_none_or(|v| *v == r.replica.volume))
                .filter(|r| node.as_ref().is_none_or(|n| *n == r.node))
                .collect();
            match out.format {
                Format::Json => print_json(&shown),
                Format::Table => orphan_table(&shown).print(),
            }
        }
        ReplicaCmd::List {
            volume, node, out, ..
        } => {
            let all: Vec<ReplicaInfo> = client.get("/v1/replicas")?;
            let shown: Vec<ReplicaInfo> = all
                .into_iter()
                .filter(|r| volume.as_ref().is_none_or(|v| *v == r.volume))
                .filter(|r| node.as_ref().is_none_or(|n| *n == r.replica.node))
                .collect();
            match out.format {
                Format::Json => print_json(&shown),
                Format::Table => table(&shown).print(),
            }
        }
        ReplicaCmd::Show { id, out } => {
            // Replica ids are `{volume}-r{n}-{hex}`: path-safe, but encode anyway.
            let r: ReplicaInfo = client.get(&format!("/v1/replicas/{}", urlencode(&id)))?;
            match out.format {
                Format::Json => print_json(&r),
                Format::Table => table(std::slice::from_ref(&r)).print(),
            }
        }
    }
    Ok(())
}

fn orphan_table(orphans: &[OrphanReplica]) -> Table {
    let mut t = Table::new(&["ID", "VOLUME", "NODE", "POOL", "SIZE", "TRASHED-AT"]);
    for o in orphans {
        let r = &o.replica;
        t.row(vec![
            r.replica_id.clone(),
            r.volume.clone(),
            o.node.clone(),
            r.pool.clone(),
            hawser_api::format_size(r.bytes),
            format!("unix {}", r.trashed_at_secs),
        ]);
    }
    t
}

fn table(replicas: &[ReplicaInfo]) -> Table {
    let mut t = Table::new(&["ID", "VOLUME", "NODE", "POOL", "STATE"]);
    for r in replicas {
        t.row(vec![
            r.replica.id.clone(),
            r.volume.clone(),
            r.replica.node.clone(),
            r.replica.pool.clone(),
            state(r),
        ]);
    }
    t
}

/// "in_sync", "outdated (new)", "retired", ...
fn state(r: &ReplicaInfo) -> String {
    if r.retired {
        return "retired (deleted when its node answers)".into();
    }
    let s = snake(&r.replica.state);
    if r.replica.blank {
        format!("{s} (new, first sync)")
    } else {
        s
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
