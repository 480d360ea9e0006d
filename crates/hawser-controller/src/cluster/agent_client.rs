//! HTTP client for the agents' admin API (`hawser_api::agent`).

use hawser_api::agent::{
    AgentIo, AgentStatus, CreateReplica, EnginePaused, EngineResumed, EngineStatus, FetchSnapshot,
    HeldReplica, PauseEngine, PeerReach, ProbePeers, ReplicaSnapshot, ReplicaStatus,
    RestoreReplica, ResumeEngine, StartEngine, TakeSnapshot, NODE_HEADER,
};
use hawser_api::error::{error_chain, truncate_chars};
use hawser_api::ApiError;
use reqwest::header::{HeaderMap, HeaderValue, ETAG, IF_NONE_MATCH};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::auth::tls::ControllerTls;
use crate::constants::{AGENT_CONNECT_TIMEOUT, AGENT_COPY_TIMEOUT, AGENT_REQUEST_TIMEOUT};

pub use crate::errors::AgentError;

/// The agent of one node: where to call, and the node the call is meant for (sent in
/// `NODE_HEADER`, so an agent that now answers at that address refuses it).
#[derive(Clone, Copy, Debug)]
pub struct Agent<'a> {
    pub node: &'a str,
    pub addr: &'a str,
}

impl crate::store::model::NodeRecord {
    pub fn agent(&self) -> Agent<'_> {
        Agent {
            node: &self.name,
            addr: &self.admin_addr,
        }
    }
}

/// One shared connection pool for all agents; over TLS, one per agent (each accepts only
/// the node it calls).
#[derive(Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    /// `Bearer <agent token>`: agents without TLS refuse admin calls without it.
    /// `Bearer <agent token>`, plaintext clusters only: over TLS the controller's
    /// certificate authenticates it, and the agent token (a node's way in) is never sent.
    authorization: Option<String>,
    tls: Option<Arc<ControllerTls>>,
    per_node: Arc<Mutex<HashMap<String, reqwest::Client>>>,
}

fn builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(AGENT_CONNECT_TIMEOUT)
        .timeout(AGENT_REQUEST_TIMEOUT)
        .pool_idle_timeout(hawser_api::CLIENT_POOL_IDLE_TIMEOUT)
}

impl AgentClient {
    pub fn new(agent_token: Option<&str>, tls: Option<Arc<ControllerTls>>) -> anyhow::Result<Self> {
        anyhow::ensure!(
            tls.is_some() || agent_token.is_some(),
            "a plaintext controller needs the agent token to call agents"
        );
        Ok(AgentClient {
            http: builder().build()?,
            authorization: match tls {
                Some(_) => None,
                None => agent_token.map(|t| format!("Bearer {t}")),
            },
            tls,
            per_node: Default::default(),
        })
    }

    /// The client and URL scheme for calling `node`.
    fn client_for(&self, node: &str) -> Result<(reqwest::Client, &'static str), String> {
        let Some(tls) = &self.tls else {
            return Ok((self.http.clone(), "http"));
        };
        let mut map = self.per_node.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(node) {
            return Ok((c.clone(), "https"));
        }
        let config = tls.client_for(node).map_err(|e| format!("{e:#}"))?;
        let c = builder()
            .use_preconfigured_tls((*config).clone())
            .build()
            .map_err(|e| error_chain(&e))?;
        map.insert(node.into(), c.clone());
        Ok((c, "https"))
    }

    pub async fn create_replica(
        &self,
        to: Agent<'_>,
        req: &CreateReplica,
    ) -> Result<ReplicaStatus, AgentError> {
        // From a snapshot, the agent copies its file first.
        let timeout = match req.from {
            Some(_) => AGENT_COPY_TIMEOUT,
            None => AGENT_REQUEST_TIMEOUT,
        };
        self.call_within(Method::POST, to, "/v1/replicas", Some(req), timeout)
            .await
    }

    /// Deletes a replica; one the agent does not know is already deleted.
    pub async fn delete_replica(&self, to: Agent<'_>, replica_id: &str) -> Result<(), AgentError> {
        let path = format!("/v1/replicas/{replica_id}");
        self.call_no_body(Method::DELETE, to, &path).await
    }

    /// Moves a replica to its pool's trash (an orphan: kept for the agent's grace period).
    pub async fn trash_replica(&self, to: Agent<'_>, replica_id: &str) -> Result<(), AgentError> {
        let path = format!("/v1/replicas/{replica_id}/trash");
        self.call_no_body(Method::POST, to, &path).await
    }

