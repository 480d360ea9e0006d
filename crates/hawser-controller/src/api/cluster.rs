//! `/v1/cluster`: the cluster's identity and `hawser cluster recover` (`cluster/mod.rs` does
//! both), and `hawser cluster rotate-volume-key` (`volumes/key_rotation.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use hawser_api::controller::{ClusterInfo, RecoverCluster, RecoverReport, VolumeKeyRotated};

use crate::api::extract::ApiJson;
use crate::cluster;
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::volumes::key_rotation;

/// `GET /v1/cluster`.
pub async fn show(State(st): State<Arc<AppState>>) -> Result<Json<ClusterInfo>, ControllerError> {
    Ok(Json(cluster::show(&st).await?))
}

/// `POST /v1/cluster/recover`.
pub async fn recover(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<RecoverCluster>,
) -> Result<Json<RecoverReport>, ControllerError> {
    Ok(Json(cluster::recover(&st, req).await?))
}

/// `POST /v1/cluster/volume-key`.
pub async fn rotate_volume_key(
    State(st): State<Arc<AppState>>,
) -> Result<Json<VolumeKeyRotated>, ControllerError> {
    Ok(Json(key_rotation::rotate(&st).await?))
}
