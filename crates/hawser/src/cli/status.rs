//! `hawser status`: the cluster's health at a glance: nodes down or evacuating, degraded
//! volumes, and resyncs under way with their progress and time left.

use hawser_api::controller::ClusterStatus;
use hawser_api::format_size;

use crate::cli::client::{CliError, Client};
use crate::cli::output::{print_json, Format, OutputArg, Table};
use crate::cli::volume::snake;

pub fn run(client: &Client, out: OutputArg) -> Result<(), CliError> {
    let s: ClusterStatus = client.get("/v1/status")?;
    match out.format {
        Format::Json => print_json(&s),
        Format::Table => print!("{}", render(&s)),
    }
    Ok(())
}

fn render(s: &ClusterStatus) -> String {
    let mut out = String::new();
    let healthy = s.nodes_offline.is_empty() && s.degraded.is_empty() && s.resyncs.is_empty();
    out.push_str(&format!(
        "Health:     {}\n",
        if healthy { "ok" } else { "degraded" }
    ));
    out.push_str(&format!(
        "Nodes:      {} ({} offline{})\n",
        s.nodes,
        s.nodes_offline.len(),
        list(&s.nodes_offline)
    ));
    if !s.nodes_evacuating.is_empty() {
        out.push_str(&format!("Evacuating: {}\n", s.nodes_evacuating.join(", ")));
    }
    out.push_str(&format!(
        "Volumes:    {} ({} degraded)\n",
        s.volumes,
        s.degraded.len()
    ));
    if !s.degraded.is_empty() {
        let mut t = Table::new(&["  DEGRADED", "STATE", "IN-SYNC", "LAGGING"]);
        for d in &s.degraded {
            t.row(vec![
                format!("  {}", d.name),
                snake(&d.state),
                format!("{}/{}", d.in_sync, d.replica_count),
                d.lagging.join("; "),
            ]);
        }
        out.push_str(&t.render());
    }
    if !s.resyncs.is_empty() {
        let mut t = Table::new(&[
            "  RESYNC", "REPLICA", "NODE", "STATE", "COPIED", "LEFT", "RATE", "ETA",
        ]);
        for r in &s.resyncs {
            t.row(vec![
                format!("  {}", r.volume),
                format!("{}{}", r.replica, if r.blank { " (new)" } else { "" }),
                r.node.clone(),
                r.state.clone(),
                format_size(r.copied_bytes),
                format_size(r.remaining_bytes),
                format!("{}/s", format_size(r.bytes_per_sec)),
                r.eta_secs.map_or("-".into(), |s| format!("{s}s")),
            ]);
        }
        out.push_str(&t.render());
    }
    if !s.scrubs.is_empty() {
        let mut t = Table::new(&["  SCRUB", "NODE", "PROGRESS"]);
        for r in &s.scrubs {
            t.row(vec![
                format!("  {}", r.volume),
                r.node.clone(),
                crate::cli::volume::scrub_line(&r.scrub),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!(": {}", names.join(", "))
    }
}
