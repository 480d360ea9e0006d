//! A small Kubernetes API client: JSON requests with a deadline, the answers classified by
//! what the store needs to know (missing, conflict, gone, other), and watch streams.
//!
//! Objects are handled as `serde_json::Value`: the store reads a handful of fields and
//! checks each, so a surprising answer is an error, never a panic.

use std::time::Duration;

use serde_json::Value;

use crate::config::{Auth, KubeConfig, TokenSource};

/// How an API call ended, when it did not succeed.
#[derive(Debug)]
pub enum ApiError {
    /// 404.
    NotFound,
    /// 409: `AlreadyExists` on create, a stale `resourceVersion` on update or delete.
    Conflict,
    /// 410: a watch asked for history the API server no longer has.
    Gone(String),
    /// Anything else: the server could not be reached, refused, or answered garbage.
    Failed(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::NotFound => f.write_str("not found"),
            ApiError::Conflict => f.write_str("conflict"),
            ApiError::Gone(m) | ApiError::Failed(m) => f.write_str(m),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Why a client for a kubeconfig's server cannot be made (before any request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    #[error("certificate authority of {source_name}: {why}")]
    Authority { source_name: String, why: String },
    #[error("no certificate authority in {source_name}")]
    NoAuthority { source_name: String },
    #[error("client certificate of {source_name}: {why}")]
    ClientCertificate { source_name: String, why: String },
    #[error("HTTP client for {server}: {why}")]
    Http { server: String, why: String },
}

pub struct Api {
    http: reqwest::Client,
    server: String,
    token: TokenSource,
    timeout: Duration,
}

impl Api {
    pub fn new(cfg: &KubeConfig, timeout: Duration) -> Result<Api, SetupError> {
        let source_name = || cfg.source.to_string();
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(timeout)
            .tcp_keepalive(Duration::from_secs(10))
            .user_agent(concat!("hawser/", env!("CARGO_PKG_VERSION")));
        if cfg.insecure {
            b = b.danger_accept_invalid_certs(true);
        } else if let Some(pem) = &cfg.ca_pem {
            let certs =
                reqwest::Certificate::from_pem_bundle(pem).map_err(|e| SetupError::Authority {
                    source_name: source_name(),
                    why: e.to_string(),
                })?;
            if certs.is_empty() {
                return Err(SetupError::NoAuthority {
                    source_name: source_name(),
                });
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let Auth::ClientCert(pem) = &cfg.auth {
            let id =
                reqwest::Identity::from_pem(pem).map_err(|e| SetupError::ClientCertificate {
                    source_name: source_name(),
                    why: e.to_string(),
                })?;
            b = b.identity(id);
        }
        let http = b.build().map_err(|e| SetupError::Http {
            server: cfg.server.clone(),
            why: e.to_string(),
        })?;
        Ok(Api {
            http,
            server: cfg.server.clone(),
            token: TokenSource::new(cfg.auth.clone()),
            timeout,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> ApiResult<reqwest::RequestBuilder> {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.server))
            .header("Accept", "application/json");
        if let Some(b) = self
            .token
            .bearer()
            .map_err(|e| ApiError::Failed(e.to_string()))?
        {
            rb = rb.header("Authorization", b);
        }
        Ok(rb)
    }

    pub async fn get(&self, path: &str) -> ApiResult<Value> {
        self.send(self.request(reqwest::Method::GET, path)?).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> ApiResult<Value> {
        self.send(self.request(reqwest::Method::POST, path)?.json(body))
            .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> ApiResult<Value> {
        self.send(self.request(reqwest::Method::PUT, path)?.json(body))
            .await
    }

    pub async fn merge_patch(&self, path: &str, body: &Value) -> ApiResult<Value> {
        let rb = self
            .request(reqwest::Method::PATCH, path)?
            .header("Content-Type", "application/merge-patch+json")
            .body(body.to_string());
        self.send(rb).await
    }

    /// Deletes, if `resource_version` is given only while the object still has it.
    pub async fn delete(&self, path: &str, resource_version: Option<u64>) -> ApiResult<()> {
        let mut body = serde_json::json!({"apiVersion": "v1", "kind": "DeleteOptions"});
        if let Some(rv) = resource_version {
            body["preconditions"] = serde_json::json!({"resourceVersion": rv.to_string()});
        }
        self.delete_with(path, &body).await
    }

    /// Deletes with the given `DeleteOptions`.
    pub async fn delete_with(&self, path: &str, options: &Value) -> ApiResult<()> {
        self.send(self.request(reqwest::Method::DELETE, path)?.json(options))
            .await
            .map(|_| ())
    }

    async fn send(&self, rb: reqwest::RequestBuilder) -> ApiResult<Value> {
        let resp = rb
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| ApiError::Failed(describe_reqwest(&e)))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ApiError::Failed(describe_reqwest(&e)))?;
        classify(status.as_u16(), &bytes)
    }

    /// Opens a watch (`path` carries the query); events are read with [`WatchStream::next`].
    pub async fn watch(&self, path: &str) -> ApiResult<WatchStream> {
        // No overall timeout: the stream lives until the server's `timeoutSeconds`.
        let resp = self
            .request(reqwest::Method::GET, path)?
            .send()
            .await
            .map_err(|e| ApiError::Failed(describe_reqwest(&e)))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let bytes = resp.bytes().await.unwrap_or_default();
            return Err(classify(status, &bytes)
                .err()
                .unwrap_or_else(|| ApiError::Failed(format!("watch answered HTTP {status}"))));
        }
        Ok(WatchStream {
            resp,
            buf: Vec::new(),
        })
    }
}

/// The error chain of a reqwest error on one line (its Display alone hides the cause).
fn describe_reqwest(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    if e.is_timeout() {
        s.push_str(" (timed out)");
    }
    s
}

/// Success bodies as JSON; failures by status, with the server's message.
fn classify(status: u16, body: &[u8]) -> ApiResult<Value> {
    if (200..300).contains(&status) {
        return serde_json::from_slice(body).map_err(|e| {
            ApiError::Failed(format!("HTTP {status} with a body that is not JSON: {e}"))
        });
    }
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    match status {
        404 => Err(ApiError::NotFound),
        409 => Err(ApiError::Conflict),
        410 => Err(ApiError::Gone(message)),
        _ => Err(ApiError::Failed(format!("HTTP {status}: {message}"))),
    }
}

/// One event of a watch stream.
#[derive(Debug)]
pub enum RawEvent {
    Added(Value),
    Modified(Value),
    Deleted(Value),
    /// An `ERROR` event: its `Status` object's code and message.
    Error(u16, String),
    Bookmark,
}

/// Newline-delimited JSON events of a watch.
pub struct WatchStream {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

/// Longest event line accepted: an object is at most ~1.5 MiB in etcd.
const MAX_EVENT_BYTES: usize = 4 << 20;

impl WatchStream {
    /// The next event; `Ok(None)` once the server ended the stream.
    pub async fn next(&mut self) -> ApiResult<Option<RawEvent>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let line = &line[..line.len() - 1];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return decode_event(line).map(Some);
            }
            if self.buf.len() > MAX_EVENT_BYTES {
                return Err(ApiError::Failed(format!(
                    "watch event longer than {MAX_EVENT_BYTES} bytes"
                )));
            }
            match self.resp.chunk().await {
                Ok(Some(c)) => self.buf.extend_from_slice(&c),
                Ok(None) => return Ok(None),
                Err(e) => return Err(ApiError::Failed(describe_reqwest(&e))),
            }
        }
    }
}

fn decode_event(line: &[u8]) -> ApiResult<RawEvent> {
    let v: Value = serde_json::from_slice(line)
        .map_err(|e| ApiError::Failed(format!("watch event is not JSON: {e}")))?;
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    let object = v.get("object").cloned().unwrap_or(Value::Null);
    match kind {
        "ADDED" => Ok(RawEvent::Added(object)),
        "MODIFIED" => Ok(RawEvent::Modified(object)),
        "DELETED" => Ok(RawEvent::Deleted(object)),
        "BOOKMARK" => Ok(RawEvent::Bookmark),
        "ERROR" => {
            let code = object
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0);
            let msg = object
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            Ok(RawEvent::Error(code, msg))
        }
        other => Err(ApiError::Failed(format!(
            "watch event of unknown type {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn statuses_classify() {
        assert!(matches!(classify(404, b"{}"), Err(ApiError::NotFound)));
        assert!(matches!(classify(409, b""), Err(ApiError::Conflict)));
        assert!(
            matches!(classify(410, br#"{"message":"too old"}"#), Err(ApiError::Gone(m)) if m == "too old")
        );
        assert!(
            matches!(classify(403, br#"{"message":"forbidden: x"}"#), Err(ApiError::Failed(m)) if m == "HTTP 403: forbidden: x")
        );
        assert!(matches!(
            classify(200, b"not json"),
            Err(ApiError::Failed(_))
        ));
        assert_eq!(classify(201, br#"{"a":1}"#).unwrap()["a"], 1);
    }

    #[test]
    fn events_decode_without_panics() {
        assert!(matches!(
            decode_event(br#"{"type":"ADDED","object":{"a":1}}"#),
            Ok(RawEvent::Added(_))
        ));
        assert!(matches!(
            decode_event(br#"{"type":"ERROR","object":{"code":410,"message":"gone"}}"#),
            Ok(RawEvent::Error(410, m)) if m == "gone"
        ));
        for bad in [&b"{"[..], b"[]", b"{\"type\":\"WHAT\"}", b"\xff"] {
            assert!(decode_event(bad).is_err());
        }
        assert!(matches!(
            decode_event(br#"{"type":"ERROR","object":7}"#),
            Ok(RawEvent::Error(0, _))
        ));
    }
}
