//! The controller as the cluster's certificate authority (issue 16.a): the CA's files, the
//! controller's own certificate (made at start, renewed while it runs, never written down),
//! and the certificates nodes get by joining and renew with their current one (the routes
//! that hand them out are `api/join.rs`).
//!
//! The CA is kept in the controller's data directory or a Secret (`ca_home`), and replaced
//! by `ca_rotation`: this holds the CAs in force, which both change while the controller
//! runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use hawser_api::controller::{CaRotationStep, NodeCertificate, NodeTlsReport};
use hawser_tls::{Ca, CertSlot, ClientAuth, Credentials, Peer, TrustSlot};

use crate::auth::ca_home::CaHome;
use crate::errors::ControllerError;

/// The CAs in force: the one that issues, the one kept with its key (`ca_home`; the old
/// one until a rotation retires it), and the grant key's root.
struct Cas {
    issuer: Arc<Ca>,
    kept: Arc<Ca>,
    grant_root: [u8; 32],
}

/// The CA rotation step a controller applied last (`ca_rotation`), with the fingerprints of
/// the old and the new CA: a controller applies the store's rotation record only when it differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AppliedRotation {
    pub(crate) step: CaRotationStep,
    pub(crate) old: [u8; 32],
    pub(crate) new: [u8; 32],
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
    pub(crate) rotation: Mutex<Option<AppliedRotation>>,
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
            tracing::info!(issuer = %hawser_api::auth::digest_hex(&fingerprint), "reissued the controller's certificate on the new CA");
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
    pub(crate) fn issue_node(
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
