//! The controller as the cluster's certificate authority (issue 16.a): the CA's files, the
//! controller's own certificate (made at start, renewed while it runs, never written down),
//! join tokens, and the certificates nodes get by joining and renew with their current one.
//!
//! The CA lives in the controller's data directory (`ca.pem`, `ca.key`, mode 0600), not in
//! the store: a wiped or rolled-back store must not cost the nodes their identity (they
//! could not reach the controller to be recovered), and controllers that share a store are
//! given the same files, as they are given the same agent token. Join tokens live in the
//! store (`auth/join/<id>`), which keeps only their secret's digest.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::{Extension, Json};
use hawser_api::auth;
use hawser_api::controller::{
    CreateJoinToken, JoinNode, JoinTokenCreated, NodeCertificate, RenewCertificate,
};
use hawser_listen::Transport;
use hawser_store::{get_json, put_json, Expect, StoreError};
use hawser_tls::{Ca, CertSlot, ClientAuth, Credentials, JoinToken, Peer};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::errors::ControllerError;
use crate::model::now_ms;
use crate::server::{ApiJson, ApiPath};
use crate::state::AppState;

const CA_CERT_FILE: &str = "ca.pem";
const CA_KEY_FILE: &str = "ca.key";
const JOIN_PREFIX: &str = "auth/join/";
const DEFAULT_JOIN_TTL_SECS: u64 = 3600;
const MAX_JOIN_TTL_SECS: u64 = 7 * 24 * 3600;
const MAX_JOIN_USES: u32 = 1000;

/// The controller's TLS state.
pub struct ControllerTls {
    ca: Ca,
    slot: Arc<CertSlot>,
    server: Arc<hawser_tls::rustls::ServerConfig>,
    lifetime: Duration,
    /// DNS names and addresses its certificate is also valid for (`hawser_tls::server_names`).
    names: Vec<String>,
}

