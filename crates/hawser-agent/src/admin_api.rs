//! The agent's admin API (see `hawser_api::agent` for the endpoint table), called by the
//! controller. Storage errors map to API error codes in `storage_error`, the one place.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use hawser_api::agent::{AgentStatus, CreateReplica, StartEngine};
use hawser_api::{ApiError, ErrorCode};
use hawser_storage::{NewReplica, StorageError};

use crate::engines::Engines;
use crate::node_storage::{status, NodeStorage};
use crate::volume_engine::VolumeEngine;

#[derive(Clone)]
pub struct AdminState {
    pub node: String,
    pub storage: Arc<NodeStorage>,
    pub engines: Arc<Engines>,
    /// Resync rate of the engines it starts, bytes per second (0: unlimited).
    pub resync_rate: u64,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/v1/status", get(get_status))
        .route("/v1/replicas", post(create_replica))
        .route("/v1/replicas/{id}", delete(delete_replica))
        .route("/v1/engines", post(start_engine))
        .route("/v1/engines/{volume}", delete(stop_engine))
        .with_state(state)
}

pub struct Failure(ApiError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, Json(self.0)).into_response()
    }
}

fn storage_error(e: StorageError) -> Failure {
    let code = match &e {
        StorageError::NoRoom { .. } => ErrorCode::InsufficientCapacity,
        StorageError::ReplicaExists { .. } => ErrorCode::AlreadyExists,
        StorageError::ReplicaNotFound { .. } => ErrorCode::NotFound,
        StorageError::InvalidSize { .. }
        | StorageError::InvalidId { .. }
        | StorageError::WrongKind { .. } => ErrorCode::InvalidArgument,
        StorageError::Io { .. } | StorageError::Meta { .. } => ErrorCode::Internal,
    };
    Failure(ApiError::new(code, e.to_string()))
}

async fn get_status(State(s): State<AdminState>) -> Json<AgentStatus> {
    let storage = s.storage.clone();
    let (pools, replicas) =
        tokio::task::spawn_blocking(move || (storage.pool_infos(), storage.replica_statuses()))
            .await
            .unwrap_or_default();
    Json(AgentStatus {
        node: s.node.clone(),
        pools,
        replicas,
        engines: s.engines.statuses(),
    })
}

async fn create_replica(
    State(s): State<AdminState>,
    Json(req): Json<CreateReplica>,
) -> Result<impl IntoResponse, Failure> {
    let new = NewReplica {
        id: req.replica_id.clone(),
        volume: req.volume.clone(),
        size: req.size_bytes,
        thin: req.thin,
    };
    let storage = s.storage.clone();
    let replica = tokio::task::spawn_blocking(move || storage.create(&req.pool, &new))
        .await
        .map_err(|e| Failure(ApiError::new(ErrorCode::Internal, e.to_string())))?
        .map_err(storage_error)?;
    tracing::info!(
        replica = replica.id(),
        volume = replica.volume(),
        "replica created"
    );
    Ok((StatusCode::CREATED, Json(status(&replica))))
}

async fn delete_replica(
    State(s): State<AdminState>,
    Path(id): Path<String>,
) -> Result<StatusCode, Failure> {
    let storage = s.storage.clone();
    let rid = id.clone();
    tokio::task::spawn_blocking(move || storage.delete(&rid))
        .await
        .map_err(|e| Failure(ApiError::new(ErrorCode::Internal, e.to_string())))?
        .map_err(storage_error)?;
    tracing::info!(replica = %id, "replica deleted");
    Ok(StatusCode::NO_CONTENT)
}

async fn start_engine(
    State(s): State<AdminState>,
    Json(req): Json<StartEngine>,
) -> Result<impl IntoResponse, Failure> {
    if let Some(existing) = s.engines.get(&req.volume) {
        if existing.status().epoch == req.epoch {
            return Ok((StatusCode::OK, Json(existing.status())));
        }
    }
    let engine = VolumeEngine::start(&req, &s.node, &s.storage, s.resync_rate)
        .await
        .map_err(|e| {
            Failure(ApiError::new(
                ErrorCode::Unavailable,
                format!("start engine: {e:#}"),
            ))
        })?;
    if let Some(old) = s.engines.insert(&req.volume, engine.clone()) {
        old.stop().await;
    }
    tracing::info!(volume = %req.volume, epoch = req.epoch, "engine started");
    Ok((StatusCode::CREATED, Json(engine.status())))
}

async fn stop_engine(
    State(s): State<AdminState>,
    Path(volume): Path<String>,
) -> Result<StatusCode, Failure> {
    let engine = s
        .engines
        .remove(&volume)
        .ok_or_else(|| Failure(ApiError::not_found("engine", &volume)))?;
    engine.stop().await;
    tracing::info!(%volume, "engine stopped");
    Ok(StatusCode::NO_CONTENT)
}
