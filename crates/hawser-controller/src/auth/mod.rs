//! Cluster tokens: created at cluster init, checked on every request.
//!
//! The first controller to start against an empty store generates two random tokens (256
//! bits each): the admin token (CLI, operators: every route) and the agent token (agents:
//! only the routes they need, and the controller's own calls to agents' admin API). The store
//! keeps only their SHA-256, so every controller sharing it accepts them and reading the
//! store does not give a usable token. The tokens themselves go to files (mode 0600) that
//! the operator hands to the CLI and the agents.
//!
//! Token files that already exist when the store has no tokens are adopted instead of
//! generated: that is how several controllers sharing etcd start with the same tokens
//! (each needs the agent token to call agents; the admin token file is optional for them).

pub mod ca_home;
pub(crate) mod ca_rotation;
pub(crate) mod client_cert;
pub(crate) mod join;
pub(crate) mod tls;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use axum::http::HeaderMap;
use hawser_api::auth::{self, TokenDigest};
use hawser_listen::Transport;
use hawser_store::{get_json, put_json, Expect, Store};
use hawser_tls::Peer;
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::errors::ControllerError;

/// Store key of the token digests.
const TOKENS_KEY: &str = "auth/tokens";

/// Bytes of randomness in a generated token (hex-encoded: 64 characters).
const TOKEN_BYTES: usize = 32;

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The admin token only.
    Admin,
    /// The routes agents call (register/heartbeat, outdate, in-sync, certificate renewal):
    /// over TLS a node certificate (the handler checks the node may act on what it names),
    /// in plaintext the agent token; the admin token always.
    Agent,
    /// Nobody is checked by the guard: the join token in the body is (`POST /v1/join`).
    Joining,
    /// The metrics token (a read-only scrape credential: `GET /metrics` only) or the admin
    /// token.
    Metrics,
    /// What a node reads of itself (the CSI node plugin, which authenticates with its node's
    /// certificate rather than the admin token): over TLS a node certificate, the handler
    /// then answering only about that node and the volumes attached to it; the admin token
    /// always.
    NodeRead,
}

/// Who made a request, as the guard established it; in the request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Admin,
    /// The agent token (plaintext clusters): any node.
    AgentToken,
    /// A node certificate: this node only.
    Node(String),
    /// Not authenticated yet (the join route).
    Joining,
    /// The metrics token: scrapes only.
    Metrics,
}

impl Principal {
    /// Whether the caller may read what concerns `node` (its record, the volumes attached
    /// to it): the admin, and that node.
    pub fn may_read_node(&self, node: &str) -> Result<(), ControllerError> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Node(n) if n == node => Ok(()),
            Principal::Node(n) => Err(ControllerError::ForbiddenFor {
                reason: format!("node {n} reads only what concerns node {n}, not {node}"),
            }),
            _ => Err(ControllerError::Forbidden),
        }
    }

    /// Whether the caller may act as `node` (register it, report for its engine).
    pub fn may_act_as(&self, node: &str) -> Result<(), ControllerError> {
        match self {
            Principal::Admin | Principal::AgentToken => Ok(()),
            Principal::Node(n) if n == node => Ok(()),
            Principal::Node(n) => Err(ControllerError::ForbiddenFor {
                reason: format!("node {n} cannot act as node {node}"),
            }),
            Principal::Joining | Principal::Metrics => Err(ControllerError::ForbiddenFor {
                reason: "not authenticated as a node".into(),
            }),
        }
    }
}

/// The token digests as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRecord {
    admin_sha256: String,
    agent_sha256: String,
    /// After a rotation: the previous admin token's digest, still taken until
    /// `admin_previous_until_ms`, so the CLIs and CSI drivers holding it can be given the new
    /// one without an outage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    admin_previous_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    admin_previous_until_ms: Option<u64>,
    /// The same for the agent token (TLS clusters: the token nodes join with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_previous_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_previous_until_ms: Option<u64>,
    /// The metrics (scrape) token, and its previous one after a rotation. Missing in a
    /// store made before metrics existed: the first controller to start adds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metrics_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metrics_previous_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metrics_previous_until_ms: Option<u64>,
}

