//! `hawser events`: what happened lately in the cluster, newest first (the leader's recent
//! events: `GET /v1/events`).

use hawser_api::controller::ClusterEvent;

use crate::cli::client::{CliError, Client};
use crate::cli::output::{ago, now_ms, print_json, Format, OutputArg, Table};

#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Only the events of this volume.
    #[arg(long)]
    pub volume: Option<String>,
    /// Only the events of this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Only warnings.
    #[arg(long)]
    pub warnings: bool,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[command(flatten)]
    pub out: OutputArg,
}

pub fn run(client: &Client, args: EventsArgs) -> Result<(), CliError> {
    let all: Vec<ClusterEvent> = client.get("/v1/events")?;
    let shown = select(all, &args);
    match args.out.format {
        Format::Json => print_json(&shown),
        Format::Table => print!("{}", render(&shown, now_ms())),
    }
    Ok(())
}

fn select(all: Vec<ClusterEvent>, args: &EventsArgs) -> Vec<ClusterEvent> {
    all.into_iter()
        .filter(|e| args.volume.is_none() || e.volume == args.volume)
        .filter(|e| args.node.is_none() || e.node == args.node)
        .filter(|e| !args.warnings || e.warning)
        .take(args.limit)
        .collect()
}

fn render(events: &[ClusterEvent], now: u64) -> String {
    if events.is_empty() {
        return "No events (the leader keeps the recent ones in memory only).\n".into();
    }
    let mut t = Table::new(&["AGE", "TYPE", "REASON", "OBJECT", "MESSAGE"]);
    for e in events {
        let object = match (&e.volume, &e.node) {
            (Some(v), _) => format!("volume/{v}"),
            (None, Some(n)) => format!("node/{n}"),
            (None, None) => "-".into(),
        };
        t.row(vec![
            ago(e.at_ms, now),
            if e.warning { "Warning" } else { "Normal" }.into(),
            e.reason.clone(),
            object,
            e.message.clone(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, warning: bool, volume: Option<&str>, node: Option<&str>) -> ClusterEvent {
        ClusterEvent {
            seq,
            at_ms: 1_000_000 - seq * 1000,
            warning,
            reason: if warning { "Degraded" } else { "Resynced" }.into(),
            volume: volume.map(Into::into),
            node: node.map(Into::into),
            message: format!("event {seq}"),
        }
    }

    fn args(volume: Option<&str>, node: Option<&str>, warnings: bool, limit: usize) -> EventsArgs {
        EventsArgs {
            volume: volume.map(Into::into),
            node: node.map(Into::into),
            warnings,
            limit,
            out: OutputArg {
                format: Format::Table,
            },
        }
    }

    #[test]
    fn filters_and_renders() {
        let all = vec![
            ev(4, true, Some("web"), Some("n2")),
            ev(3, false, None, Some("n2")),
            ev(2, false, Some("db"), None),
            ev(1, true, Some("web"), None),
        ];
        let seqs =
            |a: &EventsArgs| -> Vec<u64> { select(all.clone(), a).iter().map(|e| e.seq).collect() };
        assert_eq!(seqs(&args(Some("web"), None, false, 50)), vec![4, 1]);
        assert_eq!(seqs(&args(None, Some("n2"), false, 50)), vec![4, 3]);
        assert_eq!(seqs(&args(None, None, true, 50)), vec![4, 1]);
        assert_eq!(seqs(&args(None, None, false, 2)), vec![4, 3]);
        let table = render(&all[..2], 1_000_000);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with("4s ") && lines[1].contains("Warning"));
        assert!(lines[1].contains("volume/web") && lines[1].ends_with("event 4"));
        assert!(lines[2].contains("node/n2") && lines[2].contains("Normal"));
        assert!(render(&[], 0).starts_with("No events"));
    }
}
