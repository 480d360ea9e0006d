//! The cluster figures of `make bench` (issue 44): what idle attached volumes cost an agent,
//! how the API answers as the volume count grows, and how long failover takes. The e2e tests
//! that measure them (`idle_volumes`, `control_plane_scale`, `k8s_failover`) append one JSON
//! line each to the file `HAWSER_BENCH_FIGURES` names; `hawser bench --cluster-charts FILE`
//! charts them (`chart_cluster`).
//!
//! JSON lines rather than one document: each test is a separate process, a run that stops
//! half-way keeps what it measured, and a line that does not parse is skipped, not fatal.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Names the file the measuring tests append to; unset, they only print.
pub const FIGURES_ENV: &str = "HAWSER_BENCH_FIGURES";

/// One measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Figure {
    Idle(IdleFigure),
    Api(ApiFigure),
    Failover(FailoverFigure),
}

/// The cluster at rest with `volumes` attached (`idle_volumes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleFigure {
    pub volumes: u64,
    /// Engines spread over the nodes in turn, rather than all on the first.
    pub spread: bool,
    pub processes: Vec<ProcessCost>,
}

/// What one process cost over the idle window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessCost {
    /// `n1`, `n2`, `n3` (agents) or `controller`.
    pub name: String,
    /// Percent of one core.
    pub cpu_pct: f64,
    pub rss_mib: u64,
    pub fds: u64,
    pub threads: u64,
}

/// The control plane with `volumes` volumes on `store` (`control_plane_scale`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiFigure {
    /// `embedded`, `etcd` or `kubernetes`.
    pub store: String,
    pub volumes: u64,
    pub create_ms: Quantiles,
    pub attach_ms: Quantiles,
    pub detach_ms: Quantiles,
    pub delete_ms: Quantiles,
    /// `GET /v1/volumes` without paging.
    pub list_whole_ms: f64,
    /// Every page of 1,000.
    pub list_pages_ms: f64,
    /// `hawser volume list`.
    pub cli_list_ms: f64,
    pub controller_rss_mib: u64,
    /// The controller at rest with every volume created, percent of one core.
    pub controller_idle_pct: f64,
    pub store_mib: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p99: f64,
}

/// Power losses of a node under a pod (`k8s_failover`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverFigure {
    pub trials: u64,
    /// The kubelets' `nodeStatusUpdateFrequency`.
    pub kubelet_status_secs: u64,
    /// Fault to the first acknowledged write on the other node.
    pub first_write_s: Spread,
    /// Fault to the pod deleted: Hawser's part.
    pub pod_deleted_s: Spread,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub worst: f64,
}

/// Appends `figure` to the file `HAWSER_BENCH_FIGURES` names, if it names one.
pub fn record(figure: &Figure) -> anyhow::Result<()> {
    match std::env::var_os(FIGURES_ENV) {
        Some(path) if !path.is_empty() => append(Path::new(&path), figure),
        _ => Ok(()),
    }
}

/// Appends `figure` to `path` as one line.
pub fn append(path: &Path, figure: &Figure) -> anyhow::Result<()> {
    let mut line = serde_json::to_string(figure).context("encode a bench figure")?;
    line.push('\n');
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    // One write per line: tests that append at once do not interleave within a line.
    file.write_all(line.as_bytes())
        .with_context(|| format!("append to {}", path.display()))
}

/// The figures in `path`, in order, and a description of each line that did not parse.
pub fn read(path: &Path) -> anyhow::Result<(Vec<Figure>, Vec<String>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    Ok(parse(&text))
}

fn parse(text: &str) -> (Vec<Figure>, Vec<String>) {
    let mut figures = Vec::new();
    let mut skipped = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(f) => figures.push(f),
            Err(e) => skipped.push(format!("line {}: {e}", i + 1)),
        }
    }
    (figures, skipped)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn idle(volumes: u64, agent_pct: f64, rss: u64) -> Figure {
        let process = |name: &str, cpu_pct: f64, rss_mib: u64| ProcessCost {
            name: name.into(),
            cpu_pct,
            rss_mib,
            fds: 40,
            threads: 6,
        };
        Figure::Idle(IdleFigure {
            volumes,
            spread: false,
            processes: vec![
                process("n1", agent_pct, rss),
                process("controller", agent_pct / 2.0, rss / 2),
            ],
        })
    }

    pub(crate) fn api(store: &str, volumes: u64, create_p50: f64) -> Figure {
        let q = Quantiles {
            p50: create_p50,
            p99: create_p50 * 3.0,
        };
        Figure::Api(ApiFigure {
            store: store.into(),
            volumes,
            create_ms: q,
            attach_ms: q,
            detach_ms: q,
            delete_ms: q,
            list_whole_ms: volumes as f64 / 100.0,
            list_pages_ms: volumes as f64 / 50.0,
            cli_list_ms: volumes as f64 / 40.0,
            controller_rss_mib: 30 + volumes / 100,
            controller_idle_pct: 1.5,
            store_mib: volumes as f64 / 1000.0,
        })
    }

    pub(crate) fn failover(kubelet_status_secs: u64, median: f64) -> Figure {
        Figure::Failover(FailoverFigure {
            trials: 10,
            kubelet_status_secs,
            first_write_s: Spread {
                median,
                worst: median + 2.0,
            },
            pod_deleted_s: Spread {
                median: median / 2.0,
                worst: median / 2.0 + 1.0,
            },
        })
    }

    #[test]
    fn figures_append_as_lines_and_a_bad_line_is_skipped() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("figures.jsonl");
        let all = [idle(10, 0.5, 30), api("etcd", 100, 12.0), failover(2, 6.8)];
        for f in &all {
            append(&path, f)?;
        }
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str("{\"kind\":\"idle\",\"volumes\":\n\n{\"kind\":\"bogus\"}\n");
        std::fs::write(&path, text)?;
        let (read_back, skipped) = read(&path)?;
        assert_eq!(read_back, all);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].starts_with("line 4:"), "{skipped:?}");
        assert!(read(&dir.path().join("missing")).is_err());
        Ok(())
    }
}