impl ControllerTls {
    /// The cluster's CA.
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// Loads the CA from `data_dir`, making it if neither file exists, and issues this
    /// controller's certificate (valid for `lifetime`).
    pub fn load_or_create(
        data_dir: &Path,
        cluster_hint: &str,
        lifetime: Duration,
        names: Vec<String>,
    ) -> anyhow::Result<ControllerTls> {
        let (cert_path, key_path) = (data_dir.join(CA_CERT_FILE), data_dir.join(CA_KEY_FILE));
        let ca = match (cert_path.exists(), key_path.exists()) {
            (true, true) => {
                let read = |p: &Path| {
                    std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))
                };
                Ca::from_pem(&read(&cert_path)?, &read(&key_path)?)
                    .with_context(|| format!("the cluster CA in {}", data_dir.display()))?
            }
            (false, false) => {
                let ca = Ca::generate(cluster_hint)?;
                write_new(&key_path, &ca.key_pem(), 0o600)?;
                write_new(&cert_path, ca.cert_pem(), 0o644)?;
                tracing::info!(
                    ca = %cert_path.display(),
                    "made the cluster's certificate authority; give {CA_CERT_FILE} to the CLI \
                     and the CSI driver, and both files to any other controller of this cluster"
                );
                ca
            }
            _ => anyhow::bail!(
                "{} and {} must both exist or both be absent: restore the missing one (a new \
                 CA would lock every node out)",
                cert_path.display(),
                key_path.display()
            ),
        };
        Self::with_ca(ca, lifetime, names)
    }

    /// Loads the CA from Secret `namespace/name`, making it (and the Secret) if the Secret
    /// does not exist; controllers starting together agree on the one that was created.
    /// The CA's certificate (public) is also written to `<data_dir>/ca.pem`, for the
    /// processes beside this one (the chart's CSI controller in the same pod, which cannot
    /// mount a Secret that does not exist before this pod starts).
    pub async fn from_secret(
        kube: &crate::kube::Kube,
        namespace: &str,
        name: &str,
        data_dir: &Path,
        lifetime: Duration,
        names: Vec<String>,
    ) -> anyhow::Result<ControllerTls> {
        let tls = Self::load_or_make_secret(kube, namespace, name, lifetime, names).await?;
        let path = data_dir.join(CA_CERT_FILE);
        let tmp = data_dir.join(format!(".{CA_CERT_FILE}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        write_new(&tmp, tls.ca.cert_pem(), 0o644)?;
        std::fs::rename(&tmp, &path).with_context(|| format!("write {}", path.display()))?;
        Ok(tls)
    }

    async fn load_or_make_secret(
        kube: &crate::kube::Kube,
        namespace: &str,
        name: &str,
        lifetime: Duration,
        names: Vec<String>,
    ) -> anyhow::Result<ControllerTls> {
        let what = format!("the cluster CA in Secret {namespace}/{name}");
        for _ in 0..3 {
            if let Some(data) = kube
                .secret(namespace, name)
                .await
                .map_err(|e| anyhow::anyhow!(e))?
            {
                let (Some(cert), Some(key)) = (data.get(CA_CERT_FILE), data.get(CA_KEY_FILE))
                else {
                    anyhow::bail!(
                        "{what} lacks {CA_CERT_FILE} or {CA_KEY_FILE}: restore it (a new CA \
                         would lock every node out)"
                    );
                };
                let ca = Ca::from_pem(cert, key).with_context(|| what.clone())?;
                return Self::with_ca(ca, lifetime, names);
            }
            let ca = Ca::generate(&format!("{namespace}/{name}"))?;
            let created = kube
                .create_secret(
                    namespace,
                    name,
                    &[(CA_CERT_FILE, ca.cert_pem()), (CA_KEY_FILE, &ca.key_pem())],
                )
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
            if created {
                tracing::info!(secret = %format!("{namespace}/{name}"), "made the cluster's certificate authority");
                return Self::with_ca(ca, lifetime, names);
            }
            // Another controller made it first: read theirs.
        }
        anyhow::bail!("{what}: created and deleted under us; check who deletes it")
    }

    fn with_ca(ca: Ca, lifetime: Duration, names: Vec<String>) -> anyhow::Result<ControllerTls> {
        let slot = CertSlot::new(&own_certificate(&ca, lifetime, &names)?)?;
        let server = hawser_tls::server_config(ca.cert_pem(), slot.clone(), ClientAuth::Optional)?;
        Ok(ControllerTls {
            ca,
            slot,
            server,
            lifetime,
            names,
        })
    }

    pub fn server_config(&self) -> Arc<hawser_tls::rustls::ServerConfig> {
        self.server.clone()
    }

    /// A client configuration that presents this controller's certificate and accepts only
    /// `node`'s agent (`AgentClient` keeps one HTTP client per node built from it).
    pub fn client_for(&self, node: &str) -> anyhow::Result<Arc<hawser_tls::rustls::ClientConfig>> {
        hawser_tls::client_config(
            self.ca.cert_pem(),
            Peer::Node(node.into()),
            Some(self.slot.clone()),
        )
    }

    /// Renews this controller's certificate at two thirds of its life, forever.
    pub async fn renew_forever(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.slot.renew_in()).await;
            let renewed = own_certificate(&self.ca, self.lifetime, &self.names)
                .and_then(|creds| self.slot.replace(&creds));
            match renewed {
                Ok(()) => tracing::info!("renewed the controller's certificate"),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "cannot renew the controller's certificate")
                }
            }
        }
    }

    /// A certificate for `node`, also valid for the `names` it is dialled by (its listen
    /// addresses and `--tls-san`: what it says, as it says its node name when it joins).
    fn issue_node(
        &self,
        node: &str,
        public_key_b64: &str,
        names: &[String],
    ) -> Result<NodeCertificate, ControllerError> {
        hawser_api::validate_name("node", node)?;
        let spki = decode_public_key(public_key_b64)?;
        let issued = self
            .ca
            .issue_with_names(&Peer::Node(node.into()), &spki, self.lifetime, names)
            .map_err(|e| ControllerError::invalid(format!("cannot issue a certificate: {e:#}")))?;
        Ok(NodeCertificate {
            chain_pem: issued.chain_pem,
            ca_pem: self.ca.cert_pem().to_string(),
            not_after_unix: issued.not_after_unix,
        })
    }
}

