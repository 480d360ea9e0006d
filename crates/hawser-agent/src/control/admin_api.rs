//! The agent's admin API (see `hawser_api::agent` for the endpoint table), called by the
//! controller. Storage errors map to API error codes in `storage_error`, the one place.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use hawser_api::agent::{
    AgentIo, AgentStatus, CreateReplica, EnginePaused, EngineResumed, EngineStatus, FetchSnapshot,
    GrowEngine, GrowReplica, PauseEngine, PeerReach, ProbePeers, ReplicaSnapshot, ReplicaStatus,
    RestoreReplica, ResumeEngine, StartEngine, TakeSnapshot, NODE_HEADER,
};
use hawser_api::{auth, ApiError, ErrorCode};
use hawser_storage::{NewReplica, StorageError};

use hawser_listen::Transport;
use hawser_tls::Peer;

use crate::control::link::LinkAuth;
use crate::engine::rate_limit::ResyncRates;
use crate::engine::registry::pause::PauseError;
use crate::engine::registry::Engines;
use crate::observe::metrics::AgentMetrics;
use crate::storage::pools::{sealed_key, status, NodeStorage};

#[derive(Clone)]
pub struct AdminState {
    pub node: String,
    pub storage: Arc<NodeStorage>,
    pub engines: Arc<Engines>,
    /// Without TLS, the cluster's agent token: the controller sends it on every admin call.
    /// With TLS (`None`), only a client whose certificate names the controller gets in.
    pub token: Option<Arc<str>>,
    /// How engines authenticate their reports to the controller.
    pub link: LinkAuth,
    /// Resync rate of the engines it starts, bytes per second (0: unlimited).
    pub resync_rate: ResyncRates,
    pub metrics: Arc<AgentMetrics>,
    /// The kernel devices this agent serves: a growing volume's device is told its new size.
    pub devices: Option<Arc<crate::frontends::devices::Devices>>,
    /// The backups this node runs (`backup/`).
    pub backups: Arc<crate::backup::BackupJobs>,
}

pub fn router(state: AdminState) -> Router {
    let auth = axum::middleware::from_fn_with_state(state.clone(), require_token);
    Router::new()
        .route("/v1/status", get(get_status))
        .route("/v1/io", get(get_io))
        .route("/v1/replicas", post(create_replica))
        .route("/v1/replicas/{id}", delete(delete_replica))
        .route("/v1/replicas/{id}/grow", post(grow_replica))
        .route("/v1/replicas/{id}/wrapped-key", put(set_wrapped_key))
        .route("/v1/replicas/{id}/trash", post(trash_replica))
        .route("/v1/replicas/inventory", get(inventory))
        .route("/v1/replicas/held", get(held_replicas))
        .route("/v1/peers/probe", post(probe_peers))
        .route(
            "/v1/replicas/{id}/snapshots",
            post(take_snapshot).get(list_snapshots),
        )
        .route(
            "/v1/replicas/{id}/snapshots/{snapshot}",
            delete(delete_snapshot),
        )
        .route(
            "/v1/replicas/{id}/snapshots/{snapshot}/fetch",
            post(fetch_snapshot),
        )
        .route("/v1/replicas/{id}/restore", post(restore_replica))
        .route("/v1/engines", post(start_engine).get(list_engines))
        .route("/v1/engines/{volume}", delete(stop_engine))
        .route("/v1/engines/{volume}/qos", put(set_engine_qos))
        .route("/v1/engines/{volume}/grow", post(grow_engine))
        .route("/v1/devices", get(list_devices))
        .route("/v1/backup-jobs", post(crate::backup::start_job))
        .route("/v1/backup-jobs/{backup}", get(crate::backup::get_job))
        .route("/v1/restore-jobs", post(crate::backup::start_restore))
        .route("/v1/engines/{volume}/scrub", post(scrub_engine))
        .route("/v1/engines/{volume}/pause", post(pause_engine))
        .route("/v1/engines/{volume}/resume", post(resume_engine))
        .layer(auth)
        .merge(Router::new().route("/metrics", get(get_metrics)).layer(
            axum::middleware::from_fn_with_state(state.clone(), require_scrape_token),
        ))
        .with_state(state)
}

