//! Riding out a cluster store outage: the records' reads and writes are retried, with
//! backoff and within [`STORE_RETRY_DEADLINE`], while etcd cannot be reached, and while
//! this controller has stepped down for that reason and no other controller leads. An
//! operation in flight when etcd dies therefore finishes once etcd is back, instead of
//! stopping between two of its writes.
//!
//! Why retrying is safe:
//! - Reads, and unconditional writes of the same value, are idempotent.
//! - A conditional write whose answer was lost may have happened. Sent again, it either
//!   happens now or fails with `Conflict` (its own first attempt changed the version), and
//!   the records treat that like any lost race: they re-read and recognise their own write
//!   (`store/records.rs`).
//! - Each attempt carries the fence of the leadership current at that moment. An operation
//!   that began before this controller stepped down goes on only if it leads again, and
//!   then every write it makes is still conditioned on the record it read, so whatever
//!   another leader did in between is seen (a conflict, then re-read and re-checked) rather
//!   than overwritten. Once another controller is known to lead, the operation stops at
//!   once with `Fenced` (the API's `not_leader`).
//!
//! When the deadline passes, the last error is returned and the operation fails the way it
//! fails on any store error (a create rolls back, a delete stays Deleting for a retry).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hawser_store::{Expect, LeaseId, Result, Store, StoreError, Versioned, Watch, WriteOptions};
use tokio::time::Instant;

use crate::constants::{STORE_RETRY_DEADLINE, STORE_RETRY_FIRST_BACKOFF, STORE_RETRY_MAX_BACKOFF};
use crate::state::metrics::StoreMetrics;
use crate::store::leader::{Leadership, Role};

/// How long and how often to retry.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// No attempt starts after this much time since the first.
    pub deadline: Duration,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// The controller's policy (`constants.rs`).
    pub const STORE: RetryPolicy = RetryPolicy {
        deadline: STORE_RETRY_DEADLINE,
        first_backoff: STORE_RETRY_FIRST_BACKOFF,
        max_backoff: STORE_RETRY_MAX_BACKOFF,
    };
}

/// The records' store with outage retries (see the module doc). Leases and watches pass
/// through untouched: the election handles its own failures.
pub struct RetryingStore {
    inner: Arc<dyn Store>,
    leadership: Leadership,
    /// This controller's URL: a follower whose known leader is itself holds a stale key.
    own_url: String,
    policy: RetryPolicy,
    metrics: StoreMetrics,
}

impl RetryingStore {
    pub fn new(
        inner: Arc<dyn Store>,
        leadership: Leadership,
        own_url: String,
        policy: RetryPolicy,
    ) -> RetryingStore {
        RetryingStore {
            inner,
            leadership,
            own_url,
            policy,
            metrics: StoreMetrics::default(),
        }
    }

    /// Times every call (retries included) and counts the ones that fail into `metrics`.
    pub fn with_metrics(mut self, metrics: StoreMetrics) -> RetryingStore {
        self.metrics = metrics;
        self
    }

    /// Whether a failed call may succeed later without anyone else's help.
    fn transient(&self, e: &StoreError) -> bool {
        match e {
            StoreError::Unavailable { .. } => true,
            // Refused for leadership: worth waiting only while nobody else leads.
            StoreError::Fenced { .. } => match self.leadership.role() {
                Role::Sole | Role::Leader { .. } => true,
                Role::Follower { leader_url } => {
                    leader_url.is_none_or(|u| u.trim_end_matches('/') == self.own_url)
                }
            },
            _ => false,
        }
    }

    /// Runs `call` until it succeeds, fails for good, or the deadline passes.
    async fn retry<T, F, Fut>(&self, op: &'static str, key: &str, call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let start = Instant::now();
        let result = self.retry_loop(op, key, start, call).await;
        self.metrics
            .observe(op, start.elapsed(), result.as_ref().err());
        result
    }

    async fn retry_loop<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        start: Instant,
        mut call: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut backoff = self.policy.first_backoff;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match call().await {
                Ok(v) => {
                    if attempts > 1 {
                        tracing::info!(op, key, attempts, "cluster store call succeeded again");
                    }
                    return Ok(v);
                }
                Err(e)
                    if self.transient(&e) && start.elapsed() + backoff < self.policy.deadline =>
                {
                    if attempts == 1 {
                        tracing::warn!(op, key, error = %e, "cluster store call failed; retrying");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.policy.max_backoff);
                }
                Err(e) => {
                    if attempts > 1 {
                        tracing::warn!(op, key, attempts, error = %e, "giving up on the store");
                    }
                    return Err(e);
                }
            }
        }
    }
}

#[async_trait]
impl Store for RetryingStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        self.retry("get", key, || self.inner.get(key)).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>> {
        self.retry("list", prefix, || self.inner.list(prefix)).await
    }
    async fn list_at(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64)> {
        self.retry("list", prefix, || self.inner.list_at(prefix))
            .await
    }
    async fn put_with(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Expect,
        opts: &WriteOptions,
    ) -> Result<u64> {
        self.retry("put", key, || {
            self.inner.put_with(key, value.clone(), expect, opts)
        })
        .await
    }
    async fn delete_with(&self, key: &str, expect: Expect, opts: &WriteOptions) -> Result<()> {
        self.retry("delete", key, || self.inner.delete_with(key, expect, opts))
            .await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.inner.revoke_lease(lease).await
    }
    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch> {
        self.inner.watch(prefix, after).await
    }
    async fn revision(&self) -> Result<u64> {
        self.retry("read revision", "", || self.inner.revision())
            .await
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
