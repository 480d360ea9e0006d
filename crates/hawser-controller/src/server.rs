//! The HTTP server: routes, the body limit, and extractors that turn every malformed request
//! into a JSON `ApiError` (axum's defaults answer in plain text, some with 422).

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use serde::de::DeserializeOwned;

use crate::constants::MAX_BODY_BYTES;
use crate::errors::ControllerError;
use crate::leader::Role;
use crate::state::AppState;
use crate::{api_nodes, api_pools, api_replicas, api_status, api_volumes};

pub fn router(state: Arc<AppState>) -> Router {
    let leader_only = axum::middleware::from_fn_with_state(state.clone(), require_leader);
    Router::new()
        .route("/v1/nodes", get(api_nodes::list))
        .route(
            "/v1/nodes/{node}",
            put(api_nodes::register).get(api_nodes::show),
        )
        .route("/v1/nodes/{node}/evacuate", post(api_nodes::evacuate))
        .route("/v1/nodes/{node}/restore", post(api_nodes::restore))
        .route("/v1/pools", get(api_pools::list))
        .route("/v1/status", get(api_status::show))
        .route("/v1/replicas", get(api_replicas::list))
        .route("/v1/replicas/{id}", get(api_replicas::show))
        .route(
            "/v1/volumes",
            post(api_volumes::create).get(api_volumes::list),
        )
        .route(
            "/v1/volumes/{name}",
            get(api_volumes::show).delete(api_volumes::delete),
        )
        .route("/v1/volumes/{name}/attach", post(api_volumes::attach))
        .route("/v1/volumes/{name}/detach", post(api_volumes::detach))
        .route(
            "/v1/volumes/{name}/replicas/{id}/outdate",
            post(api_volumes::outdate),
        )
        .route(
            "/v1/volumes/{name}/replicas/{id}/in-sync",
            post(api_volumes::mark_in_sync),
        )
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(leader_only)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Only the leader serves the API, reads included: a follower's view may lag behind the
/// leader's in-memory decisions (reservations, per-volume locks), and one place to ask keeps
/// clients simple. Followers say where the leader is.
async fn require_leader(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    match st.leadership.role() {
        Role::Follower { leader_url } => ControllerError::NotLeader { leader_url }.into_response(),
        Role::Sole | Role::Leader { .. } => next.run(req).await,
    }
}

async fn no_route(method: Method, uri: Uri) -> ControllerError {
    ControllerError::NoRoute {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ControllerError {
    ControllerError::BadBody {
        status: 405,
        message: format!("method {method} is not allowed on {}", uri.path()),
    }
}

/// `axum::Json` whose rejections are JSON `ApiError`s: 400 for anything malformed (syntax,
/// wrong types, unknown fields, missing content type), 413 past the body limit.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ControllerError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ControllerError {
    let status = r.status().as_u16();
    if status == 413 {
        return ControllerError::BadBody {
            status,
            message: format!("request body is larger than {MAX_BODY_BYTES} bytes"),
        };
    }
    let message = match r {
        JsonRejection::MissingJsonContentType(_) => {
            "expected a JSON body with Content-Type: application/json".to_string()
        }
        other => other.body_text(),
    };
    ControllerError::BadBody {
        status: 400,
        message,
    }
}

/// `axum::extract::Path` with JSON rejections.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ControllerError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(ApiPath(v)),
            Err(r) => Err(path_rejection(r)),
        }
    }
}

fn path_rejection(r: PathRejection) -> ControllerError {
    ControllerError::BadBody {
        status: 400,
        message: r.body_text(),
    }
}
