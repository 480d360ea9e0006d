//! `hawser cluster rotate-ca`: replaces the cluster's CA in three steps (trust, issue,
//! retire; the controller's `ca_rotation` says what each does), waiting before each until
//! every online node is ready for it, so that no connection is refused on the way. The CA
//! file this CLI trusts (`--ca-file`, `$HAWSER_CA_FILE` or `~/.config/hawser/ca.pem`) is
//! rewritten after `trust` (both CAs) and after `retire` (the new one only): this CLI keeps
//! reaching the controller, and other clients can be given the same file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hawser_api::controller::{CaRotation, CaRotationStep, StartCaRotationStep};

use crate::cli::client::{CliError, Client};
use crate::cli::output::{print_json, Format, OutputArg};

const PATH: &str = "/v1/cluster/ca-rotation";

#[derive(Debug, clap::Args)]
pub struct RotateCaArgs {
    /// Take only this step (`trust`, `issue` or `retire`); without it, every step left.
    #[arg(long, value_parser = parse_step)]
    step: Option<CaRotationStep>,
    /// Only show where the rotation stands.
    #[arg(long)]
    status: bool,
    /// How long to wait for the nodes before each step (they get there at their next
    /// heartbeat; an online node that never does is named in the error).
    #[arg(long, default_value_t = 120)]
    wait_secs: u64,
    #[command(flatten)]
    out: OutputArg,
}

fn parse_step(s: &str) -> Result<CaRotationStep, String> {
    match s {
        "trust" => Ok(CaRotationStep::Trust),
        "issue" => Ok(CaRotationStep::Issue),
        "retire" => Ok(CaRotationStep::Retire),
        _ => Err(format!("{s:?}: the steps are trust, issue and retire")),
    }
}

fn name(s: CaRotationStep) -> &'static str {
    match s {
        CaRotationStep::Trust => "trust",
        CaRotationStep::Issue => "issue",
        CaRotationStep::Retire => "retire",
    }
}

pub fn run(client: &Client, args: RotateCaArgs, ca_file: Option<&Path>) -> Result<(), CliError> {
    let now: CaRotation = client.get(PATH)?;
    if args.status {
        return show(&now, args.out.format);
    }
    let steps: Vec<CaRotationStep> = match args.step {
        Some(s) => vec![s],
        None => {
            let all = [
                CaRotationStep::Trust,
                CaRotationStep::Issue,
                CaRotationStep::Retire,
            ];
            match now.step {
                None | Some(CaRotationStep::Retire) => all.to_vec(),
                Some(CaRotationStep::Trust) => all[1..].to_vec(),
                Some(CaRotationStep::Issue) => all[2..].to_vec(),
            }
        }
    };
    let mut last = now;
    for step in steps {
        if step != CaRotationStep::Trust {
            wait_for_nodes(client, step, Duration::from_secs(args.wait_secs))?;
        }
        last = client.post(PATH, &StartCaRotationStep { step })?;
        if args.out.format == Format::Table {
            println!(
                "{}: done (new CA {})",
                name(step),
                last.new_sha256.as_deref().unwrap_or("?")
            );
        }
        if matches!(step, CaRotationStep::Trust | CaRotationStep::Retire) {
            write_trust(ca_file, &last.trust_pem, args.out.format)?;
        }
    }
    if !last.offline.is_empty() && args.out.format == Format::Table {
        println!(
            "offline during the rotation: {}. Once the old CA is retired they rejoin: give \
             each a join token (`hawser cluster join-token --node NAME`) or the new ca.pem",
            last.offline.join(", ")
        );
    }
    if args.out.format == Format::Json {
        print_json(&last);
    }
    Ok(())
}

/// Waits until no online node holds back `step`.
fn wait_for_nodes(client: &Client, step: CaRotationStep, limit: Duration) -> Result<(), CliError> {
    let start = Instant::now();
    loop {
        let now: CaRotation = client.get(PATH)?;
        if now.waiting_for.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(CliError::Client(format!(
                "`{}` waited {}s for node(s) {}: check that they are running and reach the \
                 controller, then run `hawser cluster rotate-ca` again (it goes on where it \
                 stopped)",
                name(step),
                limit.as_secs(),
                now.waiting_for.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Rewrites the CA file this CLI trusts with `pem` (a new file renamed over it).
fn write_trust(ca_file: Option<&Path>, pem: &str, format: Format) -> Result<(), CliError> {
    let Some(path) = ca_file else {
        if format == Format::Table {
            println!("no CA file to update (this CLI reached the controller without one)");
        }
        return Ok(());
    };
    let fail = |e: std::io::Error| CliError::Client(format!("write {}: {e}", path.display()));
    let tmp: PathBuf = path.with_extension("tmp-rotate-ca");
    let _ = std::fs::remove_file(&tmp);
    std::fs::write(&tmp, pem).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)?;
    if format == Format::Table {
        println!("{} now trusts what the cluster trusts", path.display());
    }
    Ok(())
}

fn show(r: &CaRotation, format: Format) -> Result<(), CliError> {
    if format == Format::Json {
        print_json(r);
        return Ok(());
    }
    match r.step {
        None => println!("the cluster's CA has never rotated"),
        Some(s) => {
            println!("last step: {}", name(s));
            println!("old CA: {}", r.old_sha256.as_deref().unwrap_or("?"));
            println!("new CA: {}", r.new_sha256.as_deref().unwrap_or("?"));
        }
    }
    if !r.waiting_for.is_empty() {
        println!("next step waits for: {}", r.waiting_for.join(", "));
    }
    if !r.offline.is_empty() {
        println!("offline: {}", r.offline.join(", "));
    }
    Ok(())
}
