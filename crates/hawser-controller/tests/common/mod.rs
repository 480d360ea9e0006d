//! Test harness: a controller on 127.0.0.1:0 with a fresh data directory, and fake agents
//! (small axum servers) that record the admin calls they get and can be told to fail.
#![allow(dead_code, clippy::unwrap_used)]

pub mod schema;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use hawser_api::agent::{
    CreateReplica, EnginePaused, EngineResumed, EngineStatus, GrowReplica, PauseEngine,
    ReplicaSnapshot, ReplicaStatus, RestoreReplica, ResumeEngine, StartEngine, TakeSnapshot,
};
use hawser_api::controller::{PoolInfo, PoolKind};
use hawser_api::{ApiError, ErrorCode};
use hawser_controller::{Controller, ControllerArgs};
use serde_json::{json, Value};

pub const GIB: u64 = 1 << 30;

/// Which agent call a fake agent fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    CreateReplica,
    DeleteReplica,
    StartEngine,
    StopEngine,
    GrowReplica,
    /// `POST /v1/engines/{volume}/grow` fails (500), but not its `check_only` form.
    GrowEngine,
    /// ... is refused with 409, as by a node whose kernel device cannot grow (ublk on 6.12).
    GrowEngineCannot,
    TakeSnapshot,
    PauseEngine,
    RestoreReplica,
    SetQos,
    /// `PUT /v1/replicas/{id}/wrapped-key` (a key rotation) fails, as on a node that is down.
    SetWrappedKey,
    /// `DELETE /v1/replicas/{id}/snapshots/{snapshot}` fails, as on a node that is down.
    DeleteSnapshot,
}

#[derive(Default)]
pub struct FakeState {
    /// "METHOD path" of every call, in order.
    pub calls: Vec<String>,
    pub replicas: BTreeMap<String, CreateReplica>,
    pub engines: BTreeMap<String, StartEngine>,
    pub failing: BTreeSet<Op>,
    /// The Authorization header of every call (None: there was none), in order.
    pub authorizations: Vec<Option<String>>,
    /// Replicas each volume's engine reports `down` (unreachable, not outdated).
    pub down: BTreeMap<String, Vec<String>>,
    /// (replica, snapshot) copies held.
    pub snapshots: BTreeSet<(String, String)>,
    /// Volumes paused now: the pause id.
    pub paused: BTreeMap<String, u64>,
    /// Volumes whose engine was asked for a scrub pass (it "runs" from then on).
    pub scrubbing: BTreeSet<String>,
    /// Peer nodes a peer probe says this node does not reach.
    pub unreached: BTreeSet<String>,
}

type Fake = Arc<Mutex<FakeState>>;

pub struct FakeAgent {
    pub node: String,
    pub addr: SocketAddr,
    pub state: Fake,
}

