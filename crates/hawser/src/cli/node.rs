//! `hawser node list|show|evacuate|restore`: the nodes registered with the controller, their
//! labels and pools; moving every replica off a node and letting it take replicas again.

use hawser_api::controller::{Labels, Node, PoolInfo};
use hawser_api::format_size;

use crate::cli::args::parse_node_name;
use crate::cli::client::{CliError, Client};
use crate::cli::output::{ago, now_ms, or_dash, print_json, Format, OutputArg, Table};
use crate::cli::pool::thin_limit;
use crate::cli::volume::snake;

#[derive(Debug, clap::Subcommand)]
pub enum NodeCmd {
    /// List nodes, their addresses, labels and whether they are online.
    List {
        #[command(flatten)]
        out: OutputArg,
    },
    /// Show a node, its labels and its pools.
    Show {
        #[arg(value_parser = parse_node_name)]
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Move every replica off a node (each is added elsewhere and synced before it is
    /// removed, so redundancy never drops); the node takes no new replicas until restored.
    Evacuate {
        #[arg(value_parser = parse_node_name)]
        name: String,
    },
    /// Let an evacuated node take replicas again.
    Restore {
        #[arg(value_parser = parse_node_name)]
        name: String,
    },
}

pub fn run(client: &Client, cmd: NodeCmd) -> Result<(), CliError> {
    match cmd {
        NodeCmd::List { out } => {
            let nodes: Vec<Node> = client.get("/v1/nodes")?;
            match out.format {
                Format::Json => print_json(&nodes),
                Format::Table => table(&nodes).print(),
            }
        }
        NodeCmd::Show { name, out } => {
            let node: Node = client.get(&format!("/v1/nodes/{name}"))?;
            match out.format {
                Format::Json => print_json(&node),
                Format::Table => {
                    let pools: Vec<PoolInfo> = client.get("/v1/pools")?;
                    let pools: Vec<PoolInfo> =
                        pools.into_iter().filter(|p| p.node == node.name).collect();
                    print!("{}", details(&node, &pools));
                }
            }
        }
        NodeCmd::Evacuate { name } => {
            let _: Node = client.post(&format!("/v1/nodes/{name}/evacuate"), &())?;
            println!(
                "node {name} is evacuating: its replicas move to other nodes (watch `hawser \
                 volume list`); `hawser node restore {name}` lets it take replicas again"
            );
        }
        NodeCmd::Restore { name } => {
            let _: Node = client.post(&format!("/v1/nodes/{name}/restore"), &())?;
            println!("node {name} takes replicas again");
        }
    }
    Ok(())
}

fn table(nodes: &[Node]) -> Table {
    let now = now_ms();
    let mut t = Table::new(&[
        "NAME",
        "STATE",
        "ADMIN",
        "REPLICA",
        "NBD",
        "LAST-SEEN",
        "LABELS",
    ]);
    for n in nodes {
        t.row(vec![
            n.name.clone(),
            state(n),
            n.admin_addr.clone(),
            n.replica_addr.clone(),
            or_dash(n.nbd_addr.as_deref()),
            format!("{} ago", ago(n.last_seen_ms, now)),
            labels(&n.labels),
        ]);
    }
    t
}

/// "online", "offline", or either with ",evacuating".
fn state(n: &Node) -> String {
    let s = snake(&n.state);
    if n.evacuating {
        format!("{s},evacuating")
    } else {
        s
    }
}

/// "rack=r1,zone=a", or "-".
fn labels(l: &Labels) -> String {
    if l.is_empty() {
        return "-".into();
    }
    let pairs: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

fn details(n: &Node, pools: &[PoolInfo]) -> String {
    let mut s = String::new();
    let mut line = |k: &str, val: String| s.push_str(&format!("{k:<11}{val}\n"));
    line("Name:", n.name.clone());
    line("State:", state(n));
    line("Labels:", labels(&n.labels));
    line("Admin:", n.admin_addr.clone());
    line("Replica:", n.replica_addr.clone());
    line("NBD:", or_dash(n.nbd_addr.as_deref()));
    line("NBD unix:", or_dash(n.nbd_socket.as_deref()));
    line(
        "Last seen:",
        format!("{} ago", ago(n.last_seen_ms, now_ms())),
    );
    line("Pools:", pools.len().to_string());
    let mut t = Table::new(&[
        "  POOL",
        "KIND",
        "CAPACITY",
        "FREE",
        "PROVISIONED",
        "THIN-LIMIT",
        "REPLICAS",
    ]);
    for p in pools {
        t.row(vec![
            format!("  {}", p.name),
            snake(&p.kind),
            format_size(p.capacity_bytes),
            format_size(p.free_bytes),
            format_size(p.provisioned_bytes),
            thin_limit(p),
            p.replicas.to_string(),
        ]);
    }
    s.push_str(&t.render());
    s
}
