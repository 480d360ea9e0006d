//! `hawser bench`: runs the standard 8-test fio comparison against block targets and prints
//! each target's ratio to the baseline, plus the CPU and memory of monitored processes.
//!
//! `plan` checks the arguments, `target` and `suite` define what is measured, `fio` runs and
//! parses fio, `procstat` samples processes, `cost` divides their CPU and context switches
//! by the requests of each test, `ratio` compares targets, `runner` sequences a run and
//! `report` prints and saves it; `chart` draws SVG charts beside the JSON (`chart_by_test`,
//! `chart_history`, from `chart_run`'s view of the JSON, on `chart_scale` axes, with `svg`).
//! `cluster_figures` are what the e2e tests of issue 44 measure (idle volumes, the control
//! plane at scale, failover), and `chart_cluster` charts them (`--cluster-charts`).

use std::path::PathBuf;

use anyhow::Context;

mod chart;
mod chart_by_test;
mod chart_cluster;
mod chart_files;
mod chart_history;
mod chart_run;
mod chart_scale;
pub mod cluster_figures;
mod cost;
mod fio;
mod plan;
mod procstat;
mod ratio;
mod report;
mod runner;
mod suite;
mod svg;
mod target;

/// Arguments of `hawser bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A target to measure, as NAME=SPEC. SPEC is `file:/path` (a regular file, created and
    /// preallocated to --size if missing, or a block device; libaio, O_DIRECT) or `nbd:URI`
    /// (fio's nbd engine, e.g. `nbd://127.0.0.1:10809/demo` or
    /// `nbd+unix:///demo?socket=/run/demo.sock`). Repeatable; the first is the baseline.
    #[arg(
        long = "target",
        value_name = "NAME=SPEC",
        required_unless_present_any = ["chart_only", "cluster_charts"]
    )]
    pub targets: Vec<String>,

    /// Target the ratios are computed against [default: the first --target].
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,

    /// Seconds each test runs on each target.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub runtime: u64,

    /// Region every test works on, e.g. 1GiB, 64MiB, 512M (units are binary, as in fio).
    #[arg(long, value_name = "SIZE", default_value = "1GiB")]
    pub size: String,

    /// Tests to run, comma separated [default: all]. They always run in the standard order.
    #[arg(
        long,
        value_name = "TEST,...",
        value_delimiter = ',',
        value_parser = clap::builder::PossibleValuesParser::new(suite::NAMES)
    )]
    pub tests: Vec<String>,

    /// Where to write all numbers, command lines and settings as JSON. The charts go beside
    /// it: `<stem>.<test>.svg` per test, and `<stem>.history.svg` with --history.
    #[arg(long, value_name = "PATH", default_value = "bench-results.json")]
    pub json: PathBuf,

    /// A directory of earlier results JSON files (`*.json`; others are ignored, and files
    /// that do not parse are skipped with a warning): also chart every target's ratio to the
    /// baseline run over run, this run included, as `<stem>.history.svg`.
    #[arg(long, value_name = "DIR")]
    pub history: Option<PathBuf>,

    /// Write no SVG charts.
    #[arg(long, conflicts_with_all = ["chart_only", "history"])]
    pub no_charts: bool,

    /// Run no test: redraw the charts of an earlier run's results JSON, beside it (with
    /// --history, the run-over-run chart too), e.g. to regenerate the charts in docs/bench.
    #[arg(long, value_name = "JSON", conflicts_with = "targets")]
    pub chart_only: Option<PathBuf>,

    /// Run no test: chart the cluster figures that `make bench`'s e2e tests appended to
    /// FIGURES (JSON lines; `HAWSER_BENCH_FIGURES` names the file): `<stem>.idle.svg`,
    /// `<stem>.api.svg` and `<stem>.failover.svg` beside it.
    #[arg(long, value_name = "FIGURES", conflicts_with_all = ["targets", "chart_only"])]
    pub cluster_charts: Option<PathBuf>,

    /// Report RSS and CPU of a process (e.g. a target's server) at rest before the tests and
    /// under load during them. Repeatable.
    #[arg(long = "monitor-pid", value_name = "NAME=PID")]
    pub monitor_pids: Vec<String>,

    /// Seconds monitored processes are sampled at rest before the tests.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub idle_secs: u64,

    /// Write the whole region of every target once before the first read test, so reads
    /// never hit unallocated holes (which would flatter thin targets). On by default.
    #[arg(long, overrides_with = "no_prefill")]
    pub prefill: bool,

    /// Skip the prefill.
    #[arg(long, overrides_with = "prefill")]
    pub no_prefill: bool,

    /// Also report NAME's ratio to BASE on every test (e.g. `hawser-1r:nbdkit`). Repeatable.
    #[arg(long = "targets-ratio", value_name = "NAME:BASE")]
    pub targets_ratios: Vec<String>,

    /// Print PASS/MISS for TARGET's ratio to BASE (default: the baseline) on TEST, e.g.
    /// `hawser-1r/nbdkit:randwrite>=0.95`. Reported only; never changes the exit code.
    #[arg(long = "expect", value_name = "TARGET[/BASE]:TEST>=RATIO")]
    pub expects: Vec<String>,

    /// The fio binary (3.x, built with the nbd engine for nbd: targets).
    #[arg(long, value_name = "PATH", default_value = "fio")]
    pub fio: String,
}

/// Runs `hawser bench`: all tests on all targets, then prints the table and writes the JSON
/// and the charts. With `--chart-only`, only redraws the charts of an earlier run.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(json) = &args.chart_only {
        return chart_files::redraw(json, args.history.as_deref());
    }
    if let Some(figures) = &args.cluster_charts {
        for path in chart_cluster::write(figures)? {
            eprintln!("wrote {}", path.display());
        }
        return Ok(());
    }
    let plan = plan::Plan::from_args(&args).context("check bench arguments")?;
    let report = runner::run(&plan)?;
    print!("{}", report::render(&report));
    report::write_json(&report, &plan.json_path)?;
    eprintln!("wrote {}", plan.json_path.display());
    if plan.charts {
        let run = chart_run::RunData::from_report(&report)?;
        let history = plan.history_dir.as_deref();
        for path in chart_files::write_charts(&run, &plan.json_path, history)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}
