//! `POST /v1/cluster/admin-token`, `/v1/cluster/agent-token` and `/v1/cluster/metrics-token`: rotating a cluster token
//! without an outage. The new token is random, shown once, and its digest replaces the old in
//! the store by compare-and-swap; the old digest stays valid for a grace period, so the CLIs
//! and CSI drivers (admin token) or the node installers (agent token: nodes join with it)
//! that hold it can be given the new one. Other controllers of the cluster take the new
//! digests from the store within seconds (`refresh_forever`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use hawser_api::controller::{RotateToken, TokenRotated};

use crate::api::extract::ApiJson;
use crate::auth::TokenKind;
use crate::errors::ControllerError;
use crate::state::AppState;

const DEFAULT_GRACE_SECS: u64 = 3600;
const MAX_GRACE_SECS: u64 = 7 * 24 * 3600;
/// How often a controller reads the token digests again.
const REFRESH: Duration = Duration::from_secs(5);

pub async fn rotate_admin_token(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<RotateToken>,
) -> Result<Json<TokenRotated>, ControllerError> {
    rotate(&st, TokenKind::Admin, req).await
}

pub async fn rotate_agent_token(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<RotateToken>,
) -> Result<Json<TokenRotated>, ControllerError> {
    rotate(&st, TokenKind::Agent, req).await
}

/// The metrics (scrape) token; agents learn its new digest with their next heartbeat.
pub async fn rotate_metrics_token(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<RotateToken>,
) -> Result<Json<TokenRotated>, ControllerError> {
    rotate(&st, TokenKind::Metrics, req).await
}

async fn rotate(
    st: &AppState,
    kind: TokenKind,
    req: RotateToken,
) -> Result<Json<TokenRotated>, ControllerError> {
    let grace = req.grace_secs.unwrap_or(DEFAULT_GRACE_SECS);
    if grace > MAX_GRACE_SECS {
        return Err(ControllerError::invalid(format!(
            "grace_secs {grace}: use 0 to {MAX_GRACE_SECS}"
        )));
    }
    let store = st.records.store();
    let (token, until) = st
        .tokens
        .rotate(&*store, kind, grace.saturating_mul(1000))
        .await?;
    tracing::warn!(
        token = ?kind,
        grace_secs = grace,
        "token rotated; the previous one works until the grace period ends"
    );
    Ok(Json(TokenRotated {
        token,
        previous_valid_until_ms: until,
    }))
}

/// Reads the token digests from the store every few seconds, forever.
pub async fn refresh_forever(st: Arc<AppState>) {
    loop {
        tokio::time::sleep(REFRESH).await;
        let store = st.records.store();
        if let Err(e) = st.tokens.refresh(&*store).await {
            tracing::debug!(error = %format!("{e:#}"), "cannot refresh the token digests");
        }
    }
}
