//! What the controller's and the agents' `/metrics` share: the choice between the two text
//! formats Prometheus reads, the process metrics, and the scrape credential's check.
//!
//! Metrics are registered with `prometheus-client`. A scrape that accepts OpenMetrics (as
//! Prometheus asks first) gets OpenMetrics text; any other (curl, `promtool check metrics`,
//! older scrapers) gets the classic text format 0.0.4, from the same registry.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Latency buckets of request histograms, in seconds: 50 µs to 10 s. A 4k request on a
/// local NVMe disk takes tens of microseconds, a flush on a busy disk can take seconds.
pub const LATENCY_BUCKETS_SECS: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];

/// Whether a scrape with this `Accept` header takes OpenMetrics text.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// The registry in the format the `Accept` header asks for: (content type, body).
pub fn render(registry: &Registry, accept: Option<&str>) -> (&'static str, String) {
    let mut body = String::new();
    if wants_openmetrics(accept) {
        // Writing to a String fails only if a collector fails, and ours do not.
        let _ = prometheus_client::encoding::text::encode(&mut body, registry);
        (OPENMETRICS_CONTENT_TYPE, body)
    } else {
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut body, registry);
        (
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            body,
        )
    }
}

/// The process's CPU time, resident memory and open descriptors, read from /proc at each
/// scrape, under the names every Prometheus client library uses (`process_*`).
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// From /proc/self: CPU seconds (user + system), resident bytes, open descriptors.
fn process_sample() -> Option<(f64, i64, i64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields after its last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a configuration value; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = if page > 0 { page } else { 4096 };
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as i64);
    Some((ticks as f64 / hz, pages * page, fds))
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let Some((cpu, rss, fds)) = process_sample() else {
            return Ok(());
        };
        let c = ConstCounter::new(cpu);
        c.encode(encoder.encode_descriptor(
            "process_cpu",
            "User and system CPU time of the process",
            Some(&Unit::Seconds),
            c.metric_type(),
        )?)?;
        let g = ConstGauge::new(rss);
        g.encode(encoder.encode_descriptor(
            "process_resident_memory",
            "Resident memory of the process",
            Some(&Unit::Bytes),
            g.metric_type(),
        )?)?;
        let g = ConstGauge::new(fds);
        g.encode(encoder.encode_descriptor(
            "process_open_fds",
            "Open file descriptors of the process",
            None,
            g.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    fn registry() -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(ProcessCollector));
        let c: Counter = Counter::default();
        c.inc_by(3);
        r.sub_registry_with_prefix("hawser")
            .register("things", "Things done", c);
        r
    }

    #[test]
    fn openmetrics_when_asked_and_the_classic_format_otherwise() {
        let r = registry();
        let accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.2";
        let (ty, body) = render(&r, Some(accept));
        assert_eq!(ty, OPENMETRICS_CONTENT_TYPE);
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert!(body.contains("# TYPE hawser_things counter\nhawser_things_total 3\n"));

        let (ty, body) = render(&r, None);
        assert!(ty.starts_with("text/plain; version=0.0.4"), "{ty}");
        assert!(!body.contains("# EOF"), "{body}");
        // The classic format names a counter's family by its sample.
        assert!(body.contains("# TYPE hawser_things_total counter\nhawser_things_total 3\n"));
    }

    #[test]
    fn process_metrics_are_read_from_proc() {
        let (_, body) = render(&registry(), None);
        let rss: f64 = body
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            rss > 1e6,
            "a test process holds more than a megabyte: {rss}"
        );
        assert!(body.contains("process_cpu_seconds_total "), "{body}");
    }
}
