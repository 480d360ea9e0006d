//! The current certificate of a process, replaced while it runs: servers and clients built
//! by this crate read it at every handshake, so a renewed certificate is used by the next
//! connection and the open ones carry on.

use std::sync::{Arc, RwLock};

use anyhow::Context;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;

use crate::config::certs_from_pem;
use crate::peer::{peer_of, Peer};

/// A certificate chain and its key, both PEM, as the CA issued them and as they are kept on
/// disk.
#[derive(Clone)]
pub struct Credentials {
    pub chain_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

struct Current {
    key: Arc<CertifiedKey>,
    peer: Peer,
    not_after_unix: u64,
}

/// Holds the certificate a process presents.
pub struct CertSlot {
    current: RwLock<Current>,
}

impl std::fmt::Debug for CertSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertSlot")
            .field("peer", &self.peer())
            .finish()
    }
}

impl CertSlot {
    pub fn new(creds: &Credentials) -> anyhow::Result<Arc<CertSlot>> {
        Ok(Arc::new(CertSlot {
            current: RwLock::new(load(creds)?),
        }))
    }

    /// Presents `creds` from the next handshake on. They must name the same principal.
    pub fn replace(&self, creds: &Credentials) -> anyhow::Result<()> {
        let next = load(creds)?;
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        anyhow::ensure!(
            next.peer == cur.peer,
            "the new certificate names {} instead of {}",
            next.peer,
            cur.peer
        );
        *cur = next;
        Ok(())
    }

    /// Whom the certificate names.
    pub fn peer(&self) -> Peer {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .peer
            .clone()
    }

    /// When the current certificate expires (seconds since the Unix epoch).
    pub fn not_after_unix(&self) -> u64 {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .not_after_unix
    }

    fn key(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .key
            .clone()
    }
}

fn load(creds: &Credentials) -> anyhow::Result<Current> {
    let chain = certs_from_pem(&creds.chain_pem)?;
    let leaf = chain.first().context("no certificate in the chain")?;
    let peer = peer_of(leaf).context("the certificate")?;
    let not_after_unix = not_after(leaf)?;
    let key = PrivateKeyDer::from_pem_slice(creds.key_pem.as_bytes())
        .context("the key is not a PEM private key")?;
    let signing = crate::provider()
        .key_provider
        .load_private_key(key)
        .context("load the private key")?;
    let key = CertifiedKey::new(chain, signing);
    key.keys_match()
        .context("the key does not belong to the certificate")?;
    Ok(Current {
        key: Arc::new(key),
        peer,
        not_after_unix,
    })
}

/// When a certificate expires (seconds since the Unix epoch).
pub(crate) fn not_after(cert_der: &[u8]) -> anyhow::Result<u64> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(cert_der)
        .map_err(|_| anyhow::anyhow!("malformed certificate"))?;
    Ok(u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0))
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key())
    }
}

impl ResolvesClientCert for CertSlot {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.key())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
