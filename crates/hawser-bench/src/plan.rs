//! Turns `BenchArgs` into a checked `Plan`, so a typo fails before minutes of fio runs.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{bail, ensure, Context};

use crate::ratio::{Expectation, TargetPair};
use crate::suite::{self, TestDef};
use crate::target::{is_valid_name, Target};
use crate::BenchArgs;

/// The largest 4M test needs at least one whole block, and 4k tests need aligned offsets.
const MIN_SIZE_BYTES: u64 = 4 << 20;
const SIZE_ALIGN_BYTES: u64 = 4096;

/// A process whose RSS and CPU time are sampled during the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Monitor {
    pub name: String,
    pub pid: u32,
}

/// A validated bench run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub targets: Vec<Target>,
    /// Index into `targets`.
    pub baseline: usize,
    pub tests: Vec<TestDef>,
    pub runtime_secs: u64,
    pub size_bytes: u64,
    pub json_path: PathBuf,
    /// Draw SVG charts beside the JSON.
    pub charts: bool,
    /// Earlier results for the run-over-run chart.
    pub history_dir: Option<PathBuf>,
    pub monitors: Vec<Monitor>,
    pub idle_secs: u64,
    pub prefill: bool,
    pub pairs: Vec<TargetPair>,
    pub expectations: Vec<Expectation>,
    pub fio: String,
}

impl Plan {
    pub fn from_args(args: &BenchArgs) -> anyhow::Result<Plan> {
        let targets = parse_targets(&args.targets)?;
        let baseline = match &args.baseline {
            Some(name) => targets
                .iter()
                .position(|t| &t.name == name)
                .with_context(|| format!("baseline {name} is no target"))?,
            None => 0,
        };
        ensure!(args.runtime >= 1, "--runtime must be at least 1 second");
        let size_bytes =
            parse_size(&args.size).with_context(|| format!("parse --size {}", args.size))?;
        let tests = suite::select(&args.tests)?;
        let (pairs, expectations) = parse_comparisons(args, &targets)?;
        let monitors = parse_all(&args.monitor_pids, parse_monitor)?;
        if let Some(dir) = &args.history {
            // Checked now: finding out after minutes of fio would lose the history chart.
            ensure!(
                dir.is_dir(),
                "--history {} is not a directory",
                dir.display()
            );
        }
        Ok(Plan {
            targets,
            baseline,
            tests,
            runtime_secs: args.runtime,
            size_bytes,
            json_path: args.json.clone(),
            charts: !args.no_charts,
            history_dir: args.history.clone(),
            monitors,
            idle_secs: args.idle_secs,
            prefill: !args.no_prefill,
            pairs,
            expectations,
            fio: args.fio.clone(),
        })
    }

    pub fn baseline_name(&self) -> &str {
        &self.targets[self.baseline].name
    }
}

