//! The HTTP server: routes, the body limit, and extractors that turn every malformed request
//! into a JSON `ApiError` (axum's defaults answer in plain text, some with 422).

pub(crate) mod backups;
pub(crate) mod ca_rotation;
pub(crate) mod certificates;
pub(crate) mod cluster;
pub(crate) mod extract;
pub(crate) mod io;
pub(crate) mod metrics;
pub(crate) mod nodes;
pub(crate) mod paging;
pub(crate) mod pools;
pub(crate) mod replicas;
pub(crate) mod snapshots;
pub(crate) mod status;
pub(crate) mod tokens;
pub(crate) mod ui;
pub(crate) mod volumes;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::Router;

use axum::Extension;
use hawser_listen::Transport;

use crate::auth::Caller;
use crate::constants::MAX_BODY_BYTES;
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::leader::Role;

/// One route of the API: method, path (axum syntax), who may call it, and its handler.
struct Route {
    method: Method,
    path: &'static str,
    caller: Caller,
    handler: MethodRouter<Arc<AppState>>,
}

fn route(
    method: Method,
    path: &'static str,
    caller: Caller,
    handler: MethodRouter<Arc<AppState>>,
) -> Route {
    Route {
        method,
        path,
        caller,
        handler,
    }
}

/// Every route the API serves: the router is built from this list, and `docs/openapi.json`
/// is tested against it ([`route_table`]).
fn routes() -> Vec<Route> {
    use Caller::{Admin, Agent, Joining, Metrics, NodeRead};
    use Method as M;
    vec![
        route(M::GET, "/v1/nodes", Admin, get(nodes::list)),
        route(M::PUT, "/v1/nodes/{node}", Agent, put(nodes::register)),
        route(M::GET, "/v1/nodes/{node}", NodeRead, get(nodes::show)),
        route(
            M::POST,
            "/v1/nodes/{node}/engines",
            Agent,
            post(nodes::start_engines),
        ),
        route(
            M::POST,
            "/v1/nodes/{node}/events",
            Agent,
            post(nodes::device_event),
        ),
        route(
            M::POST,
            "/v1/nodes/{node}/evacuate",
            Admin,
            post(nodes::evacuate),
        ),
        route(
            M::POST,
            "/v1/nodes/{node}/restore",
            Admin,
            post(nodes::restore),
        ),
        route(M::GET, "/v1/cluster", Admin, get(cluster::show)),
        route(
            M::POST,
            "/v1/cluster/admin-token",
            Admin,
            post(crate::api::tokens::rotate_admin_token),
        ),
        route(
            M::POST,
            "/v1/cluster/agent-token",
            Admin,
            post(crate::api::tokens::rotate_agent_token),
        ),
        route(
            M::POST,
            "/v1/cluster/metrics-token",
            Admin,
            post(crate::api::tokens::rotate_metrics_token),
        ),
        route(
            M::POST,
            "/v1/cluster/volume-key",
            Admin,
            post(cluster::rotate_volume_key),
        ),
        route(
            M::GET,
            "/metrics",
            Metrics,
            get(crate::api::metrics::scrape),
        ),
        route(
            M::POST,
            "/v1/join-tokens",
            Admin,
            post(certificates::create_join_token),
        ),
        route(M::POST, "/v1/join", Joining, post(certificates::join)),
        route(
            M::GET,
            "/v1/cluster/ca-rotation",
            Admin,
            get(ca_rotation::show),
        ),
        route(
            M::POST,
            "/v1/cluster/ca-rotation",
            Admin,
            post(ca_rotation::step),
        ),
        route(
            M::POST,
            "/v1/client-certificates",
            Admin,
            post(certificates::create_client_certificate),
        ),
        route(
            M::POST,
            "/v1/nodes/{node}/certificate",
            Agent,
            post(certificates::renew),
        ),
        route(
            M::POST,
            "/v1/cluster/recover",
            Admin,
            post(cluster::recover),
        ),
        route(M::GET, "/v1/pools", Admin, get(pools::list)),
        route(M::GET, "/v1/status", Admin, get(status::show)),
        route(M::GET, "/v1/io", Admin, get(crate::api::io::io)),
        route(M::POST, "/v1/snapshots", Admin, post(snapshots::create)),
        route(M::GET, "/v1/snapshots", Admin, get(snapshots::list)),
        route(M::GET, "/v1/snapshots/{name}", Admin, get(snapshots::show)),
        route(
            M::DELETE,
            "/v1/snapshots/{name}",
            Admin,
            delete(snapshots::delete),
        ),
        route(
            M::POST,
            "/v1/backup-targets",
            Admin,
            post(backups::add_target),
        ),
        route(
            M::GET,
            "/v1/backup-targets",
            Admin,
            get(backups::list_targets),
        ),
        route(
            M::GET,
            "/v1/backup-targets/{name}",
            Admin,
            get(backups::show_target),
        ),
        route(
            M::DELETE,
            "/v1/backup-targets/{name}",
            Admin,
            delete(backups::remove_target),
        ),
        route(M::POST, "/v1/backups", Admin, post(backups::create)),
        route(M::GET, "/v1/backups", Admin, get(backups::list)),
        route(M::GET, "/v1/backups/{name}", Admin, get(backups::show)),
        route(
            M::DELETE,
            "/v1/backups/{name}",
            Admin,
            delete(backups::delete_backup),
        ),
        route(
            M::POST,
            "/v1/backup-targets/{name}/prune",
            Admin,
            post(backups::prune_target),
        ),
        route(
            M::PUT,
            "/v1/volumes/{name}/backup-schedules/{target}",
            Admin,
            put(backups::set_schedule),
        ),
        route(
            M::DELETE,
            "/v1/volumes/{name}/backup-schedules/{target}",
            Admin,
            delete(backups::remove_schedule),
        ),
        route(M::GET, "/v1/events", Admin, get(crate::api::io::events)),
        route(M::GET, "/v1/replicas", Admin, get(replicas::list)),
        route(M::GET, "/v1/replicas/{id}", Admin, get(replicas::show)),
        route(M::GET, "/v1/trash", Admin, get(replicas::trash)),
        route(M::POST, "/v1/volumes", Admin, post(volumes::create)),
        route(M::GET, "/v1/volumes", Admin, get(volumes::list)),
        route(M::GET, "/v1/volumes/{name}", NodeRead, get(volumes::show)),
        route(
            M::DELETE,
            "/v1/volumes/{name}",
            Admin,
            delete(volumes::delete),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/attach",
            Admin,
            post(volumes::attach),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/detach",
            Admin,
            post(volumes::detach),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/expand",
            Admin,
            post(volumes::expand),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/restore",
            Admin,
            post(volumes::restore),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/activate",
            Admin,
            post(volumes::activate),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/qos",
            Admin,
            post(volumes::set_qos),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/scrub",
            Admin,
            post(volumes::scrub),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/force-promote",
            Admin,
            post(volumes::force_promote),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/replicas/{id}/outdate",
            Agent,
            post(volumes::outdate),
        ),
        route(
            M::POST,
            "/v1/volumes/{name}/replicas/{id}/in-sync",
            Agent,
            post(volumes::mark_in_sync),
        ),
    ]
}

