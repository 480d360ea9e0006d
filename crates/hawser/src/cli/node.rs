//! `hawser node list`: the nodes registered with the controller.

use hawser_api::controller::Node;

use crate::cli::client::{CliError, Client};
use crate::cli::output::{ago, or_dash, print_json, Format, OutputArg, Table};
use crate::cli::volume::snake;

#[derive(Debug, clap::Subcommand)]
pub enum NodeCmd {
    /// List nodes, their addresses and whether they are online.
    List {
        #[command(flatten)]
        out: OutputArg,
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
    }
    Ok(())
}

fn table(nodes: &[Node]) -> Table {
    let now = now_ms();
    let mut t = Table::new(&["NAME", "STATE", "ADMIN", "REPLICA", "NBD", "LAST-SEEN"]);
    for n in nodes {
        t.row(vec![
            n.name.clone(),
            snake(&n.state),
            n.admin_addr.clone(),
            n.replica_addr.clone(),
            or_dash(n.nbd_addr.as_deref()),
            format!("{} ago", ago(n.last_seen_ms, now)),
        ]);
    }
    t
}

fn now_ms() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
