//! The routes that hand out certificates: join tokens, a node's join and renewal
//! (`auth/join.rs`), and NBD clients' certificates (`auth/client_cert.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use hawser_api::controller::{
    ClientCertificate, CreateClientCertificate, CreateJoinToken, JoinNode, JoinTokenCreated,
    NodeCertificate, RenewCertificate,
};
use hawser_listen::Transport;

use crate::api::extract::{ApiJson, ApiPath};
use crate::auth::{client_cert, join, Principal};
use crate::errors::ControllerError;
use crate::state::AppState;

/// `POST /v1/join-tokens`.
pub async fn create_join_token(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<CreateJoinToken>,
) -> Result<Json<JoinTokenCreated>, ControllerError> {
    Ok(Json(join::create_join_token(&st, req).await?))
}

/// `POST /v1/join`.
pub async fn join(
    State(st): State<Arc<AppState>>,
    transport: Option<Extension<Transport>>,
    ApiJson(req): ApiJson<JoinNode>,
) -> Result<Json<NodeCertificate>, ControllerError> {
    Ok(Json(join::join(&st, transport.as_deref(), req).await?))
}

/// `POST /v1/nodes/{node}/certificate`.
pub async fn renew(
    State(st): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ApiPath(node): ApiPath<String>,
    ApiJson(req): ApiJson<RenewCertificate>,
) -> Result<Json<NodeCertificate>, ControllerError> {
    Ok(Json(join::renew(&st, &principal, &node, req)?))
}

/// `POST /v1/client-certificates`.
pub async fn create_client_certificate(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<CreateClientCertificate>,
) -> Result<Json<ClientCertificate>, ControllerError> {
    Ok(Json(client_cert::create(&st, req).await?))
}