/// A new key and a certificate for it naming the controller and `names`.
fn own_certificate(ca: &Ca, lifetime: Duration, names: &[String]) -> anyhow::Result<Credentials> {
    let (key_pem, spki) = hawser_tls::new_key()?;
    let issued = ca
        .issue_with_names(&Peer::Controller, &spki, lifetime, names)
        .context("the controller's certificate (check --tls-san)")?;
    Ok(Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    })
}

/// A public key as joining nodes and NBD clients send it: DER SubjectPublicKeyInfo, base64.
pub(crate) fn decode_public_key(b64: &str) -> Result<Vec<u8>, ControllerError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| ControllerError::invalid("public_key is not base64"))
}

fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .with_context(|| format!("write {}", path.display()))
}

/// A join token as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinRecord {
    secret_sha256: String,
    expires_ms: u64,
    uses_left: u32,
    /// The only node name it joins (`hawser cluster join-token --node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<String>,
}

pub(crate) fn tls_of(st: &AppState) -> Result<&Arc<ControllerTls>, ControllerError> {
    st.tls.as_ref().ok_or_else(|| ControllerError::Refused {
        message: "this controller runs without TLS (--insecure): nodes do not join, they use \
                  the agent token"
            .into(),
    })
}

/// `POST /v1/join-tokens`.
pub async fn create_join_token(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<CreateJoinToken>,
) -> Result<Json<JoinTokenCreated>, ControllerError> {
    let tls = tls_of(&st)?;
    let ttl = req.ttl_secs.unwrap_or(DEFAULT_JOIN_TTL_SECS);
    let uses = req.uses.unwrap_or(1);
    if ttl == 0 || ttl > MAX_JOIN_TTL_SECS {
        return Err(ControllerError::invalid(format!(
            "ttl_secs {ttl}: use 1 to {MAX_JOIN_TTL_SECS}"
        )));
    }
    if uses == 0 || uses > MAX_JOIN_USES {
        return Err(ControllerError::invalid(format!(
            "uses {uses}: use 1 to {MAX_JOIN_USES}"
        )));
    }
    if let Some(n) = &req.node {
        hawser_api::validate_name("node", n)?;
    }
    let token = JoinToken::generate(tls.ca.cert_der());
    let record = JoinRecord {
        secret_sha256: auth::digest_hex(&auth::digest(&token.secret)),
        expires_ms: now_ms().saturating_add(ttl.saturating_mul(1000)),
        uses_left: uses,
        node: req.node.clone(),
    };
    let store = st.records.store();
    put_json(
        &*store,
        &format!("{JOIN_PREFIX}{}", token.id),
        &record,
        Expect::Absent,
    )
    .await?;
    tracing::info!(id = %token.id, ttl, uses, node = ?req.node, "join token created");
    Ok(Json(JoinTokenCreated {
        token: token.to_string(),
        expires_ms: record.expires_ms,
        uses,
    }))
}

