//! The agent's calls to the controller: registration/heartbeat and the engine's membership
//! requests (outdate, mark in-sync). Outdates are retried until the controller answers, because an engine must not
//! acknowledge a write a lost replica missed before the store says that replica is out; while
//! the controller is unreachable those writes wait (I/O suspends rather than diverges).
//!
//! With several controllers (sharing etcd) only the leader answers; the link knows every
//! controller URL it was given, moves to the next one when a controller cannot be reached,
//! and goes straight to the leader a follower names in its `not_leader` answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hawser_api::controller::{MarkInSync, Outdate, RegisterNode};
use hawser_api::{ApiError, ErrorCode};

use crate::constants::{CONTROLLER_CALL_TIMEOUT, OUTDATE_RETRY_INTERVAL};

pub enum OutdateOutcome {
    Done,
    /// The controller says a newer epoch exists.
    Fenced,
    /// The controller refused for another reason (only for requests where waiting is not
    /// the safe answer; see `mark_in_sync`).
    Refused,
    /// The engine stopped while retrying.
    GaveUp,
}

/// How an agent and its engines authenticate to the controller (and engines to the replica
/// ports of other nodes).
#[derive(Clone, Default)]
pub struct LinkAuth {
    /// The agent token (clusters without TLS).
    pub token: Option<Arc<str>>,
    /// A client configuration that presents the node's certificate and accepts only the
    /// cluster's controllers.
    pub tls: Option<Arc<hawser_tls::rustls::ClientConfig>>,
    /// The node's certificate, for replica connections (clusters with TLS).
    pub node: Option<Arc<crate::tls::node::NodeTls>>,
}

fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .timeout(CONTROLLER_CALL_TIMEOUT)
        .pool_idle_timeout(hawser_api::CLIENT_POOL_IDLE_TIMEOUT)
}

pub struct ControllerLink {
    targets: Mutex<Targets>,
    http: reqwest::Client,
    /// `Bearer <agent token>`, sent on every call when set.
    authorization: Option<String>,
    stopped: Arc<AtomicBool>,
}

/// The known controllers and the one calls go to.
struct Targets {
    urls: Vec<String>,
    current: usize,
}

/// How one call went, for choosing where the next one goes.
enum Reply {
    /// With the answer's body (empty if it could not be read).
    Ok(bytes::Bytes),
    /// A refusal other than `not_leader`, with the controller's error when it sent one.
    Refused {
        status: reqwest::StatusCode,
        error: Option<ApiError>,
    },
    /// A follower answered; nothing was done. `moved`: the link now targets the leader it
    /// named, so asking again at once makes sense.
    NotLeader {
        moved: bool,
        error: ApiError,
    },
    Unreachable(reqwest::Error),
}

/// Leaders followed at once before waiting a retry interval (two controllers that each
/// name the other, mid-election, must not make a hot loop).
const MAX_IMMEDIATE_HOPS: u32 = 3;

/// Controller URLs one link remembers (given ones plus leaders it was sent to).
const MAX_KNOWN_CONTROLLERS: usize = 16;

