//! The chart of one test: on the left a bar per target with its IOPS (MiB/s for the 4M
//! sequential tests, the figure `ratio_metric` names) and its ratio to the baseline on the
//! bar; on the right each target's latency on a log axis: the mean, and p50 / p99 / p99.9
//! completion latency when the results hold them, with the numbers written out below.
//!
//! One file per test rather than one overview with a panel per test: a test's targets share
//! an axis but tests do not (hundreds of IOPS at queue depth 1, 150k at 4 x 128, or MiB/s),
//! the set of tests varies with `--tests`, and the docs show each chart beside the test it
//! discusses.

use crate::chart::{self, Colour, AXIS, GRID, MUTED, WIDTH};
use crate::chart_run::{ResultData, RunData};
use crate::chart_scale::{fmt_count, fmt_latency_us, sig3, ticks_from_zero, Linear, Log};
use crate::suite::{self, RatioMetric};
use crate::svg::{Stroke, Svg, TextStyle};

const BARS_LEFT: f64 = 80.0;
const BARS_RIGHT: f64 = 390.0;
const LAT_LABEL_X: f64 = 420.0;
const LAT_LEFT: f64 = 530.0;
const LAT_RIGHT: f64 = 780.0;
const MIN_PLOT_HEIGHT: f64 = 220.0;
const ROW_HEIGHT: f64 = 52.0;
/// Bars stop short of the top tick so the value and ratio above the tallest one fit.
const HEADROOM: f64 = 1.25;

/// A target's result on this test, as drawn.
struct Row<'a> {
    name: &'a str,
    colour: Colour,
    result: &'a ResultData,
}

/// The SVG of `test` in `run`.
pub fn draw(run: &RunData, test: &str) -> String {
    let names = run.target_names();
    let colours = chart::colours(&names, &run.baseline);
    let rows: Vec<Row> = names
        .iter()
        .zip(colours)
        .filter_map(|(name, colour)| {
            let result = run.result(test, name)?;
            Some(Row {
                name,
                colour,
                result,
            })
        })
        .collect();
    let metric = rows
        .first()
        .map_or(RatioMetric::Iops, |r| r.result.ratio_metric);
    let title = format!("{test}: {}", workload(test, rows.first().map(|r| r.result)));
    let mut svg = Svg::new(WIDTH, &title);
    let mut y = chart::header(&mut svg, &title, &subtitle(run));
    let entries: Vec<(String, Colour)> = rows
        .iter()
        .map(|r| (target_label(r.name, &run.baseline), r.colour))
        .collect();
    y = chart::legend(&mut svg, y + 4.0, &entries);
    let heading = TextStyle::new(12.5).bold();
    let (what, better) = match metric {
        RatioMetric::Iops => ("IOPS", "higher is better"),
        RatioMetric::Bandwidth => ("MiB/s", "higher is better"),
    };
    svg.text(
        20.0,
        y + 14.0,
        &format!("{what} ({better}), ratio to {}", run.baseline),
        heading,
    );
    svg.text(
        LAT_LABEL_X,
        y + 14.0,
        "Latency, log scale (lower is better)",
        heading,
    );
    let top = y + 34.0;
    let bottom = top + MIN_PLOT_HEIGHT.max(ROW_HEIGHT * rows.len() as f64);
    draw_bars(&mut svg, &rows, (top, bottom), metric);
    draw_latency(&mut svg, &rows, (top, bottom));
    let percentiles = rows.iter().any(|r| r.result.clat_percentiles_us.is_some());
    draw_marker_legend(&mut svg, bottom + 44.0, percentiles);
    svg.finish(bottom + 62.0)
}

/// fio's parameters of the test as its command line recorded them (the standard definition
/// when the file kept no command line).
fn workload(test: &str, result: Option<&ResultData>) -> String {
    let def = suite::by_name(test);
    let arg = |name: &str, standard: Option<String>| {
        result
            .and_then(|r| r.fio_arg(name).map(str::to_owned))
            .or(standard)
    };
    let params = [
        ("rw", arg("rw", def.map(|d| d.rw.to_owned()))),
        ("bs", arg("bs", def.map(|d| d.block_size.to_owned()))),
        (
            "iodepth",
            arg("iodepth", def.map(|d| d.iodepth.to_string())),
        ),
        (
            "numjobs",
            arg("numjobs", def.map(|d| d.numjobs.to_string())),
        ),
        (
            "fsync",
            arg("fsync", def.filter(|d| d.fsync).map(|_| "1".to_owned())),
        ),
    ];
    let text: Vec<String> = params
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
        .collect();
    if text.is_empty() {
        "fio parameters not recorded".to_owned()
    } else {
        format!("fio {}", text.join(" "))
    }
}