/// `POST /v1/join`: one use of a join token buys a certificate for the named node. The
/// cluster's agent token is also taken, and not used up: it is the standing bootstrap
/// secret of installations that hand every node the same credentials (the Helm chart's
/// Secret, as k3s's node token), where the node learns the CA from a file, not the token.
pub async fn join(
    State(st): State<Arc<AppState>>,
    transport: Option<Extension<Transport>>,
    ApiJson(req): ApiJson<JoinNode>,
) -> Result<Json<NodeCertificate>, ControllerError> {
    let tls = tls_of(&st)?;
    if !matches!(transport.as_deref(), Some(Transport::Tls { .. })) {
        return Err(ControllerError::invalid("join over TLS only"));
    }
    hawser_api::validate_name("node", &req.node)?;
    // Every failure of the token itself says the same: nothing to probe.
    let refused = || ControllerError::Unauthorized {
        reason: "the join token is not valid (unknown, used up or expired)".into(),
    };
    let Some(token) = JoinToken::parse(&req.token) else {
        if st.tokens.is_agent_token(&req.token) {
            name_is_free(&st, &req.node, None).await?;
            let cert = tls.issue_node(&req.node, &req.public_key, &req.names)?;
            tracing::info!(node = %req.node, "node joined the cluster with the agent token");
            return Ok(Json(cert));
        }
        return Err(refused());
    };
    let store = st.records.store();
    let key = format!("{JOIN_PREFIX}{}", token.id);
    for _ in 0..5 {
        let Some((mut rec, version)) = get_json::<JoinRecord>(&*store, &key).await? else {
            return Err(refused());
        };
        let stored = auth::parse_digest_hex(&rec.secret_sha256).ok_or_else(refused)?;
        let matches = auth::digests_equal(&auth::digest(&token.secret), &stored);
        if !matches || rec.expires_ms < now_ms() || rec.uses_left == 0 {
            return Err(refused());
        }
        name_is_free(&st, &req.node, rec.node.as_deref()).await?;
        // Issue first (it can fail on a bad key), then spend the use.
        let cert = tls.issue_node(&req.node, &req.public_key, &req.names)?;
        rec.uses_left -= 1;
        let spent = if rec.uses_left == 0 {
            store
                .delete(&key, Expect::Version(version))
                .await
                .map(|_| ())
        } else {
            put_json(&*store, &key, &rec, Expect::Version(version))
                .await
                .map(|_| ())
        };
        match spent {
            Ok(()) => {
                tracing::info!(node = %req.node, token = %token.id, "node joined the cluster");
                return Ok(Json(cert));
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ControllerError::Contention { key, retries: 5 })
}

/// Whether a node may join as `node` with a token bound to `bound_to` (if any). A token bound
/// to another name is refused. A name whose node is online is held by another machine: a
/// second registration would take its identity while it runs, so only a token bound to that
/// name (an operator's explicit choice, as for a reinstalled machine) may take it over.
async fn name_is_free(
    st: &AppState,
    node: &str,
    bound_to: Option<&str>,
) -> Result<(), ControllerError> {
    if let Some(b) = bound_to {
        if b != node {
            return Err(ControllerError::ForbiddenFor {
                reason: format!("this join token is for node {b}, not {node}"),
            });
        }
        return Ok(());
    }
    let online = st
        .records
        .node(node)
        .await?
        .is_some_and(|n| n.is_online(now_ms(), st.node_timeout_ms));
    if online {
        return Err(ControllerError::Refused {
            message: format!(
                "node {node} is registered and online: another machine holds the name. Stop                  it (the name is free once it is offline), or join with a token made for this                  name: `hawser cluster join-token --node {node}`"
            ),
        });
    }
    Ok(())
}

/// `POST /v1/nodes/{node}/certificate`: a node renews its certificate with its current one.
pub async fn renew(
    State(st): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ApiPath(node): ApiPath<String>,
    ApiJson(req): ApiJson<RenewCertificate>,
) -> Result<Json<NodeCertificate>, ControllerError> {
    let tls = tls_of(&st)?;
    if !matches!(&principal, Principal::Node(n) if *n == node) {
        return Err(ControllerError::ForbiddenFor {
            reason: format!("only node {node}, with its current certificate, renews it"),
        });
    }
    let cert = tls.issue_node(&node, &req.public_key, &req.names)?;
    tracing::info!(%node, "renewed the node's certificate");
    Ok(Json(cert))
}
