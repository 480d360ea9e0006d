//! Axes of the bench charts: linear scales with round ticks from zero (IOPS, MiB/s, ratios),
//! logarithmic ones for latency (a p99.9 can sit two decades above the median), and the
//! short labels written on them.

/// Maps a value range onto a pixel range, linearly.
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    pub lo: f64,
    pub hi: f64,
    /// Pixel of `lo` and of `hi`; `to` may be smaller than `from` (a y axis grows upwards).
    pub from: f64,
    pub to: f64,
}

impl Linear {
    pub fn map(&self, value: f64) -> f64 {
        let span = self.hi - self.lo;
        if !positive(span) || !value.is_finite() {
            return self.from;
        }
        let t = ((value - self.lo) / span).clamp(0.0, 1.0);
        self.from + t * (self.to - self.from)
    }
}

/// Maps a positive value range onto a pixel range, by decades.
#[derive(Debug, Clone, Copy)]
pub struct Log {
    pub lo: f64,
    pub hi: f64,
    pub from: f64,
    pub to: f64,
}

impl Log {
    /// A scale spanning every value in `values` that is positive and finite, with some room on
    /// either side and at least one decade; `None` when there is none.
    pub fn covering(values: &[f64], from: f64, to: f64) -> Option<Log> {
        let positive = values.iter().copied().filter(|v| *v > 0.0 && v.is_finite());
        let (min, max) = positive.fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        if max <= 0.0 {
            return None;
        }
        let (mut lo, mut hi) = (min / 1.5, max * 1.5);
        if hi / lo < 10.0 {
            let centre = (lo * hi).sqrt();
            (lo, hi) = (centre / 10f64.sqrt(), centre * 10f64.sqrt());
        }
        Some(Log { lo, hi, from, to })
    }

    pub fn map(&self, value: f64) -> f64 {
        if !positive(value) || !positive(self.lo) || !positive(self.hi - self.lo) {
            return self.from;
        }
        let t = ((value.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10()))
            .clamp(0.0, 1.0);
        self.from + t * (self.to - self.from)
    }

    /// Powers of ten inside the scale, with 2x and 5x in between when it spans under three
    /// decades, so a narrow axis still gets a few labels.
    pub fn ticks(&self) -> Vec<f64> {
        if !positive(self.lo) || !positive(self.hi - self.lo) {
            return Vec::new();
        }
        let (first, last) = (self.lo.log10().floor(), self.hi.log10().ceil());
        let steps: &[f64] = if last - first <= 3.0 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let mut ticks = Vec::new();
        let mut power = 10f64.powf(first);
        while power <= self.hi {
            let inside = steps.iter().map(|s| s * power);
            ticks.extend(inside.filter(|v| *v >= self.lo && *v <= self.hi));
            power *= 10.0;
        }
        ticks
    }
}

/// Finite and above zero (false for NaN).
fn positive(value: f64) -> bool {
    value.is_finite() && value > 0.0
}

/// Round ticks from 0 up to at least `max`, about `count` of them (1, 2, 2.5 or 5 times a
/// power of ten apart). A non-positive or non-finite `max` gives `[0, 1]`.
pub fn ticks_from_zero(max: f64, count: usize) -> Vec<f64> {
    if !positive(max) {
        return vec![0.0, 1.0];
    }
    let rough = max / count.max(1) as f64;
    let power = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|s| *s >= rough)
        .unwrap_or(10.0 * power);
    let mut ticks = vec![0.0];
    while ticks.last().is_some_and(|t| *t < max) {
        let next = step * ticks.len() as f64;
        ticks.push(next);
    }
    ticks
}

/// A count such as IOPS in three significant digits: `950`, `35.4k`, `1.2M`.
pub fn fmt_count(value: f64) -> String {
    let abs = value.abs();
    if abs >= 1e6 {
        format!("{}M", sig3(value / 1e6))
    } else if abs >= 1e3 {
        format!("{}k", sig3(value / 1e3))
    } else {
        sig3(value)
    }
}

/// A latency given in microseconds, in the unit that keeps it short: `85 µs`, `1.58 ms`.
pub fn fmt_latency_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", sig3(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", sig3(us / 1e3))
    } else {
        format!("{} µs", sig3(us))
    }
}

/// A plain number in three significant digits, without trailing zeros: `0.376`, `12.5`, `950`.
pub fn sig3(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_owned();
    }
    let abs = value.abs();
    let decimals = if abs >= 100.0 || abs == 0.0 {
        0
    } else if abs >= 10.0 {
        1
    } else if abs >= 1.0 {
        2
    } else {
        3
    };
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_from_zero_are_round_and_cover_the_maximum() {
        assert_eq!(
            ticks_from_zero(7238.0, 5),
            [0.0, 2000.0, 4000.0, 6000.0, 8000.0]
        );
        assert_eq!(ticks_from_zero(1.0, 4), [0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(ticks_from_zero(0.0, 5), [0.0, 1.0]);
        assert_eq!(ticks_from_zero(f64::NAN, 5), [0.0, 1.0]);
        let t = ticks_from_zero(143253.0, 5);
        assert!(
            t.len() <= 7 && t.last().is_some_and(|m| *m >= 143253.0),
            "{t:?}"
        );
    }

    #[test]
    fn log_scale_spans_decades_and_maps_monotonically() -> anyhow::Result<()> {
        let s = Log::covering(&[53.0, 120.0, 1577.0, 0.0, f64::NAN], 0.0, 300.0)
            .ok_or_else(|| anyhow::anyhow!("values are positive"))?;
        assert!(s.lo < 53.0 && s.hi > 1577.0, "{s:?}");
        assert!(s.map(53.0) < s.map(120.0) && s.map(120.0) < s.map(1577.0));
        assert_eq!(s.ticks(), [50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]);
        let narrow = Log::covering(&[100.0], 0.0, 1.0).ok_or_else(|| anyhow::anyhow!("one"))?;
        assert!(narrow.hi / narrow.lo >= 10.0 - 1e-9, "{narrow:?}");
        assert!(Log::covering(&[0.0, -1.0], 0.0, 1.0).is_none());
        Ok(())
    }

    #[test]
    fn linear_scale_clamps_and_survives_an_empty_range() {
        let s = Linear {
            lo: 0.0,
            hi: 10.0,
            from: 300.0,
            to: 100.0,
        };
        assert_eq!((s.map(0.0), s.map(5.0), s.map(20.0)), (300.0, 200.0, 100.0));
        let empty = Linear { hi: 0.0, ..s };
        assert_eq!(empty.map(3.0), 300.0);
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(fmt_count(950.0), "950");
        assert_eq!(fmt_count(35387.6), "35.4k");
        assert_eq!(fmt_count(1_200_000.0), "1.2M");
        assert_eq!(fmt_count(0.0), "0");
        assert_eq!(fmt_latency_us(85.378), "85.4 µs");
        assert_eq!(fmt_latency_us(1577.2), "1.58 ms");
        assert_eq!(fmt_latency_us(2_000_000.0), "2 s");
        assert_eq!(sig3(0.37626), "0.376");
        assert_eq!(sig3(1.0), "1");
    }
}
