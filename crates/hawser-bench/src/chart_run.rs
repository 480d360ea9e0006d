//! What the charts read: the part of a results JSON they draw, whether the run just finished
//! or files of earlier runs. Both go through the JSON form, so a chart redrawn from a file is
//! the chart the run drew. Fields added to the report later (the latency percentiles) default
//! when missing, so older files still chart.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context};
use serde::Deserialize;

use crate::fio::Percentiles;
use crate::report::Report;
use crate::suite::{self, RatioMetric};

/// One run, as the charts see it.
#[derive(Debug, Clone, Deserialize)]
pub struct RunData {
    /// RFC 3339 UTC (`2026-11-27T02:23:33Z`): in this fixed form, text order is time order.
    pub timestamp: String,
    #[serde(default)]
    pub fio_version: String,
    #[serde(default)]
    pub runtime_secs: u64,
    #[serde(default)]
    pub size_bytes: u64,
    pub baseline: String,
    #[serde(default)]
    pub targets: Vec<TargetName>,
    pub results: Vec<ResultData>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TargetName {
    pub name: String,
}

/// One test on one target.
#[derive(Debug, Clone, Deserialize)]
pub struct ResultData {
    pub test: String,
    pub target: String,
    pub iops: f64,
    pub mib_per_sec: f64,
    pub lat_mean_us: f64,
    #[serde(default)]
    pub sync_lat_mean_us: Option<f64>,
    #[serde(default)]
    pub clat_percentiles_us: Option<Percentiles>,
    pub ratio_metric: RatioMetric,
    #[serde(default)]
    pub ratio_to_baseline: Option<f64>,
    /// fio's command line, where the chart titles find the workload's parameters.
    #[serde(default)]
    pub command: Vec<String>,
}

impl ResultData {
    /// The figure the ratio divides, in the unit the chart shows: IOPS, or MiB/s for the 4M
    /// sequential tests (the same ratio as bytes per second).
    pub fn metric_value(&self) -> f64 {
        match self.ratio_metric {
            RatioMetric::Iops => self.iops,
            RatioMetric::Bandwidth => self.mib_per_sec,
        }
    }

    /// The value of `--NAME=VALUE` in fio's command line.
    pub fn fio_arg(&self, name: &str) -> Option<&str> {
        let prefix = format!("--{name}=");
        self.command.iter().find_map(|a| a.strip_prefix(&prefix))
    }
}

impl RunData {
    /// The view of a report the run just made, via its JSON form.
    pub fn from_report(report: &Report) -> anyhow::Result<RunData> {
        let value = serde_json::to_value(report).context("serialize bench report for charts")?;
        let run: RunData = serde_json::from_value(value).context("read bench report for charts")?;
        run.check()?;
        Ok(run)
    }

    /// Reads a results JSON written by `hawser bench`.
    pub fn read(path: &Path) -> anyhow::Result<RunData> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read bench results {}", path.display()))?;
        let run: RunData = serde_json::from_str(&text)
            .with_context(|| format!("parse bench results {}", path.display()))?;
        run.check()
            .with_context(|| format!("check bench results {}", path.display()))?;
        Ok(run)
    }

    fn check(&self) -> anyhow::Result<()> {
        ensure!(
            is_rfc3339_utc(&self.timestamp),
            "timestamp {:?} is not RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)",
            self.timestamp
        );
        Ok(())
    }

    /// Target names in the order the run gave them, then any only the results name.
    pub fn target_names(&self) -> Vec<&str> {
        let listed = self.targets.iter().map(|t| t.name.as_str());
        unique(listed.chain(self.results.iter().map(|r| r.target.as_str())))
    }

    /// Test names in the order they ran.
    pub fn test_names(&self) -> Vec<&str> {
        unique(self.results.iter().map(|r| r.test.as_str()))
    }

    pub fn result(&self, test: &str, target: &str) -> Option<&ResultData> {
        self.results
            .iter()
            .find(|r| r.test == test && r.target == target)
    }
}

/// `items` without repeats, in first-seen order.
pub fn unique<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen: Vec<&str> = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

/// Tests in the standard order, then unknown names (from hand-edited or future files) in
/// first-seen order, so every chart lists them alike.
pub fn standard_order<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let known = suite::NAMES
        .iter()
        .filter_map(|n| names.iter().find(|m| *m == n).copied());
    let unknown = names
        .iter()
        .filter(|n| suite::by_name(n).is_none())
        .copied();
    known.chain(unknown).collect()
}

/// `YYYY-MM-DDTHH:MM:SSZ`, the form `report::rfc3339_utc` writes.
fn is_rfc3339_utc(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 20
        && bytes.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            10 => *b == b'T',
            13 | 16 => *b == b':',
            19 => *b == b'Z',
            _ => b.is_ascii_digit(),
        })
}

/// A results file of the history directory that was left out, and why.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// The runs of a history directory: every `*.json` in it that reads as bench results. A file
/// that does not is skipped, not fatal: one truncated copy must not stop a run's charts.
pub fn load_history(dir: &Path) -> anyhow::Result<(Vec<RunData>, Vec<Skipped>)> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("list bench history directory {}", dir.display()))?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry =
            entry.with_context(|| format!("list bench history directory {}", dir.display()))?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    let (mut runs, mut skipped) = (Vec::new(), Vec::new());
    for path in paths {
        match RunData::read(&path) {
            Ok(run) => runs.push(run),
            Err(err) => skipped.push(Skipped {
                reason: format!("{err:#}"),
                path,
            }),
        }
    }
    Ok((runs, skipped))
}

/// The runs of the run-over-run chart: `current` and `history`, oldest first. A history run
/// with the current run's timestamp is the current run copied there, and is dropped.
pub fn timeline(current: &RunData, history: Vec<RunData>) -> Vec<RunData> {
    let mut runs: Vec<RunData> = history
        .into_iter()
        .filter(|r| r.timestamp != current.timestamp)
        .collect();
    runs.push(current.clone());
    // Stable: runs of one second keep file-name order.
    runs.sort_by(|a, b| a.timestamp.cmp(&b.timestamp));
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_timestamp_form_the_report_writes() {
        assert!(is_rfc3339_utc("2026-11-27T02:23:33Z"));
        for bad in [
            "",
            "2026-11-27 02:23:33Z",
            "2026-11-27T02:23:33+01:00",
            "yesterday",
        ] {
            assert!(!is_rfc3339_utc(bad), "{bad}");
        }
    }

    #[test]
    fn orders_tests_as_the_suite_does() {
        let names = ["zzz", "read", "randwrite_fsync"];
        assert_eq!(standard_order(&names), ["randwrite_fsync", "read", "zzz"]);
        assert_eq!(unique(["a", "b", "a"].into_iter()), ["a", "b"]);
    }
}
