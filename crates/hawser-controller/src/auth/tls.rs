//! The controller as the cluster's certificate authority (issue 16.a): the CA's files, the
//! controller's own certificate (made at start, renewed while it runs, never written down),
//! join tokens, and the certificates nodes get by joining and renew with their current one.
//!
//! The CA is kept in the controller's data directory or a Secret (`ca_home`), and replaced
//! by `ca_rotation`: this holds the CAs in force, which both change while the controller
//! runs. Join tokens live in the store (`auth/join/<id>`), which keeps only their secret's
//! digest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::{Extension, Json};
use hawser_api::auth;
use hawser_api::controller::{
    CreateJoinToken, JoinNode, JoinTokenCreated, NodeCertificate, NodeTlsReport, RenewCertificate,
};
use hawser_listen::Transport;
use hawser_store::{get_json, put_json, Expect, StoreError};
use hawser_tls::{Ca, CertSlot, ClientAuth, Credentials, JoinToken, Peer, TrustSlot};
use serde::{Deserialize, Serialize};

use crate::api::extract::{ApiJson, ApiPath};
use crate::auth::ca_home::CaHome;
use crate::auth::Principal;
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::now_ms;

const JOIN_PREFIX: &str = "auth/join/";
const DEFAULT_JOIN_TTL_SECS: u64 = 3600;
const MAX_JOIN_TTL_SECS: u64 = 7 * 24 * 3600;
const MAX_JOIN_USES: u32 = 1000;

/// The CAs in force: the one that issues, the one kept with its key (`ca_home`; the old
/// one until a rotation retires it), and the grant key's root.
struct Cas {
    issuer: Arc<Ca>,
    kept: Arc<Ca>,
    grant_root: [u8; 32],
}

/// The controller's TLS state.
pub struct ControllerTls {
    cas: RwLock<Cas>,
    /// The CAs whose certificates are accepted (two during a rotation).
    trust: Arc<TrustSlot>,
    slot: Arc<CertSlot>,
    server: Arc<hawser_tls::rustls::ServerConfig>,
    lifetime: Duration,
    /// DNS names and addresses its certificate is also valid for (`hawser_tls::server_names`).
    names: Vec<String>,
    pub(crate) home: CaHome,
    /// What each node last reported of its CAs (`RegisterNode::tls`), for the rotation's
    /// steps.
    node_reports: Mutex<HashMap<String, NodeTlsReport>>,
    /// The rotation applied last (`ca_rotation`), if the CA ever rotated.
    pub(crate) rotation: Mutex<Option<crate::auth::ca_rotation::Applied>>,
}

impl ControllerTls {
    /// The CA that issues certificates now.
    pub fn ca(&self) -> Arc<Ca> {
        self.read().issuer.clone()
    }

    /// The seed of the epoch grant key for cluster `id`: derived from the first CA's key, and
    /// the same after CA rotations.
    pub fn grant_seed(&self, id: &str) -> anyhow::Result<[u8; 32]> {
        hawser_tls::derive_from_root(&self.read().grant_root, id)
    }

    pub(crate) fn grant_root(&self) -> [u8; 32] {
        self.read().grant_root
    }

