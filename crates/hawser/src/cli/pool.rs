//! `hawser pool list`: every node's storage pools and their space.

use hawser_api::controller::PoolInfo;
use hawser_api::format_size;

use crate::cli::client::{CliError, Client};
use crate::cli::output::{print_json, Format, OutputArg, Table};
use crate::cli::volume::snake;

#[derive(Debug, clap::Subcommand)]
pub enum PoolCmd {
    /// List pools with capacity, free and provisioned space, the thin limit (capacity times
    /// the overprovision ratio) and which replicas they take (kind: any, thin or thick).
    List {
        #[command(flatten)]
        out: OutputArg,
    },
}

pub fn run(client: &Client, cmd: PoolCmd) -> Result<(), CliError> {
    match cmd {
        PoolCmd::List { out } => {
            let pools: Vec<PoolInfo> = client.get("/v1/pools")?;
            match out.format {
                Format::Json => print_json(&pools),
                Format::Table => table(&pools).print(),
            }
        }
    }
    Ok(())
}

fn table(pools: &[PoolInfo]) -> Table {
    let mut t = Table::new(&[
        "NODE",
        "POOL",
        "CAPACITY",
        "FREE",
        "PROVISIONED",
        "THIN-LIMIT",
        "KIND",
        "REPLICAS",
        "SNAPSHOTS",
        "PATH",
    ]);
    for p in pools {
        t.row(vec![
            p.node.clone(),
            p.name.clone(),
            format_size(p.capacity_bytes),
            format_size(p.free_bytes),
            format_size(p.provisioned_bytes),
            thin_limit(p),
            snake(&p.kind),
            p.replicas.to_string(),
            snapshots(p),
            p.path.clone(),
        ]);
    }
    t
}

/// "3 (1.2 GiB)": snapshot copies and the space their files occupy.
fn snapshots(p: &PoolInfo) -> String {
    match p.snapshots {
        0 => "0".to_string(),
        n => format!("{n} ({})", format_size(p.snapshot_bytes)),
    }
}

/// "150 GiB (1.5x)": how much may be provisioned, and the ratio it comes from.
pub fn thin_limit(p: &PoolInfo) -> String {
    format!(
        "{} ({}x)",
        format_size(p.overprovision_limit()),
        p.overprovision_ratio
    )
}
