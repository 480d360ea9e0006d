//! rustls configurations for every link between Hawser processes: servers that require (or
//! accept) a client certificate of the cluster, and clients that accept only the peer they
//! dial. Both check chains against the cluster's CA alone (no system roots).

use std::sync::Arc;

use anyhow::Context;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::verify_server_cert_signed_by_trust_anchor;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::peer::{peer_of, Peer};
use crate::pem::certs_from_pem;
use crate::slot::CertSlot;
use crate::trust::{ClientAuth, SlotClientVerifier, TrustSlot};

/// When the first certificate in a PEM text stops being valid, in Unix seconds.
pub fn not_after_unix(pem: &str) -> anyhow::Result<u64> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = certs_from_pem(pem)?;
    let (_, cert) = X509Certificate::from_der(&der[0]).context("malformed certificate")?;
    u64::try_from(cert.validity().not_after.timestamp()).context("a validity before 1970")
}

/// The SHA-256 of the CA certificate in a chain as the cluster's CA issues it (the
/// certificate, then its CA's): which CA issued the holder's certificate.
pub fn issuer_fingerprint(chain_pem: &str) -> anyhow::Result<[u8; 32]> {
    let chain = certs_from_pem(chain_pem)?;
    let ca = chain
        .get(1)
        .context("the chain holds no CA certificate after the certificate")?;
    Ok(crate::join::ca_fingerprint(ca))
}

/// The DNS names and IP addresses the first certificate in a PEM text is valid for, as
/// text (addresses as `IpAddr` prints them).
pub fn cert_names(pem: &str) -> anyhow::Result<Vec<String>> {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = certs_from_pem(pem)?;
    let (_, cert) = X509Certificate::from_der(&der[0]).context("malformed certificate")?;
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    for n in &san.value.general_names {
        match n {
            GeneralName::DNSName(d) => names.push(d.to_ascii_lowercase()),
            GeneralName::IPAddress(b) => {
                let ip = match b.len() {
                    4 => <[u8; 4]>::try_from(*b).map(std::net::IpAddr::from).ok(),
                    16 => <[u8; 16]>::try_from(*b).map(std::net::IpAddr::from).ok(),
                    _ => None,
                };
                names.extend(ip.map(|ip| ip.to_string()));
            }
            _ => {}
        }
    }
    Ok(names)
}

/// The names a server's certificate covers besides its principal, for clients that check
/// the name they dialled (curl, libnbd, Prometheus): `localhost`, the loopback addresses, each
/// listen address that is not a wildcard (which names no address anyone dials), and `extra`
/// (`--tls-san`). Hawser's own clients check the principal instead.
pub fn server_names(listen: &[std::net::SocketAddr], extra: &[String]) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    names.extend(
        listen
            .iter()
            .filter(|a| !a.ip().is_unspecified())
            .map(|a| a.ip().to_string()),
    );
    names.extend(extra.iter().map(|n| n.trim().to_ascii_lowercase()));
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// A server presenting the certificate in `slot` and checking clients against the CA.
pub fn server_config(
    ca_pem: &str,
    slot: Arc<CertSlot>,
    auth: ClientAuth,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    server_config_trusting(&TrustSlot::from_pem(ca_pem)?, slot, auth)
}

/// A server presenting the certificate in `slot` and checking clients against the CAs
/// `trust` holds at each handshake.
pub fn server_config_trusting(
    trust: &Arc<TrustSlot>,
    slot: Arc<CertSlot>,
    auth: ClientAuth,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let verifier = Arc::new(SlotClientVerifier {
        trust: trust.clone(),
        auth,
    });
    let config = rustls::ServerConfig::builder_with_provider(crate::provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(slot);
    Ok(Arc::new(config))
}

/// A client that accepts only a server whose certificate the CA issued to `expect`
/// (whatever host or address it dials), presenting the certificate in `slot` if any.
pub fn client_config(
    ca_pem: &str,
    expect: Peer,
    slot: Option<Arc<CertSlot>>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    client_config_trusting(&TrustSlot::from_pem(ca_pem)?, expect, slot)
}

/// [`client_config`] checking servers against the CAs `trust` holds at each handshake.
pub fn client_config_trusting(
    trust: &Arc<TrustSlot>,
    expect: Peer,
    slot: Option<Arc<CertSlot>>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let verifier = PeerVerifier {
        roots: Trust::Slot(trust.clone()),
        expect,
        algs: crate::provider().signature_verification_algorithms,
    };
    build_client(verifier, slot)
}

/// A client for a node joining the cluster: it knows the CA only by its fingerprint (from
/// the join token), and accepts a controller whose presented chain holds that CA.
pub fn pinned_client_config(ca_sha256: [u8; 32]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let verifier = PeerVerifier {
        roots: Trust::Pinned(ca_sha256),
        expect: Peer::Controller,
        algs: crate::provider().signature_verification_algorithms,
    };
    build_client(verifier, None)
}

fn build_client(
    verifier: PeerVerifier,
    slot: Option<Arc<CertSlot>>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder_with_provider(crate::provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let config = match slot {
        Some(s) => builder.with_client_cert_resolver(s),
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

#[derive(Debug)]
enum Trust {
    Slot(Arc<TrustSlot>),
    /// The CA whose DER has this SHA-256, found among the certificates the server presents.
    Pinned([u8; 32]),
}

/// Checks the chain against the cluster's CA and the principal against the expected one;
/// the name the client dialled is ignored.
#[derive(Debug)]
struct PeerVerifier {
    roots: Trust,
    expect: Peer,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let pinned;
        let current;
        let roots = match &self.roots {
            Trust::Slot(t) => {
                current = t.roots();
                current.as_ref()
            }
            Trust::Pinned(pin) => {
                let ca = intermediates
                    .iter()
                    .find(|c| crate::join::ca_fingerprint(c) == *pin)
                    .ok_or(rustls::Error::InvalidCertificate(
                        CertificateError::UnknownIssuer,
                    ))?;
                let mut r = RootCertStore::empty();
                r.add(ca.clone().into_owned()).map_err(|_| {
                    rustls::Error::InvalidCertificate(CertificateError::BadEncoding)
                })?;
                pinned = r;
                &pinned
            }
        };
        let parsed = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            roots,
            intermediates,
            now,
            self.algs.all,
        )?;
        match peer_of(end_entity) {
            Ok(p) if p == self.expect => Ok(ServerCertVerified::assertion()),
            Ok(p) => Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(WrongPeer {
                    expected: self.expect.clone(),
                    found: p,
                })),
            ))),
            Err(_) => Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the server is {found}, not {expected}")]
struct WrongPeer {
    expected: Peer,
    found: Peer,
}

/// The principal of a verified client, from the connection's peer certificates.
pub fn client_peer(certs: Option<&[CertificateDer<'_>]>) -> Option<Peer> {
    peer_of(certs?.first()?).ok()
}
