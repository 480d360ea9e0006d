//! The results of a bench run: the JSON document written to `--json`, and the table printed
//! to stdout.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::cost::ServerCost;
use crate::fio::Percentiles;
use crate::procstat::PhaseStats;
use crate::suite::RatioMetric;

const MIB: f64 = 1048576.0;

/// Everything a run measured, and how.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub fio_version: String,
    /// Start of the run, RFC 3339 UTC.
    pub timestamp: String,
    pub runtime_secs: u64,
    pub size_bytes: u64,
    pub baseline: String,
    pub prefill: bool,
    pub targets: Vec<TargetInfo>,
    pub prefills: Vec<PrefillRun>,
    pub results: Vec<TestResult>,
    pub target_ratios: Vec<PairRatio>,
    pub processes: Vec<ProcessReport>,
    pub expectations: Vec<ExpectOutcome>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TargetInfo {
    pub name: String,
    pub kind: &'static str,
    pub spec: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PrefillRun {
    pub target: String,
    pub secs: f64,
    pub mib_per_sec: f64,
    pub command: Vec<String>,
}

/// One test on one target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TestResult {
    pub test: String,
    pub target: String,
    pub iops: f64,
    pub bw_bytes_per_sec: f64,
    pub mib_per_sec: f64,
    pub lat_mean_us: f64,
    /// Mean flush latency of the `_fsync` write test, which `lat_mean_us` does not include.
    pub sync_lat_mean_us: Option<f64>,
    /// p50 / p99 / p99.9 completion latency of the data I/Os (see `fio::Percentiles`).
    pub clat_percentiles_us: Option<Percentiles>,
    pub ratio_metric: RatioMetric,
    pub ratio_to_baseline: Option<f64>,
    /// Requests completed (data I/Os and flushes).
    pub requests: u64,
    /// fio's own CPU (user + system) and context switches per request: the client's cost.
    pub client_cpu_us_per_request: Option<f64>,
    pub client_ctx_switches_per_request: Option<f64>,
    /// The monitored processes' cost per request; `None` when none is monitored.
    pub server: Option<ServerCost>,
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PairRatio {
    pub target: String,
    pub base: String,
    pub test: String,
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcessReport {
    pub name: String,
    pub pid: u32,
    /// Before any test ran.
    pub idle: Option<PhaseStats>,
    /// While the tests (and prefills) ran.
    pub tests: Option<PhaseStats>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExpectOutcome {
    pub expectation: String,
    pub ratio: Option<f64>,
    pub pass: bool,
}

/// Writes the report as pretty JSON.
pub fn write_json(report: &Report, path: &Path) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report).context("serialize bench report")?;
    std::fs::write(path, text + "\n")
        .with_context(|| format!("write bench results to {}", path.display()))
}

/// The human-readable report: results table, then target ratios, processes, expectations.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    render_results(&mut out, report);
    render_costs(&mut out, report);
    render_pairs(&mut out, report);
    render_processes(&mut out, report);
    render_expectations(&mut out, report);
    out
}

/// `lat us` is fio's mean data I/O latency; with fsync=1 the flush that follows each write is
/// timed apart by fio, so it gets its own `fsync us` column.
fn render_results(out: &mut String, r: &Report) {
    let size_mib = r.size_bytes as f64 / MIB;
    let prefill = if r.prefill { "on" } else { "off" };
    let _ = writeln!(
        out,
        "{}, {} s per test, region {size_mib:.0} MiB, prefill {prefill}, baseline {}",
        r.fio_version, r.runtime_secs, r.baseline
    );
    let tw = width(r.results.iter().map(|x| x.test.as_str()), "test");
    let nw = width(r.results.iter().map(|x| x.target.as_str()), "target");
    let vs = format!("x {}", r.baseline);
    let _ = writeln!(
        out,
        "{:<tw$}  {:<nw$}  {:>10}  {:>9}  {:>10}  {:>10}  {vs:>9}",
        "test", "target", "IOPS", "MiB/s", "lat us", "fsync us"
    );
    for (test, x) in labelled(&r.results) {
        let _ = writeln!(
            out,
            "{test:<tw$}  {:<nw$}  {:>10.0}  {:>9.1}  {:>10.1}  {:>10}  {:>w$}",
            x.target,
            x.iops,
            x.mib_per_sec,
            x.lat_mean_us,
            fmt_opt(x.sync_lat_mean_us, 1),
            fmt_ratio(x.ratio_to_baseline),
            w = vs.len().max(9)
        );
    }
}