    /// The trusted CAs, the issuing one first (what nodes and clients are given).
    pub fn trust_pem(&self) -> String {
        let issuer = self.ca();
        let mut pem = issuer.cert_pem().to_string();
        let own = issuer.fingerprint();
        if let Ok(certs) = hawser_tls::certs_from_pem(&self.trust.pem()) {
            for c in certs {
                if hawser_tls::ca_fingerprint(&c) != own {
                    pem.push_str(&hawser_tls::der_to_pem(&c));
                }
            }
        }
        pem
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Cas> {
        self.cas.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Loads the CA kept at `home`, making it if there is none, and issues this
    /// controller's certificate (valid for `lifetime`).
    pub async fn load(
        home: CaHome,
        hint: &str,
        lifetime: Duration,
        names: Vec<String>,
    ) -> anyhow::Result<ControllerTls> {
        let kept = home.load_or_create(hint).await?;
        let trust = TrustSlot::from_pem(&kept.trust_pem).context("the trusted CAs")?;
        let slot = CertSlot::new(&own_certificate(&kept.ca, lifetime, &names)?)?;
        let server =
            hawser_tls::server_config_trusting(&trust, slot.clone(), ClientAuth::Optional)?;
        Ok(ControllerTls {
            cas: RwLock::new({
                let ca = Arc::new(kept.ca);
                Cas {
                    issuer: ca.clone(),
                    kept: ca,
                    grant_root: kept.grant_root,
                }
            }),
            trust,
            slot,
            server,
            lifetime,
            names,
            home,
            node_reports: Mutex::default(),
            rotation: Mutex::default(),
        })
    }

    pub fn server_config(&self) -> Arc<hawser_tls::rustls::ServerConfig> {
        self.server.clone()
    }

    /// A client configuration that presents this controller's certificate and accepts only
    /// `node`'s agent (`AgentClient` keeps one HTTP client per node built from it).
    pub fn client_for(&self, node: &str) -> anyhow::Result<Arc<hawser_tls::rustls::ClientConfig>> {
        hawser_tls::client_config_trusting(
            &self.trust,
            Peer::Node(node.into()),
            Some(self.slot.clone()),
        )
    }

    /// Takes `issuer` as the CA that issues, `trust_pem` as the CAs trusted, and reissues
    /// this controller's certificate if another CA issued it.
    pub(crate) fn set_cas(&self, issuer: Arc<Ca>, trust_pem: &str) -> anyhow::Result<()> {
        self.trust.replace(trust_pem)?;
        let fingerprint = issuer.fingerprint();
        self.cas.write().unwrap_or_else(|p| p.into_inner()).issuer = issuer.clone();
        if self.own_issuer() != Some(fingerprint) {
            self.slot
                .replace(&own_certificate(&issuer, self.lifetime, &self.names)?)?;
            tracing::info!(issuer = %auth::digest_hex(&fingerprint), "reissued the controller's certificate on the new CA");
        }
        Ok(())
    }

    /// The CA kept with its key (`ca_home`).
    pub(crate) fn kept(&self) -> Arc<Ca> {
        self.read().kept.clone()
    }

    /// After the old CA is retired: `ca` is the kept one; the grant root stays.
    pub(crate) fn set_kept(&self, ca: Arc<Ca>, grant_root: [u8; 32]) {
        let mut cas = self.cas.write().unwrap_or_else(|p| p.into_inner());
        cas.kept = ca;
        cas.grant_root = grant_root;
    }

    fn own_issuer(&self) -> Option<[u8; 32]> {
        self.slot.issuer()
    }

    /// Notes what node `node` reported of its CAs.
    pub fn note_report(&self, node: &str, report: NodeTlsReport) {
        self.node_reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.into(), report);
    }

    pub(crate) fn report_of(&self, node: &str) -> Option<NodeTlsReport> {
        self.node_reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned()
    }

    /// Renews this controller's certificate at two thirds of its life, forever.
    pub async fn renew_forever(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.slot.renew_in()).await;
            let renewed = own_certificate(&self.ca(), self.lifetime, &self.names)
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
            .ca()
            .issue_with_names(&Peer::Node(node.into()), &spki, self.lifetime, names)
            .map_err(|e| ControllerError::invalid(format!("cannot issue a certificate: {e:#}")))?;
        Ok(NodeCertificate {
            chain_pem: issued.chain_pem,
            ca_pem: self.trust_pem(),
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
    let token = JoinToken::generate(tls.ca().cert_der());
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
                "node {node} is registered and online: another machine holds the name. Stop \
                 it (the name is free once it is offline), or join with a token made for this \
                 name: `hawser cluster join-token --node {node}`"
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