/// `GET /metrics`: Prometheus metrics (see `metrics`), OpenMetrics text when the scrape
/// accepts it, the classic text format otherwise.
async fn get_metrics(State(s): State<AdminState>, headers: axum::http::HeaderMap) -> Response {
    let accept = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Pool usage reads the filesystems: not on a runtime thread.
    let metrics = s.metrics.clone();
    match tokio::task::spawn_blocking(move || metrics.render(accept.as_deref())).await {
        Ok((content_type, body)) => {
            ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
        }
        Err(e) => Failure(ApiError::new(
            ErrorCode::Internal,
            format!("metrics could not be gathered: {e}"),
        ))
        .into_response(),
    }
}

/// The bearer token a request carries, if it is one at all and not longer than any token.
fn presented_token(req: &Request) -> Option<&str> {
    req.headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(auth::bearer_token)
        .filter(|t| t.len() <= auth::MAX_TOKEN_CHARS)
}

/// A scrape needs the cluster's metrics token (read-only: it opens nothing but `/metrics`),
/// or what the rest of the admin API takes (the controller's certificate or the agent token).
async fn require_scrape_token(State(s): State<AdminState>, req: Request, next: Next) -> Response {
    let presented = presented_token(&req);
    if presented.is_some_and(|t| s.metrics.admits(t)) {
        return next.run(req).await;
    }
    let controller = matches!(
        req.extensions().get::<Transport>(),
        Some(Transport::Tls {
            peer: Some(Peer::Controller)
        })
    );
    // Plaintext clusters: the agent token (checked there, 401 without it).
    if controller || s.token.is_some() {
        return require_token(State(s), req, next).await;
    }
    let e = ApiError::new(
        ErrorCode::Unauthorized,
        "unauthorized: /metrics needs `Authorization: Bearer <metrics token>` \
         (the controller's data dir has it: metrics.token)",
    );
    let mut resp = Failure(e).into_response();
    resp.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    resp
}

/// Every admin call needs the agent token: the admin API creates and deletes replicas and
/// starts engines, so anyone who can reach the port could otherwise destroy data. Digests
/// are compared in constant time.
async fn require_token(State(s): State<AdminState>, req: Request, next: Next) -> Response {
    let Some(token) = &s.token else {
        let peer = match req.extensions().get::<Transport>() {
            Some(Transport::Tls { peer }) => peer.clone(),
            _ => None,
        };
        if peer == Some(Peer::Controller) {
            return match misdirected(&s.node, &req) {
                None => next.run(req).await,
                Some(e) => Failure(e).into_response(),
            };
        }
        let who = peer.map_or("a client without a certificate".to_string(), |p| {
            p.to_string()
        });
        let e = ApiError::new(
            ErrorCode::Forbidden,
            format!("forbidden: only the controller calls the agent admin API, not {who}"),
        );
        return Failure(e).into_response();
    };
    let presented = presented_token(&req);
    let ok = presented.is_some_and(|t| auth::digests_equal(&auth::digest(t), &auth::digest(token)));
    if ok {
        return match misdirected(&s.node, &req) {
            None => next.run(req).await,
            Some(e) => Failure(e).into_response(),
        };
    }
    let e = ApiError::new(
        ErrorCode::Unauthorized,
        "unauthorized: the agent admin API needs `Authorization: Bearer <agent token>`",
    );
    let mut resp = Failure(e).into_response();
    resp.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    resp
}