/// CPU time and context switches per request: of the monitored processes (`server`, summed;
/// the servers of other targets idle meanwhile) and of fio itself (`client`).
fn render_costs(out: &mut String, r: &Report) {
    if r.results.is_empty() {
        return;
    }
    let names: Vec<&str> = r.processes.iter().map(|p| p.name.as_str()).collect();
    let servers = if names.is_empty() {
        "none monitored".to_owned()
    } else {
        names.join(" + ")
    };
    let _ = writeln!(
        out,
        "\nCPU and context switches per request (server: {servers}; client: fio)"
    );
    let tw = width(r.results.iter().map(|x| x.test.as_str()), "test");
    let nw = width(r.results.iter().map(|x| x.target.as_str()), "target");
    let _ = writeln!(
        out,
        "{:<tw$}  {:<nw$}  {:>10}  {:>13}  {:>13}  {:>13}  {:>13}",
        "test",
        "target",
        "requests",
        "server us/req",
        "server cs/req",
        "client us/req",
        "client cs/req"
    );
    for (test, x) in labelled(&r.results) {
        let server = x.server.as_ref();
        let note = if server.is_some_and(|s| s.incomplete) {
            "  (a monitored process was gone)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{test:<tw$}  {:<nw$}  {:>10}  {:>13}  {:>13}  {:>13}  {:>13}{note}",
            x.target,
            x.requests,
            fmt_opt(server.and_then(|s| s.cpu_us_per_request), 1),
            fmt_opt(server.and_then(|s| s.ctx_switches_per_request), 2),
            fmt_opt(x.client_cpu_us_per_request, 1),
            fmt_opt(x.client_ctx_switches_per_request, 2),
        );
    }
}

fn render_pairs(out: &mut String, r: &Report) {
    if r.target_ratios.is_empty() {
        return;
    }
    let tw = width(r.target_ratios.iter().map(|p| p.test.as_str()), "test");
    let _ = writeln!(out, "\ntarget ratios (IOPS; bandwidth for 4M tests)");
    for p in &r.target_ratios {
        let pair = format!("{}/{}", p.target, p.base);
        let _ = writeln!(out, "{:<tw$}  {pair}  {}", p.test, fmt_ratio(p.ratio));
    }
}

fn render_processes(out: &mut String, r: &Report) {
    if r.processes.is_empty() {
        return;
    }
    let nw = width(r.processes.iter().map(|p| p.name.as_str()), "process");
    let _ = writeln!(out, "\nprocesses (CPU % of one core)");
    let _ = writeln!(
        out,
        "{:<nw$}  {:>8}  {:>10}  {:>12}  {:>11}  {:>15}",
        "process", "pid", "idle CPU %", "idle RSS MiB", "tests CPU %", "peak RSS MiB"
    );
    for p in &r.processes {
        let cpu = |s: &Option<PhaseStats>| fmt_opt(s.as_ref().and_then(|s| s.cpu_percent), 1);
        let mib = |b: Option<u64>| fmt_opt(b.map(|b| b as f64 / MIB), 1);
        let idle_rss = mib(p.idle.as_ref().and_then(|s| s.rss_mean_bytes));
        let peak = mib(p.tests.as_ref().and_then(|s| s.rss_peak_bytes));
        let exited = [&p.idle, &p.tests]
            .iter()
            .any(|s| s.as_ref().is_some_and(|s| s.exited));
        let note = if exited {
            "  (exited during the run)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{:<nw$}  {:>8}  {:>10}  {idle_rss:>12}  {:>11}  {peak:>15}{note}",
            p.name,
            p.pid,
            cpu(&p.idle),
            cpu(&p.tests),
        );
    }
}

fn render_expectations(out: &mut String, r: &Report) {
    if r.expectations.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nexpectations (reported, not enforced)");
    for e in &r.expectations {
        let verdict = if e.pass { "PASS" } else { "MISS" };
        let _ = writeln!(
            out,
            "{verdict}  {}  (measured {})",
            e.expectation,
            fmt_ratio(e.ratio)
        );
    }
}

/// Each result with the test name to print beside it: blank when it repeats the row above.
fn labelled(results: &[TestResult]) -> impl Iterator<Item = (&str, &TestResult)> {
    results.iter().enumerate().map(|(i, x)| {
        let repeats = i > 0 && results[i - 1].test == x.test;
        (if repeats { "" } else { x.test.as_str() }, x)
    })
}