impl ControllerLink {
    /// `base` is one controller URL or several, comma-separated.
    pub fn new(base: &str) -> ControllerLink {
        let http = client_builder()
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        let mut urls: Vec<String> = Vec::new();
        for u in base.split(',') {
            let u = u.trim().trim_end_matches('/').to_owned();
            if !u.is_empty() && !urls.contains(&u) {
                urls.push(u);
            }
        }
        if urls.is_empty() {
            urls.push(hawser_api::DEFAULT_CONTROLLER_URL.to_owned());
        }
        ControllerLink {
            targets: Mutex::new(Targets { urls, current: 0 }),
            http,
            authorization: None,
            stopped: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Authenticates as `auth` says: over TLS with the node's certificate (no token), else
    /// with the agent token as the bearer token on every call.
    pub fn with_auth(mut self, auth: &LinkAuth) -> ControllerLink {
        match &auth.tls {
            Some(tls) => {
                if let Ok(http) = client_builder()
                    .use_preconfigured_tls((**tls).clone())
                    .build()
                {
                    self.http = http;
                }
                self.authorization = None;
            }
            None => self.authorization = auth.token.as_ref().map(|t| format!("Bearer {t}")),
        }
        self
    }

    fn targets(&self) -> std::sync::MutexGuard<'_, Targets> {
        self.targets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The controller calls go to now.
    fn current(&self) -> String {
        let t = self.targets();
        t.urls[t.current].clone()
    }

    /// `base` could not be reached: try the next controller.
    fn skip(&self, base: &str) {
        let mut t = self.targets();
        if t.urls[t.current] == base {
            t.current = (t.current + 1) % t.urls.len();
        }
    }

    /// A follower named `leader` (or nobody): go there next. Returns whether the target
    /// changed to a leader that was not being asked already.
    fn follow(&self, base: &str, leader: Option<&str>) -> bool {
        let Some(leader) = leader.map(|l| l.trim_end_matches('/')) else {
            self.skip(base);
            return false;
        };
        if leader == base {
            return false;
        }
        let mut t = self.targets();
        let i = match t.urls.iter().position(|u| u == leader) {
            Some(i) => i,
            None if t.urls.len() < MAX_KNOWN_CONTROLLERS => {
                t.urls.push(leader.to_owned());
                t.urls.len() - 1
            }
            None => {
                tracing::warn!(%leader, "too many controller URLs; not following");
                return false;
            }
        };
        t.current = i;
        true
    }

    /// Sends one request to the current controller and moves on according to the answer.
    async fn call<B: serde::Serialize>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &B,
    ) -> Reply {
        let base = self.current();
        let url = format!("{base}{path}");
        let mut req = self.http.request(method, &url).json(body);
        if let Some(a) = &self.authorization {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                self.skip(&base);
                return Reply::Unreachable(e);
            }
        };
        let status = resp.status();
        if status.is_success() {
            return Reply::Ok(resp.bytes().await.unwrap_or_default());
        }
        let error = resp.json::<ApiError>().await.ok();
        match error {
            Some(e) if e.code == ErrorCode::NotLeader => {
                let moved = self.follow(&base, e.leader_url.as_deref());
                Reply::NotLeader { moved, error: e }
            }
            error => Reply::Refused { status, error },
        }
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Take `replica` out of the in-sync set (as failed on a disk error). Retried until the
    /// controller answers yes or "stale epoch": a refusal for any other reason is retried
    /// too, because waiting is safe and guessing is not.
    pub async fn outdate(
        &self,
        volume: &str,
        replica: &str,
        epoch: u64,
        reason: &str,
        failed: bool,
    ) -> OutdateOutcome {
        let path = format!("/v1/volumes/{volume}/replicas/{replica}/outdate");
        let body = Outdate {
            epoch,
            reason: reason.into(),
            failed,
        };
        self.post_until_answered("outdate", &path, &body, volume, replica, false)
            .await
    }

    /// Make a resynced replica in-sync again. Retried while the controller is unreachable;
    /// a refusal (e.g. the replica was marked failed meanwhile) is final.
    pub async fn mark_in_sync(&self, volume: &str, replica: &str, epoch: u64) -> OutdateOutcome {
        let path = format!("/v1/volumes/{volume}/replicas/{replica}/in-sync");
        let body = MarkInSync { epoch };
        self.post_until_answered("mark in-sync", &path, &body, volume, replica, true)
            .await
    }

    async fn post_until_answered<B: serde::Serialize>(
        &self,
        what: &str,
        path: &str,
        body: &B,
        volume: &str,
        replica: &str,
        refusal_is_final: bool,
    ) -> OutdateOutcome {
        let mut attempt = 0u32;
        let mut hops = 0u32;
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return OutdateOutcome::GaveUp;
            }
            attempt += 1;
            let log = attempt == 1 || attempt.is_multiple_of(30);
            match self.call(reqwest::Method::POST, path, body).await {
                Reply::Ok(_) => return OutdateOutcome::Done,
                Reply::Refused { status, error } => {
                    if let Some(e) = &error {
                        if e.code == ErrorCode::StaleEpoch {
                            return OutdateOutcome::Fenced;
                        }
                    }
                    if refusal_is_final && status.is_client_error() {
                        tracing::error!(%volume, %replica, %status, ?error, "controller refused {what}");
                        return OutdateOutcome::Refused;
                    }
                    if log {
                        tracing::error!(%volume, %replica, %status, ?error, "controller refused {what}; retrying");
                    }
                }
                Reply::NotLeader { moved, error } => {
                    if moved && hops < MAX_IMMEDIATE_HOPS {
                        hops += 1;
                        continue;
                    }
                    if log {
                        tracing::error!(%volume, %replica, message = %error.message, "no controller leads for {what}; retrying");
                    }
                }
                Reply::Unreachable(e) => {
                    // The next controller may be up: ask it at once, once per round.
                    let others = u32::try_from(self.targets().urls.len() - 1).unwrap_or(0);
                    if hops < others {
                        hops += 1;
                        continue;
                    }
                    if log {
                        tracing::error!(%volume, %replica, error = %e, "controller unreachable for {what}; retrying");
                    }
                }
            }
            hops = 0;
            tokio::time::sleep(OUTDATE_RETRY_INTERVAL).await;
        }
    }

    /// `method path body` on the leader, trying each known controller once and following
    /// the not-leader answers: the answer's body, or the refusal (`Ok(Err)`), or why no
    /// controller answered (`Err`).
    async fn on_leader<B: serde::Serialize>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &B,
    ) -> Result<Result<bytes::Bytes, Refusal>, String> {
        let tries = self.targets().urls.len() + MAX_IMMEDIATE_HOPS as usize;
        let mut last = String::new();
        for _ in 0..tries {
            match self.call(method.clone(), path, body).await {
                Reply::Ok(b) => return Ok(Ok(b)),
                Reply::Refused { status, error } => return Ok(Err(Refusal { status, error })),
                Reply::NotLeader { error, .. } => last = error.message,
                Reply::Unreachable(e) => last = e.to_string(),
            }
        }
        Err(last)
    }

    /// The node the controller says `volume` is attached to: `Ok(None)` when it is not
    /// attached to this node (detached, elsewhere, or gone), an error when no controller
    /// answered. A restarted agent asks before it serves a kernel device it left behind
    /// (`frontends::devices`). Over TLS the controller shows a node only the volumes attached
    /// to it and answers 403 for the rest, which is the answer here.
    /// Where the volume is attached now, and which volume of that name it is (`None`:
    /// detached or gone).
    pub async fn attachment(
        &self,
        volume: &str,
    ) -> anyhow::Result<Option<crate::frontends::device_identity::Attachment>> {
        let path = format!("/v1/volumes/{volume}");
        match self.on_leader(reqwest::Method::GET, &path, &()).await {
            Ok(Ok(b)) => {
                let v: hawser_api::controller::Volume = serde_json::from_slice(&b)
                    .map_err(|e| anyhow::anyhow!("bad answer for volume {volume}: {e}"))?;
                Ok(v.attached_node
                    .map(|node| crate::frontends::device_identity::Attachment {
                        node,
                        uid: v.uid,
                        epoch: v.epoch,
                        attached_epoch: v.attached_epoch,
                    }))
            }
            Ok(Err(Refusal { error: Some(e), .. }))
                if matches!(e.code, ErrorCode::NotFound | ErrorCode::Forbidden) =>
            {
                Ok(None)
            }
            Ok(Err(r)) => anyhow::bail!("controller answered {r} for volume {volume}"),
            Err(last) => anyhow::bail!("no controller answered for volume {volume}: {last}"),
        }
    }

    /// Asks the controller to start now the engines `node` should run (the agent has just
    /// started). A controller without this call (an older one) answers 404: its engine watch
    /// starts them at its next round instead.
    pub async fn start_engines(&self, node: &str) -> anyhow::Result<()> {
        let path = format!("/v1/nodes/{node}/engines");
        match self.on_leader(reqwest::Method::POST, &path, &()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(r)) => anyhow::bail!("controller answered {r}"),
            Err(last) => anyhow::bail!("no controller answered: {last}"),
        }
    }

    /// Tells the controller what happened to a kernel device of `event.volume` on `node`.
    pub async fn device_event(
        &self,
        node: &str,
        event: &hawser_api::controller::DeviceEvent,
    ) -> anyhow::Result<()> {
        let path = format!("/v1/nodes/{node}/events");
        match self.on_leader(reqwest::Method::POST, &path, event).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(r)) => anyhow::bail!("controller answered {r}"),
            Err(last) => anyhow::bail!("no controller answered: {last}"),
        }
    }

    /// Registers (or heartbeats) `node` with the leader, trying each known controller once;
    /// returns the controller's view of the node (with the cluster's id and grant key).
    pub async fn register(
        &self,
        node: &str,
        body: &RegisterNode,
    ) -> anyhow::Result<hawser_api::controller::Node> {
        let path = format!("/v1/nodes/{node}");
        match self.on_leader(reqwest::Method::PUT, &path, body).await {
            Ok(Ok(b)) => serde_json::from_slice(&b)
                .map_err(|e| anyhow::anyhow!("bad registration answer: {e}")),
            Ok(Err(r)) => anyhow::bail!("controller answered {r}"),
            Err(last) => anyhow::bail!("no controller accepted the registration: {last}"),
        }
    }
}

