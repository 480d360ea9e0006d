//! `GET /v1/pools`: every node's pools, as last reported by their agents.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use hawser_api::controller::PoolInfo;

use crate::errors::ControllerError;
use crate::state::AppState;

pub async fn list(State(st): State<Arc<AppState>>) -> Result<Json<Vec<PoolInfo>>, ControllerError> {
    let nodes = st.records.nodes().await?;
    Ok(Json(nodes.into_iter().flat_map(|n| n.pools).collect()))
}
