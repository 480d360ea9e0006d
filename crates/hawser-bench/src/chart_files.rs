//! SVG charts of bench results, written beside the results JSON: `<stem>.<test>.svg` for each
//! test (`chart_by_test`) and, given a history directory, `<stem>.history.svg`, every target's
//! ratio to the baseline run over run (`chart_history`). For `bench-results.json` that is
//! `bench-results.randwrite.svg`, ..., `bench-results.history.svg`. This module names the
//! files and writes them; what the charts share is in `chart`.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::chart_run::{self, RunData};
use crate::{chart_by_test, chart_history};

/// Where the charts of the results at `json` go: its directory and file stem.
fn chart_path(json: &Path, suffix: &str) -> PathBuf {
    let stem = json
        .file_stem()
        .map_or_else(|| "bench-results".into(), |s| s.to_string_lossy());
    json.with_file_name(format!("{stem}.{suffix}.svg"))
}

/// A test name made safe as part of a file name: names come from the JSON, which may have
/// been edited, and `../x` must not write outside the directory.
fn file_part(test: &str) -> String {
    let safe: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() {
        "_".to_owned()
    } else {
        safe
    }
}

/// Writes the per-test charts of `run` beside `json` and, with `history`, the run-over-run
/// chart of `run` and the runs found there. Returns the files written; files of the history
/// directory that are not bench results are reported on stderr and left out.
pub fn write_charts(
    run: &RunData,
    json: &Path,
    history: Option<&Path>,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut written: Vec<PathBuf> = Vec::new();
    for test in chart_run::standard_order(&run.test_names()) {
        let mut path = chart_path(json, &file_part(test));
        // Two names that sanitize alike (`a/b`, `a_b`) must not overwrite each other.
        let mut n = 2;
        while written.contains(&path) {
            path = chart_path(json, &format!("{}-{n}", file_part(test)));
            n += 1;
        }
        write(&path, &chart_by_test::draw(run, test))?;
        written.push(path);
    }
    if let Some(dir) = history {
        let (earlier, skipped) = chart_run::load_history(dir)?;
        for s in &skipped {
            eprintln!(
                "warning: bench history: skipped {}: {}",
                s.path.display(),
                s.reason
            );
        }
        let runs = chart_run::timeline(run, earlier);
        let path = chart_path(json, "history");
        write(
            &path,
            &chart_history::draw(&runs, &dir.display().to_string()),
        )?;
        written.push(path);
    }
    Ok(written)
}