/// A call whose `NODE_HEADER` names another node: this agent's address used to be that
/// node's (the controller has not noticed yet), and acting on it would, for one, place a
/// replica meant for that node here, beside another of the same volume. A call without the
/// header (a person with curl) is taken as meant for this node.
fn misdirected(node: &str, req: &Request) -> Option<ApiError> {
    let meant = req.headers().get(NODE_HEADER)?;
    if meant.as_bytes() == node.as_bytes() {
        return None;
    }
    let meant = String::from_utf8_lossy(meant.as_bytes());
    Some(ApiError::new(
        ErrorCode::Conflict,
        format!(
            "this agent is node {node}, not {}: its address is no longer that node's",
            hawser_api::error::truncate_chars(&meant, 100)
        ),
    ))
}

pub struct Failure(pub ApiError);

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
        StorageError::ReplicaExists { .. } | StorageError::SnapshotExists { .. } => {
            ErrorCode::AlreadyExists
        }
        StorageError::ReplicaNotFound { .. } | StorageError::SnapshotNotFound { .. } => {
            ErrorCode::NotFound
        }
        StorageError::StaleEpoch { .. } => ErrorCode::StaleEpoch,
        StorageError::Failed { .. } => ErrorCode::Conflict,
        StorageError::InvalidSize { .. }
        | StorageError::InvalidId { .. }
        | StorageError::Shrink { .. }
        | StorageError::WrongKind { .. }
        | StorageError::KeyMismatch { .. }
        | StorageError::NotEncrypted { .. } => ErrorCode::InvalidArgument,
        StorageError::InUse { .. } | StorageError::OtherCluster { .. } => ErrorCode::Conflict,
        StorageError::Io { .. } | StorageError::Meta { .. } => ErrorCode::Internal,
    };
    Failure(ApiError::new(code, e.to_string()))
}

/// The request counters of every volume exported here.
async fn get_io(State(s): State<AdminState>) -> Json<AgentIo> {
    Json(AgentIo {
        volumes: s.engines.io_counters(&s.node),
    })
}

/// `POST /v1/peers/probe`: whether this node reaches the replica ports of `peers`
/// (`control/peers.rs`).
async fn probe_peers(
    State(s): State<AdminState>,
    Json(req): Json<ProbePeers>,
) -> Result<Json<Vec<PeerReach>>, Failure> {
    let reached = crate::control::peers::probe(s.link.node.clone(), req).await;
    reached.map(Json).map_err(Failure)
}

async fn get_status(State(s): State<AdminState>) -> Json<AgentStatus> {
    let storage = s.storage.clone();
    let (pools, replicas, trash) = tokio::task::spawn_blocking(move || {
        (
            storage.pool_infos(),
            storage.replica_statuses(),
            storage.trash_list(),
        )
    })
    .await
    .unwrap_or_default();
    Json(AgentStatus {
        node: s.node.clone(),
        pools,
        replicas,
        engines: s.engines.statuses(),
        trash,
        cluster_id: s.storage.cluster_id(),
    })
}

/// `GET /v1/replicas/held`: the replicas, tagged; 304 while unchanged (`control::held`).
async fn held_replicas(State(s): State<AdminState>, headers: axum::http::HeaderMap) -> Response {
    let if_none_match = headers.get(axum::http::header::IF_NONE_MATCH);
    crate::control::held::answer(&s.storage.held(), if_none_match)
}

/// `GET /v1/engines`: the engines alone. The controller polls them every few seconds for
/// every node with an attached volume (engine watch, quorum check), and `/v1/status` would
/// also read every replica's metadata here and ship it there: with 6,700 replicas on a
/// node, decoding that was most of an idle controller's CPU (issue 44).
async fn list_engines(State(s): State<AdminState>) -> Json<Vec<EngineStatus>> {
    Json(s.engines.statuses())
}

