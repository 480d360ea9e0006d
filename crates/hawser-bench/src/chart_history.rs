//! The run-over-run chart: each target's ratio to the baseline on every test, one point per
//! run, oldest run first, so a regression shows as a dip in its line.
//!
//! Small multiples, one panel per test, rather than all (target, test) lines in one plot:
//! eight tests times three targets would be 24 crossing lines. Ratios, not IOPS, because the
//! baseline absorbs what the machine did that day; each run's ratio is to its own baseline.
//! Runs are spaced evenly, not by date: runs come in bursts, and a dip must stay visible.

use crate::chart::{self, Colour, AXIS, MUTED, WIDTH};
use crate::chart_run::{self, RunData};
use crate::suite::RatioMetric;
use crate::svg::{Stroke, Svg, TextStyle};

const COLUMNS: usize = 2;
const PANEL_WIDTH: f64 = 380.0;
const PANEL_HEIGHT: f64 = 190.0;
/// Plot area inside a panel: room for the panel title above, tick labels left and below.
const PLOT_LEFT: f64 = 44.0;
const PLOT_RIGHT: f64 = 16.0;
const PLOT_TOP: f64 = 26.0;
const PLOT_BOTTOM: f64 = 40.0;
/// Run labels per axis at most; more would overlap.
const MAX_RUN_LABELS: usize = 5;

/// The SVG of `runs` (oldest first) found in `source` (a directory, named in the subtitle).
pub fn draw(runs: &[RunData], source: &str) -> String {
    let title = "Ratio to baseline, run over run";
    let mut svg = Svg::new(WIDTH, title);
    let subtitle = match (runs.first(), runs.last()) {
        (Some(first), Some(last)) => format!(
            "{} run(s), {} to {}, from {source}; a regression shows as a dip",
            runs.len(),
            chart::short_time(&first.timestamp),
            chart::short_time(&last.timestamp)
        ),
        _ => format!("no runs in {source}"),
    };
    let mut y = chart::header(&mut svg, title, &subtitle);
    let targets = contenders(runs);
    let mut entries: Vec<(String, Colour)> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), chart::colour(i)))
        .collect();
    entries.push(("each run's baseline = 1".to_owned(), chart::BASELINE));
    y = chart::legend(&mut svg, y + 4.0, &entries);
    let tests = chart_run::standard_order(&chart_run::unique(
        runs.iter()
            .flat_map(|r| r.results.iter().map(|x| x.test.as_str())),
    ));
    if tests.is_empty() {
        svg.text(
            20.0,
            y + 20.0,
            "no results to chart",
            TextStyle::new(12.0).fill(MUTED),
        );
        return svg.finish(y + 40.0);
    }
    for (i, test) in tests.iter().enumerate() {
        let left = 20.0 + (i % COLUMNS) as f64 * PANEL_WIDTH;
        let top = y + (i / COLUMNS) as f64 * PANEL_HEIGHT;
        draw_panel(&mut svg, runs, test, &targets, (left, top));
    }
    let rows = tests.len().div_ceil(COLUMNS) as f64;
    svg.finish(y + rows * PANEL_HEIGHT + 10.0)
}

/// Every target that is not its run's baseline, in order of first appearance: the lines.
fn contenders(runs: &[RunData]) -> Vec<&str> {
    chart_run::unique(runs.iter().flat_map(|r| {
        r.target_names()
            .into_iter()
            .filter(move |t| *t != r.baseline)
    }))
}

fn draw_panel(
    svg: &mut Svg,
    runs: &[RunData],
    test: &str,
    targets: &[&str],
    (left, top): (f64, f64),
) {
    let ratio = |run: &RunData, target: &str| {
        run.result(test, target)
            .and_then(|r| r.ratio_to_baseline)
            .filter(|r| r.is_finite())
    };
    let metric = runs
        .iter()
        .find_map(|r| r.results.iter().find(|x| x.test == test))
        .map_or(RatioMetric::Iops, |x| x.ratio_metric);
    let unit = match metric {
        RatioMetric::Iops => "IOPS",
        RatioMetric::Bandwidth => "MiB/s",
    };
    let heading = format!("{} ({unit} ratio)", chart::fit(test, 260.0, 12.0));
    svg.text(left, top + 14.0, &heading, TextStyle::new(12.0).bold());
    let (x0, x1) = (left + PLOT_LEFT, left + PANEL_WIDTH - PLOT_RIGHT);
    let (y0, y1) = (top + PLOT_TOP, top + PANEL_HEIGHT - PLOT_BOTTOM);
    let max = runs
        .iter()
        .flat_map(|run| targets.iter().filter_map(move |t| ratio(run, t)))
        .fold(1.0, f64::max);
    let y = chart::y_axis_from_zero(svg, max * 1.1, (x0, x1), (y0, y1));
    let one = Stroke::new(chart::BASELINE.fill, 1.5).dashed("5 4");
    svg.line((x0, y.map(1.0)), (x1, y.map(1.0)), one);
    svg.line((x0, y0), (x0, y1), Stroke::new(AXIS, 1.0));
    svg.line((x0, y1), (x1, y1), Stroke::new(AXIS, 1.0));
    let step = (x1 - x0) / runs.len().max(1) as f64;
    let run_x = |i: usize| x0 + step * (i as f64 + 0.5);
    draw_run_labels(svg, runs, &run_x, y1);
    for (t, target) in targets.iter().enumerate() {
        let colour = chart::colour(t).fill;
        let points: Vec<Option<(f64, f64, f64)>> = runs
            .iter()
            .enumerate()
            .map(|(i, run)| ratio(run, target).map(|r| (run_x(i), y.map(r), r)))
            .collect();
        // A run without this target breaks the line rather than bridging the gap.
        for segment in points.split(Option::is_none) {
            let segment: Vec<(f64, f64)> = segment.iter().flatten().map(|p| (p.0, p.1)).collect();
            svg.polyline(&segment, Stroke::new(colour, 2.0));
        }
        for (run, point) in runs.iter().zip(&points) {
            if let Some((px, py, r)) = point {
                let tooltip = format!("{target}, {test}, {}: ×{r:.3}", run.timestamp);
                svg.open_group("point", &tooltip);
                svg.circle((*px, *py), 3.5, colour);
                svg.close_group();
            }
        }
    }
}

/// Dates of the runs under the axis; at most `MAX_RUN_LABELS`, always the latest.
fn draw_run_labels(svg: &mut Svg, runs: &[RunData], run_x: &dyn Fn(usize) -> f64, y: f64) {
    let stride = runs.len().div_ceil(MAX_RUN_LABELS).max(1);
    let last = runs.len().saturating_sub(1);
    for (i, run) in runs.iter().enumerate() {
        if i % stride != 0 && i != last {
            continue;
        }
        if i != last && last - i < stride {
            continue; // too close to the latest, which is always labelled
        }
        let (day, time) = match (run.timestamp.get(5..10), run.timestamp.get(11..16)) {
            (Some(day), Some(time)) => (day, time),
            _ => (run.timestamp.as_str(), ""),
        };
        let style = TextStyle::new(9.5).anchor("middle").fill(MUTED);
        svg.text(run_x(i), y + 13.0, day, style);
        svg.text(run_x(i), y + 24.0, time, style);
    }
}