/// `hawser bench --chart-only JSON`: redraws the charts of an earlier run from its JSON,
/// without fio, e.g. to regenerate the charts in docs/bench.
pub fn redraw(json: &Path, history: Option<&Path>) -> anyhow::Result<()> {
    let run = RunData::read(json)?;
    for path in write_charts(&run, json, history)? {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn write(path: &Path, svg: &str) -> anyhow::Result<()> {
    std::fs::write(path, svg).with_context(|| format!("write chart {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fio::Percentiles;
    use crate::ratio::{self, tests::result};
    use crate::report::{self, Report, TargetInfo};
    use crate::suite::{self, RatioMetric};
    use anyhow::anyhow;

    /// A report of `tests` on `targets` (the first is the baseline); the others reach
    /// `ratio` of the baseline's IOPS, and the first of them has latency percentiles.
    fn report(timestamp: &str, targets: &[&str], tests: &[&str], ratio: f64) -> Report {
        let mut results = Vec::new();
        for test in tests {
            let metric = suite::by_name(test).map_or(RatioMetric::Iops, |t| t.ratio_metric());
            for (i, target) in targets.iter().enumerate() {
                let iops = if i == 0 { 1000.0 } else { 1000.0 * ratio };
                let mut r = result(test, target, iops, metric);
                if i == 1 {
                    r.clat_percentiles_us = Some(Percentiles {
                        p50: 400.0,
                        p99: 2000.0,
                        p99_9: 9000.0,
                    });
                }
                results.push(r);
            }
        }
        ratio::fill_baseline_ratios(&mut results, targets[0]);
        Report {
            fio_version: "fio-3.33".into(),
            timestamp: timestamp.into(),
            runtime_secs: 10,
            size_bytes: 1 << 30,
            baseline: targets[0].into(),
            prefill: true,
            targets: targets
                .iter()
                .map(|t| TargetInfo {
                    name: (*t).to_owned(),
                    kind: "file",
                    spec: format!("file:/tmp/{t}"),
                })
                .collect(),
            prefills: vec![],
            results,
            target_ratios: vec![],
            processes: vec![],
            expectations: vec![],
        }
    }

    fn parse(path: &Path) -> anyhow::Result<String> {
        let text = std::fs::read_to_string(path)?;
        roxmltree::Document::parse(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        assert!(!text.contains("<script"), "no JavaScript in a chart");
        Ok(text)
    }

    /// The hover texts of the groups of `class`, in document order.
    fn tooltips(svg: &str, class: &str) -> anyhow::Result<Vec<String>> {
        let doc = roxmltree::Document::parse(svg)?;
        let titles = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .map(|g| {
                g.first_element_child()
                    .and_then(|t| t.text())
                    .unwrap_or("")
                    .to_owned()
            });
        Ok(titles.collect())
    }

    fn texts(svg: &str) -> anyhow::Result<Vec<String>> {
        let doc = roxmltree::Document::parse(svg)?;
        let texts = doc.descendants().filter(|n| n.has_tag_name("text"));
        Ok(texts.filter_map(|n| n.text()).map(str::to_owned).collect())
    }

    #[test]
    fn every_test_gets_a_well_formed_chart_with_one_bar_per_target() -> anyhow::Result<()> {
        let hostile = "a<b&\"c'";
        let targets = ["base", hostile, "hawser-2r"];
        let r = report(
            "2026-01-01T00:00:00Z",
            &targets,
            &["read", "randwrite_fsync"],
            0.5,
        );
        let dir = tempfile::tempdir()?;
        let json = dir.path().join("results.json");
        let written = write_charts(&RunData::from_report(&r)?, &json, None)?;
        let names: Vec<_> = written.iter().filter_map(|p| p.file_name()).collect();
        assert_eq!(names, ["results.randwrite_fsync.svg", "results.read.svg"]);
        for (path, test) in written.iter().zip(["randwrite_fsync", "read"]) {
            let svg = parse(path)?;
            let bars = tooltips(&svg, "bar")?;
            assert_eq!(bars.len(), targets.len(), "{bars:?}");
            for (bar, target) in bars.iter().zip(targets) {
                assert!(bar.starts_with(&format!("{target}: ")), "{bar}");
            }
            let texts = texts(&svg)?;
            let ratios: Vec<_> = texts.iter().filter(|t| t.starts_with('×')).collect();
            assert_eq!(ratios, ["×1.000", "×0.500", "×0.500"], "{test}");
            assert!(
                texts.iter().any(|t| t == hostile),
                "names are drawn, escaped"
            );
            assert!(texts.iter().any(|t| t.contains("p99.9 9 ms")), "{texts:?}");
            assert!(
                texts.iter().any(|t| t.contains("no percentiles")),
                "{texts:?}"
            );
            let title = texts.first().ok_or_else(|| anyhow!("no title"))?;
            assert!(title.starts_with(test), "{title}");
        }
        let read = std::fs::read_to_string(&written[1])?;
        assert!(
            read.contains("bs=4M iodepth=16") && read.contains("MiB/s"),
            "{read}"
        );
        let fsync = std::fs::read_to_string(&written[0])?;
        assert!(fsync.contains("iodepth=1 numjobs=1 fsync=1") && fsync.contains("IOPS"));
        Ok(())
    }

    #[test]
    fn redrawing_from_the_json_gives_the_same_charts() -> anyhow::Result<()> {
        let r = report("2026-01-01T00:00:00Z", &["base", "x"], &["randread"], 0.8);
        let dir = tempfile::tempdir()?;
        let json = dir.path().join("bench-results.json");
        report::write_json(&r, &json)?;
        let drawn = write_charts(&RunData::from_report(&r)?, &json, None)?;
        let first = std::fs::read_to_string(&drawn[0])?;
        std::fs::remove_file(&drawn[0])?;
        redraw(&json, None)?;
        assert_eq!(std::fs::read_to_string(&drawn[0])?, first);
        Ok(())
    }

    #[test]
    fn charts_results_written_before_percentiles_were_kept() -> anyhow::Result<()> {
        let r = report("2026-01-01T00:00:00Z", &["base", "x"], &["randread"], 0.8);
        let mut value = serde_json::to_value(&r)?;
        for result in value["results"]
            .as_array_mut()
            .ok_or_else(|| anyhow!("results"))?
        {
            result
                .as_object_mut()
                .map(|o| o.remove("clat_percentiles_us"));
        }
        let dir = tempfile::tempdir()?;
        let json = dir.path().join("old.json");
        std::fs::write(&json, value.to_string())?;
        redraw(&json, None)?;
        let svg = parse(&dir.path().join("old.randread.svg"))?;
        assert_eq!(tooltips(&svg, "bar")?.len(), 2);
        assert!(!svg.contains("p99.9"), "no percentiles to show");
        Ok(())
    }

    /// The history chart's points whose hover text starts with `prefix`: (text, cx, cy).
    fn points(svg: &str, prefix: &str) -> anyhow::Result<Vec<(String, f64, f64)>> {
        let doc = roxmltree::Document::parse(svg)?;
        let points = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("point"))
            .filter_map(|g| {
                let tip = g.first_element_child()?.text()?.to_owned();
                let circle = g.children().find(|n| n.has_tag_name("circle"))?;
                let cx: f64 = circle.attribute("cx")?.parse().ok()?;
                let cy: f64 = circle.attribute("cy")?.parse().ok()?;
                Some((tip, cx, cy))
            })
            .filter(|(tip, _, _)| tip.starts_with(prefix));
        Ok(points.collect())
    }

    #[test]
    fn history_orders_runs_by_timestamp_and_skips_garbage() -> anyhow::Result<()> {
        let targets = ["baseline", "hawser-2r"];
        let tests = ["randwrite", "read"];
        let dir = tempfile::tempdir()?;
        let history = dir.path().join("history");
        std::fs::create_dir(&history)?;
        // File names deliberately out of time order; the dip is the middle run.
        let runs = [
            ("b.json", "2026-01-01T10:00:00Z", 0.9),
            ("a.json", "2026-01-02T10:00:00Z", 0.5),
            ("c.json", "2026-01-03T10:00:00Z", 0.95),
        ];
        for (file, timestamp, ratio) in runs {
            report::write_json(
                &report(timestamp, &targets, &tests, ratio),
                &history.join(file),
            )?;
        }
        std::fs::write(history.join("garbage.json"), "{\"timestamp\": \"2026-")?;
        let undated = report("yesterday", &targets, &tests, 0.1);
        report::write_json(&undated, &history.join("undated.json"))?;
        std::fs::write(history.join("notes.txt"), "not results, not a warning")?;

        let (found, skipped) = chart_run::load_history(&history)?;
        assert_eq!(found.len(), 3);
        let skipped: Vec<_> = skipped.iter().filter_map(|s| s.path.file_name()).collect();
        assert_eq!(skipped, ["garbage.json", "undated.json"]);

        // The current run is c.json's: its copy in the history is not counted twice.
        let current = report("2026-01-03T10:00:00Z", &targets, &tests, 0.95);
        let json = dir.path().join("bench-results.json");
        let written = write_charts(&RunData::from_report(&current)?, &json, Some(&history))?;
        let path = written.last().ok_or_else(|| anyhow!("no charts"))?;
        assert_eq!(path.file_name(), Some("bench-results.history.svg".as_ref()));
        let svg = parse(path)?;
        let points = points(&svg, "hawser-2r, randwrite,")?;
        let stamps: Vec<&str> = points
            .iter()
            .filter_map(|p| p.0.rsplit_once(": ")?.0.rsplit(", ").next())
            .collect();
        assert_eq!(
            stamps,
            [
                "2026-01-01T10:00:00Z",
                "2026-01-02T10:00:00Z",
                "2026-01-03T10:00:00Z"
            ]
        );
        assert!(
            points[0].1 < points[1].1 && points[1].1 < points[2].1,
            "{points:?}"
        );
        assert!(
            points[1].2 > points[0].2 && points[1].2 > points[2].2,
            "a dip: {points:?}"
        );
        assert!(points[1].0.ends_with("×0.500"), "{points:?}");
        // One line per (target, test): the baseline's is the dashed reference, not a line.
        let doc = roxmltree::Document::parse(&svg)?;
        let lines = doc.descendants().filter(|n| n.has_tag_name("polyline"));
        assert_eq!(lines.count(), 2);
        Ok(())
    }

    #[test]
    fn names_charts_beside_the_json() {
        let json = Path::new("/r/bench-results.json");
        assert_eq!(
            chart_path(json, "read"),
            Path::new("/r/bench-results.read.svg")
        );
        assert_eq!(
            chart_path(json, "history"),
            Path::new("/r/bench-results.history.svg")
        );
        assert_eq!(file_part("../x y"), "___x_y");
        assert_eq!(file_part(""), "_");
    }

    #[test]
    fn two_tests_whose_names_sanitize_alike_get_two_files() -> anyhow::Result<()> {
        let r = report("2026-01-01T00:00:00Z", &["base"], &["a/b", "a_b"], 1.0);
        let dir = tempfile::tempdir()?;
        let written = write_charts(&RunData::from_report(&r)?, &dir.path().join("r.json"), None)?;
        let names: Vec<_> = written.iter().filter_map(|p| p.file_name()).collect();
        assert_eq!(names, ["r.a_b.svg", "r.a_b-2.svg"]);
        Ok(())
    }
}
