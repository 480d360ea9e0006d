//! `/v1/snapshots`: take, list, show and delete snapshots (the logic is in
//! `snapshots/create.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::Json;
use hawser_api::controller::{CreateSnapshot, Snapshot};
use serde::Deserialize;

use crate::api::extract::{ApiJson, ApiPath, ApiQuery};
use crate::api::paging::{self, PageQuery};
use crate::errors::ControllerError;
use crate::state::AppState;

type Shared = State<Arc<AppState>>;

pub async fn create(
    State(st): Shared,
    ApiJson(req): ApiJson<CreateSnapshot>,
) -> Result<(StatusCode, Json<Snapshot>), ControllerError> {
    let volume = req.volume.clone();
    let s = crate::snapshots::create::create_snapshot(&st, req).await?;
    Ok((StatusCode::CREATED, Json(s.to_api(&volume))))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this volume's snapshots.
    pub volume: Option<String>,
    /// A page (`api::paging`), by snapshot name.
    pub limit: Option<usize>,
    pub after: Option<String>,
}

/// Every snapshot (of one volume with `?volume=`), by volume, oldest first; one page of
/// them, by name, with `?limit=&after=`.
pub async fn list(
    State(st): Shared,
    uri: Uri,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<(HeaderMap, Json<Vec<Snapshot>>), ControllerError> {
    let volumes = st.records.volumes().await?;
    if let Some(name) = &q.volume {
        if !volumes.iter().any(|v| v.name == *name) {
            return Err(ControllerError::VolumeNotFound {
                volume: name.clone(),
            });
        }
    }
    let all: Vec<Snapshot> = volumes
        .iter()
        .filter(|v| q.volume.as_ref().is_none_or(|n| *n == v.name))
        .flat_map(|v| v.snapshots.iter().map(|s| s.to_api(&v.name)))
        .collect();
    let page_q = PageQuery {
        limit: q.limit,
        after: q.after,
    };
    let (headers, page) = paging::page(all, |s| s.name.clone(), &page_q, &uri)?;
    Ok((headers, Json(page)))
}

pub async fn show(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Snapshot>, ControllerError> {
    let volumes = st.records.volumes().await?;
    let (v, s) = crate::snapshots::create::find(&volumes, &name)
        .ok_or(ControllerError::SnapshotNotFound { snapshot: name })?;
    Ok(Json(s.to_api(&v.name)))
}

pub async fn delete(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ControllerError> {
    crate::snapshots::create::delete_snapshot(&st, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