impl FakeAgent {
    pub async fn start(node: &str) -> FakeAgent {
        let state: Fake = Arc::default();
        let app = Router::new()
            .route("/v1/replicas", post(create_replica))
            .route("/v1/replicas/{id}", delete(delete_replica))
            .route("/v1/replicas/{id}/grow", post(grow_replica))
            .route("/v1/replicas/{id}/wrapped-key", put(set_wrapped_key))
            .route("/v1/replicas/{id}/restore", post(restore_replica))
            .route("/v1/replicas/{id}/trash", post(trash_replica))
            .route("/v1/engines", post(start_engine).get(agent_engines))
            .route("/v1/engines/{volume}", delete(stop_engine))
            .route("/v1/engines/{volume}/qos", put(set_qos))
            .route("/v1/engines/{volume}/grow", post(grow_engine))
            .route("/v1/engines/{volume}/scrub", post(scrub_engine))
            .route("/v1/engines/{volume}/pause", post(pause_engine))
            .route("/v1/engines/{volume}/resume", post(resume_engine))
            .route("/v1/replicas/{id}/snapshots", post(take_snapshot))
            .route(
                "/v1/replicas/{id}/snapshots/{snapshot}",
                delete(delete_snapshot),
            )
            .route("/v1/status", get(agent_status))
            .route("/v1/replicas/held", get(agent_held))
            .route("/v1/peers/probe", post(probe_peers))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                record_authorization,
            ))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeAgent {
            node: node.into(),
            addr,
            state,
        }
    }

    pub fn fail(&self, op: Op, on: bool) {
        let mut s = self.state.lock().unwrap();
        if on {
            s.failing.insert(op);
        } else {
            s.failing.remove(&op);
        }
    }

    /// The size each replica has now (the fake grows them).
    pub fn replica_size(&self, id: &str) -> Option<u64> {
        self.state
            .lock()
            .unwrap()
            .replicas
            .get(id)
            .map(|r| r.size_bytes)
    }

    pub fn replicas(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .replicas
            .keys()
            .cloned()
            .collect()
    }

    /// What a replica was created with.
    pub fn replica(&self, id: &str) -> Option<CreateReplica> {
        self.state.lock().unwrap().replicas.get(id).cloned()
    }

    pub fn engine(&self, volume: &str) -> Option<StartEngine> {
        self.state.lock().unwrap().engines.get(volume).cloned()
    }

    /// Makes a peer probe report `peer` as not reached (`on`) or reached.
    pub fn cut_off_from(&self, peer: &str, on: bool) {
        let mut st = self.state.lock().unwrap();
        if on {
            st.unreached.insert(peer.into());
        } else {
            st.unreached.remove(peer);
        }
    }

    /// Makes the engine of `volume` report `replicas` as down (an empty list: none).
    pub fn report_down(&self, volume: &str, replicas: Vec<String>) {
        self.state
            .lock()
            .unwrap()
            .down
            .insert(volume.into(), replicas);
    }

    /// (replica, snapshot) copies this agent holds.
    pub fn snapshots(&self) -> Vec<(String, String)> {
        self.state
            .lock()
            .unwrap()
            .snapshots
            .iter()
            .cloned()
            .collect()
    }

    /// Volumes paused now.
    pub fn paused(&self) -> Vec<String> {
        self.state.lock().unwrap().paused.keys().cloned().collect()
    }

    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().authorizations.clone()
    }
}

/// Records the Authorization header of every call the fake agent gets.
async fn record_authorization(
    State(st): State<Fake>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let auth = req
        .headers()
        .get("authorization")
        .map(|v| v.to_str().unwrap_or("<not ascii>").to_string());
    st.lock().unwrap().authorizations.push(auth);
    next.run(req).await
}

/// Controller arguments for tests: an ephemeral port, default token files in `data_dir`
/// unless `tokens_dir` names shared ones (controllers of one cluster share their tokens).
pub fn controller_args(
    data_dir: &std::path::Path,
    store: Option<String>,
    tokens_dir: Option<&std::path::Path>,
) -> ControllerArgs {
    ControllerArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.to_path_buf(),
        store,
        etcd: Default::default(),
        node_timeout_secs: 15,
        advertise_url: None,
        engine_check_secs: 0,
        scrub_interval_secs: 0,
        backup_rate: 0,
        backup_retry_secs: 120,
        standby_poll_secs: 60,
        backup_prune_grace_secs: 600,
        replace_after_secs: 300,
        max_rebuilds: 2,
        heal_check_secs: 0,
        admin_token_file: tokens_dir.map(|d| d.join("admin.token")),
        agent_token_file: tokens_dir.map(|d| d.join("agent.token")),
        metrics_token_file: None,
        insecure: true,
        ca_secret: None,
        cert_lifetime_secs: 3600,
        tls_san: Vec::new(),
        failover_after_secs: hawser_controller::DEFAULT_FAILOVER_AFTER_SECS,
        failover_confirm_secs: hawser_controller::DEFAULT_FAILOVER_CONFIRM_SECS,
        csi_driver: "csi.hawser.dev".into(),
    }
}

