//! HTTP client for the agents' admin API (`hawser_api::agent`).

use hawser_api::agent::{AgentStatus, CreateReplica, EngineStatus, ReplicaStatus, StartEngine};
use hawser_api::error::{error_chain, truncate_chars};
use hawser_api::{ApiError, ErrorCode};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::constants::{AGENT_CONNECT_TIMEOUT, AGENT_REQUEST_TIMEOUT};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No answer: connection refused, timeout, reset. Unless `connect` (the connection was
    /// never made), the request may or may not have run.
    #[error("agent at {addr} unreachable: {reason}")]
    Unreachable {
        addr: String,
        connect: bool,
        reason: String,
    },
    #[error("agent at {addr} answered {status}: {message}")]
    Refused {
        addr: String,
        status: u16,
        code: Option<ErrorCode>,
        message: String,
    },
    #[error("agent at {addr} sent an unreadable response: {source}")]
    BadResponse {
        addr: String,
        #[source]
        source: reqwest::Error,
    },
}

impl AgentError {
    /// The agent's error code, when it answered with an `ApiError`.
    pub fn api_code(&self) -> Option<ErrorCode> {
        match self {
            AgentError::Refused { code, .. } => *code,
            _ => None,
        }
    }

    pub fn is_unreachable(&self) -> bool {
        matches!(self, AgentError::Unreachable { .. })
    }

    /// Whether the request certainly did not reach the agent.
    pub fn never_sent(&self) -> bool {
        matches!(self, AgentError::Unreachable { connect: true, .. })
    }
}

/// One shared connection pool for all agents.
#[derive(Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    /// `Bearer <agent token>`: agents refuse admin calls without it.
    authorization: String,
}

impl AgentClient {
    pub fn new(agent_token: &str) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(AGENT_CONNECT_TIMEOUT)
            .timeout(AGENT_REQUEST_TIMEOUT)
            .build()?;
        Ok(AgentClient {
            http,
            authorization: format!("Bearer {agent_token}"),
        })
    }

    pub async fn create_replica(
        &self,
        addr: &str,
        req: &CreateReplica,
    ) -> Result<ReplicaStatus, AgentError> {
        self.call(Method::POST, addr, "/v1/replicas", Some(req))
            .await
    }

    /// Deletes a replica; one the agent does not know is already deleted.
    pub async fn delete_replica(&self, addr: &str, replica_id: &str) -> Result<(), AgentError> {
        let path = format!("/v1/replicas/{replica_id}");
        self.call_no_body(Method::DELETE, addr, &path).await
    }

    pub async fn start_engine(
        &self,
        addr: &str,
        req: &StartEngine,
    ) -> Result<EngineStatus, AgentError> {
        self.call(Method::POST, addr, "/v1/engines", Some(req))
            .await
    }

    pub async fn status(&self, addr: &str) -> Result<AgentStatus, AgentError> {
        self.call::<(), _>(Method::GET, addr, "/v1/status", None)
            .await
    }

    /// Flushes and stops a volume's engine; one the agent does not run is already stopped.
    pub async fn stop_engine(&self, addr: &str, volume: &str) -> Result<(), AgentError> {
        let path = format!("/v1/engines/{volume}");
        self.call_no_body(Method::DELETE, addr, &path).await
    }

    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<R, AgentError> {
        let resp = self.send(method, addr, path, body).await?;
        resp.json().await.map_err(|source| AgentError::BadResponse {
            addr: addr.into(),
            source,
        })
    }

    async fn call_no_body(&self, method: Method, addr: &str, path: &str) -> Result<(), AgentError> {
        match self.send::<()>(method, addr, path, None).await {
            Ok(_) => Ok(()),
            Err(AgentError::Refused { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sends the request; a non-2xx answer becomes `Refused` with the agent's message.
    async fn send<B: Serialize>(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<reqwest::Response, AgentError> {
        let mut req = self
            .http
            .request(method, format!("http://{addr}{path}"))
            .header(reqwest::header::AUTHORIZATION, &self.authorization);
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

/// A non-JSON error body, trimmed so a stray HTML page does not flood the error message.
fn short(text: &str, status: StatusCode) -> String {
    const MAX: usize = 200;
    let t = text.trim();
    if t.is_empty() {
        return status.canonical_reason().unwrap_or("error").to_string();
    }
    truncate_chars(t, MAX)
}
