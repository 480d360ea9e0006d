//! A blocking HTTP client for the controller API (feature `client`), used by the CLI and the
//! CSI driver: bearer token, several controllers tried in order, `not_leader` followed.

use std::time::Duration;

use crate::error::{error_chain, truncate_chars};
use crate::{ApiError, ErrorCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Longest a caller waits for one answer. Attach starts an engine on a node (which connects
/// to every replica), so this is well above the controller's own agent timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The controller refused the request; its message is what the user needs.
    #[error("{}", .0.message)]
    Api(ApiError),
    #[error("cannot reach the controller at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("unexpected answer from {url} (HTTP {status}): {body}")]
    BadResponse {
        url: String,
        status: u16,
        body: String,
    },
    #[error("build the HTTP client: {0}")]
    Client(String),
    /// No usable API token (see `cli::token`).
    #[error("{0}")]
    Token(String),
}

/// Leaders followed for one request: a follower names the leader, which may itself have
/// just lost the lease and name the next one; past this many hops the CLI gives up.
const MAX_LEADER_HOPS: usize = 3;

pub struct Client {
    /// Every controller the user named, tried in order.
    bases: Vec<String>,
    http: reqwest::blocking::Client,
    /// `Bearer <admin token>`, sent on every request.
    /// `Bearer <token>`; none for a client that authenticates with its certificate.
    authorization: Option<String>,
}

/// What one controller did with a request.
enum Attempt {
    /// Answered (success or a refusal that is not about leadership), or failed in a way
    /// that may have left the request executed: not retried elsewhere.
    Done(Result<String, ClientError>),
    /// Could not connect: the request was not sent, another controller may take it.
    Unreachable(ClientError),
    /// A follower: nothing was done; the leader is there, when known.
    NotLeader(ApiError),
}

impl Client {
    /// `base` is one controller URL or several, comma-separated (controllers sharing etcd).
    pub fn new(base: &str, token: &str) -> Result<Client, ClientError> {
        Client::with_ca(base, token, None)
    }

    /// A client that also speaks TLS to `https://` controllers, accepting only a controller
    /// of the cluster whose CA certificate (PEM) is `ca_pem`.
    pub fn with_ca(base: &str, token: &str, ca_pem: Option<&str>) -> Result<Client, ClientError> {
        let trust = ca_pem
            .map(hawser_tls::TrustSlot::from_pem)
            .transpose()
            .map_err(|e| ClientError::Client(format!("the cluster CA: {e:#}")))?;
        Client::with_trust(base, Some(token), trust, None)
    }

    /// [`Client::with_ca`] with the CA certificates in the file `ca_file`, read again when
    /// it changes (a long-running client, such as the CSI driver, follows a CA rotation).
    pub fn with_ca_file(
        base: &str,
        token: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Client, ClientError> {
        let trust = ca_file
            .map(hawser_tls::TrustSlot::from_file)
            .transpose()
            .map_err(|e| ClientError::Client(format!("{e:#}")))?;
        Client::with_trust(base, Some(token), trust, None)
    }

    /// A client that authenticates with a node's certificate instead of a token, from the
    /// node's TLS directory (`node.pem`, `node.key`, `ca.pem`, which the agent renews and
    /// a CA rotation rewrites; they are read again when they change). What it may do is
    /// what the node may read of itself: the CSI node plugin's credential. The pair is read
    /// as `hawser_tls::NODE_IDENTITY` says: after an older agent's cut renewal, the key and
    /// certificate that belong together.
    pub fn with_node_identity(
        base: &str,
        tls_dir: &std::path::Path,
    ) -> Result<Client, ClientError> {
        let fail =
            |e: &dyn std::fmt::Display| ClientError::Client(format!("the node's identity: {e}"));
        let trust = hawser_tls::TrustSlot::from_file(&tls_dir.join("ca.pem"))
            .map_err(|e| fail(&format!("{e:#}")))?;
        let slot = hawser_tls::CertSlot::from_dir(tls_dir, &hawser_tls::NODE_IDENTITY)
            .map_err(|e| fail(&format!("{e:#}")))?;
        Client::with_trust(base, None, Some(trust), Some(slot))
    }

    fn with_trust(
        base: &str,
        token: Option<&str>,
        trust: Option<std::sync::Arc<hawser_tls::TrustSlot>>,
        identity: Option<std::sync::Arc<hawser_tls::CertSlot>>,
    ) -> Result<Client, ClientError> {
        let mut builder = reqwest::blocking::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .pool_idle_timeout(crate::CLIENT_POOL_IDLE_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(trust) = trust {
            let config =
                hawser_tls::client_config_trusting(&trust, hawser_tls::Peer::Controller, identity)
                    .map_err(|e| ClientError::Client(format!("the cluster CA: {e:#}")))?;
            builder = builder.use_preconfigured_tls((*config).clone());
        } else if base.contains("https://") {
            return Err(ClientError::Client(
                "an https:// controller needs the cluster's CA certificate: pass --ca-file \
                 (or set HAWSER_CA_FILE, or copy the controller's <data-dir>/ca.pem to \
                 ~/.config/hawser/ca.pem)"
                    .into(),
            ));
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Client(error_chain(&e)))?;
        let bases: Vec<String> = base
            .split(',')
            .map(|b| b.trim().trim_end_matches('/').to_string())
            .filter(|b| !b.is_empty())
            .collect();
        if bases.is_empty() {
            return Err(ClientError::Client(format!(
                "no controller URL in {base:?}"
            )));
        }
        Ok(Client {
            bases,
            http,
            authorization: token.map(|t| format!("Bearer {t}")),
        })
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let body = self.send(reqwest::Method::GET, path, None::<&()>)?;
        self.decode(path, &body)
    }

    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        b: &B,
    ) -> Result<T, ClientError> {
        let body = self.send(reqwest::Method::POST, path, Some(b))?;
        self.decode(path, &body)
    }

    pub fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        b: &B,
    ) -> Result<T, ClientError> {
        let body = self.send(reqwest::Method::PUT, path, Some(b))?;
        self.decode(path, &body)
    }

    pub fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.send(reqwest::Method::DELETE, path, None::<&()>)
            .map(|_| ())
    }

    /// Sends a request to the leader and returns the body of a 2xx answer. Controllers are
    /// tried in order; one that cannot be connected to is skipped, and a follower's
    /// `not_leader` answer is followed to the leader it names. Anything else is final.
    fn send<B: Serialize>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<String, ClientError> {
        let mut queue: std::collections::VecDeque<String> = self.bases.iter().cloned().collect();
        let mut hops = 0;
        let mut last = None;
        while let Some(base) = queue.pop_front() {
            match self.send_to(&base, method.clone(), path, body) {
                Attempt::Done(result) => return result,
                Attempt::Unreachable(e) => last = Some(e),
                Attempt::NotLeader(e) => {
                    if let Some(leader) = e.leader_url.clone() {
                        let leader = leader.trim_end_matches('/').to_string();
                        if leader != base && hops < MAX_LEADER_HOPS {
                            hops += 1;
                            queue.retain(|u| *u != leader);
                            queue.push_front(leader);
                        }
                    }
                    last = Some(ClientError::Api(e));
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Client("no controller to ask".into())))
    }

    fn send_to<B: Serialize>(
        &self,
        base: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Attempt {
        let url = format!("{base}{path}");
        let mut req = self.http.request(method, &url);
        if let Some(a) = &self.authorization {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let unreachable = |e: &reqwest::Error| ClientError::Unreachable {
            url: base.to_string(),
            reason: error_chain(e),
        };
        let resp = match req.send() {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Attempt::Unreachable(unreachable(&e)),
            Err(e) => return Attempt::Done(Err(unreachable(&e))),
        };
        let status = resp.status().as_u16();
        let text = match resp.text() {
            Ok(t) => t,
            Err(e) => return Attempt::Done(Err(unreachable(&e))),
        };
        if (200..300).contains(&status) {
            return Attempt::Done(Ok(text));
        }
        match serde_json::from_str::<ApiError>(&text) {
            Ok(e) if e.code == ErrorCode::NotLeader => Attempt::NotLeader(e),
            Ok(e) => Attempt::Done(Err(ClientError::Api(e))),
            Err(_) => Attempt::Done(Err(ClientError::BadResponse {
                url,
                status,
                body: truncate_chars(&text, 300),
            })),
        }
    }

    fn decode<T: DeserializeOwned>(&self, path: &str, body: &str) -> Result<T, ClientError> {
        serde_json::from_str(body).map_err(|e| ClientError::BadResponse {
            url: path.to_string(),
            status: 200,
            body: format!("{e}: {}", truncate_chars(body, 300)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An older agent's TLS directory after a cut renewal: the cluster's CA, and `node.key`,
    /// `node.pem` and `node.new` each from the first (`false`) or second (`true`) pair.
    fn older_cut(key_new: bool, cert_new: bool) -> tempfile::TempDir {
        let ca = hawser_tls::Ca::generate("c").expect("ca");
        let pairs: Vec<(String, String)> = (0..2)
            .map(|_| {
                let node = hawser_tls::Peer::Node("n1".into());
                let (issued, key) = ca
                    .issue_with_key(&node, Duration::from_secs(3600))
                    .expect("issue");
                (issued.chain_pem, key)
            })
            .collect();
        let at = |new: bool| &pairs[usize::from(new)];
        let dir = tempfile::tempdir().expect("dir");
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).expect("write");
        };
        write("ca.pem", ca.cert_pem());
        write("node.key", &at(key_new).1);
        write("node.pem", &at(cert_new).0);
        // The half of the new pair that was not renamed into place.
        write("node.new", if key_new { &at(true).0 } else { &at(true).1 });
        dir
    }

    #[test]
    fn the_csi_node_plugin_starts_after_a_renewal_cut_between_key_and_certificate() {
        let dir = older_cut(true, false);
        Client::with_node_identity("https://127.0.0.1:9", dir.path()).expect("the new pair");
    }

    #[test]
    fn the_csi_node_plugin_starts_when_the_new_certificate_is_beside_the_old_key() {
        let dir = older_cut(false, true);
        Client::with_node_identity("https://127.0.0.1:9", dir.path()).expect("the new pair");
    }
}