/// Which of the two cluster tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    Admin,
    Agent,
    Metrics,
}

impl TokenRecord {
    /// The current digest and the previous one with its end, of `kind`.
    /// (Only called once the metrics token exists: `init` adds it to an older record.)
    fn fields(&mut self, kind: TokenKind) -> (&mut String, &mut Option<String>, &mut Option<u64>) {
        match kind {
            TokenKind::Metrics => (
                self.metrics_sha256.get_or_insert_with(String::new),
                &mut self.metrics_previous_sha256,
                &mut self.metrics_previous_until_ms,
            ),
            TokenKind::Admin => (
                &mut self.admin_sha256,
                &mut self.admin_previous_sha256,
                &mut self.admin_previous_until_ms,
            ),
            TokenKind::Agent => (
                &mut self.agent_sha256,
                &mut self.agent_previous_sha256,
                &mut self.agent_previous_until_ms,
            ),
        }
    }

    fn digests(&self, kind: TokenKind) -> anyhow::Result<Digests> {
        let (current, previous, until) = match kind {
            TokenKind::Admin => (
                &self.admin_sha256,
                &self.admin_previous_sha256,
                self.admin_previous_until_ms,
            ),
            TokenKind::Agent => (
                &self.agent_sha256,
                &self.agent_previous_sha256,
                self.agent_previous_until_ms,
            ),
            TokenKind::Metrics => (
                self.metrics_sha256
                    .as_ref()
                    .context("the store has no metrics token")?,
                &self.metrics_previous_sha256,
                self.metrics_previous_until_ms,
            ),
        };
        let previous = match (previous.as_deref(), until) {
            (Some(hex), Some(until)) => Some((parse_digest(hex)?, until)),
            _ => None,
        };
        Ok(Digests {
            current: parse_digest(current)?,
            previous,
        })
    }
}

/// The tokens of one kind a request may carry: the current one, and after a rotation the
/// previous one until its grace period ends.
#[derive(Clone, Copy)]
struct Digests {
    current: TokenDigest,
    previous: Option<(TokenDigest, u64)>,
}

impl Digests {
    #[cfg(test)]
    fn only(current: TokenDigest) -> Digests {
        Digests {
            current,
            previous: None,
        }
    }

    /// Constant-time comparisons (the previous token's only while there is one).
    fn admits(&self, d: &TokenDigest, now_ms: u64) -> bool {
        let current = auth::digests_equal(d, &self.current);
        let previous = match self.previous {
            Some((p, until)) => auth::digests_equal(d, &p) && now_ms < until,
            None => false,
        };
        current | previous
    }

    /// The digests (hex) valid at `now_ms`: what agents are told to take.
    fn valid_hex(&self, now_ms: u64) -> Vec<String> {
        let mut v = vec![auth::digest_hex(&self.current)];
        if let Some((p, until)) = self.previous {
            if now_ms < until {
                v.push(auth::digest_hex(&p));
            }
        }
        v
    }
}

type Shared<T> = std::sync::Arc<std::sync::RwLock<T>>;

fn shared<T>(v: T) -> Shared<T> {
    std::sync::Arc::new(std::sync::RwLock::new(v))
}