async fn create_replica(
    State(s): State<AdminState>,
    Json(req): Json<CreateReplica>,
) -> Result<impl IntoResponse, Failure> {
    let wrapped_key = req
        .wrapped_key
        .as_ref()
        .map(|w| sealed_key(w, req.key_check))
        .transpose()
        .map_err(Failure)?;
    let volume_uid = req
        .volume_uid
        .as_deref()
        .map(hawser_api::uid::parse_uid)
        .transpose()
        .map_err(Failure)?;
    let new = NewReplica {
        id: req.replica_id.clone(),
        volume: req.volume.clone(),
        size: req.size_bytes,
        thin: req.thin,
        cluster: req.cluster_id.clone(),
        key_check: req.key_check.map(|k| k.0),
        checksums: req.checksums,
        wrapped_key,
        volume_uid,
    };
    let storage = s.storage.clone();
    let replica = tokio::task::spawn_blocking(move || {
        storage.create_from(&req.pool, &new, req.from.as_ref())
    })
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

fn pause_error(e: PauseError) -> Failure {
    let code = match &e {
        PauseError::NotFound(_) => ErrorCode::NotFound,
        PauseError::Paused(_) | PauseError::Expired(_) => ErrorCode::Conflict,
        PauseError::Drain { .. } | PauseError::Flush { .. } => ErrorCode::Unavailable,
    };
    Failure(ApiError::new(code, e.to_string()))
}

/// Holds a volume's requests for a snapshot (`engine/registry/pause.rs`).
async fn pause_engine(
    State(s): State<AdminState>,
    Path(volume): Path<String>,
    Json(req): Json<PauseEngine>,
) -> Result<Json<EnginePaused>, Failure> {
    let lease = std::time::Duration::from_millis(req.lease_ms);
    let paused = s.engines.pause(&volume, lease).await.map_err(pause_error)?;
    tracing::info!(
        volume,
        pause = paused.pause_id,
        drain_us = paused.drain_micros,
        "volume paused"
    );
    Ok(Json(paused))
}

async fn resume_engine(
    State(s): State<AdminState>,
    Path(volume): Path<String>,
    Json(req): Json<ResumeEngine>,
) -> Result<Json<EngineResumed>, Failure> {
    let resumed = s
        .engines
        .resume(&volume, req.pause_id)
        .await
        .map_err(pause_error)?;
    tracing::info!(
        volume,
        pause = req.pause_id,
        held_us = resumed.held_micros,
        "volume resumed"
    );
    Ok(Json(resumed))
}

/// Runs blocking storage work on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure(ApiError::new(ErrorCode::Internal, e.to_string())))?
        .map_err(storage_error)
}

fn snapshot_view(replica: &str, f: hawser_storage::SnapshotFile) -> ReplicaSnapshot {
    ReplicaSnapshot {
        replica_id: replica.into(),
        snapshot: f.id,
        size_bytes: f.size,
        allocated_bytes: f.allocated_bytes,
        how: None,
        micros: 0,
    }
}

async fn take_snapshot(
    State(s): State<AdminState>,
    Path(id): Path<String>,
    Json(req): Json<TakeSnapshot>,
) -> Result<(StatusCode, Json<ReplicaSnapshot>), Failure> {
    let storage = s.storage.clone();
    let rid = id.clone();
    let taken = blocking(move || storage.take_snapshot(&rid, req.epoch, &req.snapshot)).await?;
    let mut view = snapshot_view(&id, taken.file);
    view.how = taken.kind.map(|k| k.name().to_string());
    view.micros = taken.micros;
    let code = if taken.kind.is_some() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(view)))
}

