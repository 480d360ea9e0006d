//! Comparisons between targets: ratio math, `--targets-ratio NAME:BASE` pairs and
//! `--expect TARGET[/BASE]:TEST>=RATIO` lines, which report PASS/MISS but never fail a run.

use anyhow::{ensure, Context};

use crate::report::TestResult;
use crate::suite::RatioMetric;
use crate::target::is_valid_name;

/// `value / base`, or `None` when the base is not a positive finite number.
pub fn ratio(value: f64, base: f64) -> Option<f64> {
    (base > 0.0 && base.is_finite() && value.is_finite()).then(|| value / base)
}

/// The figure of a result that its ratio divides.
fn metric(result: &TestResult) -> f64 {
    match result.ratio_metric {
        RatioMetric::Iops => result.iops,
        RatioMetric::Bandwidth => result.bw_bytes_per_sec,
    }
}

/// Ratio of `target` to `base` on `test`, when both ran it.
pub fn between(results: &[TestResult], test: &str, target: &str, base: &str) -> Option<f64> {
    let find = |name: &str| results.iter().find(|r| r.test == test && r.target == name);
    ratio(metric(find(target)?), metric(find(base)?))
}

/// Fills every result's `ratio_to_baseline`.
pub fn fill_baseline_ratios(results: &mut [TestResult], baseline: &str) {
    let ratios: Vec<Option<f64>> = results
        .iter()
        .map(|r| between(results, &r.test, &r.target, baseline))
        .collect();
    for (result, ratio) in results.iter_mut().zip(ratios) {
        result.ratio_to_baseline = ratio;
    }
}

/// `--targets-ratio NAME:BASE`: also report NAME relative to BASE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPair {
    pub target: String,
    pub base: String,
}

impl TargetPair {
    pub fn parse(text: &str) -> anyhow::Result<TargetPair> {
        let (target, base) = text
            .split_once(':')
            .with_context(|| format!("{text:?} is not NAME:BASE"))?;
        ensure!(
            is_valid_name(target) && is_valid_name(base),
            "{text:?} is not NAME:BASE"
        );
        Ok(TargetPair {
            target: target.to_owned(),
            base: base.to_owned(),
        })
    }
}

/// `--expect TARGET[/BASE]:TEST>=RATIO`; BASE defaults to the baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    pub text: String,
    pub target: String,
    pub base: Option<String>,
    pub test: String,
    pub min_ratio: f64,
}

impl Expectation {
    pub fn parse(text: &str) -> anyhow::Result<Expectation> {
        let shape = || format!("{text:?} is not TARGET[/BASE]:TEST>=RATIO");
        let (left, min_ratio) = text.split_once(">=").with_context(shape)?;
        let (who, test) = left.split_once(':').with_context(shape)?;
        let (target, base) = match who.split_once('/') {
            Some((target, base)) => (target, Some(base)),
            None => (who, None),
        };
        ensure!(
            is_valid_name(target) && base.is_none_or(is_valid_name),
            shape()
        );
        let min_ratio: f64 = min_ratio.trim().parse().with_context(shape)?;
        ensure!(min_ratio.is_finite() && min_ratio >= 0.0, shape());
        Ok(Expectation {
            text: text.to_owned(),
            target: target.to_owned(),
            base: base.map(str::to_owned),
            test: test.to_owned(),
            min_ratio,
        })
    }

    /// The measured ratio, and whether it meets the expectation (a missing ratio misses).
    pub fn evaluate(&self, results: &[TestResult], baseline: &str) -> (Option<f64>, bool) {
        let base = self.base.as_deref().unwrap_or(baseline);
        let measured = between(results, &self.test, &self.target, base);
        (measured, measured.is_some_and(|r| r >= self.min_ratio))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn result(test: &str, target: &str, iops: f64, metric: RatioMetric) -> TestResult {
        TestResult {
            test: test.to_owned(),
            target: target.to_owned(),
            iops,
            bw_bytes_per_sec: iops * 4096.0,
            mib_per_sec: iops * 4096.0 / 1048576.0,
            lat_mean_us: 1e6 / iops,
            sync_lat_mean_us: None,
            clat_percentiles_us: None,
            ratio_metric: metric,
            ratio_to_baseline: None,
            requests: 1000,
            client_cpu_us_per_request: Some(5.0),
            client_ctx_switches_per_request: Some(0.5),
            server: None,
            command: vec!["fio".to_owned()],
        }
    }

    #[test]
    fn ratio_math() {
        assert_eq!(ratio(50.0, 100.0), Some(0.5));
        assert_eq!(ratio(50.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        let mut results = vec![
            result("randwrite", "a", 1000.0, RatioMetric::Iops),
            result("randwrite", "b", 950.0, RatioMetric::Iops),
            result("read", "a", 100.0, RatioMetric::Bandwidth),
            result("read", "b", 150.0, RatioMetric::Bandwidth),
        ];
        results[3].bw_bytes_per_sec = 300.0; // bandwidth is what a 4M test compares
        results[2].bw_bytes_per_sec = 200.0;
        fill_baseline_ratios(&mut results, "a");
        let got: Vec<_> = results.iter().map(|r| r.ratio_to_baseline).collect();
        assert_eq!(got, [Some(1.0), Some(0.95), Some(1.0), Some(1.5)]);
        assert_eq!(
            between(&results, "randwrite", "a", "b"),
            Some(1000.0 / 950.0)
        );
        assert_eq!(between(&results, "write", "a", "b"), None);
    }

    #[test]
    fn parses_pairs_and_expectations() -> anyhow::Result<()> {
        assert_eq!(
            TargetPair::parse("hawser-1r:nbdkit")?,
            TargetPair {
                target: "hawser-1r".into(),
                base: "nbdkit".into()
            }
        );
        assert!(TargetPair::parse("a").is_err() && TargetPair::parse("a:").is_err());
        let e = Expectation::parse("hawser-1r:randwrite>=0.95")?;
        assert_eq!((e.target.as_str(), e.base.as_deref()), ("hawser-1r", None));
        assert_eq!((e.test.as_str(), e.min_ratio), ("randwrite", 0.95));
        let e = Expectation::parse("h3/nbdkit:read>=0.5")?;
        assert_eq!(e.base.as_deref(), Some("nbdkit"));
        for bad in ["a:b", "a>=1", "a:b>=x", "a:b>=-1", ":b>=1", "a/:b>=1"] {
            assert!(Expectation::parse(bad).is_err(), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn evaluates_expectations() -> anyhow::Result<()> {
        let results = vec![
            result("randwrite", "a", 1000.0, RatioMetric::Iops),
            result("randwrite", "b", 950.0, RatioMetric::Iops),
            result("randwrite", "c", 900.0, RatioMetric::Iops),
        ];
        let pass = Expectation::parse("b:randwrite>=0.95")?.evaluate(&results, "a");
        assert_eq!(pass, (Some(0.95), true));
        let miss = Expectation::parse("c:randwrite>=0.95")?.evaluate(&results, "a");
        assert_eq!(miss, (Some(0.9), false));
        let vs_b = Expectation::parse("c/b:randwrite>=0.94")?.evaluate(&results, "a");
        assert!(vs_b.1, "{vs_b:?}");
        let absent = Expectation::parse("c:read>=0.1")?.evaluate(&results, "a");
        assert_eq!(absent, (None, false));
        Ok(())
    }
}
