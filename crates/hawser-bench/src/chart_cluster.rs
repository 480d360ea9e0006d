//! The cluster charts of `make bench` (issue 44), from `cluster_figures`:
//! - `<stem>.idle.svg`: each process's CPU and RSS against the volumes attached at rest;
//! - `<stem>.api.svg`: create latency, a whole list, and the controller's RSS and idle CPU
//!   against the volume count, a line per store;
//! - `<stem>.failover.svg`: fault to first write elsewhere and fault to pod deleted, median
//!   with the worst as a whisker, per kubelet setting, against the 10 s target and the
//!   peers' published figures.
//!
//! Volume counts go on a log axis (10, 100, 1,000, 10,000), values on linear axes from zero:
//! the question is whether a line stays flat, and a log y axis would flatten every line.
//! Each target of issue 44 is a dashed grey line, so a miss shows without reading numbers.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::chart::{self, Colour, AXIS, GRID, MUTED, WIDTH};
use crate::chart_run;
use crate::chart_scale::{fmt_count, sig3, ticks_from_zero, Linear, Log};
use crate::cluster_figures::{self, ApiFigure, FailoverFigure, Figure, IdleFigure};
use crate::svg::{Stroke, Svg, TextStyle};

const COLUMNS: usize = 2;
const PANEL_WIDTH: f64 = 380.0;
const PANEL_HEIGHT: f64 = 200.0;
const PLOT_LEFT: f64 = 48.0;
const PLOT_RIGHT: f64 = 16.0;
const PLOT_TOP: f64 = 26.0;
const PLOT_BOTTOM: f64 = 34.0;
const TARGET: Colour = chart::BASELINE;

/// Failover figures the peers publish, seconds: drawn beside Hawser's where they fit.
const PIRAEUS_S: f64 = 10.0;