/// Copies a snapshot this node's replica lacks from a holder (`replica/snapshot_fetch.rs`). A
/// replica that has it already answers with it.
async fn fetch_snapshot(
    State(s): State<AdminState>,
    Path((id, snapshot)): Path<(String, String)>,
    Json(req): Json<FetchSnapshot>,
) -> Result<(StatusCode, Json<ReplicaSnapshot>), Failure> {
    let storage = s.storage.clone();
    let (rid, sid) = (id.clone(), snapshot.clone());
    let held = blocking(move || storage.snapshots(&rid)).await?;
    if let Some(f) = held.into_iter().find(|f| f.id == sid) {
        return Ok((StatusCode::OK, Json(snapshot_view(&id, f))));
    }
    let grant = match &req.grant {
        Some(g) => {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(g)
                .map_err(|_| Failure(ApiError::invalid("the grant is not base64")))?;
            Some(bytes)
        }
        None => None,
    };
    let tls = match &s.link.node {
        Some(n) => Some(n.replica_client(&req.from_node).map_err(|e| {
            Failure(ApiError::new(
                ErrorCode::Internal,
                format!("no TLS configuration for node {}: {e:#}", req.from_node),
            ))
        })?),
        None => None,
    };
    let hello = hawser_wire::grant::HelloSnapshotRequest {
        replica: req.from_replica.clone(),
        snapshot: snapshot.clone(),
        grant,
    };
    let started = std::time::Instant::now();
    let fetched =
        crate::replica::snapshot_fetch::fetch_snapshot(&s.storage, &id, &req.from_addr, tls, hello)
            .await
            .map_err(|e| {
                Failure(ApiError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "fetch snapshot {snapshot} for replica {id} from {} on {}: {e}",
                        req.from_replica, req.from_node
                    ),
                ))
            })?;
    let mut view = snapshot_view(&id, fetched.file);
    view.how = Some("fetch".into());
    view.micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    Ok((StatusCode::CREATED, Json(view)))
}

