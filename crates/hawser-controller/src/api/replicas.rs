//! `GET /v1/replicas` and `GET /v1/replicas/{id}`: every replica with its volume, including
//! retired ones (replaced or moved, waiting for their node to delete them). Replicas are
//! changed through their volume (`/v1/volumes/...`) and by self-healing, never directly.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::Json;
use hawser_api::controller::{OrphanReplica, ReplicaInfo};

use crate::api::extract::{ApiPath, ApiQuery};
use crate::api::paging::{self, PageQuery};
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::VolumeRecord;

/// Every replica, by volume; one page of them, by replica id, with `?limit=&after=`.
pub async fn list(
    State(st): State<Arc<AppState>>,
    uri: Uri,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<ReplicaInfo>>), ControllerError> {
    let volumes = st.records.volumes().await?;
    let all: Vec<ReplicaInfo> = volumes.iter().flat_map(infos).collect();
    let (headers, page) = paging::page(all, |r| r.replica.id.clone(), &q, &uri)?;
    Ok((headers, Json(page)))
}

/// `GET /v1/trash`: the trash of every agent that answers; one page of it, by
/// `NODE/REPLICA`, with `?limit=&after=`.
pub async fn trash(
    State(st): State<Arc<AppState>>,
    uri: Uri,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<OrphanReplica>>), ControllerError> {
    let mut out = Vec::new();
    for n in st.records.nodes().await? {
        let status = tokio::time::timeout(STATUS_TIMEOUT, st.agents.status(n.agent())).await;
        match status {
            Ok(Ok(s)) => out.extend(s.trash.into_iter().map(|replica| OrphanReplica {
                node: n.name.clone(),
                replica,
            })),
            _ => tracing::debug!(node = %n.name, "trash listing: agent does not answer"),
        }
    }
    let key = |o: &OrphanReplica| format!("{}/{}", o.node, o.replica.replica_id);
    let (headers, page) = paging::page(out, key, &q, &uri)?;
    Ok((headers, Json(page)))
}

const STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn show(
    State(st): State<Arc<AppState>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ReplicaInfo>, ControllerError> {
    let volumes = st.records.volumes().await?;
    let found = volumes.iter().flat_map(infos).find(|r| r.replica.id == id);
    found
        .map(Json)
        .ok_or(ControllerError::UnknownReplica { replica: id })
}

fn infos(v: &VolumeRecord) -> impl Iterator<Item = ReplicaInfo> + '_ {
    let info = |retired: bool| {
        move |r: &hawser_api::controller::Replica| ReplicaInfo {
            volume: v.name.clone(),
            replica: r.clone(),
            retired,
        }
    };
    v.replicas
        .iter()
        .map(info(false))
        .chain(v.retired.iter().map(info(true)))
}
