//! `POST /v1/cluster/admin-token`: rotating the admin token without an outage. The new
//! token is random, shown once, and its digest replaces the old in the store by
//! compare-and-swap; the old digest stays valid for a grace period, so the CLIs and CSI
//! drivers that hold it can be given the new one. Other controllers of the cluster take the
//! new digests from the store within seconds (`refresh_forever`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use hawser_api::controller::{AdminTokenRotated, RotateAdminToken};

use crate::errors::ControllerError;
use crate::server::ApiJson;
use crate::state::AppState;

const DEFAULT_GRACE_SECS: u64 = 3600;
const MAX_GRACE_SECS: u64 = 7 * 24 * 3600;
/// How often a controller reads the token digests again.
const REFRESH: Duration = Duration::from_secs(5);

pub async fn rotate_admin_token(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<RotateAdminToken>,
) -> Result<Json<AdminTokenRotated>, ControllerError> {
    let grace = req.grace_secs.unwrap_or(DEFAULT_GRACE_SECS);
    if grace > MAX_GRACE_SECS {
        return Err(ControllerError::invalid(format!(
            "grace_secs {grace}: use 0 to {MAX_GRACE_SECS}"
        )));
    }
    let store = st.records.store();
    let (token, until) = st
        .tokens
        .rotate_admin(&*store, grace.saturating_mul(1000))
        .await?;
    tracing::warn!(
        grace_secs = grace,
        "admin token rotated; the previous one works until the grace period ends"
    );
    Ok(Json(AdminTokenRotated {
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
