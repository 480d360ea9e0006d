//! `hawser cluster rotate-ca`'s routes: the rotation as it stands, and one step of it
//! (`auth/ca_rotation.rs` takes the step and says when the cluster is not ready for it).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use hawser_api::controller::{CaRotation, StartCaRotationStep};

use crate::api::extract::ApiJson;
use crate::auth::ca_rotation;
use crate::errors::ControllerError;
use crate::state::AppState;

/// `GET /v1/cluster/ca-rotation`.
pub async fn show(State(st): State<Arc<AppState>>) -> Result<Json<CaRotation>, ControllerError> {
    Ok(Json(ca_rotation::show(&st).await?))
}

/// `POST /v1/cluster/ca-rotation`: takes one step.
pub async fn step(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<StartCaRotationStep>,
) -> Result<Json<CaRotation>, ControllerError> {
    Ok(Json(ca_rotation::step(&st, req).await?))
}