fn subtitle(run: &RunData) -> String {
    format!(
        "{}, {} s per target, {} MiB region, run of {}",
        if run.fio_version.is_empty() {
            "fio"
        } else {
            &run.fio_version
        },
        run.runtime_secs,
        run.size_bytes >> 20,
        chart::short_time(&run.timestamp)
    )
}

fn target_label(name: &str, baseline: &str) -> String {
    if name == baseline && !name.contains("baseline") {
        format!("{name} (baseline)")
    } else {
        name.to_owned()
    }
}

/// Bars with round ticks from zero, the value above each bar and the ratio on it.
fn draw_bars(svg: &mut Svg, rows: &[Row], (top, bottom): (f64, f64), metric: RatioMetric) {
    let max = rows
        .iter()
        .map(|r| r.result.metric_value())
        .fold(0.0, f64::max);
    let ticks = ticks_from_zero(max * HEADROOM, 5);
    let hi = ticks.last().copied().unwrap_or(1.0);
    let y = Linear {
        lo: 0.0,
        hi,
        from: bottom,
        to: top,
    };
    let label = |v: f64| match metric {
        RatioMetric::Iops => fmt_count(v),
        RatioMetric::Bandwidth => sig3(v),
    };
    for tick in &ticks {
        let ty = y.map(*tick);
        svg.line((BARS_LEFT, ty), (BARS_RIGHT, ty), Stroke::new(GRID, 1.0));
        let style = TextStyle::new(10.5).anchor("end").fill(MUTED);
        svg.text(BARS_LEFT - 6.0, ty + 3.5, &label(*tick), style);
    }
    svg.line(
        (BARS_LEFT, top),
        (BARS_LEFT, bottom),
        Stroke::new(AXIS, 1.0),
    );
    svg.line(
        (BARS_LEFT, bottom),
        (BARS_RIGHT, bottom),
        Stroke::new(AXIS, 1.0),
    );
    let slot = (BARS_RIGHT - BARS_LEFT) / rows.len().max(1) as f64;
    let width = (slot * 0.62).min(72.0);
    for (i, row) in rows.iter().enumerate() {
        let value = row.result.metric_value().max(0.0);
        let x = BARS_LEFT + slot * i as f64 + (slot - width) / 2.0;
        let bar_top = y.map(value);
        let ratio = row.result.ratio_to_baseline;
        // Three decimals, as the table prints ratios.
        let ratio_text = ratio.map_or_else(|| "no ratio".to_owned(), |r| format!("×{r:.3}"));
        let unit = match metric {
            RatioMetric::Iops => "IOPS",
            RatioMetric::Bandwidth => "MiB/s",
        };
        let tooltip = format!("{}: {} {unit}, {ratio_text}", row.name, sig3(value));
        svg.open_group("bar", &tooltip);
        svg.rect(x, bar_top, width, bottom - bar_top, row.colour.fill);
        svg.close_group();
        let centre = x + width / 2.0;
        let small = TextStyle::new(11.0).anchor("middle");
        svg.text(centre, bar_top - 5.0, &label(value), small);
        if bottom - bar_top >= 24.0 && ratio.is_some() {
            let on_bar = TextStyle::new(12.0)
                .anchor("middle")
                .bold()
                .fill(row.colour.ink);
            svg.text(centre, bar_top + 17.0, &ratio_text, on_bar);
        } else {
            let above = TextStyle::new(12.0).anchor("middle").bold();
            svg.text(centre, bar_top - 19.0, &ratio_text, above);
        }
        let name = chart::fit(row.name, slot - 4.0, 11.0);
        svg.text(
            centre,
            bottom + 16.0,
            &name,
            TextStyle::new(11.0).anchor("middle"),
        );
    }
}

