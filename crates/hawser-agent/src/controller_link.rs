//! The agent's calls to the controller: registration/heartbeat and the engine's membership
//! requests (outdate, mark in-sync). Outdates are retried until the controller answers, because an engine must not
//! acknowledge a write a lost replica missed before the store says that replica is out; while
//! the controller is unreachable those writes wait (I/O suspends rather than diverges).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hawser_api::controller::{MarkInSync, Outdate, RegisterNode};
use hawser_api::{ApiError, ErrorCode};

use crate::constants::{CONTROLLER_CALL_TIMEOUT, OUTDATE_RETRY_INTERVAL};

pub enum OutdateOutcome {
    Done,
    /// The controller says a newer epoch exists.
    Fenced,
    /// The controller refused for another reason (only for requests where waiting is not
    /// the safe answer; see `mark_in_sync`).
    Refused,
    /// The engine stopped while retrying.
    GaveUp,
}

pub struct ControllerLink {
    base: String,
    http: reqwest::Client,
    stopped: Arc<AtomicBool>,
}

impl ControllerLink {
    pub fn new(base: &str) -> ControllerLink {
        let http = reqwest::Client::builder()
            .timeout(CONTROLLER_CALL_TIMEOUT)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        ControllerLink {
            base: base.trim_end_matches('/').to_owned(),
            http,
            stopped: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Take `replica` out of the in-sync set (as failed on a disk error). Retried until the
    /// controller answers yes or "stale epoch": a refusal for any other reason is retried
    /// too, because waiting is safe and guessing is not.
    pub async fn outdate(
        &self,
        volume: &str,
        replica: &str,
        epoch: u64,
        reason: &str,
        failed: bool,
    ) -> OutdateOutcome {
        let url = format!(
            "{}/v1/volumes/{volume}/replicas/{replica}/outdate",
            self.base
        );
        let body = Outdate {
            epoch,
            reason: reason.into(),
            failed,
        };
        self.post_until_answered("outdate", &url, &body, volume, replica, false)
            .await
    }

    /// Make a resynced replica in-sync again. Retried while the controller is unreachable;
    /// a refusal (e.g. the replica was marked failed meanwhile) is final.
    pub async fn mark_in_sync(&self, volume: &str, replica: &str, epoch: u64) -> OutdateOutcome {
        let url = format!(
            "{}/v1/volumes/{volume}/replicas/{replica}/in-sync",
            self.base
        );
        let body = MarkInSync { epoch };
        self.post_until_answered("mark in-sync", &url, &body, volume, replica, true)
            .await
    }

    async fn post_until_answered<B: serde::Serialize>(
        &self,
        what: &str,
        url: &str,
        body: &B,
        volume: &str,
        replica: &str,
        refusal_is_final: bool,
    ) -> OutdateOutcome {
        let mut attempt = 0u32;
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return OutdateOutcome::GaveUp;
            }
            attempt += 1;
            match self.http.post(url).json(body).send().await {
                Ok(resp) if resp.status().is_success() => return OutdateOutcome::Done,
                Ok(resp) => {
                    let status = resp.status();
                    let err = resp.json::<ApiError>().await.ok();
                    if let Some(e) = &err {
                        if e.code == ErrorCode::StaleEpoch {
                            return OutdateOutcome::Fenced;
                        }
                    }
                    if refusal_is_final && status.is_client_error() {
                        tracing::error!(%volume, %replica, %status, error = ?err, "controller refused {what}");
                        return OutdateOutcome::Refused;
                    }
                    if attempt == 1 || attempt.is_multiple_of(30) {
                        tracing::error!(%volume, %replica, %status, error = ?err, "controller refused {what}; retrying");
                    }
                }
                Err(e) => {
                    if attempt == 1 || attempt.is_multiple_of(30) {
                        tracing::error!(%volume, %replica, error = %e, "controller unreachable for {what}; retrying");
                    }
                }
            }
            tokio::time::sleep(OUTDATE_RETRY_INTERVAL).await;
        }
    }

    pub async fn register(&self, node: &str, body: &RegisterNode) -> anyhow::Result<()> {
        let url = format!("{}/v1/nodes/{node}", self.base);
        let resp = self.http.put(&url).json(body).send().await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            anyhow::bail!("controller answered {status}: {text}");
        }
        Ok(())
    }
}
