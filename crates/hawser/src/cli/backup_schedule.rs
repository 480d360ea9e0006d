//! `hawser backup schedule|unschedule|schedules`: a volume's backups on a schedule, keeping
//! its newest N (docs/backup.md).

use hawser_api::backup::{BackupSchedule, SetBackupSchedule};
use hawser_api::controller::Volume;
use serde_json::json;

use crate::cli::args::parse_volume_name;
use crate::cli::client::{CliError, Client};
use crate::cli::output::{ago, now_ms, or_dash, print_json, Format, OutputArg, Table};

#[derive(Debug, clap::Args)]
pub struct ScheduleArgs {
    #[arg(value_parser = parse_volume_name)]
    pub volume: String,
    #[arg(long)]
    pub target: String,
    /// When, in UTC: five cron fields (minute hour day-of-month month day-of-week), as
    /// "0 * * * *" for hourly, or six with seconds first. A run missed while the controller
    /// was down runs once when it is back.
    #[arg(long)]
    pub cron: String,
    /// How many of the backups this schedule makes are kept (older ones are deleted and
    /// their blocks pruned; backups made by hand are kept).
    #[arg(long)]
    pub retain: u32,
    #[command(flatten)]
    pub out: OutputArg,
}

pub fn set(client: &Client, a: ScheduleArgs) -> Result<(), CliError> {
    let s: BackupSchedule = client.put(
        &format!("/v1/volumes/{}/backup-schedules/{}", a.volume, a.target),
        &SetBackupSchedule {
            cron: a.cron,
            retain: a.retain,
        },
    )?;
    match a.out.format {
        Format::Json => print_json(&s),
        Format::Table => println!(
            "volume {} is backed up to {} on \"{}\" (UTC), keeping {}; next run {}",
            a.volume,
            s.target,
            s.cron,
            s.retain,
            or_dash(
                s.next_run_ms
                    .map(|ms| hawser_api::time::rfc3339(ms / 1000))
                    .as_deref()
            )
        ),
    }
    Ok(())
}

pub fn remove(client: &Client, volume: &str, target: &str, out: OutputArg) -> Result<(), CliError> {
    client.delete(&format!("/v1/volumes/{volume}/backup-schedules/{target}"))?;
    match out.format {
        Format::Json => print_json(&json!({ "volume": volume, "target": target, "removed": true })),
        Format::Table => {
            println!("volume {volume} is no longer backed up to {target} on a schedule (its backups stay)")
        }
    }
    Ok(())
}

pub fn list(client: &Client, volume: Option<&str>, out: OutputArg) -> Result<(), CliError> {
    let volumes: Vec<Volume> = match volume {
        Some(v) => vec![client.get(&format!("/v1/volumes/{v}"))?],
        None => client.get("/v1/volumes")?,
    };
    let rows: Vec<(&str, &BackupSchedule)> = volumes
        .iter()
        .flat_map(|v| v.backup_schedules.iter().map(|s| (v.name.as_str(), s)))
        .collect();
    match out.format {
        Format::Json => {
            let all: Vec<_> = rows
                .iter()
                .map(|(v, s)| json!({ "volume": v, "schedule": s }))
                .collect();
            print_json(&all);
        }
        Format::Table if rows.is_empty() => println!("No backup schedules."),
        Format::Table => print!("{}", table(&rows, now_ms())),
    }
    Ok(())
}

fn table(rows: &[(&str, &BackupSchedule)], now: u64) -> String {
    let mut t = Table::new(&[
        "VOLUME",
        "TARGET",
        "CRON (UTC)",
        "RETAIN",
        "LAST RUN",
        "NEXT RUN",
        "LAST BACKUP",
        "ERROR",
    ]);
    for (v, s) in rows {
        t.row(vec![
            (*v).to_owned(),
            s.target.clone(),
            s.cron.clone(),
            s.retain.to_string(),
            s.last_run_ms
                .map_or("-".into(), |l| format!("{} ago", ago(l, now))),
            or_dash(
                s.next_run_ms
                    .map(|ms| hawser_api::time::rfc3339(ms / 1000))
                    .as_deref(),
            ),
            or_dash(s.last_backup.as_deref()),
            or_dash(s.error.as_deref()),
        ]);
    }
    t.render()
}
