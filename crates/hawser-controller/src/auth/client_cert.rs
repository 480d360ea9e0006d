//! Certificates for NBD clients (`POST /v1/client-certificates`, admin): a client of some
//! volumes gets a certificate naming them by name and uid (`hawser://client/volume/<v>/<uid>`:
//! a volume created later under the same name is not opened by it), and an agent's NBD
//! port opens those exports to it and no others, at any node or only at the one it names.
//! The client makes its own key and sends the public half, as a joining node does, so the
//! key never crosses the network. Such a certificate opens nothing else: no API, no replica
//! port. The route is `api/certificates.rs`.

use std::time::Duration;

use hawser_api::controller::{ClientCertificate, CreateClientCertificate};
use hawser_tls::{ClientScope, ClientVolume, Peer, MAX_CLIENT_VOLUMES, NODE_CERT_LIFETIME};

use crate::auth::tls::decode_public_key;
use crate::errors::ControllerError;
use crate::state::AppState;

/// A day: long enough for a working session, short enough that a lost laptop's key dies soon.
const DEFAULT_CLIENT_CERT_TTL_SECS: u64 = 24 * 3600;

/// `POST /v1/client-certificates`.
pub async fn create(
    st: &AppState,
    req: CreateClientCertificate,
) -> Result<ClientCertificate, ControllerError> {
    let tls = st.required_tls()?;
    let ttl = req.ttl_secs.unwrap_or(DEFAULT_CLIENT_CERT_TTL_SECS);
    let max = NODE_CERT_LIFETIME.as_secs();
    if ttl == 0 || ttl > max {
        return Err(ControllerError::invalid(format!(
            "ttl_secs {ttl}: use 1 to {max} (30 days)"
        )));
    }
    if req.volumes.is_empty() || req.volumes.len() > MAX_CLIENT_VOLUMES {
        return Err(ControllerError::invalid(format!(
            "volumes: name 1 to {MAX_CLIENT_VOLUMES}, not {}",
            req.volumes.len()
        )));
    }
    let mut volumes = Vec::with_capacity(req.volumes.len());
    for v in &req.volumes {
        hawser_api::validate_name("volume", v)?;
        // Named by uid too: the certificate opens this volume, not a later namesake.
        let uid = st.records.existing_volume(v).await?.uid;
        volumes.push(ClientVolume {
            name: v.clone(),
            uid,
        });
    }
    if let Some(n) = &req.node {
        hawser_api::validate_name("node", n)?;
        if st.records.node(n).await?.is_none() {
            return Err(ControllerError::NodeNotFound { node: n.clone() });
        }
    }
    let scope = ClientScope::of(&volumes, req.node.as_deref())
        .map_err(|e| ControllerError::invalid(e.to_string()))?;
    let spki = decode_public_key(&req.public_key)?;
    let issued = tls
        .ca()
        .issue(
            &Peer::Client(scope.clone()),
            &spki,
            Duration::from_secs(ttl),
        )
        .map_err(|e| ControllerError::invalid(format!("cannot issue a certificate: {e:#}")))?;
    tracing::info!(
        volumes = ?scope.names(),
        node = ?scope.node(),
        ttl,
        "issued an NBD client certificate"
    );
    Ok(ClientCertificate {
        chain_pem: issued.chain_pem,
        ca_pem: tls.trust_pem(),
        not_after_unix: issued.not_after_unix,
        volumes: scope.names(),
        node: scope.node().map(str::to_string),
    })
}
