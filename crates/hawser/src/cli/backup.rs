//! `hawser backup target add|list|show|remove|prune` and `hawser backup
//! create|list|show|delete`: backups off the cluster (docs/backup.md). Schedules are in
//! `backup_schedule.rs`.

use std::path::PathBuf;

use hawser_api::backup::{
    AddBackupTarget, Backup, BackupState, BackupTarget, CreateBackup, PruneReport, S3Key,
    TargetSpec,
};
use hawser_api::{format_size, Secret};
use serde_json::json;

use crate::cli::args::{parse_snapshot_name, parse_volume_name};
use crate::cli::client::{CliError, Client};
use crate::cli::output::{ago, now_ms, print_json, Format, OutputArg, Table};

fn failed(message: String) -> CliError {
    CliError::Api(hawser_api::ApiError::invalid(message))
}

#[derive(Debug, clap::Subcommand)]
pub enum BackupCmd {
    /// Where backups go: an S3-compatible store or a directory.
    #[command(subcommand)]
    Target(TargetCmd),
    /// Back up a volume: a crash-consistent snapshot (or `--snapshot`), of which only the
    /// blocks the target lacks are sent, by a node that holds it.
    Create {
        #[arg(value_parser = parse_volume_name)]
        volume: String,
        #[arg(long)]
        target: String,
        /// Back up this existing snapshot of the volume instead of taking one.
        #[arg(long, value_parser = parse_snapshot_name)]
        snapshot: Option<String>,
        /// Wait until the backup is on the target (or failed), printing its progress.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        out: OutputArg,
    },
    /// List backups, of one volume or to one target.
    List {
        #[arg(long, value_parser = parse_volume_name)]
        volume: Option<String>,
        #[arg(long)]
        target: Option<String>,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Show one backup: its state, progress (bytes, rate, ETA) and what it cost.
    Show {
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Delete a backup from its target (a ready or failed one). Its blocks go when the
    /// target is next pruned, which follows on its own.
    Delete {
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Back a volume up on a schedule, keeping its newest N backups.
    Schedule(crate::cli::backup_schedule::ScheduleArgs),
    /// Stop a volume's schedule for a target (the backups it made stay).
    Unschedule {
        #[arg(value_parser = parse_volume_name)]
        volume: String,
        #[arg(long)]
        target: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// List backup schedules: when each last ran and will run next, and what it keeps.
    Schedules {
        #[arg(long, value_parser = parse_volume_name)]
        volume: Option<String>,
        #[command(flatten)]
        out: OutputArg,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum TargetCmd {
    /// Add a target after checking that an object can be written, read back and deleted.
    Add {
        name: String,
        /// An S3-compatible server's URL (http(s)://host:port), with --bucket and
        /// --credentials-file.
        #[arg(long, conflicts_with = "dir", requires_all = ["bucket", "credentials_file"])]
        s3: Option<String>,
        #[arg(long)]
        bucket: Option<String>,
        /// Objects go under this prefix in the bucket.
        #[arg(long, default_value = "")]
        prefix: String,
        #[arg(long)]
        region: Option<String>,
        /// A file with `access_key_id = ...` and `secret_access_key = ...` lines (an AWS
        /// credentials file works). The controller keeps the key in a 0600 file, never in
        /// the store.
        #[arg(long)]
        credentials_file: Option<PathBuf>,
        /// A directory (an NFS mount, say) at the same path on the controller and every node.
        #[arg(long, required_unless_present = "s3")]
        dir: Option<String>,
        #[command(flatten)]
        out: OutputArg,
    },
    List {
        #[command(flatten)]
        out: OutputArg,
    },
    Show {
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Forget a target. Its backups stay on it.
    Remove {
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Delete the blocks no backup on the target names (after backups were deleted).
    /// Refused while a backup runs on it, from this cluster or another.
    Prune {
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
}

pub fn run(client: &Client, cmd: BackupCmd) -> Result<(), CliError> {
    match cmd {
        BackupCmd::Target(t) => run_target(client, t),
        BackupCmd::Create {
            volume,
            target,
            snapshot,
            wait,
            out,
        } => {
            let mut b: Backup = client.post(
                "/v1/backups",
                &CreateBackup {
                    volume,
                    target,
                    snapshot,
                },
            )?;
            if wait {
                b = wait_for(client, b, out.format == Format::Table)?;
            }
            match out.format {
                Format::Json => print_json(&b),
                Format::Table => print!("{}", details(&b, now_ms())),
            }
            if b.state == BackupState::Failed {
                return Err(failed(format!("backup {} failed", b.name)));
            }
            Ok(())
        }
        BackupCmd::List {
            volume,
            target,
            out,
        } => {
            let mut q = Vec::new();
            if let Some(v) = &volume {
                q.push(format!("volume={v}"));
            }
            if let Some(t) = &target {
                q.push(format!("target={t}"));
            }
            let path = if q.is_empty() {
                "/v1/backups".into()
            } else {
                format!("/v1/backups?{}", q.join("&"))
            };
            let list: Vec<Backup> = client.get(&path)?;
            match out.format {
                Format::Json => print_json(&list),
                Format::Table => print!("{}", table(&list, now_ms())),
            }
            Ok(())
        }
        BackupCmd::Show { name, out } => {
            let b: Backup = client.get(&format!("/v1/backups/{name}"))?;
            match out.format {
                Format::Json => print_json(&b),
                Format::Table => print!("{}", details(&b, now_ms())),
            }
            Ok(())
        }
        BackupCmd::Delete { name, out } => {
            client.delete(&format!("/v1/backups/{name}"))?;
            match out.format {
                Format::Json => print_json(&json!({ "name": name, "deleted": true })),
                Format::Table => {
                    println!("backup {name} deleted (its blocks go when the target is next pruned)")
                }
            }
            Ok(())
        }
        BackupCmd::Schedule(args) => crate::cli::backup_schedule::set(client, args),
        BackupCmd::Unschedule {
            volume,
            target,
            out,
        } => crate::cli::backup_schedule::remove(client, &volume, &target, out),
        BackupCmd::Schedules { volume, out } => {
            crate::cli::backup_schedule::list(client, volume.as_deref(), out)
        }
    }
}

/// Polls the backup until it ends; prints a progress line per change on a terminal table.
fn wait_for(client: &Client, mut b: Backup, show: bool) -> Result<Backup, CliError> {
    let mut last = String::new();
    while b.state == BackupState::Running {
        std::thread::sleep(std::time::Duration::from_millis(500));
        b = client.get(&format!("/v1/backups/{}", b.name))?;
        let line = progress(&b);
        if show && line != last {
            eprintln!("{line}");
            last = line;
        }
    }
    Ok(b)
}

fn run_target(client: &Client, cmd: TargetCmd) -> Result<(), CliError> {
    match cmd {
        TargetCmd::Add {
            name,
            s3,
            bucket,
            prefix,
            region,
            credentials_file,
            dir,
            out,
        } => {
            let (spec, credentials) = match (s3, dir) {
                (Some(endpoint), _) => {
                    let file = credentials_file.unwrap_or_default();
                    let text = std::fs::read_to_string(&file)
                        .map_err(|e| failed(format!("read {}: {e}", file.display())))?;
                    let key = hawser_backup::S3Credentials::parse(&text)
                        .map_err(|e| failed(format!("{}: {e}", file.display())))?;
                    let spec = TargetSpec::S3 {
                        endpoint,
                        bucket: bucket.unwrap_or_default(),
                        prefix,
                        region,
                    };
                    let key = S3Key {
                        access_key_id: key.access_key_id,
                        secret_access_key: Secret::new(key.secret_access_key.as_bytes()),
                    };
                    (spec, Some(key))
                }
                (None, Some(path)) => (TargetSpec::Dir { path }, None),
                (None, None) => return Err(failed("give --s3 or --dir".into())),
            };
            let t: BackupTarget = client.post(
                "/v1/backup-targets",
                &AddBackupTarget {
                    name,
                    spec,
                    credentials,
                },
            )?;
            match out.format {
                Format::Json => print_json(&t),
                Format::Table => println!("backup target {} added: {}", t.name, t.spec.describe()),
            }
        }
        TargetCmd::List { out } => {
            let list: Vec<BackupTarget> = client.get("/v1/backup-targets")?;
            match out.format {
                Format::Json => print_json(&list),
                Format::Table if list.is_empty() => println!("No backup targets."),
                Format::Table => {
                    let mut t = Table::new(&["NAME", "WHERE", "CREDENTIALS"]);
                    for x in &list {
                        let c = if x.credentials { "yes" } else { "-" };
                        t.row(vec![x.name.clone(), x.spec.describe(), c.into()]);
                    }
                    print!("{}", t.render());
                }
            }
        }
        TargetCmd::Show { name, out } => {
            let t: BackupTarget = client.get(&format!("/v1/backup-targets/{name}"))?;
            match out.format {
                Format::Json => print_json(&t),
                Format::Table => println!("{}: {}", t.name, t.spec.describe()),
            }
        }
        TargetCmd::Prune { name, out } => {
            let r: PruneReport =
                client.post(&format!("/v1/backup-targets/{name}/prune"), &json!({}))?;
            match out.format {
                Format::Json => print_json(&r),
                Format::Table => {
                    println!(
                        "target {name} pruned: {} blocks deleted ({}), {} kept for {} backups, \
                         {} too recent to prune yet",
                        r.deleted_blocks,
                        format_size(r.freed_bytes),
                        r.blocks.saturating_sub(r.deleted_blocks + r.young_blocks),
                        r.backups,
                        r.young_blocks
                    );
                    if r.held_backups > 0 {
                        println!(
                            "{} deleted backups are still being read (a restore or a standby): \
                             their blocks go at the first prune after it ends",
                            r.held_backups
                        );
                    }
                }
            }
        }
        TargetCmd::Remove { name, out } => {
            client.delete(&format!("/v1/backup-targets/{name}"))?;
            match out.format {
                Format::Json => print_json(&json!({ "name": name, "removed": true })),
                Format::Table => println!("backup target {name} removed (its backups are kept)"),
            }
        }
    }
    Ok(())
}

fn state(b: &Backup) -> &'static str {
    match b.state {
        BackupState::Running => "running",
        BackupState::Ready => "ready",
        BackupState::Failed => "failed",
    }
}

/// `42% of 1.0 GiB, 80 MiB/s, ETA 7s`.
fn progress(b: &Backup) -> String {
    let Some(p) = &b.progress else {
        return "-".into();
    };
    let pct = (p.done_bytes.saturating_mul(100))
        .checked_div(p.total_bytes)
        .unwrap_or(0);
    let eta = p.eta_secs.map_or_else(|| "-".into(), |s| format!("{s}s"));
    // Retries mean the target throttles or fails: worth a look while it runs.
    let retries = match p.retries {
        0 => String::new(),
        n => format!(", {n} requests retried"),
    };
    format!(
        "{pct}% of {}, {}/s, sent {}, ETA {eta}{retries}",
        format_size(p.total_bytes),
        format_size(p.bytes_per_sec),
        format_size(p.transferred_bytes)
    )
}

fn table(list: &[Backup], now: u64) -> String {
    if list.is_empty() {
        return "No backups.\n".into();
    }
    let mut t = Table::new(&["NAME", "VOLUME", "TARGET", "STATE", "SIZE", "STORED", "AGE"]);
    for b in list {
        let stored = b
            .stats
            .as_ref()
            .map_or_else(|| "-".into(), |s| format_size(s.stored_bytes));
        t.row(vec![
            b.name.clone(),
            b.volume.clone(),
            b.target.clone(),
            state(b).into(),
            format_size(b.size_bytes),
            stored,
            ago(b.taken_ms, now),
        ]);
    }
    t.render()
}

fn details(b: &Backup, now: u64) -> String {
    let mut s = format!(
        "Backup:         {}\nVolume:         {} ({})\nTarget:         {}\nState:          {}\n\
         Recovery point: {} ago (snapshot {})\n",
        b.name,
        b.volume,
        format_size(b.size_bytes),
        b.target,
        state(b),
        ago(b.taken_ms, now),
        b.snapshot,
    );
    if let Some(n) = &b.node {
        s += &format!("Node:           {n}\n");
    }
    s += &format!("Progress:       {}\n", progress(b));
    if let Some(st) = &b.stats {
        s += &format!(
            "Stored:         {} ({} new blocks, {} already there of which {} found on the \
             target, {} zero) in {:.1} s, {} requests retried\n",
            format_size(st.stored_bytes),
            st.new_blocks,
            st.reused_blocks,
            st.found_blocks,
            st.zero_blocks,
            st.micros as f64 / 1e6,
            st.retries
        );
    }
    if let Some(e) = &b.error {
        s += &format!("Error:          {e}\n");
    }
    s
}