/// `hawser bench --cluster-charts FIGURES`: the three charts beside `figures`; returns the
/// files written. Lines that do not parse are reported on stderr and left out.
pub fn write(figures: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let (all, skipped) = cluster_figures::read(figures)?;
    for s in &skipped {
        eprintln!("warning: {}: skipped {s}", figures.display());
    }
    let stem = figures
        .file_stem()
        .map_or_else(|| "bench-cluster".into(), |s| s.to_string_lossy());
    let mut written = Vec::new();
    for (suffix, svg) in [
        ("idle", draw_idle(&all)),
        ("api", draw_api(&all)),
        ("failover", draw_failover(&all)),
    ] {
        let path = figures.with_file_name(format!("{stem}.{suffix}.svg"));
        std::fs::write(&path, svg).with_context(|| format!("write chart {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// One line of a panel: `(volumes, value)` points.
struct Series {
    label: String,
    colour: Colour,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

struct Panel {
    title: String,
    series: Vec<Series>,
    /// Issue 44's bound for this value, drawn dashed.
    target: Option<f64>,
}

/// The idle chart: a panel for CPU, one for RSS; a line per process.
pub fn draw_idle(all: &[Figure]) -> String {
    let figures: Vec<&IdleFigure> = all
        .iter()
        .filter_map(|f| match f {
            Figure::Idle(i) => Some(i),
            _ => None,
        })
        .collect();
    let key = |f: &IdleFigure, name: &str| match f.spread {
        true => format!("{name} (engines spread)"),
        false => name.to_owned(),
    };
    let mut names: Vec<String> = Vec::new();
    for f in &figures {
        for p in &f.processes {
            let name = key(f, &p.name);
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    let series = |value: fn(&cluster_figures::ProcessCost) -> f64| -> Vec<Series> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| Series {
                label: name.clone(),
                colour: chart::colour(i),
                dashed: false,
                points: figures
                    .iter()
                    .flat_map(|f| {
                        f.processes
                            .iter()
                            .filter(|p| key(f, &p.name) == *name)
                            .map(|p| (f.volumes as f64, value(p)))
                    })
                    .collect(),
            })
            .collect()
    };
    let panels = [
        Panel {
            title: "CPU at rest, % of one core".into(),
            series: series(|p| p.cpu_pct),
            target: Some(5.0),
        },
        Panel {
            title: "RSS, MiB".into(),
            series: series(|p| p.rss_mib as f64),
            target: Some(128.0),
        },
    ];
    let subtitle = "2-replica volumes attached on n1 (3 agents, 1 controller); dashed: \
                    n1's target";
    draw_panels("Idle cost against attached volumes", subtitle, &panels)
}

/// The API chart: a line per store in each of four panels.
pub fn draw_api(all: &[Figure]) -> String {
    let figures: Vec<&ApiFigure> = all
        .iter()
        .filter_map(|f| match f {
            Figure::Api(a) => Some(a),
            _ => None,
        })
        .collect();
    let stores = chart_run::unique(figures.iter().map(|f| f.store.as_str()));
    let line =
        |store: &str, i: usize, label: &str, dashed: bool, value: &dyn Fn(&ApiFigure) -> f64| {
            Series {
                label: format!("{store}{label}"),
                colour: chart::colour(i),
                dashed,
                points: figures
                    .iter()
                    .filter(|f| f.store == store)
                    .map(|f| (f.volumes as f64, value(f)))
                    .collect(),
            }
        };
    let per_store = |value: &dyn Fn(&ApiFigure) -> f64| -> Vec<Series> {
        stores
            .iter()
            .enumerate()
            .map(|(i, s)| line(s, i, "", false, value))
            .collect()
    };
    let mut create = Vec::new();
    for (i, s) in stores.iter().enumerate() {
        create.push(line(s, i, " p50", false, &|f| f.create_ms.p50));
        create.push(line(s, i, " p99", true, &|f| f.create_ms.p99));
    }
    let panels = [
        Panel {
            title: "Create, ms (p50 solid, p99 dashed)".into(),
            series: create,
            target: None,
        },
        Panel {
            title: "List every volume, ms".into(),
            series: per_store(&|f| f.list_whole_ms),
            target: Some(1000.0),
        },
        Panel {
            title: "Controller RSS, MiB".into(),
            series: per_store(&|f| f.controller_rss_mib as f64),
            target: Some(256.0),
        },
        Panel {
            title: "Controller at rest, % of one core".into(),
            series: per_store(&|f| f.controller_idle_pct),
            target: Some(5.0),
        },
    ];
    let subtitle = "2-replica volumes on 3 nodes, a line per store; dashed grey: the target \
                    (list in 1 s, 256 MiB, 5% of a core)";
    draw_panels(
        "The control plane against the volume count",
        subtitle,
        &panels,
    )
}

/// Header, legend (one entry per series label, p99 twins left out) and the panels.
fn draw_panels(title: &str, subtitle: &str, panels: &[Panel]) -> String {
    let mut svg = Svg::new(WIDTH, title);
    let mut y = chart::header(&mut svg, title, subtitle);
    let mut entries: Vec<(String, Colour)> = Vec::new();
    for s in panels.iter().flat_map(|p| &p.series) {
        let label = s.label.trim_end_matches(" p50").to_owned();
        if !s.dashed && !entries.iter().any(|(l, _)| *l == label) {
            entries.push((label, s.colour));
        }
    }
    if entries.is_empty() {
        svg.text(
            20.0,
            y + 20.0,
            "no figures to chart",
            TextStyle::new(12.0).fill(MUTED),
        );
        return svg.finish(y + 40.0);
    }
    entries.push(("target".to_owned(), TARGET));
    y = chart::legend(&mut svg, y + 4.0, &entries);
    let xs: Vec<f64> = panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    for (i, panel) in panels.iter().enumerate() {
        let left = 20.0 + (i % COLUMNS) as f64 * PANEL_WIDTH;
        let top = y + (i / COLUMNS) as f64 * PANEL_HEIGHT;
        draw_panel(&mut svg, panel, &xs, (left, top));
    }
    let rows = panels.len().div_ceil(COLUMNS) as f64;
    svg.finish(y + rows * PANEL_HEIGHT + 10.0)
}

fn draw_panel(svg: &mut Svg, panel: &Panel, xs: &[f64], (left, top): (f64, f64)) {
    svg.text(left, top + 14.0, &panel.title, TextStyle::new(12.0).bold());
    let (x0, x1) = (left + PLOT_LEFT, left + PANEL_WIDTH - PLOT_RIGHT);
    let (y0, y1) = (top + PLOT_TOP, top + PANEL_HEIGHT - PLOT_BOTTOM);
    let max = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(panel.target)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let y = chart::y_axis_from_zero(svg, max * 1.1, (x0, x1), (y0, y1));
    // Room on either side of the first and last count, so their points are not on the axis.
    let x = Log::covering(xs, x0 + 14.0, x1 - 14.0);
    let mut counts: Vec<f64> = xs.to_vec();
    counts.sort_by(f64::total_cmp);
    counts.dedup();
    if let Some(x) = &x {
        for c in &counts {
            let style = TextStyle::new(9.5).anchor("middle").fill(MUTED);
            svg.text(x.map(*c), y1 + 13.0, &fmt_count(*c), style);
        }
    }
    let style = TextStyle::new(9.5).anchor("middle").fill(MUTED);
    svg.text((x0 + x1) / 2.0, y1 + 26.0, "volumes", style);
    if let Some(t) = panel.target {
        let stroke = Stroke::new(TARGET.fill, 1.5).dashed("5 4");
        svg.line((x0, y.map(t)), (x1, y.map(t)), stroke);
    }
    svg.line((x0, y0), (x0, y1), Stroke::new(AXIS, 1.0));
    svg.line((x0, y1), (x1, y1), Stroke::new(AXIS, 1.0));
    let Some(x) = x else { return };
    for s in &panel.series {
        let mut points = s.points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let line: Vec<(f64, f64)> = points.iter().map(|p| (x.map(p.0), y.map(p.1))).collect();
        let stroke = Stroke::new(s.colour.fill, 2.0);
        svg.polyline(
            &line,
            if s.dashed {
                stroke.dashed("4 3")
            } else {
                stroke
            },
        );
        for (p, at) in points.iter().zip(&line) {
            let tooltip = format!("{}, {} volumes: {}", s.label, fmt_count(p.0), sig3(p.1));
            svg.open_group("point", &tooltip);
            svg.circle(*at, 3.5, s.colour.fill);
            svg.close_group();
        }
    }
}

/// The failover chart: per kubelet setting, a bar to the median with a whisker to the worst,
/// for fault to first write and fault to pod deleted; the 10 s target and Piraeus's ~10 s.
pub fn draw_failover(all: &[Figure]) -> String {
    let figures: Vec<&FailoverFigure> = all
        .iter()
        .filter_map(|f| match f {
            Figure::Failover(x) => Some(x),
            _ => None,
        })
        .collect();
    let title = "Failover on Kubernetes: a node loses power under a pod";
    let subtitle = "fault to first write on the other node, and Hawser's part of it; median \
                    bar, worst whisker";
    let mut svg = Svg::new(WIDTH, title);
    let y = chart::header(&mut svg, title, subtitle);
    if figures.is_empty() {
        svg.text(
            20.0,
            y + 20.0,
            "no figures to chart",
            TextStyle::new(12.0).fill(MUTED),
        );
        return svg.finish(y + 40.0);
    }
    let first = (
        "fault to first write on the other node".to_owned(),
        chart::colour(0),
    );
    let hawser = (
        "fault to pod deleted (Hawser's part)".to_owned(),
        chart::colour(1),
    );
    let entries = [
        first.clone(),
        hawser.clone(),
        ("target 10 s; Piraeus ~10 s".to_owned(), TARGET),
    ];
    let top = chart::legend(&mut svg, y + 4.0, &entries);
    const LABEL: f64 = 190.0;
    const BAR: f64 = 16.0;
    const ROW: f64 = 2.0 * BAR + 18.0;
    let (x0, x1) = (20.0 + LABEL, WIDTH - 30.0);
    let max = figures
        .iter()
        .map(|f| f.first_write_s.worst.max(f.pod_deleted_s.worst))
        .chain([PIRAEUS_S])
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ticks = ticks_from_zero(max * 1.1, 6);
    let x = Linear {
        lo: 0.0,
        hi: ticks.last().copied().unwrap_or(1.0),
        from: x0,
        to: x1,
    };
    let bottom = top + ROW * figures.len() as f64;
    for tick in &ticks {
        let tx = x.map(*tick);
        svg.line((tx, top), (tx, bottom), Stroke::new(GRID, 1.0));
        let style = TextStyle::new(10.0).anchor("middle").fill(MUTED);
        svg.text(tx, bottom + 14.0, &format!("{} s", sig3(*tick)), style);
    }
    for (i, f) in figures.iter().enumerate() {
        let row = top + ROW * i as f64 + 6.0;
        let label = format!("kubelet status every {} s", f.kubelet_status_secs);
        svg.text(20.0, row + BAR + 4.0, &label, TextStyle::new(11.5));
        let trials = format!("{} trial(s)", f.trials);
        svg.text(
            20.0,
            row + BAR + 17.0,
            &trials,
            TextStyle::new(10.0).fill(MUTED),
        );
        for (j, (spread, (name, colour))) in [(f.first_write_s, &first), (f.pod_deleted_s, &hawser)]
            .iter()
            .enumerate()
        {
            let by = row + BAR * j as f64;
            let tooltip = format!(
                "{label}: {name}: median {} s, worst {} s",
                sig3(spread.median),
                sig3(spread.worst)
            );
            svg.open_group("bar", &tooltip);
            svg.rect(
                x0,
                by + 1.0,
                x.map(spread.median) - x0,
                BAR - 2.0,
                colour.fill,
            );
            let mid = by + BAR / 2.0;
            let whisker = Stroke::new(AXIS, 1.2);
            svg.line(
                (x.map(spread.median), mid),
                (x.map(spread.worst), mid),
                whisker,
            );
            svg.line(
                (x.map(spread.worst), by + 3.0),
                (x.map(spread.worst), by + BAR - 3.0),
                whisker,
            );
            svg.close_group();
            let style = TextStyle::new(10.0).fill(MUTED);
            let text = format!("{} s (worst {})", sig3(spread.median), sig3(spread.worst));
            svg.text(x.map(spread.worst) + 5.0, mid + 3.5, &text, style);
        }
    }
    let tx = x.map(PIRAEUS_S);
    svg.line(
        (tx, top),
        (tx, bottom),
        Stroke::new(TARGET.fill, 1.5).dashed("5 4"),
    );
    svg.line((x0, top), (x0, bottom), Stroke::new(AXIS, 1.0));
    let note = "Published: Piraeus ha-controller ~10 s (no epoch fencing), Longhorn 1-7 min, \
                Rook/Ceph RBD 7-30 min (manual taints)";
    svg.text(20.0, bottom + 34.0, note, TextStyle::new(10.5).fill(MUTED));
    svg.finish(bottom + 44.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_figures::tests::{api, failover, idle};

    /// Well-formed XML, with a point (or bar) titled by each figure.
    fn parse(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("well-formed SVG");
        doc.descendants()
            .filter(|n| n.has_tag_name("title"))
            .filter_map(|n| n.text().map(str::to_owned))
            .collect()
    }

    #[test]
    fn each_chart_draws_its_figures_and_says_when_there_are_none() -> anyhow::Result<()> {
        let figures = vec![
            idle(10, 0.4, 40),
            idle(1000, 1.5, 117),
            api("embedded", 100, 8.0),
            api("embedded", 10000, 10.0),
            api("kubernetes", 10000, 43.0),
            failover(10, 14.0),
            failover(2, 6.8),
        ];
        let has = |svg: &str, points: &[&str]| {
            let titles = parse(svg);
            for p in points {
                assert!(titles.iter().any(|t| t == p), "{p} in {titles:?}");
            }
        };
        let idle_points = ["n1, 1k volumes: 1.5", "controller, 10 volumes: 20"];
        has(&draw_idle(&figures), &idle_points);
        let api_points = [
            "kubernetes p99, 10k volumes: 129",
            "embedded, 100 volumes: 1",
        ];
        has(&draw_api(&figures), &api_points);
        let titles = parse(&draw_failover(&figures));
        assert!(
            titles.iter().any(
                |t| t.starts_with("kubelet status every 2 s: fault to first write")
                    && t.ends_with("median 6.8 s, worst 8.8 s")
            ),
            "{titles:?}"
        );
        for svg in [draw_idle(&[]), draw_api(&[]), draw_failover(&[])] {
            assert!(svg.contains("no figures to chart"));
            parse(&svg);
        }
        Ok(())
    }

    #[test]
    fn the_charts_are_written_beside_the_figures() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bench-cluster.jsonl");
        cluster_figures::append(&path, &idle(100, 0.9, 60))?;
        let written = write(&path)?;
        let names: Vec<String> = written
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        assert_eq!(
            names,
            [
                "bench-cluster.idle.svg",
                "bench-cluster.api.svg",
                "bench-cluster.failover.svg"
            ]
        );
        let idle = std::fs::read_to_string(&written[0])?;
        assert!(parse(&idle).contains(&"n1, 100 volumes: 0.9".to_owned()));
        Ok(())
    }
}