/// The token in a token file a controller wrote.
pub fn read_token(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

/// An HTTP client that sends `token` as the bearer token on every request.
pub fn client_with_token(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = format!("Bearer {token}").parse().unwrap();
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

fn refuse(what: &str) -> Response {
    let e = ApiError::new(ErrorCode::Internal, format!("injected failure: {what}"));
    (StatusCode::INTERNAL_SERVER_ERROR, Json(e)).into_response()
}

/// Records the call; returns true if this op is set to fail.
fn record(state: &Fake, call: String, op: Op) -> bool {
    let mut s = state.lock().unwrap();
    s.calls.push(call);
    s.failing.contains(&op)
}

async fn create_replica(State(st): State<Fake>, Json(req): Json<CreateReplica>) -> Response {
    if record(
        &st,
        format!("POST /v1/replicas {}", req.replica_id),
        Op::CreateReplica,
    ) {
        return refuse("create replica");
    }
    let status = replica_status(&req);
    st.lock()
        .unwrap()
        .replicas
        .insert(req.replica_id.clone(), req);
    Json(status).into_response()
}

/// Keeps the newer wrapping, as a real agent does.
async fn set_wrapped_key(
    State(st): State<Fake>,
    Path(id): Path<String>,
    Json(w): Json<hawser_api::WrappedKey>,
) -> Response {
    if record(
        &st,
        format!("PUT /v1/replicas/{id}/wrapped-key"),
        Op::SetWrappedKey,
    ) {
        return refuse("set wrapped key");
    }
    let mut s = st.lock().unwrap();
    let Some(r) = s.replicas.get_mut(&id) else {
        return (
            StatusCode::NOT_FOUND,
            Json(ApiError::new(ErrorCode::NotFound, "no such replica")),
        )
            .into_response();
    };
    if r.wrapped_key.as_ref().is_none_or(|held| held.kek < w.kek) {
        r.wrapped_key = Some(w);
    }
    Json(replica_status(r)).into_response()
}

fn replica_status(req: &CreateReplica) -> ReplicaStatus {
    ReplicaStatus {
        replica_id: req.replica_id.clone(),
        volume: req.volume.clone(),
        pool: req.pool.clone(),
        size_bytes: req.size_bytes,
        thin: req.thin,
        epoch: 0,
        allocated_bytes: 0,
        data_path: format!("/fake/{}", req.replica_id),
        failed: false,
        error: None,
        cluster_id: None,
        key_check: req.key_check,
        checksums: req.checksums,
        wrapped_key: req.wrapped_key.clone(),
        volume_uid: req.volume_uid.clone(),
    }
}

/// A delete's answer: done, or 404 for a `what` the fake does not have.
fn removed(found: bool, what: &str, id: &str) -> Response {
    if found {
        return StatusCode::NO_CONTENT.into_response();
    }
    (StatusCode::NOT_FOUND, Json(ApiError::not_found(what, id))).into_response()
}

async fn delete_replica(State(st): State<Fake>, Path(id): Path<String>) -> Response {
    if record(&st, format!("DELETE /v1/replicas/{id}"), Op::DeleteReplica) {
        return refuse("delete replica");
    }
    let found = st.lock().unwrap().replicas.remove(&id).is_some();
    removed(found, "replica", &id)
}

/// Like a delete: the fake keeps no trash.
async fn trash_replica(State(st): State<Fake>, Path(id): Path<String>) -> Response {
    if record(
        &st,
        format!("POST /v1/replicas/{id}/trash"),
        Op::DeleteReplica,
    ) {
        return refuse("trash replica");
    }
    let found = st.lock().unwrap().replicas.remove(&id).is_some();
    removed(found, "replica", &id)
}

async fn grow_replica(
    State(st): State<Fake>,
    Path(id): Path<String>,
    Json(req): Json<GrowReplica>,
) -> Response {
    if record(
        &st,
        format!("POST /v1/replicas/{id}/grow {}", req.size_bytes),
        Op::GrowReplica,
    ) {
        return refuse("grow replica");
    }
    let mut s = st.lock().unwrap();
    let Some(r) = s.replicas.get_mut(&id) else {
        return (
            StatusCode::NOT_FOUND,
            Json(ApiError::not_found("replica", &id)),
        )
            .into_response();
    };
    r.size_bytes = r.size_bytes.max(req.size_bytes);
    Json(replica_status(r)).into_response()
}

/// Restores a replica to a snapshot copy it holds (404 if it holds none).
async fn restore_replica(
    State(st): State<Fake>,
    Path(id): Path<String>,
    Json(req): Json<RestoreReplica>,
) -> Response {
    let call = format!("POST /v1/replicas/{id}/restore {}", req.snapshot);
    if record(&st, call, Op::RestoreReplica) {
        return refuse("restore replica");
    }
    let s = st.lock().unwrap();
    match s.replicas.get(&id) {
        Some(r) if s.snapshots.contains(&(id.clone(), req.snapshot.clone())) => {
            Json(replica_status(r)).into_response()
        }
        _ => {
            let e = ApiError::new(ErrorCode::NotFound, format!("no snapshot on {id}"));
            (StatusCode::NOT_FOUND, Json(e)).into_response()
        }
    }
}

/// Pauses a running engine: its replicas (all of them) are its in-sync set.
async fn pause_engine(
    State(st): State<Fake>,
    Path(volume): Path<String>,
    Json(_req): Json<PauseEngine>,
) -> Response {
    if record(
        &st,
        format!("POST /v1/engines/{volume}/pause"),
        Op::PauseEngine,
    ) {
        return refuse("pause engine");
    }
    let mut s = st.lock().unwrap();
    let Some(e) = s.engines.get(&volume).cloned() else {
        let e = ApiError::new(ErrorCode::NotFound, format!("no engine of {volume}"));
        return (StatusCode::NOT_FOUND, Json(e)).into_response();
    };
    let id = s.paused.values().max().copied().unwrap_or(0) + 1;
    s.paused.insert(volume, id);
    Json(EnginePaused {
        pause_id: id,
        epoch: e.epoch,
        in_sync: e.replicas.iter().map(|r| r.replica_id.clone()).collect(),
        drain_micros: 5,
    })
    .into_response()
}

async fn resume_engine(
    State(st): State<Fake>,
    Path(volume): Path<String>,
    Json(req): Json<ResumeEngine>,
) -> Response {
    record(
        &st,
        format!("POST /v1/engines/{volume}/resume"),
        Op::StopEngine,
    );
    let mut s = st.lock().unwrap();
    if s.paused.get(&volume) != Some(&req.pause_id) {
        let e = ApiError::new(ErrorCode::Conflict, "no such pause");
        return (StatusCode::CONFLICT, Json(e)).into_response();
    }
    s.paused.remove(&volume);
    Json(EngineResumed { held_micros: 42 }).into_response()
}

async fn take_snapshot(
    State(st): State<Fake>,
    Path(id): Path<String>,
    Json(req): Json<TakeSnapshot>,
) -> Response {
    let call = format!("POST /v1/replicas/{id}/snapshots {}", req.snapshot);
    if record(&st, call, Op::TakeSnapshot) {
        return refuse("take snapshot");
    }
    let mut s = st.lock().unwrap();
    let Some(r) = s.replicas.get(&id).cloned() else {
        let e = ApiError::new(ErrorCode::NotFound, format!("replica {id} not found"));
        return (StatusCode::NOT_FOUND, Json(e)).into_response();
    };
    s.snapshots.insert((id.clone(), req.snapshot.clone()));
    let snap = ReplicaSnapshot {
        replica_id: id,
        snapshot: req.snapshot,
        size_bytes: r.size_bytes,
        allocated_bytes: 0,
        how: Some("reflink".into()),
        micros: 7,
    };
    (StatusCode::CREATED, Json(snap)).into_response()
}

async fn delete_snapshot(
    State(st): State<Fake>,
    Path((id, snapshot)): Path<(String, String)>,
) -> Response {
    if record(
        &st,
        format!("DELETE /v1/replicas/{id}/snapshots/{snapshot}"),
        Op::DeleteSnapshot,
    ) {
        return refuse("delete snapshot");
    }
    st.lock().unwrap().snapshots.remove(&(id, snapshot));
    StatusCode::NO_CONTENT.into_response()
}

async fn start_engine(State(st): State<Fake>, Json(req): Json<StartEngine>) -> Response {
    if record(
        &st,
        format!("POST /v1/engines {}", req.volume),
        Op::StartEngine,
    ) {
        return refuse("start engine");
    }
    let status = EngineStatus {
        volume: req.volume.clone(),
        epoch: req.epoch,
        size_bytes: req.size_bytes,
        in_sync: req.replicas.iter().map(|r| r.replica_id.clone()).collect(),
        replicas: vec![],
        recovery: None,
        active_extents: 0,
        qos: req.qos,
        scrub: None,
    };
    st.lock().unwrap().engines.insert(req.volume.clone(), req);
    Json(status).into_response()
}

/// Grows a running engine's size (`check_only`: says whether it could).
async fn grow_engine(
    State(st): State<Fake>,
    Path(volume): Path<String>,
    Json(req): Json<hawser_api::agent::GrowEngine>,
) -> Response {
    let call = format!(
        "POST /v1/engines/{volume}/grow {}{}",
        req.size_bytes,
        if req.check_only { " check" } else { "" }
    );
    // Only the grow itself fails: the check before passed (the agent died in between).
    if record(&st, call, Op::GrowEngine) && !req.check_only {
        return refuse("grow engine");
    }
    let mut s = st.lock().unwrap();
    if s.failing.contains(&Op::GrowEngineCannot) {
        let e = ApiError::new(
            ErrorCode::Conflict,
            format!("volume {volume} cannot grow while attached: its ublk device cannot"),
        );
        return (StatusCode::CONFLICT, Json(e)).into_response();
    }
    let Some(e) = s.engines.get_mut(&volume) else {
        let e = ApiError::new(ErrorCode::NotFound, format!("no engine of {volume}"));
        return (StatusCode::NOT_FOUND, Json(e)).into_response();
    };
    if !req.check_only {
        e.size_bytes = e.size_bytes.max(req.size_bytes);
    }
    Json(EngineStatus {
        volume: volume.clone(),
        epoch: e.epoch,
        size_bytes: e.size_bytes,
        in_sync: e.replicas.iter().map(|r| r.replica_id.clone()).collect(),
        replicas: vec![],
        recovery: None,
        active_extents: 0,
        qos: e.qos,
        scrub: None,
    })
    .into_response()
}

fn down_replicas(st: &Fake, volume: &str) -> Vec<hawser_api::agent::EngineReplicaStatus> {
    let s = st.lock().unwrap();
    s.down
        .get(volume)
        .into_iter()
        .flatten()
        .map(|id| hawser_api::agent::EngineReplicaStatus {
            replica_id: id.clone(),
            state: "down".into(),
            connected: false,
            dirty_bytes: 0,
            copied_bytes: 0,
            resync_bytes_per_sec: 0,
            ..Default::default()
        })
        .collect()
}

/// Only what the controller reads: the replicas it holds and the engines it runs.
async fn probe_peers(
    State(st): State<Fake>,
    Json(req): Json<hawser_api::agent::ProbePeers>,
) -> Json<Vec<hawser_api::agent::PeerReach>> {
    let mut st = st.lock().unwrap();
    st.calls.push("POST /v1/peers/probe".into());
    let answers = req
        .peers
        .into_iter()
        .map(|p| {
            // An unreached peer is one whose host is silent (a dead host, a cut link).
            let reached = !st.unreached.contains(&p.node);
            hawser_api::agent::PeerReach {
                error: (!reached).then(|| "connect: connection timed out".into()),
                host_answered: (!reached).then_some(false),
                node: p.node,
                reached,
            }
        })
        .collect();
    Json(answers)
}

/// The engines it runs, each with the replicas `report_down` named.
fn engines(st: &Fake) -> Vec<EngineStatus> {
    let started: Vec<StartEngine> = st.lock().unwrap().engines.values().cloned().collect();
    let scrubbing = st.lock().unwrap().scrubbing.clone();
    started
        .iter()
        .map(|req| EngineStatus {
            replicas: down_replicas(st, &req.volume),
            ..engine_status(req, scrubbing.contains(&req.volume))
        })
        .collect()
}

async fn agent_engines(State(st): State<Fake>) -> Response {
    Json(engines(&st)).into_response()
}

/// The replicas, tagged as the agent tags them (a digest of the answer's bytes; here std's
/// hasher), and 304 to a request that names the tag: the reconcile round's rounds go
/// through its kept lists as they do against a real agent.
async fn agent_held(State(st): State<Fake>, headers: axum::http::HeaderMap) -> Response {
    use std::hash::{Hash, Hasher};
    let held: Vec<hawser_api::agent::HeldReplica> = st
        .lock()
        .unwrap()
        .replicas
        .values()
        .map(|r| {
            let r = replica_status(r);
            hawser_api::agent::HeldReplica {
                replica_id: r.replica_id,
                volume: r.volume,
                failed: r.failed,
            }
        })
        .collect();
    let body = serde_json::to_vec(&held).unwrap();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    let tag = format!("\"{:016x}\"", h.finish());
    let etag = axum::http::header::ETAG;
    let asked = headers.get(axum::http::header::IF_NONE_MATCH);
    if asked.is_some_and(|t| t.as_bytes() == tag.as_bytes()) {
        return (StatusCode::NOT_MODIFIED, [(etag, tag)]).into_response();
    }
    let json = (
        axum::http::header::CONTENT_TYPE,
        "application/json".to_string(),
    );
    (StatusCode::OK, [(etag, tag), json], body).into_response()
}

async fn agent_status(State(st): State<Fake>) -> Response {
    let replicas = st
        .lock()
        .unwrap()
        .replicas
        .values()
        .map(replica_status)
        .collect();
    Json(hawser_api::agent::AgentStatus {
        node: String::new(),
        pools: vec![],
        replicas,
        engines: engines(&st),
        trash: vec![],
        cluster_id: None,
    })
    .into_response()
}

async fn stop_engine(State(st): State<Fake>, Path(volume): Path<String>) -> Response {
    if record(&st, format!("DELETE /v1/engines/{volume}"), Op::StopEngine) {
        return refuse("stop engine");
    }
    let found = st.lock().unwrap().engines.remove(&volume).is_some();
    removed(found, "engine", &volume)
}

async fn scrub_engine(State(st): State<Fake>, Path(volume): Path<String>) -> Response {
    record(&st, format!("POST /v1/engines/{volume}/scrub"), Op::SetQos);
    let mut s = st.lock().unwrap();
    let Some(e) = s.engines.get(&volume).cloned() else {
        return (
            StatusCode::NOT_FOUND,
            Json(ApiError::not_found("engine", &volume)),
        )
            .into_response();
    };
    s.scrubbing.insert(volume.clone());
    Json(engine_status(&e, true)).into_response()
}

/// What the fake says of an engine it runs: no replicas, its limits, a scrub "running" once
/// one was asked for.
fn engine_status(e: &StartEngine, scrubbing: bool) -> EngineStatus {
    EngineStatus {
        volume: e.volume.clone(),
        epoch: e.epoch,
        size_bytes: e.size_bytes,
        in_sync: vec![],
        replicas: vec![],
        recovery: None,
        active_extents: 0,
        qos: e.qos,
        scrub: scrubbing.then(|| hawser_api::agent::ScrubStatus {
            running: true,
            size_bytes: e.size_bytes,
            ..Default::default()
        }),
    }
}

async fn set_qos(
    State(st): State<Fake>,
    Path(volume): Path<String>,
    Json(qos): Json<hawser_api::Qos>,
) -> Response {
    if record(&st, format!("PUT /v1/engines/{volume}/qos"), Op::SetQos) {
        return refuse("set qos");
    }
    let mut s = st.lock().unwrap();
    match s.engines.get_mut(&volume) {
        Some(e) => {
            e.qos = qos;
            let e = e.clone();
            Json(engine_status(&e, s.scrubbing.contains(&volume))).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            Json(ApiError::not_found("engine", &volume)),
        )
            .into_response(),
    }
}

pub struct Cluster {
    pub url: String,
    /// Sends the admin token on every request.
    pub http: reqwest::Client,
    pub admin_token: String,
    pub agent_token: String,
    pub agents: Vec<FakeAgent>,
    pub dir: tempfile::TempDir,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub fn pool(node: &str, capacity: u64, free: u64) -> PoolInfo {
    PoolInfo {
        node: node.into(),
        name: "default".into(),
        path: format!("/var/lib/hawser/{node}"),
        capacity_bytes: capacity,
        free_bytes: free,
        provisioned_bytes: 0,
        overprovision_ratio: 2.0,
        replicas: 0,
        kind: PoolKind::Any,
        snapshots: 0,
        snapshot_bytes: 0,
    }
}

impl Cluster {
    /// A controller and `nodes` fake agents n1..nN, each registered with one 100 GiB pool.
    ///
    /// Fake agents register once and never heartbeat, so their nodes stay online only for
    /// the node timeout. Here it is 10 minutes: a test's length on a loaded machine must not
    /// decide whether a node is offline (a 15 s timeout once turned an expected 409 into a
    /// 503 in CI). Tests of offline nodes use `start_with` with a short timeout.
    pub async fn start(nodes: usize) -> Cluster {
        Cluster::start_with(nodes, 600).await
    }

    pub async fn start_with(nodes: usize, node_timeout_secs: u64) -> Cluster {
        Cluster::start_opts(nodes, node_timeout_secs, 0).await
    }

    /// With the engine check every `engine_check_secs` (0: off).
    pub async fn start_opts(
        nodes: usize,
        node_timeout_secs: u64,
        engine_check_secs: u64,
    ) -> Cluster {
        Cluster::start_full(nodes, node_timeout_secs, engine_check_secs, None).await
    }

    /// With self-healing every second, replacing replicas of nodes offline for
    /// `replace_after_secs`; nodes go offline after 1 s without a heartbeat.
    pub async fn start_healing(nodes: usize, replace_after_secs: u64) -> Cluster {
        Cluster::start_full(nodes, 1, 0, Some(replace_after_secs)).await
    }

    async fn start_full(
        nodes: usize,
        node_timeout_secs: u64,
        engine_check_secs: u64,
        replace_after_secs: Option<u64>,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("controller");
        let args = ControllerArgs {
            node_timeout_secs,
            engine_check_secs,
            replace_after_secs: replace_after_secs.unwrap_or(300),
            heal_check_secs: u64::from(replace_after_secs.is_some()),
            ..controller_args(&data_dir, None, None)
        };
        let controller = Controller::bind(args).await.unwrap();
        let admin_token = read_token(&data_dir.join("admin.token"));
        let agent_token = read_token(&data_dir.join("agent.token"));
        let url = format!("http://{}", controller.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(controller.serve(async move {
            let _ = rx.await;
        }));
        let mut c = Cluster {
            url,
            http: client_with_token(&admin_token),
            admin_token,
            agent_token,
            agents: Vec::new(),
            dir,
            shutdown: Some(tx),
        };
        for i in 1..=nodes {
            let name = format!("n{i}");
            let agent = FakeAgent::start(&name).await;
            c.register(&agent, vec![pool(&name, 100 * GIB, 100 * GIB)])
                .await;
            c.agents.push(agent);
        }
        c
    }

    pub async fn register(&self, agent: &FakeAgent, pools: Vec<PoolInfo>) {
        let (status, body) = self
            .put(
                &format!("/v1/nodes/{}", agent.node),
                json!({
                    "admin_addr": agent.addr.to_string(),
                    "replica_addr": format!("127.0.0.1:{}", 20000 + agent.addr.port() % 1000),
                    "nbd_addr": "127.0.0.1:10809",
                    "nbd_socket": format!("/run/hawser/{}.sock", agent.node),
                    "pools": pools,
                }),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    pub fn agent(&self, node: &str) -> &FakeAgent {
        self.agents.iter().find(|a| a.node == node).unwrap()
    }

    /// Every replica id on every fake agent.
    pub fn all_replicas(&self) -> Vec<String> {
        self.agents.iter().flat_map(|a| a.replicas()).collect()
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        read(resp).await
    }

    /// A request with the given Authorization header value (None: no header at all).
    pub async fn send_auth(
        &self,
        authorization: Option<&str>,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = reqwest::Client::new().request(method, format!("{}{path}", self.url));
        if let Some(a) = authorization {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        read(resp).await
    }

    /// Waits (10 s at most) until the controller shows every node offline: the agents of
    /// this cluster send no heartbeats, so that is 1 s after the last registration.
    pub async fn until_every_node_is_offline(&self) {
        eventually(10, || async {
            let (_, nodes) = self.get("/v1/nodes").await;
            nodes
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n["state"] == "offline")
        })
        .await;
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::DELETE, path, None).await
    }

    /// A request with a raw body and content type.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        ct: &str,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let resp = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap();
        read(resp).await
    }

    pub async fn create(&self, name: &str, size: u64, replicas: u32) -> (u16, Value) {
        self.post(
            "/v1/volumes",
            json!({"name": name, "size_bytes": size, "replicas": replicas}),
        )
        .await
    }

    pub async fn volume(&self, name: &str) -> Value {
        let (status, v) = self.get(&format!("/v1/volumes/{name}")).await;
        assert_eq!(status, 200, "{v}");
        v
    }

    pub async fn volume_names(&self) -> Vec<String> {
        let (status, v) = self.get("/v1/volumes").await;
        assert_eq!(status, 200, "{v}");
        v.as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    }
}

/// Reads a response. Every error must be a JSON `ApiError` whose code matches the status.
pub async fn read(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_string())
        .unwrap_or_default();
    let bytes = resp.bytes().await.unwrap();
    if status == 204 {
        assert!(bytes.is_empty());
        return (status, Value::Null);
    }
    assert!(
        ct.starts_with("application/json"),
        "status {status} content-type {ct:?}: {bytes:?}"
    );
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    if status >= 400 {
        let e: ApiError = serde_json::from_value(body.clone())
            .unwrap_or_else(|err| panic!("error body is not an ApiError ({err}): {body}"));
        if !matches!(status, 405 | 413) {
            assert_eq!(e.code.http_status(), status, "{body}");
        }
    }
    (status, body)
}

/// A volume body's replicas as (id, node, state, blank), in its order.
pub fn replicas_of(v: &Value) -> Vec<(String, String, String, bool)> {
    v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["node"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
                r["blank"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// The error code of an error body.
pub fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("<no code>")
}

/// Polls `check` until it returns true or `secs` pass.
pub async fn eventually<F, Fut>(secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {secs}s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A real kube-apiserver (in `dir`, kept alive by the returned process) with namespace `ns`,
/// and the controller's client of it.
pub async fn apiserver_with_namespace(
    dir: &std::path::Path,
    ns: &str,
) -> (
    hawser_testkit::apiserver_process::ApiserverProcess,
    Arc<hawser_controller::kube::Kube>,
) {
    let api = hawser_testkit::apiserver_process::ApiserverProcess::start(dir)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    api.create_namespace(ns).await.unwrap();
    let kube = hawser_controller::kube::Kube::new(&api.config(), "csi.hawser.dev").unwrap();
    (api, Arc::new(kube))
}

/// Runs kubectl against `api` with `stdin`; its stdout. Fails the test if kubectl fails.
pub fn kubectl(
    api: &hawser_testkit::apiserver_process::ApiserverProcess,
    args: &[&str],
    stdin: Option<&str>,
) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(
        hawser_testkit::apiserver_process::k8s_bin_dir().join("kubectl"),
    )
    .arg("--kubeconfig")
    .arg(api.kubeconfig())
    .args(args)
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