async fn list_snapshots(
    State(s): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<ReplicaSnapshot>>, Failure> {
    let storage = s.storage.clone();
    let rid = id.clone();
    let files = blocking(move || storage.snapshots(&rid)).await?;
    Ok(Json(
        files.into_iter().map(|f| snapshot_view(&id, f)).collect(),
    ))
}

async fn delete_snapshot(
    State(s): State<AdminState>,
    Path((id, snapshot)): Path<(String, String)>,
) -> Result<StatusCode, Failure> {
    let storage = s.storage.clone();
    let (rid, snap) = (id.clone(), snapshot.clone());
    blocking(move || storage.delete_snapshot(&rid, &snap)).await?;
    tracing::info!(replica = %id, snapshot, "snapshot deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Replaces a replica's data with its snapshot: only while no engine holds the replica.
async fn restore_replica(
    State(s): State<AdminState>,
    Path(id): Path<String>,
    Json(req): Json<RestoreReplica>,
) -> Result<Json<ReplicaStatus>, Failure> {
    let storage = s.storage.clone();
    let rid = id.clone();
    let replica = blocking(move || storage.restore(&rid, &req.snapshot)).await?;
    Ok(Json(status(&replica)))
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

async fn trash_replica(
    State(s): State<AdminState>,
    Path(id): Path<String>,
) -> Result<StatusCode, Failure> {
    let storage = s.storage.clone();
    let rid = id.clone();
    tokio::task::spawn_blocking(move || storage.trash(&rid))
        .await
        .map_err(|e| Failure(ApiError::new(ErrorCode::Internal, e.to_string())))?
        .map_err(storage_error)?;
    tracing::warn!(replica = %id, "replica moved to the pool's trash");
    Ok(StatusCode::NO_CONTENT)
}

async fn inventory(
    State(s): State<AdminState>,
) -> Result<Json<Vec<hawser_api::agent::ReplicaInventory>>, Failure> {
    let storage = s.storage.clone();
    tokio::task::spawn_blocking(move || storage.inventory())
        .await
        .map(Json)
        .map_err(|e| Failure(ApiError::new(ErrorCode::Internal, e.to_string())))
}

async fn grow_replica(
    State(s): State<AdminState>,
    Path(id): Path<String>,
    Json(req): Json<GrowReplica>,
) -> Result<Json<ReplicaStatus>, Failure> {
    let storage = s.storage.clone();
    let rid = id.clone();
    let replica = tokio::task::spawn_blocking(move || storage.grow(&rid, req.size_bytes))
        .await
        .map_err(|e| Failure(ApiError::new(ErrorCode::Internal, e.to_string())))?
        .map_err(storage_error)?;
    tracing::info!(replica = %id, size = replica.size(), "replica grown");
    Ok(Json(status(&replica)))
}

/// A key rotation: the replica's copy of its volume's wrapped data key, now under a newer KEK.
/// One under an older KEK than the copy held changes nothing; the answer shows the copy held.
async fn set_wrapped_key(
    State(s): State<AdminState>,
    Path(id): Path<String>,
    Json(req): Json<hawser_api::WrappedKey>,
) -> Result<Json<ReplicaStatus>, Failure> {
    let replica = s
        .storage
        .replica(&id)
        .ok_or_else(|| storage_error(StorageError::ReplicaNotFound { id: id.clone() }))?;
    let sealed =
        sealed_key(&req, replica.key_check().map(hawser_api::KeyCheck)).map_err(Failure)?;
    let storage = s.storage.clone();
    let rid = id.clone();
    let replica = tokio::task::spawn_blocking(move || storage.set_wrapped_key(&rid, &sealed))
        .await
        .map_err(|e| Failure(ApiError::new(ErrorCode::Internal, e.to_string())))?
        .map_err(storage_error)?;
    tracing::info!(
        replica = %id, kek = replica.wrapped_key().map(|w| w.kek),
        "replica's wrapped data key updated"
    );
    Ok(Json(status(&replica)))
}

async fn start_engine(
    State(s): State<AdminState>,
    Json(req): Json<StartEngine>,
) -> Result<impl IntoResponse, Failure> {
    req.validate().map_err(Failure)?;
    if let Some(key) = s.storage.grant_key() {
        use base64::Engine as _;
        let signed = req
            .grant
            .as_deref()
            .map(|g| base64::engine::general_purpose::STANDARD.decode(g))
            .transpose()
            .map_err(|_| Failure(ApiError::invalid("the grant is not base64")))?;
        let cluster = s.storage.cluster_id().unwrap_or_default();
        let want = crate::replica::grants::Expected {
            cluster: &cluster,
            volume: &req.volume,
            epoch: req.epoch,
            node: Some(&s.node),
        };
        crate::replica::grants::check(&key, signed.as_deref(), &want).map_err(|e| {
            Failure(ApiError::new(
                ErrorCode::Forbidden,
                format!("start engine: {e}"),
            ))
        })?;
    }
    if let Some(existing) = s.engines.get(&req.volume) {
        if existing.status().epoch == req.epoch {
            // Already running: only the limits may have changed since.
            s.engines.set_qos(&req.volume, req.qos);
            let status = s
                .engines
                .status(&req.volume)
                .unwrap_or_else(|| existing.status());
            return Ok((StatusCode::OK, Json(status)));
        }
    }
    let engine = s
        .engines
        .start(&req, &s.node, &s.storage, s.resync_rate, &s.link)
        .await
        .map_err(|e| {
            Failure(ApiError::new(
                ErrorCode::Unavailable,
                format!("start engine: {e:#}"),
            ))
        })?;
    tracing::info!(volume = %req.volume, epoch = req.epoch, "engine started");
    let status = s
        .engines
        .status(&req.volume)
        .unwrap_or_else(|| engine.status());
    Ok((StatusCode::CREATED, Json(status)))
}

/// `GET /v1/devices`: the kernel block devices this agent serves (for `hawser volume show`).
async fn list_devices(State(s): State<AdminState>) -> Json<Vec<hawser_api::agent::Device>> {
    match &s.devices {
        Some(d) => Json(d.list().await),
        None => Json(Vec::new()),
    }
}

/// `POST /v1/engines/{volume}/grow`: online expansion on the node where the volume is
/// attached, once the controller has grown every replica. The engine grows first, then its
/// export (new NBD connections see the new size), then the kernel device, which is what a
/// mounted filesystem grows into. Refused before anything changes when the device cannot
/// follow (ublk before Linux 6.16): the controller asks with `check_only` before it grows a
/// replica.
async fn grow_engine(
    State(s): State<AdminState>,
    Path(volume): Path<String>,
    Json(req): Json<GrowEngine>,
) -> Result<Json<EngineStatus>, Failure> {
    let fail = |code, msg: String| Failure(ApiError::new(code, msg));
    let size = req.size_bytes;
    let current = s.engines.size_of(&volume).ok_or_else(|| {
        fail(
            ErrorCode::NotFound,
            format!("no engine of volume {volume} runs on this node"),
        )
    })?;
    if size < current {
        return Err(fail(
            ErrorCode::InvalidArgument,
            format!("volume {volume} is {current} bytes here; it cannot shrink to {size}"),
        ));
    }
    // Only a real grow needs the device to follow: the same size again (a retried expand)
    // is answered for any device.
    if let Some(devices) = s.devices.as_ref().filter(|_| size > current) {
        if let Some(why) = devices.cannot_grow(&volume).await {
            return Err(fail(
                ErrorCode::Conflict,
                format!(
                    "volume {volume} cannot grow while attached on node {}: its {why}",
                    s.node
                ),
            ));
        }
    }
    if !req.check_only && size > current {
        s.engines.grow(&volume, size).await.map_err(|e| {
            fail(
                ErrorCode::Unavailable,
                format!("grow the engine of {volume} to {size} bytes: {e:#}"),
            )
        })?;
        tracing::info!(%volume, size, "engine grown");
    }
    if !req.check_only {
        if let Some(devices) = &s.devices {
            // Also after a grow whose device step failed before: the engine is already big.
            devices.grow(&volume, size).await.map_err(|e| {
                fail(
                    ErrorCode::Internal,
                    format!("volume {volume} grew, but its kernel device did not: {e}"),
                )
            })?;
        }
    }
    s.engines.status(&volume).map(Json).ok_or_else(|| {
        fail(
            ErrorCode::NotFound,
            format!("the engine of {volume} stopped"),
        )
    })
}

/// `PUT /v1/engines/{volume}/qos`: the volume's limits, applied to its client requests from
/// now on (requests already waiting keep their slot).
async fn set_engine_qos(
    State(s): State<AdminState>,
    Path(volume): Path<String>,
    Json(qos): Json<hawser_api::Qos>,
) -> Result<Json<EngineStatus>, Failure> {
    qos.validate().map_err(Failure)?;
    if !s.engines.set_qos(&volume, qos) {
        return Err(Failure(ApiError::not_found("engine", &volume)));
    }
    tracing::info!(%volume, qos = %qos.describe(), "volume limits set");
    s.engines
        .status(&volume)
        .map(Json)
        .ok_or_else(|| Failure(ApiError::not_found("engine", &volume)))
}

/// `POST /v1/engines/{volume}/scrub`: start a scrub pass (one under way goes on); the
/// engine's status shows its progress.
async fn scrub_engine(
    State(s): State<AdminState>,
    Path(volume): Path<String>,
) -> Result<Json<EngineStatus>, Failure> {
    let (_, status) = s
        .engines
        .start_scrub(&volume)
        .ok_or_else(|| Failure(ApiError::not_found("engine", &volume)))?;
    Ok(Json(status))
}

async fn stop_engine(
    State(s): State<AdminState>,
    Path(volume): Path<String>,
) -> Result<StatusCode, Failure> {
    if !s.engines.stop(&volume).await {
        return Err(Failure(ApiError::not_found("engine", &volume)));
    }
    tracing::info!(%volume, "engine stopped");
    Ok(StatusCode::NO_CONTENT)
}
