//! `GET /v1/pools`: every node's pools, as last reported by their agents.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::Json;
use hawser_api::controller::PoolInfo;

use crate::api::extract::ApiQuery;
use crate::api::paging::{self, PageQuery};
use crate::errors::ControllerError;
use crate::state::AppState;

/// Every pool, by node; one page of them with `?limit=&after=NODE/POOL` (`api::paging`).
pub async fn list(
    State(st): State<Arc<AppState>>,
    uri: Uri,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<PoolInfo>>), ControllerError> {
    let nodes = st.records.nodes().await?;
    let pools: Vec<PoolInfo> = nodes.into_iter().flat_map(|n| n.pools).collect();
    let (headers, pools) = paging::page(pools, |p| format!("{}/{}", p.node, p.name), &q, &uri)?;
    Ok((headers, Json(pools)))
}