    /// Every replica with its newest journal's summary (for `hawser cluster recover`).
    pub async fn inventory(
        &self,
        to: Agent<'_>,
    ) -> Result<Vec<hawser_api::agent::ReplicaInventory>, AgentError> {
        self.call::<(), _>(Method::GET, to, "/v1/replicas/inventory", None)
            .await
    }

    /// Holds a volume's requests and flushes its replicas, for at most `lease_ms`.
    pub async fn pause_engine(
        &self,
        to: Agent<'_>,
        volume: &str,
        lease_ms: u64,
    ) -> Result<EnginePaused, AgentError> {
        let path = format!("/v1/engines/{volume}/pause");
        let body = PauseEngine { lease_ms };
        self.call(Method::POST, to, &path, Some(&body)).await
    }

    /// Ends a pause; refused when its lease ran out.
    pub async fn resume_engine(
        &self,
        to: Agent<'_>,
        volume: &str,
        pause_id: u64,
    ) -> Result<EngineResumed, AgentError> {
        let path = format!("/v1/engines/{volume}/resume");
        let body = ResumeEngine { pause_id };
        self.call(Method::POST, to, &path, Some(&body)).await
    }

    /// Takes a snapshot of a replica (its writes held by the caller).
    pub async fn take_snapshot(
        &self,
        to: Agent<'_>,
        replica_id: &str,
        req: &TakeSnapshot,
    ) -> Result<ReplicaSnapshot, AgentError> {
        let path = format!("/v1/replicas/{replica_id}/snapshots");
        self.call_within(Method::POST, to, &path, Some(req), AGENT_COPY_TIMEOUT)
            .await
    }

    /// Deletes a replica's snapshot; one it does not have is deleted already.
    pub async fn delete_snapshot(
        &self,
        to: Agent<'_>,
        replica_id: &str,
        snapshot: &str,
    ) -> Result<(), AgentError> {
        let path = format!("/v1/replicas/{replica_id}/snapshots/{snapshot}");
        self.call_no_body(Method::DELETE, to, &path).await
    }

    /// Gives a replica a copy of a snapshot it lacks, from a holder on another node.
    pub async fn fetch_snapshot(
        &self,
        to: Agent<'_>,
        replica_id: &str,
        snapshot: &str,
        req: &FetchSnapshot,
    ) -> Result<ReplicaSnapshot, AgentError> {
        let path = format!("/v1/replicas/{replica_id}/snapshots/{snapshot}/fetch");
        self.call_within(Method::POST, to, &path, Some(req), AGENT_COPY_TIMEOUT)
            .await
    }

    /// Replaces a replica's data with its copy of a snapshot (no engine may hold it).
    pub async fn restore_replica(
        &self,
        to: Agent<'_>,
        replica_id: &str,
        snapshot: &str,
    ) -> Result<ReplicaStatus, AgentError> {
        let path = format!("/v1/replicas/{replica_id}/restore");
        let body = RestoreReplica {
            snapshot: snapshot.to_string(),
        };
        self.call_within(Method::POST, to, &path, Some(&body), AGENT_COPY_TIMEOUT)
            .await
    }

    /// Grows a replica (of a detached volume) to `size_bytes`.
    pub async fn grow_replica(
        &self,
        to: Agent<'_>,
        replica_id: &str,
        size_bytes: u64,
    ) -> Result<ReplicaStatus, AgentError> {
        let path = format!("/v1/replicas/{replica_id}/grow");
        let body = hawser_api::agent::GrowReplica { size_bytes };
        self.call(Method::POST, to, &path, Some(&body)).await
    }

    /// Gives a replica its volume's data key wrapped under a newer KEK (a key rotation); the
    /// answer shows the copy it holds, which is newer still if another rotation got there
    /// first.
    pub async fn set_wrapped_key(
        &self,
        to: Agent<'_>,
        replica_id: &str,
        wrapped: &hawser_api::WrappedKey,
    ) -> Result<ReplicaStatus, AgentError> {
        let path = format!("/v1/replicas/{replica_id}/wrapped-key");
        self.call(Method::PUT, to, &path, Some(wrapped)).await
    }

    /// Grows the running engine of `volume` (and its kernel device) to `size_bytes`; with
    /// `check_only`, only asks whether it could.
    pub async fn grow_engine(
        &self,
        to: Agent<'_>,
        volume: &str,
        size_bytes: u64,
        check_only: bool,
    ) -> Result<EngineStatus, AgentError> {
        let path = format!("/v1/engines/{volume}/grow");
        let body = hawser_api::agent::GrowEngine {
            size_bytes,
            check_only,
        };
        self.call(Method::POST, to, &path, Some(&body)).await
    }

