//! What the bench's SVG charts share: width, colours, text fitting, header and legend. The
//! charts themselves are `chart_by_test` and `chart_history`; `chart_files` names and writes
//! them.
//!
//! Hand-written SVG (`svg`): no runtime dependency, no JavaScript, readable in a browser, on
//! GitHub and in docs.

use crate::chart_scale::{sig3, ticks_from_zero, Linear};
use crate::svg::{Stroke, Svg, TextStyle};

/// Width of every chart, px: fits a docs page and a laptop screen without scaling.
pub const WIDTH: f64 = 800.0;
/// Grey of text that explains rather than shows.
pub const MUTED: &str = "#666666";
pub const GRID: &str = "#e6e6e6";
pub const AXIS: &str = "#444444";

/// A target's colours: `fill` for its bars, lines and markers, `ink` for text on `fill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Colour {
    pub fill: &'static str,
    pub ink: &'static str,
}

/// The baseline is grey: it is the yardstick, not a contender.
pub const BASELINE: Colour = Colour {
    fill: "#8c8c8c",
    ink: "#111111",
};

/// The Okabe-Ito palette, which colour-blind readers can tell apart; the yellow is left out
/// (too pale on white). Light fills get dark ink.
const PALETTE: [Colour; 6] = [
    Colour {
        fill: "#0072B2",
        ink: "#ffffff",
    },
    Colour {
        fill: "#D55E00",
        ink: "#ffffff",
    },
    Colour {
        fill: "#009E73",
        ink: "#ffffff",
    },
    Colour {
        fill: "#CC79A7",
        ink: "#111111",
    },
    Colour {
        fill: "#E69F00",
        ink: "#111111",
    },
    Colour {
        fill: "#56B4E9",
        ink: "#111111",
    },
];

/// The colour of the `index`-th target that is not the baseline. Both kinds of chart number
/// targets in the run's order, so a target keeps its colour across the charts of one run.
pub fn colour(index: usize) -> Colour {
    PALETTE[index % PALETTE.len()]
}

/// Each name's colour: grey for `baseline`, the palette in order for the others.
pub fn colours(names: &[&str], baseline: &str) -> Vec<Colour> {
    let mut next = 0;
    names
        .iter()
        .map(|name| {
            if *name == baseline {
                BASELINE
            } else {
                next += 1;
                colour(next - 1)
            }
        })
        .collect()
}

/// Rough width of `text` in px at font `size`: enough to lay out legends and to shorten names
/// that would run into their neighbours (no font metrics without a renderer).
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.6
}

/// `text`, shortened with an ellipsis to fit `max_px` at font `size`.
pub fn fit(text: &str, max_px: f64, size: f64) -> String {
    if text_width(text, size) <= max_px {
        return text.to_owned();
    }
    let mut out = String::new();
    for c in text.chars() {
        if text_width(&out, size) + 2.0 * size * 0.6 > max_px {
            break;
        }
        out.push(c);
    }
    out + "…"
}

/// Title and subtitle; returns the y below them.
pub fn header(svg: &mut Svg, title: &str, subtitle: &str) -> f64 {
    svg.text(
        20.0,
        28.0,
        &fit(title, WIDTH - 40.0, 16.0),
        TextStyle::new(16.0).bold(),
    );
    let small = TextStyle::new(11.5).fill(MUTED);
    svg.text(20.0, 47.0, &fit(subtitle, WIDTH - 40.0, 11.5), small);
    58.0
}

/// A row of coloured swatches with labels from `top`, wrapping at the chart's width;
/// returns the y below it.
pub fn legend(svg: &mut Svg, top: f64, entries: &[(String, Colour)]) -> f64 {
    const SIZE: f64 = 11.5;
    const ROW: f64 = 18.0;
    let (mut x, mut y) = (20.0, top);
    for (label, colour) in entries {
        let label = fit(label, 300.0, SIZE);
        let width = 18.0 + text_width(&label, SIZE) + 16.0;
        if x > 20.0 && x + width > WIDTH - 20.0 {
            (x, y) = (20.0, y + ROW);
        }
        svg.rect(x, y + 2.0, 12.0, 12.0, colour.fill);
        svg.text(x + 18.0, y + 12.5, &label, TextStyle::new(SIZE));
        x += width;
    }
    y + ROW + 4.0
}

/// A y axis from zero up to at least `max`, with about four round ticks: their grid lines
/// across `(x0, x1)` and labels left of `x0`. Returns the scale, `bottom` at zero.
pub fn y_axis_from_zero(
    svg: &mut Svg,
    max: f64,
    (x0, x1): (f64, f64),
    (top, bottom): (f64, f64),
) -> Linear {
    let ticks = ticks_from_zero(max, 4);
    let y = Linear {
        lo: 0.0,
        hi: ticks.last().copied().unwrap_or(1.0),
        from: bottom,
        to: top,
    };
    for tick in &ticks {
        let ty = y.map(*tick);
        svg.line((x0, ty), (x1, ty), Stroke::new(GRID, 1.0));
        let style = TextStyle::new(10.0).anchor("end").fill(MUTED);
        svg.text(x0 - 5.0, ty + 3.5, &sig3(*tick), style);
    }
    y
}

/// `2026-11-27 02:23 UTC` from `2026-11-27T02:23:33Z`.
pub fn short_time(timestamp: &str) -> String {
    match (timestamp.get(..10), timestamp.get(11..16)) {
        (Some(day), Some(time)) => format!("{day} {time} UTC"),
        _ => timestamp.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_is_grey_and_others_take_the_palette_in_order() {
        let c = colours(&["a", "base", "b"], "base");
        assert_eq!(c, [colour(0), BASELINE, colour(1)]);
        assert_ne!(colour(0), colour(1));
    }

    #[test]
    fn fits_long_names() {
        assert_eq!(fit("short", 100.0, 10.0), "short");
        let long = fit("a-very-long-target-name", 60.0, 10.0);
        assert!(
            long.ends_with('…') && text_width(&long, 10.0) <= 60.0,
            "{long}"
        );
        assert_eq!(short_time("2026-11-27T02:23:33Z"), "2026-11-27 02:23 UTC");
    }
}