fn read<T: Copy>(s: &Shared<T>) -> T {
    *s.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(s: &Shared<T>, v: T) {
    *s.write().unwrap_or_else(|p| p.into_inner()) = v;
}

/// What the controller needs to check requests and to call agents.
#[derive(Clone)]
pub struct ClusterTokens {
    /// Shared by every clone, replaced by a rotation or a refresh from the store.
    admin: Shared<Digests>,
    agent: Shared<Digests>,
    metrics: Shared<Digests>,
    /// The agent token itself, sent to agents' admin API: plaintext clusters only. Over TLS
    /// the controller's certificate is its credential, and the agent token (which lets a
    /// node join) is never sent to a node.
    agent_token: Option<String>,
}

/// Where the token files are.
#[derive(Debug, Clone)]
pub struct TokenFiles {
    pub admin: PathBuf,
    pub agent: PathBuf,
    pub metrics: PathBuf,
}

impl ClusterTokens {
    /// Creates the cluster's tokens if the store has none (adopting existing token files,
    /// generating missing ones), else loads them. A plaintext (`insecure`) controller needs
    /// the current agent token in its file: it calls agents with it. Over TLS the file is
    /// only what cluster init wrote, and may be stale after a rotation.
    pub async fn init(
        store: &dyn Store,
        files: &TokenFiles,
        insecure: bool,
    ) -> anyhow::Result<ClusterTokens> {
        let record = match get_json::<TokenRecord>(store, TOKENS_KEY)
            .await
            .context("read the cluster tokens")?
        {
            Some((r, _)) => r,
            None => create_tokens(store, files).await?,
        };
        let record = match record.metrics_sha256 {
            Some(_) => record,
            None => add_metrics_token(store, files).await?,
        };
        let admin = record.digests(TokenKind::Admin)?;
        let agent = record.digests(TokenKind::Agent)?;
        let metrics = record.digests(TokenKind::Metrics)?;
        let agent_token = if insecure {
            let token = auth::read_token_file(&files.agent).with_context(|| {
                format!(
                    "the cluster already has tokens: copy agent.token from the controller \
                     that created them to {}",
                    files.agent.display()
                )
            })?;
            anyhow::ensure!(
                auth::digests_equal(&auth::digest(&token), &agent.current),
                "{} is not this cluster's agent token (with --insecure every controller \
                 needs the current one)",
                files.agent.display()
            );
            Some(token)
        } else {
            None
        };
        Ok(ClusterTokens {
            admin: shared(admin),
            agent: shared(agent),
            metrics: shared(metrics),
            agent_token,
        })
    }

    /// Takes the token digests from the store again: another controller of the cluster may
    /// have rotated a token.
    pub async fn refresh(&self, store: &dyn Store) -> anyhow::Result<()> {
        let (record, _) = get_json::<TokenRecord>(store, TOKENS_KEY)
            .await
            .context("read the cluster tokens")?
            .context("the cluster tokens are gone from the store")?;
        let admin = record.digests(TokenKind::Admin)?;
        let agent = record.digests(TokenKind::Agent)?;
        write(&self.admin, admin);
        write(&self.agent, agent);
        // A store written by a controller without metrics has none; keep ours then.
        if let Ok(metrics) = record.digests(TokenKind::Metrics) {
            write(&self.metrics, metrics);
        }
        Ok(())
    }

    /// Replaces the `kind` token with a new random one; the old one is still taken for
    /// `grace_ms`. Returns the new token and when the old one stops working. The agent
    /// token of a plaintext cluster does not rotate: it is also what agents check the
    /// controller's calls against.
    pub async fn rotate(
        &self,
        store: &dyn Store,
        kind: TokenKind,
        grace_ms: u64,
    ) -> Result<(String, u64), ControllerError> {
        if kind == TokenKind::Agent && self.agent_token.is_some() {
            return Err(ControllerError::Refused {
                message: "with --insecure the agent token is also the controller's credential \
                          with every agent: it cannot rotate without restarting them all; \
                          run the cluster with TLS"
                    .into(),
            });
        }
        let mut bytes = [0u8; TOKEN_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        let token = auth::digest_hex(&bytes);
        let refused = |e: anyhow::Error| ControllerError::Refused {
            message: format!("{e:#}"),
        };
        for _ in 0..5 {
            let Some((mut record, version)) = get_json::<TokenRecord>(store, TOKENS_KEY).await?
            else {
                return Err(ControllerError::Refused {
                    message: "the cluster tokens are gone from the store".into(),
                });
            };
            let until = crate::store::model::now_ms().saturating_add(grace_ms);
            let (current, previous, previous_until) = record.fields(kind);
            *previous = Some(std::mem::replace(
                current,
                auth::digest_hex(&auth::digest(&token)),
            ));
            *previous_until = Some(until);
            match put_json(store, TOKENS_KEY, &record, Expect::Version(version)).await {
                Ok(_) => {
                    let digests = record.digests(kind).map_err(refused)?;
                    match kind {
                        TokenKind::Admin => write(&self.admin, digests),
                        TokenKind::Agent => write(&self.agent, digests),
                        TokenKind::Metrics => write(&self.metrics, digests),
                    }
                    return Ok((token, until));
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ControllerError::Contention {
            key: TOKENS_KEY.into(),
            retries: 5,
        })
    }

    /// Tokens without a store, for unit tests of code that needs an `AppState`.
    #[cfg(test)]
    pub fn for_tests(admin: &str, agent: &str) -> ClusterTokens {
        ClusterTokens {
            admin: shared(Digests::only(auth::digest(admin))),
            agent: shared(Digests::only(auth::digest(agent))),
            metrics: shared(Digests::only(auth::digest("metrics"))),
            agent_token: Some(agent.to_string()),
        }
    }

    /// Digests (hex) of the metrics tokens valid now, for agents' `/metrics`.
    pub fn metrics_digests_hex(&self) -> Vec<String> {
        read(&self.metrics).valid_hex(crate::store::model::now_ms())
    }

    /// Whether `token` is the cluster's agent token, or the previous one in its grace
    /// period (constant-time comparisons of digests).
    pub fn is_agent_token(&self, token: &str) -> bool {
        read(&self.agent).admits(&auth::digest(token.trim()), crate::store::model::now_ms())
    }

    /// The agent token the controller sends to agents (plaintext clusters only).
    pub fn agent_token(&self) -> Option<&str> {
        self.agent_token.as_deref()
    }

    /// Who made a request, and whether `caller` allows it: 401 without valid credentials,
    /// 403 for agent credentials on an admin route. Over TLS (`transport`), a node
    /// certificate stands for the agent token, which is then refused.
    pub fn check(
        &self,
        headers: &HeaderMap,
        transport: Option<&Transport>,
        caller: Caller,
    ) -> Result<Principal, ControllerError> {
        if caller == Caller::Joining {
            return Ok(Principal::Joining);
        }
        let tls = matches!(transport, Some(Transport::Tls { .. }));
        let node = match transport {
            Some(Transport::Tls {
                peer: Some(Peer::Node(n)),
            }) => Some(n.clone()),
            _ => None,
        };
        if headers.get(axum::http::header::AUTHORIZATION).is_none() {
            if let Some(n) = node {
                return match caller {
                    Caller::Agent | Caller::NodeRead => Ok(Principal::Node(n)),
                    _ => Err(ControllerError::Forbidden),
                };
            }
        }
        match self.check_token(headers, caller)? {
            Principal::AgentToken if tls => Err(ControllerError::Unauthorized {
                reason: "over TLS an agent authenticates with its node certificate, not the \
                         agent token"
                    .into(),
            }),
            p => Ok(p),
        }
    }

    fn check_token(
        &self,
        headers: &HeaderMap,
        caller: Caller,
    ) -> Result<Principal, ControllerError> {
        let unauthorized = |reason: &str| ControllerError::Unauthorized {
            reason: reason.to_string(),
        };
        let value = headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("no Authorization header"))?;
        let value = value
            .to_str()
            .map_err(|_| unauthorized("the Authorization header is not ASCII"))?;
        let token = auth::bearer_token(value)
            .ok_or_else(|| unauthorized("the Authorization header is not `Bearer TOKEN`"))?;
        if token.len() > auth::MAX_TOKEN_CHARS {
            return Err(unauthorized("the token is too long"));
        }
        let d = auth::digest(token);
        // Both comparisons always run, so timing does not say which token was close.
        let now = crate::store::model::now_ms();
        let is_admin = read(&self.admin).admits(&d, now);
        let is_agent = read(&self.agent).admits(&d, now);
        let is_metrics = read(&self.metrics).admits(&d, now);
        match (is_admin, is_agent, is_metrics, caller) {
            (true, _, _, _) => Ok(Principal::Admin),
            (_, true, _, Caller::Agent) => Ok(Principal::AgentToken),
            (_, _, true, Caller::Metrics) => Ok(Principal::Metrics),
            (_, true, _, _) | (_, _, true, _) => Err(ControllerError::Forbidden),
            _ => Err(unauthorized("the token is not valid for this cluster")),
        }
    }
}

fn parse_digest(hex: &str) -> anyhow::Result<TokenDigest> {
    auth::parse_digest_hex(hex)
        .with_context(|| format!("the stored token digest {hex:?} is not 64 hex digits"))
}

/// Cluster init: reads or generates both token files, then stores their digests unless
/// another controller did first (then its digests win and are returned).
async fn create_tokens(store: &dyn Store, files: &TokenFiles) -> anyhow::Result<TokenRecord> {
    let admin = existing_or_new_token(&files.admin)?;
    let agent = existing_or_new_token(&files.agent)?;
    let metrics = existing_or_new_token(&files.metrics)?;
    let record = TokenRecord {
        admin_sha256: auth::digest_hex(&auth::digest(&admin)),
        agent_sha256: auth::digest_hex(&auth::digest(&agent)),
        admin_previous_sha256: None,
        admin_previous_until_ms: None,
        agent_previous_sha256: None,
        agent_previous_until_ms: None,
        metrics_sha256: Some(auth::digest_hex(&auth::digest(&metrics))),
        metrics_previous_sha256: None,
        metrics_previous_until_ms: None,
    };
    match put_json(store, TOKENS_KEY, &record, Expect::Absent).await {
        Ok(_) => {
            tracing::info!(
                admin = %files.admin.display(),
                agent = %files.agent.display(),
                "cluster init: created the API tokens; give the admin token to the CLI \
                 (--token-file or HAWSER_TOKEN) and the agent token to every agent"
            );
            Ok(record)
        }
        Err(e) if e.is_conflict() => {
            let (r, _) = get_json::<TokenRecord>(store, TOKENS_KEY)
                .await
                .context("read the cluster tokens another controller created")?
                .context("the cluster tokens vanished from the store")?;
            Ok(r)
        }
        Err(e) => Err(e).context("store the cluster token digests"),
    }
}

/// A store made before the metrics token existed: add one (adopting the token file if it
/// exists), unless another controller did first (then its record is returned).
/// A token file made here for a race another controller won is removed again, so no file
/// holds a token that opens nothing.
async fn add_metrics_token(store: &dyn Store, files: &TokenFiles) -> anyhow::Result<TokenRecord> {
    let existed = files.metrics.exists();
    let metrics = existing_or_new_token(&files.metrics)?;
    for _ in 0..5 {
        let (mut record, version) = get_json::<TokenRecord>(store, TOKENS_KEY)
            .await
            .context("read the cluster tokens")?
            .context("the cluster tokens vanished from the store")?;
        if record.metrics_sha256.is_some() {
            if !existed {
                let _ = std::fs::remove_file(&files.metrics);
            }
            return Ok(record);
        }
        record.metrics_sha256 = Some(auth::digest_hex(&auth::digest(&metrics)));
        match put_json(store, TOKENS_KEY, &record, Expect::Version(version)).await {
            Ok(_) => {
                tracing::info!(file = %files.metrics.display(), "created the metrics token");
                return Ok(record);
            }
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e).context("store the metrics token digest"),
        }
    }
    anyhow::bail!("the cluster tokens kept changing while the metrics token was added")
}

/// The token in `path`, or a new random one written there (mode 0600, never overwriting).
fn existing_or_new_token(path: &Path) -> anyhow::Result<String> {
    if path.exists() {
        return Ok(auth::read_token_file(path)?);
    }
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    let token = auth::digest_hex(&bytes);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create token file {}", path.display()))?;
    writeln!(f, "{token}")
        .and_then(|_| f.sync_all())
        .with_context(|| format!("write token file {}", path.display()))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_store::EmbeddedStore;

    /// After the agent token rotated, a TLS controller still starts with the token file
    /// cluster init wrote (it is stale now), and takes the new token and the old one only
    /// within the grace; a plaintext controller refuses a stale file, and cannot rotate the
    /// agent token at all.
    #[tokio::test]
    async fn the_agent_token_rotates_in_tls_clusters_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("store.json")).unwrap();
        let files = TokenFiles {
            admin: dir.path().join("admin.token"),
            agent: dir.path().join("agent.token"),
            metrics: dir.path().join("metrics.token"),
        };
        let tls = ClusterTokens::init(&store, &files, false).await.unwrap();
        assert!(tls.agent_token().is_none(), "never sent over TLS");
        let old = auth::read_token_file(&files.agent).unwrap();
        assert!(tls.is_agent_token(&old));

        let (new, _) = tls.rotate(&store, TokenKind::Agent, 60_000).await.unwrap();
        assert!(tls.is_agent_token(&new) && tls.is_agent_token(&old));
        let (newer, _) = tls.rotate(&store, TokenKind::Agent, 0).await.unwrap();
        assert!(tls.is_agent_token(&newer));
        assert!(!tls.is_agent_token(&new) && !tls.is_agent_token(&old));

        // Another controller of the cluster, started now with the stale file.
        let restarted = ClusterTokens::init(&store, &files, false).await.unwrap();
        assert!(restarted.is_agent_token(&newer) && !restarted.is_agent_token(&old));
        let err = ClusterTokens::init(&store, &files, true)
            .await
            .err()
            .unwrap();
        assert!(
            format!("{err:#}").contains("not this cluster's agent token"),
            "{err:#}"
        );

        // A plaintext cluster's agent token does not rotate.
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("store.json")).unwrap();
        let files = TokenFiles {
            admin: dir.path().join("admin.token"),
            agent: dir.path().join("agent.token"),
            metrics: dir.path().join("metrics.token"),
        };
        let plain = ClusterTokens::init(&store, &files, true).await.unwrap();
        let err = plain.rotate(&store, TokenKind::Agent, 0).await.unwrap_err();
        assert!(matches!(err, ControllerError::Refused { .. }), "{err:?}");
        assert!(plain.is_agent_token(&auth::read_token_file(&files.agent).unwrap()));
    }

    /// A store from before metrics (no metrics token) gets one at the next start, from the
    /// token file if there is one; the metrics token admits scrapes only, and agents are
    /// told its digest (and the previous one's during a rotation's grace).
    #[tokio::test]
    async fn an_older_store_gains_a_metrics_token_that_opens_metrics_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("store.json")).unwrap();
        let files = TokenFiles {
            admin: dir.path().join("admin.token"),
            agent: dir.path().join("agent.token"),
            metrics: dir.path().join("metrics.token"),
        };
        ClusterTokens::init(&store, &files, false).await.unwrap();
        // Make it an older store: no metrics token in the record, and none on disk.
        let (mut record, version) = get_json::<TokenRecord>(&store, TOKENS_KEY)
            .await
            .unwrap()
            .unwrap();
        record.metrics_sha256 = None;
        put_json(&store, TOKENS_KEY, &record, Expect::Version(version))
            .await
            .unwrap();
        std::fs::remove_file(&files.metrics).unwrap();

        let tokens = ClusterTokens::init(&store, &files, false).await.unwrap();
        let metrics = auth::read_token_file(&files.metrics).unwrap();
        let admin = auth::read_token_file(&files.admin).unwrap();
        let bearer = |t: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
            h
        };
        assert_eq!(
            tokens
                .check(&bearer(&metrics), None, Caller::Metrics)
                .unwrap(),
            Principal::Metrics
        );
        assert!(matches!(
            tokens.check(&bearer(&metrics), None, Caller::Admin),
            Err(ControllerError::Forbidden)
        ));
        assert!(matches!(
            tokens.check(&bearer(&metrics), None, Caller::Agent),
            Err(ControllerError::Forbidden)
        ));
        assert_eq!(
            tokens
                .check(&bearer(&admin), None, Caller::Metrics)
                .unwrap(),
            Principal::Admin
        );
        let digest = auth::digest_hex(&auth::digest(&metrics));
        assert_eq!(tokens.metrics_digests_hex(), vec![digest.clone()]);

        // A rotation with a grace: agents are told both digests; the new one is first.
        let (new, _) = tokens
            .rotate(&store, TokenKind::Metrics, 60_000)
            .await
            .unwrap();
        let new_digest = auth::digest_hex(&auth::digest(&new));
        assert_eq!(tokens.metrics_digests_hex(), vec![new_digest, digest]);
        // Another controller reads the same record.
        let other = ClusterTokens::init(&store, &files, false).await.unwrap();
        assert!(other.check(&bearer(&new), None, Caller::Metrics).is_ok());
    }
}
