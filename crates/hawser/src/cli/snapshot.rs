//! `hawser snapshot create|list|show|delete`: crash-consistent snapshots of volumes.

use hawser_api::controller::{CreateSnapshot, Snapshot};
use hawser_api::format_size;
use serde_json::json;

use crate::cli::args::{parse_snapshot_name, parse_volume_name};
use crate::cli::client::{CliError, Client};
use crate::cli::output::{ago, now_ms, print_json, Format, OutputArg, Table};
use crate::cli::volume::snake;

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCmd {
    /// Take a snapshot of a volume, attached or not: its data at one point between two
    /// acknowledged writes (writes are held for the moment it takes), on every replica in
    /// sync.
    Create {
        /// The snapshot's name, unique in the cluster.
        #[arg(value_parser = parse_snapshot_name)]
        name: String,
        #[arg(long, value_parser = parse_volume_name)]
        volume: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// List snapshots, of one volume with `--volume`.
    List {
        #[arg(long, value_parser = parse_volume_name)]
        volume: Option<String>,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Show one snapshot.
    Show {
        #[arg(value_parser = parse_snapshot_name)]
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Delete a snapshot (volumes cloned from it keep their data).
    Delete {
        #[arg(value_parser = parse_snapshot_name)]
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
}

pub fn run(client: &Client, cmd: SnapshotCmd) -> Result<(), CliError> {
    match cmd {
        SnapshotCmd::Create { name, volume, out } => {
            let s: Snapshot = client.post("/v1/snapshots", &CreateSnapshot { name, volume })?;
            match out.format {
                Format::Json => print_json(&s),
                Format::Table => {
                    println!("snapshot {} of volume {} taken", s.name, s.volume);
                    print!("{}", details(&s));
                }
            }
        }
        SnapshotCmd::List { volume, out } => {
            let path = match &volume {
                Some(v) => format!("/v1/snapshots?volume={v}"),
                None => "/v1/snapshots".to_string(),
            };
            let list: Vec<Snapshot> = client.get(&path)?;
            match out.format {
                Format::Json => print_json(&list),
                Format::Table => print!("{}", table(&list, now_ms())),
            }
        }
        SnapshotCmd::Show { name, out } => {
            let s: Snapshot = client.get(&format!("/v1/snapshots/{name}"))?;
            match out.format {
                Format::Json => print_json(&s),
                Format::Table => print!("{}", details(&s)),
            }
        }
        SnapshotCmd::Delete { name, out } => {
            client.delete(&format!("/v1/snapshots/{name}"))?;
            match out.format {
                Format::Json => print_json(&json!({ "name": name, "deleted": true })),
                Format::Table => println!("snapshot {name} deleted"),
            }
        }
    }
    Ok(())
}

fn pause(s: &Snapshot) -> String {
    match s.pause_micros {
        Some(us) if us >= 10_000 => format!("{} ms", us / 1000),
        Some(us) => format!("{:.2} ms", us as f64 / 1000.0),
        None => "-".into(),
    }
}

fn table(list: &[Snapshot], now: u64) -> String {
    if list.is_empty() {
        return "No snapshots.\n".into();
    }
    let mut t = Table::new(&[
        "NAME", "VOLUME", "SIZE", "STATE", "AGE", "REPLICAS", "PAUSE", "HOW",
    ]);
    for s in list {
        t.row(vec![
            s.name.clone(),
            s.volume.clone(),
            format_size(s.size_bytes),
            snake(&s.state),
            ago(s.created_ms, now),
            s.replicas.len().to_string(),
            pause(s),
            s.how.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    t.render()
}

fn details(s: &Snapshot) -> String {
    let line = |k: &str, v: String| format!("{k:<10} {v}\n");
    [
        line("Name:", s.name.clone()),
        line("Volume:", s.volume.clone()),
        line("Size:", format_size(s.size_bytes)),
        line("State:", snake(&s.state)),
        line("Replicas:", s.replicas.join(", ")),
        line("Paused:", pause(s)),
        line("Copied by:", s.how.clone().unwrap_or_else(|| "-".into())),
        line("Id:", s.id.clone()),
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_api::controller::SnapshotState;

    #[test]
    fn tables_show_state_pause_and_copy() {
        let s = Snapshot {
            name: "before-upgrade".into(),
            volume: "db".into(),
            id: "before-upgrade-00aa11".into(),
            size_bytes: 1 << 30,
            created_ms: 1_000,
            state: SnapshotState::Ready,
            replicas: vec!["db-r1-1".into(), "db-r2-2".into()],
            pause_micros: Some(1_234),
            how: Some("reflink".into()),
        };
        let t = table(std::slice::from_ref(&s), 61_000);
        let row = t.lines().nth(1).unwrap_or_default();
        for want in [
            "before-upgrade",
            "db",
            "1 GiB",
            "ready",
            "60s",
            "2",
            "1.23 ms",
            "reflink",
        ] {
            assert!(row.contains(want), "{want} not in {row:?}");
        }
        assert!(details(&s).contains("Replicas:  db-r1-1, db-r2-2"));
        assert_eq!(table(&[], 0), "No snapshots.\n");
    }
}