/// A controller's refusal: its status, and its error when it sent one.
struct Refusal {
    status: reqwest::StatusCode,
    error: Option<ApiError>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.error {
            Some(e) => write!(f, "{}: {}", self.status, e.message),
            None => write!(f, "{}", self.status),
        }
    }
}

#[async_trait::async_trait]
impl crate::frontends::devices::WhereAttached for ControllerLink {
    async fn attachment(
        &self,
        volume: &str,
    ) -> anyhow::Result<Option<crate::frontends::device_identity::Attachment>> {
        ControllerLink::attachment(self, volume).await
    }

    async fn report(
        &self,
        node: &str,
        event: &hawser_api::controller::DeviceEvent,
    ) -> anyhow::Result<()> {
        ControllerLink::device_event(self, node, event).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::AtomicUsize;

    use axum::http::StatusCode;
    use axum::Json;

    use super::*;

    /// A controller on 127.0.0.1:0 that answers every request with `status` and `error`
    /// (200 and `{}` when `error` is None), counting requests.
    async fn fake(status: StatusCode, error: Option<ApiError>) -> (String, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let app = axum::Router::new().fallback(move || {
            h.fetch_add(1, Ordering::SeqCst);
            let error = error.clone();
            async move {
                match error {
                    Some(e) => (status, Json(serde_json::to_value(e).unwrap())),
                    None => (status, Json(serde_json::json!({}))),
                }
            }
        });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        (url, hits)
    }

    fn not_leader(leader: &str) -> ApiError {
        let mut e = ApiError::new(ErrorCode::NotLeader, "not the leader");
        e.leader_url = Some(leader.into());
        e
    }

    fn dead_url() -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("http://127.0.0.1:{port}")
    }