/// A row per target: the mean as a tick, p50 / p99 / p99.9 as markers joined by a line, on a
/// log axis shared by the rows, with the numbers written below.
fn draw_latency(svg: &mut Svg, rows: &[Row], (top, bottom): (f64, f64)) {
    let values: Vec<f64> = rows
        .iter()
        .flat_map(|r| {
            let p = r.result.clat_percentiles_us;
            let pcts = p.map_or_else(Vec::new, |p| vec![p.p50, p.p99, p.p99_9]);
            std::iter::once(r.result.lat_mean_us).chain(pcts)
        })
        .collect();
    let Some(x) = Log::covering(&values, LAT_LEFT, LAT_RIGHT) else {
        let style = TextStyle::new(11.0).fill(MUTED);
        svg.text(LAT_LABEL_X, top + 20.0, "no latency recorded", style);
        return;
    };
    for tick in x.ticks() {
        let tx = x.map(tick);
        svg.line((tx, top), (tx, bottom), Stroke::new(GRID, 1.0));
        let style = TextStyle::new(10.0).anchor("middle").fill(MUTED);
        svg.text(tx, bottom + 14.0, &fmt_latency_us(tick), style);
    }
    svg.line(
        (LAT_LEFT, bottom),
        (LAT_RIGHT, bottom),
        Stroke::new(AXIS, 1.0),
    );
    let row_height = (bottom - top) / rows.len().max(1) as f64;
    for (i, row) in rows.iter().enumerate() {
        let row_top = top + row_height * i as f64;
        draw_latency_row(svg, row, &x, row_top);
    }
}

fn draw_latency_row(svg: &mut Svg, row: &Row, x: &Log, row_top: f64) {
    let cy = row_top + 13.0;
    let name = chart::fit(row.name, LAT_LEFT - LAT_LABEL_X - 10.0, 11.0);
    svg.text(LAT_LABEL_X, cy + 4.0, &name, TextStyle::new(11.0).bold());
    let r = row.result;
    let mut numbers = format!("mean {}", fmt_latency_us(r.lat_mean_us));
    if let Some(p) = r.clat_percentiles_us {
        svg.line(
            (x.map(p.p50), cy),
            (x.map(p.p99_9), cy),
            Stroke::new(row.colour.fill, 2.0),
        );
        marker(svg, Marker::P50, (x.map(p.p50), cy), row.colour.fill);
        marker(svg, Marker::P99, (x.map(p.p99), cy), row.colour.fill);
        marker(svg, Marker::P999, (x.map(p.p99_9), cy), row.colour.fill);
        numbers += &format!(
            ", p50 {}, p99 {}, p99.9 {}",
            fmt_latency_us(p.p50),
            fmt_latency_us(p.p99),
            fmt_latency_us(p.p99_9)
        );
    } else {
        numbers += " (no percentiles in these results)";
    }
    marker(svg, Marker::Mean, (x.map(r.lat_mean_us), cy), "#222222");
    let style = TextStyle::new(10.0).fill(MUTED);
    svg.text(LAT_LABEL_X, cy + 19.0, &numbers, style);
    if let Some(sync) = r.sync_lat_mean_us {
        let flush = format!("flush after each write: mean {}", fmt_latency_us(sync));
        svg.text(LAT_LABEL_X, cy + 32.0, &flush, style);
    }
}

#[derive(Debug, Clone, Copy)]
enum Marker {
    Mean,
    P50,
    P99,
    P999,
}

fn marker(svg: &mut Svg, kind: Marker, (x, y): (f64, f64), fill: &str) {
    match kind {
        Marker::Mean => svg.line((x, y - 8.0), (x, y + 8.0), Stroke::new(fill, 2.5)),
        Marker::P50 => svg.circle((x, y), 4.5, fill),
        Marker::P99 => svg.rect(x - 4.0, y - 4.0, 8.0, 8.0, fill),
        Marker::P999 => svg.polygon(
            &[(x, y - 5.5), (x + 5.0, y + 4.0), (x - 5.0, y + 4.0)],
            fill,
        ),
    }
}

/// What the latency markers mean, below the plots: the percentile ones only when drawn.
fn draw_marker_legend(svg: &mut Svg, y: f64, percentiles: bool) {
    let style = TextStyle::new(10.5).fill(MUTED);
    let entries = [
        (
            Marker::Mean,
            "mean (submission + completion, as in the table)",
        ),
        (Marker::P50, "p50"),
        (Marker::P99, "p99"),
        (Marker::P999, "p99.9 completion latency"),
    ];
    let shown = if percentiles {
        &entries[..]
    } else {
        &entries[..1]
    };
    let mut x = 20.0;
    for (kind, label) in shown.iter().copied() {
        marker(svg, kind, (x + 5.0, y - 4.0), "#444444");
        svg.text(x + 14.0, y, label, style);
        x += 14.0 + chart::text_width(label, 10.5) + 14.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_comes_from_the_command_line_then_the_suite() {
        let standard = workload("randwrite_fsync", None);
        assert_eq!(
            standard,
            "fio rw=randwrite bs=4k iodepth=1 numjobs=1 fsync=1"
        );
        assert_eq!(workload("mystery", None), "fio parameters not recorded");
    }
}
