//! What the controller counts as it happens, for `GET /metrics` (`api/metrics.rs`, which adds
//! what it reads from the store at each scrape): replicas outdated and resynced back in,
//! reports refused for a stale epoch, and the cluster store's calls. Every part of the
//! controller counts through [`AppState::metrics`](crate::state::AppState), so this file
//! imports nothing of the controller.

use std::time::Duration;

use hawser_api::metrics::LATENCY_BUCKETS_SECS;
use hawser_store::StoreError;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// What the controller counts as it happens. Clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct ControllerMetrics {
    /// Replicas taken out of the in-sync set (an engine lost them), by whether they failed.
    pub outdated: Counter,
    pub failed: Counter,
    /// Outdated replicas an engine resynced and marked in-sync again.
    pub resynced: Counter,
    /// Outdate or in-sync reports refused for a stale epoch: a fenced engine.
    pub stale_epoch_reports: Counter,
    /// The cluster store's calls (see [`StoreMetrics`]).
    pub store: StoreMetrics,
}

/// The cluster store's calls as the records make them (`store_retry`): latency, retries
/// included, and failures other than a lost compare-and-swap (which is how concurrent
/// updates are ordered, not an error of the store). Clones share the series.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    pub(crate) latency: Family<Labels, Histogram, fn() -> Histogram>,
    pub(crate) errors: Family<Labels, Counter>,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics {
            latency: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS_SECS)),
            errors: Family::default(),
        }
    }
}

impl StoreMetrics {
    /// One call of `op` (get, list, put, delete, ...) that took `took` and failed with
    /// `error`, if it did.
    pub fn observe(&self, op: &'static str, took: Duration, error: Option<&StoreError>) {
        let labels = vec![("op", op.to_string())];
        self.latency
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if error.is_some_and(|e| !e.is_conflict()) {
            self.errors.get_or_create(&labels).inc();
        }
    }
}

/// A series' labels: (name, value) pairs.
pub(crate) type Labels = Vec<(&'static str, String)>;