/// The (method, path) of every route, paths in axum's `{param}` syntax (as OpenAPI's).
pub fn route_table() -> Vec<(String, String)> {
    routes()
        .into_iter()
        .map(|r| (r.method.to_string(), r.path.to_string()))
        .collect()
}

pub fn router(state: Arc<AppState>) -> Router {
    let mut router = Router::new();
    for r in routes() {
        let guard = axum::middleware::from_fn_with_state((state.clone(), r.caller), guard);
        router = router.route(r.path, r.handler.route_layer(guard));
    }
    router
        .merge(crate::api::ui::router())
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Runs before every handler: the bearer token first (401/403 before anything else, so an
/// unauthenticated client learns nothing, not even who leads), then leadership.
///
/// Only the leader serves the API, reads included: a follower's view may lag behind the
/// leader's in-memory decisions (reservations, per-volume locks), and one place to ask keeps
/// clients simple. Followers say where the leader is.
async fn guard(
    State((st, caller)): State<(Arc<AppState>, Caller)>,
    req: Request,
    next: Next,
) -> Response {
    let mut req = req;
    let transport = req.extensions().get::<Transport>().cloned();
    match st.tokens.check(req.headers(), transport.as_ref(), caller) {
        Ok(p) => {
            req.extensions_mut().insert(p);
        }
        Err(e) => return e.into_response(),
    }
    match st.leadership.role() {
        // Every controller answers a scrape about itself.
        _ if caller == Caller::Metrics => next.run(req).await,
        Role::Follower { leader_url } => ControllerError::NotLeader { leader_url }.into_response(),
        Role::Sole | Role::Leader { .. } => next.run(req).await,
    }
}

/// Unknown paths and methods need the admin token too: without it, 401 like everywhere.
async fn no_route(
    State(st): State<Arc<AppState>>,
    transport: Option<Extension<Transport>>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
) -> ControllerError {
    admin_or(&st, transport, &headers).unwrap_or(ControllerError::NoRoute {
        method: method.to_string(),
        path: uri.path().to_string(),
    })
}

async fn method_not_allowed(
    State(st): State<Arc<AppState>>,
    transport: Option<Extension<Transport>>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
) -> ControllerError {
    admin_or(&st, transport, &headers).unwrap_or(ControllerError::BadBody {
        status: 405,
        message: format!("method {method} is not allowed on {}", uri.path()),
    })
}

/// The refusal of a caller without the admin token, if this one is such a caller.
fn admin_or(
    st: &AppState,
    transport: Option<Extension<Transport>>,
    headers: &HeaderMap,
) -> Option<ControllerError> {
    st.tokens
        .check(headers, transport.as_deref(), Caller::Admin)
        .err()
}