    /// The kernel block devices the agent serves (empty from an agent too old to say).
    pub async fn devices(
        &self,
        to: Agent<'_>,
    ) -> Result<Vec<hawser_api::agent::Device>, AgentError> {
        match self
            .call::<(), _>(Method::GET, to, "/v1/devices", None)
            .await
        {
            Err(e) if e.api_code() == Some(hawser_api::ErrorCode::NotFound) => Ok(Vec::new()),
            Err(AgentError::Refused { status: 404, .. }) => Ok(Vec::new()),
            other => other,
        }
    }

    pub async fn start_engine(
        &self,
        to: Agent<'_>,
        req: &StartEngine,
    ) -> Result<EngineStatus, AgentError> {
        self.call(Method::POST, to, "/v1/engines", Some(req)).await
    }

    /// Starts a scrub pass of the volume whose engine the agent runs.
    pub async fn start_scrub(
        &self,
        to: Agent<'_>,
        volume: &str,
    ) -> Result<EngineStatus, AgentError> {
        let path = format!("/v1/engines/{volume}/scrub");
        self.call::<(), _>(Method::POST, to, &path, None).await
    }

    /// Changes the limits of the volume whose engine the agent runs.
    pub async fn set_qos(
        &self,
        to: Agent<'_>,
        volume: &str,
        qos: &hawser_api::Qos,
    ) -> Result<EngineStatus, AgentError> {
        let path = format!("/v1/engines/{volume}/qos");
        self.call(Method::PUT, to, &path, Some(qos)).await
    }

    /// Starts a backup job on the node (`backup/` in the agent); a retried start answers with
    /// the job it started before.
    pub async fn start_backup(
        &self,
        to: Agent<'_>,
        req: &hawser_api::backup::StartBackupJob,
    ) -> Result<hawser_api::backup::BackupJob, AgentError> {
        self.call(Method::POST, to, "/v1/backup-jobs", Some(req))
            .await
    }

    /// Starts filling a blank replica from a backup; its job is `req.job()`.
    pub async fn start_restore(
        &self,
        to: Agent<'_>,
        req: &hawser_api::backup::StartRestoreJob,
    ) -> Result<hawser_api::backup::BackupJob, AgentError> {
        self.call(Method::POST, to, "/v1/restore-jobs", Some(req))
            .await
    }

    pub async fn backup_job(
        &self,
        to: Agent<'_>,
        backup: &str,
    ) -> Result<hawser_api::backup::BackupJob, AgentError> {
        let path = format!("/v1/backup-jobs/{backup}");
        self.call::<(), _>(Method::GET, to, &path, None).await
    }

    pub async fn status(&self, to: Agent<'_>) -> Result<AgentStatus, AgentError> {
        self.call::<(), _>(Method::GET, to, "/v1/status", None)
            .await
    }

    /// The engines the agent runs (`GET /v1/engines`), without the replicas and pools that
    /// `status` reads: what the loops that poll every node ask. An agent older than the
    /// route answers 404 or 405 (the path takes only POST there), and its full status is
    /// read instead, so a rolling upgrade keeps its quorum check and engine watch.
    pub async fn engines(&self, to: Agent<'_>) -> Result<Vec<EngineStatus>, AgentError> {
        match self
            .call::<(), Vec<EngineStatus>>(Method::GET, to, "/v1/engines", None)
            .await
        {
            Err(AgentError::Refused {
                status: 404 | 405, ..
            }) => Ok(self.status(to).await?.engines),
            other => other,
        }
    }

    /// The replicas the agent holds (`GET /v1/replicas/held`), or `Unchanged` if they are
    /// still the list the agent tagged `tag`. An agent older than the route answers 404 or
    /// 405 (only `DELETE /v1/replicas/{id}` matches the path there), and the replicas of its
    /// full status are read instead, untagged.
    pub async fn held_replicas(
        &self,
        to: Agent<'_>,
        tag: Option<&str>,
    ) -> Result<HeldAnswer, AgentError> {
        let mut headers = HeaderMap::new();
        if let Some(t) = tag.and_then(|t| HeaderValue::from_str(t).ok()) {
            headers.insert(IF_NONE_MATCH, t);
        }
        let path = "/v1/replicas/held";
        let sent = self
            .send::<()>(Method::GET, to, path, None, AGENT_REQUEST_TIMEOUT, headers)
            .await;
        let resp = match sent {
            Ok(resp) => resp,
            Err(AgentError::Refused { status: 304, .. }) => return Ok(HeldAnswer::Unchanged),
            Err(AgentError::Refused {
                status: 404 | 405, ..
            }) => {
                let replicas = self.status(to).await?.replicas;
                let replicas = replicas.into_iter().map(|r| HeldReplica {
                    replica_id: r.replica_id,
                    volume: r.volume,
                    failed: r.failed,
                });
                return Ok(HeldAnswer::Listed {
                    tag: None,
                    replicas: replicas.collect(),
                });
            }
            Err(e) => return Err(e),
        };
        let tag = resp
            .headers()
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let replicas = resp
            .json()
            .await
            .map_err(|source| AgentError::BadResponse {
                addr: to.addr.into(),
                source,
            })?;
        Ok(HeldAnswer::Listed { tag, replicas })
    }