fn width<'a>(names: impl Iterator<Item = &'a str>, header: &str) -> usize {
    names.map(str::len).chain([header.len()]).max().unwrap_or(0)
}

fn fmt_ratio(ratio: Option<f64>) -> String {
    fmt_opt(ratio, 3)
}

fn fmt_opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

/// Seconds since the Unix epoch as RFC 3339 UTC, e.g. `2026-11-22T04:14:36Z`.
pub fn rfc3339_utc(unix_secs: u64) -> String {
    let (y, m, d, hh, mm, ss) = hawser_api::time::utc(unix_secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratio::tests::result;

    fn sample_report() -> Report {
        let mut results = vec![
            result("randwrite_fsync", "file", 2000.0, RatioMetric::Iops),
            result("randwrite_fsync", "nbdkit", 500.0, RatioMetric::Iops),
        ];
        results[0].ratio_to_baseline = Some(1.0);
        results[1].sync_lat_mean_us = Some(1500.25);
        results[1].ratio_to_baseline = Some(0.25);
        results[1].server = Some(ServerCost {
            cpu_us_per_request: Some(42.54),
            ctx_switches_per_request: Some(1.75),
            processes: vec![],
            incomplete: true,
        });
        let phase = |cpu, rss| PhaseStats {
            secs: 5.0,
            samples: 25,
            cpu_percent: Some(cpu),
            rss_mean_bytes: Some(rss),
            rss_peak_bytes: Some(rss * 2),
            exited: false,
        };
        Report {
            fio_version: "fio-3.33".into(),
            timestamp: rfc3339_utc(0),
            runtime_secs: 10,
            size_bytes: 1 << 30,
            baseline: "file".into(),
            prefill: true,
            targets: vec![],
            prefills: vec![],
            results,
            target_ratios: vec![PairRatio {
                target: "nbdkit".into(),
                base: "file".into(),
                test: "randwrite_fsync".into(),
                ratio: Some(0.25),
            }],
            processes: vec![ProcessReport {
                name: "nbdkit".into(),
                pid: 4242,
                idle: Some(phase(0.5, 8 << 20)),
                tests: Some(phase(42.0, 10 << 20)),
            }],
            expectations: vec![ExpectOutcome {
                expectation: "nbdkit:randwrite_fsync>=0.95".into(),
                ratio: Some(0.25),
                pass: false,
            }],
        }
    }

    #[test]
    fn renders_the_table() {
        let text = render(&sample_report());
        let expected = "\
fio-3.33, 10 s per test, region 1024 MiB, prefill on, baseline file
test             target        IOPS      MiB/s      lat us    fsync us     x file
randwrite_fsync  file          2000        7.8       500.0           -      1.000
                 nbdkit         500        2.0      2000.0      1500.2      0.250

CPU and context switches per request (server: nbdkit; client: fio)
test             target    requests  server us/req  server cs/req  client us/req  client cs/req
randwrite_fsync  file          1000              -              -            5.0           0.50
                 nbdkit        1000           42.5           1.75            5.0           0.50  (a monitored process was gone)

target ratios (IOPS; bandwidth for 4M tests)
randwrite_fsync  nbdkit/file  0.250

processes (CPU % of one core)
process       pid  idle CPU %  idle RSS MiB  tests CPU %     peak RSS MiB
nbdkit       4242         0.5           8.0         42.0             20.0

expectations (reported, not enforced)
MISS  nbdkit:randwrite_fsync>=0.95  (measured 0.250)
";
        assert_eq!(text, expected, "got:\n{text}");
        assert!(
            text.lines()
                .all(|l| l.len() <= 100 || l.ends_with("(a monitored process was gone)")),
            "{text}"
        );
    }

    #[test]
    fn serializes_missing_ratios_as_null() -> anyhow::Result<()> {
        let mut report = sample_report();
        report.results[1].ratio_to_baseline = None;
        let json: serde_json::Value = serde_json::to_value(&report)?;
        assert!(json["results"][1]["ratio_to_baseline"].is_null());
        assert_eq!(json["results"][0]["ratio_metric"], "iops");
        assert_eq!(json["processes"][0]["tests"]["rss_peak_bytes"], 20 << 20);
        Ok(())
    }

    #[test]
    fn formats_timestamps() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951782400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1795320876), "2026-11-22T04:14:36Z");
    }
}