fn parse_all<T>(
    items: &[String],
    parse: impl Fn(&str) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<T>> {
    items.iter().map(|item| parse(item)).collect()
}

fn parse_targets(specs: &[String]) -> anyhow::Result<Vec<Target>> {
    let targets = parse_all(specs, Target::parse)?;
    ensure!(!targets.is_empty(), "give at least one --target NAME=SPEC");
    let mut seen = HashSet::new();
    if let Some(dup) = targets.iter().find(|t| !seen.insert(t.name.as_str())) {
        bail!("target name {} is given twice", dup.name);
    }
    Ok(targets)
}

/// `--targets-ratio` and `--expect`, with every name they mention checked.
fn parse_comparisons(
    args: &BenchArgs,
    targets: &[Target],
) -> anyhow::Result<(Vec<TargetPair>, Vec<Expectation>)> {
    let known = |name: &str| -> anyhow::Result<()> {
        ensure!(
            targets.iter().any(|t| t.name == name),
            "no target is named {name}"
        );
        Ok(())
    };
    let pairs = parse_all(&args.targets_ratios, TargetPair::parse)?;
    for pair in &pairs {
        known(&pair.target)?;
        known(&pair.base)?;
    }
    let expectations = parse_all(&args.expects, Expectation::parse)?;
    for e in &expectations {
        known(&e.target)?;
        e.base.as_deref().map_or(Ok(()), known)?;
        let test_exists = suite::by_name(&e.test).is_some();
        ensure!(
            test_exists,
            "--expect {}: there is no test {}",
            e.text,
            e.test
        );
    }
    Ok((pairs, expectations))
}

/// `NAME=PID`, checked against /proc now rather than after the first test.
fn parse_monitor(text: &str) -> anyhow::Result<Monitor> {
    let (name, pid) = text
        .split_once('=')
        .with_context(|| format!("{text:?} is not NAME=PID"))?;
    ensure!(
        is_valid_name(name),
        "monitor name {name:?} must be [A-Za-z0-9_.-]+"
    );
    let pid: u32 = pid.parse().with_context(|| format!("parse pid {pid:?}"))?;
    crate::procstat::sample(pid).with_context(|| format!("sample monitored process {name}"))?;
    Ok(Monitor {
        name: name.to_owned(),
        pid,
    })
}

/// Parses `1GiB`, `64MiB`, `512M`, `4096`. Units are binary whether or not they say `i`, as
/// in fio (its default kb_base is 1024).
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: u64 = number.parse().context("read the number of the size")?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => bail!("unknown size unit {other:?}"),
    };
    let bytes = number
        .checked_mul(1 << shift)
        .context("size overflows u64")?;
    ensure!(
        bytes >= MIN_SIZE_BYTES,
        "size must be at least 4 MiB (one 4M block)"
    );
    ensure!(
        bytes % SIZE_ALIGN_BYTES == 0,
        "size must be a multiple of 4 KiB"
    );
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn plan(argv: &[&str]) -> anyhow::Result<Plan> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(argv.iter().copied()))?;
        Plan::from_args(&cli.args)
    }

    #[test]
    fn parses_sizes() -> anyhow::Result<()> {
        assert_eq!(parse_size("1GiB")?, 1 << 30);
        assert_eq!(parse_size("64MiB")?, 64 << 20);
        assert_eq!(parse_size("512M")?, 512 << 20);
        assert_eq!(parse_size("8388608")?, 8 << 20);
        for bad in ["", "1", "1MiB", "5000000", "1PiB", "GiB", "99999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn defaults_and_overrides() -> anyhow::Result<()> {
        let p = plan(&["--target", "a=file:/tmp/a", "--target", "b=nbd:nbd://h/e"])?;
        assert_eq!(
            (p.baseline_name(), p.runtime_secs, p.size_bytes),
            ("a", 10, 1 << 30)
        );
        assert_eq!((p.tests.len(), p.prefill, p.idle_secs), (8, true, 5));
        assert_eq!(p.json_path, PathBuf::from("bench-results.json"));
        assert!(p.charts && p.history_dir.is_none());
        let tmp = std::env::temp_dir();
        let history = format!("--history={}", tmp.display());
        let p = plan(&["--target=a=file:/tmp/a", &history])?;
        assert_eq!(p.history_dir.as_deref(), Some(tmp.as_path()));
        assert!(!plan(&["--target=a=file:/tmp/a", "--no-charts"])?.charts);
        let p = plan(&[
            "--target=a=file:/tmp/a",
            "--target=b=nbd:nbd://h/e",
            "--baseline=b",
            "--tests=read,randwrite",
            "--no-prefill",
            "--targets-ratio=a:b",
            "--expect=a/b:read>=0.9",
        ])?;
        assert_eq!(p.baseline_name(), "b");
        assert_eq!(
            p.tests.iter().map(|t| t.name).collect::<Vec<_>>(),
            ["randwrite", "read"]
        );
        assert!(!p.prefill);
        let p = plan(&["--target=a=file:/tmp/a", "--no-prefill", "--prefill"])?;
        assert!(p.prefill, "the last of --prefill/--no-prefill wins");
        Ok(())
    }

    #[test]
    fn chart_only_needs_no_target() -> anyhow::Result<()> {
        let cli = Cli::try_parse_from(["bench", "--chart-only=r.json", "--history=/tmp"])?;
        assert_eq!(cli.args.chart_only, Some(PathBuf::from("r.json")));
        assert!(cli.args.targets.is_empty());
        assert!(
            Cli::try_parse_from(["bench"]).is_err(),
            "a run needs a target"
        );
        assert!(Cli::try_parse_from(["bench", "--chart-only=r.json", "--no-charts"]).is_err());
        let cli = Cli::try_parse_from(["bench", "--cluster-charts=f.jsonl"])?;
        assert_eq!(cli.args.cluster_charts, Some(PathBuf::from("f.jsonl")));
        let both = [
            "bench",
            "--cluster-charts=f.jsonl",
            "--target=a=file:/tmp/a",
        ];
        assert!(
            Cli::try_parse_from(both).is_err(),
            "charts or a run, not both"
        );
        Ok(())
    }

    #[test]
    fn rejects_inconsistent_arguments() {
        let t = "--target=a=file:/tmp/a";
        for argv in [
            vec![],
            vec![t, t],
            vec![t, "--baseline=z"],
            vec![t, "--tests=nope"],
            vec![t, "--targets-ratio=a:z"],
            vec![t, "--expect=a:nope>=1"],
            vec![t, "--expect=z:read>=1"],
            vec![t, "--runtime=0"],
            vec![t, "--monitor-pid=x=notapid"],
            vec![t, "--history=/nonexistent/hawser-bench-history"],
            vec![t, "--no-charts", "--history=/tmp"],
            vec![t, "--chart-only=x.json"],
        ] {
            assert!(plan(&argv).is_err(), "{argv:?} must be rejected");
        }
    }
}