    /// Whether the agent's node reaches these peers' replica ports (`POST /v1/peers/probe`).
    /// An agent older than the call answers 404 (`Refused`).
    pub async fn probe_peers(
        &self,
        to: Agent<'_>,
        req: &ProbePeers,
    ) -> Result<Vec<PeerReach>, AgentError> {
        self.call(Method::POST, to, "/v1/peers/probe", Some(req))
            .await
    }

    /// The request counters of the volumes the agent exports.
    pub async fn io(&self, to: Agent<'_>) -> Result<AgentIo, AgentError> {
        self.call::<(), _>(Method::GET, to, "/v1/io", None).await
    }

    /// Flushes and stops a volume's engine; one the agent does not run is already stopped.
    pub async fn stop_engine(&self, to: Agent<'_>, volume: &str) -> Result<(), AgentError> {
        let path = format!("/v1/engines/{volume}");
        self.call_no_body(Method::DELETE, to, &path).await
    }

    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        to: Agent<'_>,
        path: &str,
        body: Option<&B>,
    ) -> Result<R, AgentError> {
        self.call_within(method, to, path, body, AGENT_REQUEST_TIMEOUT)
            .await
    }

    /// [`Self::call`] for a request that may take up to `timeout` (a copy of data).
    async fn call_within<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        to: Agent<'_>,
        path: &str,
        body: Option<&B>,
        timeout: std::time::Duration,
    ) -> Result<R, AgentError> {
        let resp = self
            .send(method, to, path, body, timeout, HeaderMap::new())
            .await?;
        resp.json().await.map_err(|source| AgentError::BadResponse {
            addr: to.addr.into(),
            source,
        })
    }

    async fn call_no_body(
        &self,
        method: Method,
        to: Agent<'_>,
        path: &str,
    ) -> Result<(), AgentError> {
        match self
            .send::<()>(
                method,
                to,
                path,
                None,
                AGENT_REQUEST_TIMEOUT,
                HeaderMap::new(),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(AgentError::Refused { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sends the request with `headers` besides the node and the authorization; a non-2xx
    /// answer becomes `Refused` with the agent's message.
    async fn send<B: Serialize>(
        &self,
        method: Method,
        to: Agent<'_>,
        path: &str,
        body: Option<&B>,
        timeout: std::time::Duration,
        headers: HeaderMap,
    ) -> Result<reqwest::Response, AgentError> {
        let addr = to.addr;
        let (http, scheme) =
            self.client_for(to.node)
                .map_err(|reason| AgentError::Unreachable {
                    addr: addr.into(),
                    connect: true,
                    reason,
                })?;
        let mut req = http
            .request(method, format!("{scheme}://{addr}{path}"))
            .header(NODE_HEADER, to.node)
            .headers(headers)
            .timeout(timeout);
        if let Some(a) = &self.authorization {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| AgentError::Unreachable {
            addr: addr.into(),
            connect: e.is_connect(),
            reason: error_chain(&e),
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().await.unwrap_or_default();
        let (code, message) = match serde_json::from_str::<ApiError>(&text) {
            Ok(e) => (Some(e.code), e.message),
            Err(_) => (None, short(&text, status)),
        };
        Err(AgentError::Refused {
            addr: addr.into(),
            status: status.as_u16(),
            code,
            message,
        })
    }
}

/// What [`AgentClient::held_replicas`] learnt.
#[derive(Debug, PartialEq, Eq)]
pub enum HeldAnswer {
    /// The agent's list is the one of the tag sent.
    Unchanged,
    /// The list, with its tag (none from an agent older than the route).
    Listed {
        tag: Option<String>,
        replicas: Vec<HeldReplica>,
    },
}

/// A non-JSON error body, trimmed so a stray HTML page does not flood the error message.
fn short(text: &str, status: StatusCode) -> String {
    const MAX: usize = 200;
    let t = text.trim();
    if t.is_empty() {
        return status.canonical_reason().unwrap_or("error").to_string();
    }
    truncate_chars(t, MAX)
}

#[cfg(test)]
#[path = "agent_client_tests.rs"]
mod tests;