    /// Outdate and registration skip a dead controller and follow a follower to the leader,
    /// which gets each request exactly once; later calls go straight to the leader.
    #[tokio::test]
    async fn skips_dead_controllers_and_follows_the_leader() {
        let (leader, leader_hits) = fake(StatusCode::OK, None).await;
        let (follower, follower_hits) =
            fake(StatusCode::SERVICE_UNAVAILABLE, Some(not_leader(&leader))).await;
        let link = ControllerLink::new(&format!("{},{follower}/", dead_url()));
        let r = link.outdate("v", "r1", 3, "lost", false).await;
        assert!(matches!(r, OutdateOutcome::Done));
        assert_eq!(leader_hits.load(Ordering::SeqCst), 1);
        assert_eq!(follower_hits.load(Ordering::SeqCst), 1);
        assert!(matches!(
            link.mark_in_sync("v", "r1", 3).await,
            OutdateOutcome::Done
        ));
        let body = RegisterNode {
            admin_addr: "a:1".into(),
            replica_addr: "a:2".into(),
            nbd_addr: None,
            nbd_socket: None,
            nbd_tls: false,
            pools: vec![],
            labels: Default::default(),
            cluster_id: None,
            tls: None,
        };
        // The fake answers `{}`, which is not a node: reached, but refused as an answer.
        let answer = link.register("n1", &body).await.unwrap_err();
        assert!(
            answer.to_string().contains("bad registration answer"),
            "{answer}"
        );
        assert_eq!(leader_hits.load(Ordering::SeqCst), 3);
        assert_eq!(
            follower_hits.load(Ordering::SeqCst),
            1,
            "the leader is remembered"
        );
    }

    /// Following does not change the answers: stale epoch is still `Fenced`, and a client
    /// error is final for mark in-sync.
    #[tokio::test]
    async fn answers_after_following_keep_their_meaning() {
        let stale = ApiError::new(ErrorCode::StaleEpoch, "stale");
        let (leader, _) = fake(StatusCode::CONFLICT, Some(stale)).await;
        let (follower, _) = fake(StatusCode::SERVICE_UNAVAILABLE, Some(not_leader(&leader))).await;
        let link = ControllerLink::new(&follower);
        let r = link.outdate("v", "r1", 3, "lost", false).await;
        assert!(matches!(r, OutdateOutcome::Fenced));
        let refused = ApiError::new(ErrorCode::Conflict, "failed replica");
        let (leader, _) = fake(StatusCode::CONFLICT, Some(refused)).await;
        let link = ControllerLink::new(&format!("{},{leader}", dead_url()));
        assert!(matches!(
            link.mark_in_sync("v", "r1", 3).await,
            OutdateOutcome::Refused
        ));
    }
}
