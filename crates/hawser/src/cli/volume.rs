//! `hawser volume ...`: create, list, show, attach, detach, expand, restore, force-promote,
//! set limits on and delete volumes.

use hawser_api::controller::{
    Attach, CreateVolume, ExpandVolume, ForcePromote, QuorumLoss, ReplicaState, RestoreVolume,
    Snapshot, Volume, VolumeSource, ZoneSpread,
};
use hawser_api::format_size;
use hawser_api::{ApiError, ErrorCode};
use serde_json::json;

use crate::cli::args::{
    parse_node_name, parse_pool_name, parse_snapshot_name, parse_volume_name, parse_volume_size,
};
use crate::cli::client::{CliError, Client};
use crate::cli::output::{or_dash, print_json, Format, OutputArg, Table};
use crate::cli::qos::QosArgs;

#[derive(Debug, clap::Subcommand)]
pub enum VolumeCmd {
    /// Create a volume with replicas on distinct nodes.
    Create {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        /// Size, e.g. 10GiB, 512MiB (a multiple of 4 KiB). With --from: at least the
        /// source's, which is the default.
        #[arg(
            long,
            value_parser = parse_volume_size,
            allow_hyphen_values = true,
            required_unless_present_any = ["from", "from_backup", "standby_of"]
        )]
        size: Option<u64>,
        /// A clone: start with the data of this snapshot or volume (`snapshot:NAME` or
        /// `volume:NAME` when a snapshot and a volume share the name).
        #[arg(long, conflicts_with = "from_backup")]
        from: Option<String>,
        /// Start with the data of a backup, `TARGET/BACKUP` (`hawser backup list`), in this
        /// cluster or another that was given the target. The volume stays `restoring` (it
        /// cannot attach) until every replica holds it, each block checked against its hash.
        #[arg(long, conflicts_with = "standby_of")]
        from_backup: Option<String>,
        /// A standby of another cluster's volume, `TARGET/VOLUME` (as its backups name it):
        /// it starts as the newest backup on the target and applies each new one as it
        /// lands. It cannot attach until `hawser volume activate`.
        #[arg(long, conflicts_with = "from")]
        standby_of: Option<String>,
        /// Number of replicas (1-5), each on a different node.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=5))]
        replicas: u32,
        /// Allocate the replicas' space up front instead of thin (sparse) files.
        #[arg(long)]
        thick: bool,
        /// Place replicas only in pools of this name.
        #[arg(long, value_parser = parse_pool_name)]
        pool: Option<String>,
        /// How replicas spread over the nodes' `zone` labels: strict (each in another zone),
        /// preferred (as many zones as possible) or none. Default: strict if any node has a
        /// zone label, else none.
        #[arg(long, value_enum)]
        zone_spread: Option<SpreadArg>,
        /// Put a replica on this node if it has room (the node the volume will be attached
        /// to, so reads are local).
        #[arg(long, value_parser = parse_node_name)]
        prefer_node: Option<String>,
        /// When too few replicas are left for a quorum, writes wait for one to return
        /// (suspend) or fail with EIO (fail).
        #[arg(long, value_enum, default_value_t = QuorumLossArg::Suspend)]
        on_quorum_loss: QuorumLossArg,
        /// Encrypt its data at rest (XTS-AES-256 in the engine, with a key of its own). A clone
        /// of an encrypted volume is encrypted by itself.
        #[arg(long)]
        encrypted: bool,
        /// Keep a CRC-32C per 4 KiB block on every replica and check every read (on), or
        /// not (off). Chosen at create, never changed; a clone chooses its own.
        #[arg(long, value_enum, default_value_t = OnOff::On)]
        checksums: OnOff,
        #[command(flatten)]
        limits: QosArgs,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Change a volume's limits on client requests (QoS), attached or not; they take effect
    /// at once. Only the limits given change; 0 removes one.
    Set {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        #[command(flatten)]
        limits: QosArgs,
        #[command(flatten)]
        out: OutputArg,
    },
    /// List volumes.
    List {
        #[command(flatten)]
        out: OutputArg,
    },
    /// Show a volume and its replicas.
    Show {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Attach a volume to a node: start its engine there and export it over NBD.
    Attach {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        /// Node to attach to.
        #[arg(long, value_parser = parse_node_name)]
        node: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Detach a volume: flush and stop its engine.
    Detach {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Grow a detached volume (every replica, then the volume); shrinking is refused.
    Expand {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        /// The new size, e.g. 20GiB (a multiple of 4 KiB, not smaller than now).
        #[arg(long, value_parser = parse_volume_size, allow_hyphen_values = true)]
        size: u64,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Start a scrub pass of an attached volume: every block of every in-sync replica is read
    /// and checked against its checksum, and bad ones are rewritten from a good replica
    /// (docs/checksums.md). `hawser volume show` and `hawser status` show its progress.
    Scrub {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Write a certificate for an NBD client of these volumes: an agent's NBD port (nbds://)
    /// opens them to it and nothing else, until its TTL ends.
    ClientCert(crate::cli::client_cert::ClientCertArgs),
    /// Put a detached volume's data back to one of its snapshots. Writes made after the
    /// snapshot are discarded; every snapshot is kept. Replicas without the snapshot are
    /// copied in full afterwards.
    Restore {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        /// The snapshot (of this volume) to restore.
        #[arg(long)]
        snapshot: String,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Make a standby volume a normal one: the newest backup on its target is applied first
    /// (or, with --as-is, the backup it holds is kept, for a target that cannot be read).
    Activate {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        /// Keep the backup it holds; do not read the target.
        #[arg(long)]
        as_is: bool,
        /// Return when it is a normal volume (else when activation is asked).
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Let a detached volume attach without the in-sync replicas crash recovery waits for
    /// (DRBD's --force primary). Every in-sync replica but the kept ones is outdated and
    /// copied in full when it returns: acknowledged writes only it held are LOST.
    ForcePromote {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        /// The in-sync replica to keep (default: every in-sync replica on an online node).
        #[arg(long)]
        replica: Option<String>,
        /// Required: you accept that writes held only by the replicas outdated are lost.
        #[arg(long)]
        accept_data_loss: bool,
        #[command(flatten)]
        out: OutputArg,
    },
    /// Delete a detached volume and its replicas. Refused while it has snapshots unless
    /// `--with-snapshots`.
    Delete {
        #[arg(value_parser = parse_volume_name)]
        name: String,
        /// Delete its snapshots too.
        #[arg(long)]
        with_snapshots: bool,
        #[command(flatten)]
        out: OutputArg,
    },
}

/// `--zone-spread`; mirrors [`ZoneSpread`].
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum SpreadArg {
    Strict,
    Preferred,
    None,
}

impl From<SpreadArg> for ZoneSpread {
    fn from(s: SpreadArg) -> ZoneSpread {
        match s {
            SpreadArg::Strict => ZoneSpread::Strict,
            SpreadArg::Preferred => ZoneSpread::Preferred,
            SpreadArg::None => ZoneSpread::None,
        }
    }
}

pub fn run(client: &Client, cmd: VolumeCmd) -> Result<(), CliError> {
    match cmd {
        VolumeCmd::Create {
            name,
            size,
            replicas,
            thick,
            pool,
            zone_spread,
            prefer_node,
            on_quorum_loss,
            from,
            from_backup,
            standby_of,
            encrypted,
            checksums,
            limits,
            out,
        } => {
            let (from, source_size) = match from {
                Some(f) => {
                    let (source, size) = clone_source(client, &f)?;
                    (Some(source), Some(size))
                }
                None => (None, None),
            };
            let req = CreateVolume {
                name,
                size_bytes: size.or(source_size).unwrap_or_default(),
                replicas,
                thin: !thick,
                pool,
                zone_spread: zone_spread.map(ZoneSpread::from),
                prefer_node,
                on_quorum_loss: on_quorum_loss.into(),
                from,
                qos: limits.qos(),
                encrypted,
                checksums: Some(checksums == OnOff::On),
                from_backup,
                standby_of,
                backup_schedules: Vec::new(),
            };
            let v: Volume = client.post("/v1/volumes", &req)?;
            print_volume(&v, out.format, "created");
        }
        VolumeCmd::Set { name, limits, out } => {
            let patch = limits.patch();
            if patch.is_empty() {
                let flags: Vec<String> = hawser_api::QosField::ALL
                    .iter()
                    .map(|f| format!("--{}", f.flag()))
                    .collect();
                return Err(CliError::Api(ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("nothing to set: give one of {}", flags.join(", ")),
                )));
            }
            let v: Volume = client.post(&format!("/v1/volumes/{name}/qos"), &patch)?;
            print_volume(&v, out.format, "limits set");
        }
        VolumeCmd::List { out } => {
            let vols: Vec<Volume> = client.get("/v1/volumes")?;
            match out.format {
                Format::Json => print_json(&vols),
                Format::Table => list_table(&vols).print(),
            }
        }
        VolumeCmd::Show { name, out } => {
            let v: Volume = client.get(&format!("/v1/volumes/{name}"))?;
            match out.format {
                Format::Json => print_json(&v),
                Format::Table => print!("{}", details(&v)),
            }
        }
        VolumeCmd::Attach { name, node, out } => {
            let v: Volume = client.post(&format!("/v1/volumes/{name}/attach"), &Attach { node })?;
            print_volume(&v, out.format, "attached");
        }
        VolumeCmd::Detach { name, out } => {
            let v: Volume = client.post(&format!("/v1/volumes/{name}/detach"), &json!({}))?;
            print_volume(&v, out.format, "detached");
        }
        VolumeCmd::Expand { name, size, out } => {
            let req = ExpandVolume { size_bytes: size };
            let v: Volume = client.post(&format!("/v1/volumes/{name}/expand"), &req)?;
            print_volume(&v, out.format, "expanded");
        }
        VolumeCmd::ClientCert(args) => crate::cli::client_cert::run(client, args)?,
        VolumeCmd::Scrub { name, out } => {
            let v: Volume = client.post(&format!("/v1/volumes/{name}/scrub"), &json!({}))?;
            print_volume(&v, out.format, "being scrubbed");
        }
        VolumeCmd::Restore {
            name,
            snapshot,
            out,
        } => {
            let what = format!("restored to snapshot {snapshot}");
            let req = RestoreVolume { snapshot };
            let v: Volume = client.post(&format!("/v1/volumes/{name}/restore"), &req)?;
            print_volume(&v, out.format, &what);
        }
        VolumeCmd::Activate {
            name,
            as_is,
            wait,
            out,
        } => {
            let v = crate::cli::standby::activate(client, &name, as_is, wait)?;
            let what = match &v.standby {
                Some(_) => "activating: the newest backup is applied first",
                None => "activated",
            };
            print_volume(&v, out.format, what);
        }
        VolumeCmd::ForcePromote {
            name,
            replica,
            accept_data_loss,
            out,
        } => {
            // Without --accept-data-loss the controller refuses, naming the risk.
            let req = ForcePromote {
                replica,
                accept_data_loss,
            };
            let v: Volume = client.post(&format!("/v1/volumes/{name}/force-promote"), &req)?;
            print_volume(&v, out.format, "force-promoted");
        }
        VolumeCmd::Delete {
            name,
            with_snapshots,
            out,
        } => {
            let query = if with_snapshots {
                "?with_snapshots=true"
            } else {
                ""
            };
            client.delete(&format!("/v1/volumes/{name}{query}"))?;
            match out.format {
                Format::Json => print_json(&json!({ "name": name, "deleted": true })),
                Format::Table => println!("volume {name} deleted"),
            }
        }
    }
    Ok(())
}

/// `--from NAME`: a snapshot or a volume of that name (a prefix says which when both exist),
/// and its size.
fn clone_source(client: &Client, from: &str) -> Result<(VolumeSource, u64), CliError> {
    let snapshot = |name: &str| -> Result<(VolumeSource, u64), CliError> {
        let s: Snapshot = client.get(&format!("/v1/snapshots/{name}"))?;
        let source = VolumeSource {
            snapshot: Some(s.name),
            volume: None,
        };
        Ok((source, s.size_bytes))
    };
    let volume = |name: &str| -> Result<(VolumeSource, u64), CliError> {
        let v: Volume = client.get(&format!("/v1/volumes/{name}"))?;
        let source = VolumeSource {
            snapshot: None,
            volume: Some(v.name),
        };
        Ok((source, v.size_bytes))
    };
    let usage = |msg: String| CliError::Api(ApiError::new(ErrorCode::InvalidArgument, msg));
    if let Some(name) = from.strip_prefix("snapshot:") {
        return snapshot(&parse_snapshot_name(name).map_err(usage)?);
    }
    if let Some(name) = from.strip_prefix("volume:") {
        return volume(&parse_volume_name(name).map_err(usage)?);
    }
    parse_volume_name(from).map_err(usage)?;
    let not_found = |e: &CliError| matches!(e, CliError::Api(a) if a.code == ErrorCode::NotFound);
    match (snapshot(from), volume(from)) {
        (Ok(_), Ok(_)) => Err(usage(format!(
            "both a snapshot and a volume are named {from:?}: say snapshot:{from} or volume:{from}"
        ))),
        (Ok(s), Err(e)) | (Err(e), Ok(s)) if not_found(&e) => Ok(s),
        (Err(e), _) | (_, Err(e)) if !not_found(&e) => Err(e),
        _ => Err(CliError::Api(ApiError::new(
            ErrorCode::NotFound,
            format!("no snapshot or volume is named {from:?}"),
        ))),
    }
}

/// After a change: the volume as JSON, or its details under a one-line summary.
fn print_volume(v: &Volume, format: Format, what: &str) {
    match format {
        Format::Json => print_json(v),
        Format::Table => {
            println!("volume {} {what}", v.name);
            print!("{}", details(v));
        }
    }
}

fn kind(v: &Volume) -> &'static str {
    if v.thin {
        "thin"
    } else {
        "thick"
    }
}

fn in_sync(v: &Volume) -> usize {
    v.replicas
        .iter()
        .filter(|r| r.state == ReplicaState::InSync)
        .count()
}

fn list_table(vols: &[Volume]) -> Table {
    let mut t = Table::new(&[
        "NAME",
        "SIZE",
        "TYPE",
        "CHECKSUMS",
        "IN-SYNC",
        "STATE",
        "NODE",
        "EPOCH",
    ]);
    for v in vols {
        t.row(vec![
            v.name.clone(),
            format_size(v.size_bytes),
            kind(v).into(),
            on_off(v.checksums).into(),
            format!("{}/{}", in_sync(v), v.replicas.len()),
            snake(&v.state),
            or_dash(v.attached_node.as_deref()),
            v.epoch.to_string(),
        ]);
    }
    t
}

fn details(v: &Volume) -> String {
    let mut s = String::new();
    let mut line = |k: &str, val: String| s.push_str(&format!("{k:<10}{val}\n"));
    line("Name:", v.name.clone());
    line(
        "Size:",
        format!("{} ({})", format_size(v.size_bytes), kind(v)),
    );
    line("State:", snake(&v.state));
    line("Node:", or_dash(v.attached_node.as_deref()));
    if let Some(n) = &v.sync_node {
        line(
            "Syncing:",
            format!("new replicas, by an engine on {n} (not exported)"),
        );
    }
    line("Epoch:", v.epoch.to_string());
    if let Some(s) = &v.standby {
        for (k, val) in crate::cli::standby::lines(s, crate::cli::output::now_ms()) {
            line(k, val);
        }
    } else if let Some(s) = &v.restoring {
        let how = match s.strip_prefix("backup ") {
            Some(b) => format!("from backup {b} (`hawser events` says if it failed)"),
            None => format!(
                "to snapshot {s}; `hawser volume restore {} --snapshot {s}` finishes it",
                v.name
            ),
        };
        line("Restoring:", how);
    }
    if let Some(o) = &v.origin {
        let from = match (&o.snapshot, &o.volume) {
            (Some(s), _) => format!("a clone of snapshot {s}"),
            (None, Some(vol)) => format!("a clone of volume {vol}"),
            (None, None) => "a clone".to_string(),
        };
        line("Origin:", from);
    }
    if let Some(uri) = &v.nbd_uri {
        line("NBD:", uri.clone());
    }
    if let Some(uri) = &v.nbd_unix_uri {
        line("NBD unix:", uri.clone());
    }
    line("Policy:", placement(v));
    if v.encrypted {
        line("Encrypted:", "XTS-AES-256, a key of its own".into());
    }
    line(
        "Checksum:",
        if v.checksums {
            "on (CRC-32C per 4 KiB block, checked on every read)".into()
        } else {
            "off".into()
        },
    );
    if let Some(limits) = crate::cli::qos::describe(v) {
        line("Limits:", limits);
    }
    line(
        "Quorum:",
        format!("majority; on loss {}", snake(&v.on_quorum_loss)),
    );
    if let Some(e) = &v.engine {
        line(
            "Device:",
            match &e.device {
                Some(d) => format!("{} ({}, {})", d.path, d.frontend, format_size(d.size_bytes)),
                None => "none on its node (NBD clients only)".into(),
            },
        );
        line(
            "Activity:",
            format!("{} extents of 4 MiB in the activity log", e.active_extents),
        );
        if let Some(r) = &e.recovery {
            line(
                "Recovery:",
                format!(
                    "at attach: {} in-sync replicas compared over {}, {} copied, {} ms",
                    r.replicas,
                    format_size(r.compared_bytes),
                    format_size(r.copied_bytes),
                    r.millis
                ),
            );
        }
        if let Some(s) = &e.scrub {
            line("Scrub:", scrub_line(s));
        }
    }
    if let Some(ms) = v.last_scrub_ms {
        let now = crate::cli::output::now_ms();
        line(
            "Scrubbed:",
            format!(
                "{} ago (or first seen attached; passes are weekly)",
                crate::cli::output::ago(ms, now)
            ),
        );
    }
    line(
        "Replicas:",
        format!("{} in sync of {}", in_sync(v), v.replicas.len()),
    );
    let mut t = Table::new(&["  ID", "NODE", "POOL", "STATE"]);
    for r in &v.replicas {
        t.row(vec![
            format!("  {}", r.id),
            r.node.clone(),
            r.pool.clone(),
            if r.blank {
                format!("{} (new, first sync)", snake(&r.state))
            } else {
                snake(&r.state)
            },
        ]);
    }
    s.push_str(&t.render());
    s
}

/// "running, 40% (410 MiB of 1 GiB); 3 bad blocks found, 3 repaired"
pub fn scrub_line(s: &hawser_api::agent::ScrubStatus) -> String {
    let pct = (s.scrubbed_bytes.saturating_mul(100))
        .checked_div(s.size_bytes)
        .unwrap_or(100);
    let mut out = if s.running {
        format!(
            "running, {pct}% ({} of {})",
            format_size(s.scrubbed_bytes),
            format_size(s.size_bytes)
        )
    } else {
        "done".to_string()
    };
    out.push_str(&format!(
        "; {} bad blocks found, {} repaired",
        s.found_blocks, s.repaired_blocks
    ));
    if s.unrecoverable_blocks > 0 {
        out.push_str(&format!(
            ", {} UNRECOVERABLE (no replica had them right)",
            s.unrecoverable_blocks
        ));
    }
    out
}

/// "zone spread strict, pool ssd, prefer node n1"
fn placement(v: &Volume) -> String {
    let p = &v.placement;
    let mut s = format!("zone spread {}", snake(&p.zone_spread));
    if let Some(pool) = &p.pool {
        s.push_str(&format!(", pool {pool}"));
    }
    if let Some(node) = &p.prefer_node {
        s.push_str(&format!(", prefer node {node}"));
    }
    s
}

/// An API enum as its JSON name ("in_sync", "attached").
pub fn snake<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".into(),
    }
}

/// `--checksums on|off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum QuorumLossArg {
    Suspend,
    Fail,
}

impl From<QuorumLossArg> for QuorumLoss {
    fn from(a: QuorumLossArg) -> QuorumLoss {
        match a {
            QuorumLossArg::Suspend => QuorumLoss::Suspend,
            QuorumLossArg::Fail => QuorumLoss::Fail,
        }
    }
}
