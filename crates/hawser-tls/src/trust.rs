//! The CAs a process trusts, replaced while it runs (CA rotation, docs/security.md): servers
//! and clients built on a [`TrustSlot`] check each new handshake against its current CAs,
//! so a rotation reaches the listeners and connection pools made before it, and connections
//! already open carry on.
//!
//! Usually one CA. During a rotation two: the cluster's CA and the one replacing it, so that
//! a peer with a certificate of either is accepted while certificates are reissued. A slot
//! made from a file ([`TrustSlot::from_file`]) reads the file again when it changes: the CSI
//! driver's `--ca-file`, which the controller (or the kubelet, from the CA's Secret) rewrites.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use anyhow::Context;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::join::ca_fingerprint;
use crate::pem::certs_from_pem;

/// Whether a server demands a client certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// Every client presents a certificate of the cluster (replica port, NBD over TCP).
    Required,
    /// Clients may come without one and authenticate otherwise (the controller's REST API,
    /// where the CLI brings the admin token); a certificate that is presented must verify.
    Optional,
}

/// The most CAs trusted at once: the cluster's and the one replacing it.
pub const MAX_TRUSTED_CAS: usize = 2;

struct Current {
    pem: String,
    fingerprints: Vec<[u8; 32]>,
    roots: Arc<RootCertStore>,
    required: Arc<dyn ClientCertVerifier>,
    optional: Arc<dyn ClientCertVerifier>,
    /// The file this was read from and its modification time, for [`TrustSlot::from_file`].
    file: Option<(PathBuf, Option<SystemTime>)>,
}

/// The CAs a process trusts now.
pub struct TrustSlot {
    current: RwLock<Current>,
}

impl std::fmt::Debug for TrustSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustSlot")
            .field("cas", &self.fingerprints().len())
            .finish()
    }
}

impl TrustSlot {
    /// Trusts the CA certificates in `pem` (one or [`MAX_TRUSTED_CAS`]).
    pub fn from_pem(pem: &str) -> anyhow::Result<Arc<TrustSlot>> {
        Ok(Arc::new(TrustSlot {
            current: RwLock::new(load(pem, None)?),
        }))
    }

    /// Trusts the CAs in the file at `path`, and reads it again at the first handshake after
    /// it changed. A file that no longer reads as CAs leaves the last good ones in force.
    pub fn from_file(path: &Path) -> anyhow::Result<Arc<TrustSlot>> {
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("read the cluster CA {}", path.display()))?;
        let mtime = modified(path);
        let current = load(&pem, Some((path.to_path_buf(), mtime)))
            .with_context(|| format!("the cluster CA in {}", path.display()))?;
        Ok(Arc::new(TrustSlot {
            current: RwLock::new(current),
        }))
    }

    /// Trusts the CAs in `pem` from the next handshake on. Returns whether they changed.
    pub fn replace(&self, pem: &str) -> anyhow::Result<bool> {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if cur.pem == pem {
            return Ok(false);
        }
        let file = cur.file.take();
        *cur = load(pem, file)?;
        Ok(true)
    }

    /// The trusted CAs, PEM, as given.
    pub fn pem(&self) -> String {
        self.read().pem.clone()
    }

    /// The SHA-256 of each trusted CA's DER.
    pub fn fingerprints(&self) -> Vec<[u8; 32]> {
        self.read().fingerprints.clone()
    }

    pub(crate) fn roots(&self) -> Arc<RootCertStore> {
        self.refresh();
        self.read().roots.clone()
    }

    fn verifier(&self, auth: ClientAuth) -> Arc<dyn ClientCertVerifier> {
        self.refresh();
        let c = self.read();
        match auth {
            ClientAuth::Required => c.required.clone(),
            ClientAuth::Optional => c.optional.clone(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Current> {
        self.current.read().unwrap_or_else(|p| p.into_inner())
    }

    /// For a slot read from a file: reads it again if it changed since.
    fn refresh(&self) {
        let (path, seen) = match &self.read().file {
            Some((p, m)) => (p.clone(), *m),
            None => return,
        };
        let now = modified(&path);
        if now == seen {
            return;
        }
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        let reread = std::fs::read_to_string(&path)
            .map_err(anyhow::Error::from)
            .and_then(|pem| load(&pem, Some((path.clone(), now))));
        match reread {
            Ok(next) => {
                if next.pem != cur.pem {
                    tracing::info!(file = %path.display(), cas = next.fingerprints.len(), "the cluster CA file changed: trusting what it holds now");
                }
                *cur = next;
            }
            Err(e) => {
                // Keep trusting the last good CAs; look again at the next change.
                tracing::warn!(file = %path.display(), error = %format!("{e:#}"), "the cluster CA file is unreadable; keeping the CAs read before");
                if let Some((_, m)) = &mut cur.file {
                    *m = now;
                }
            }
        }
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn load(pem: &str, file: Option<(PathBuf, Option<SystemTime>)>) -> anyhow::Result<Current> {
    let certs = certs_from_pem(pem)?;
    anyhow::ensure!(
        certs.len() <= MAX_TRUSTED_CAS,
        "{} certificates: trust holds at most {MAX_TRUSTED_CAS} CAs",
        certs.len()
    );
    let mut roots = RootCertStore::empty();
    let mut fingerprints = Vec::new();
    for c in certs {
        fingerprints.push(ca_fingerprint(&c));
        roots.add(c).context("a CA certificate is not usable")?;
    }
    let roots = Arc::new(roots);
    let builder = || WebPkiClientVerifier::builder_with_provider(roots.clone(), crate::provider());
    let required = builder().build().context("build the client verifier")?;
    let optional = builder()
        .allow_unauthenticated()
        .build()
        .context("build the client verifier")?;
    Ok(Current {
        pem: pem.to_string(),
        fingerprints,
        roots,
        required,
        optional,
        file,
    })
}

/// A server's check of client certificates against the CAs a [`TrustSlot`] holds at each
/// handshake.
#[derive(Debug)]
pub(crate) struct SlotClientVerifier {
    pub(crate) trust: Arc<TrustSlot>,
    pub(crate) auth: ClientAuth,
}

impl ClientCertVerifier for SlotClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.auth == ClientAuth::Required
    }

    /// No hints: the list would change under a rotation, and Hawser's clients hold one
    /// certificate each.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.trust
            .verifier(self.auth)
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.trust
            .verifier(self.auth)
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.trust
            .verifier(self.auth)
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.trust.verifier(self.auth).supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ca;

    #[test]
    fn trust_holds_one_or_two_cas_and_says_which() {
        let (a, b, c) = (
            Ca::generate("a").expect("ca"),
            Ca::generate("b").expect("ca"),
            Ca::generate("c").expect("ca"),
        );
        let slot = TrustSlot::from_pem(a.cert_pem()).expect("one");
        assert_eq!(slot.fingerprints(), vec![ca_fingerprint(a.cert_der())]);
        let both = format!("{}{}", a.cert_pem(), b.cert_pem());
        assert!(slot.replace(&both).expect("two"));
        assert!(!slot.replace(&both).expect("same"), "no change");
        assert_eq!(slot.fingerprints().len(), 2);
        let three = format!("{both}{}", c.cert_pem());
        let err = slot.replace(&three).expect_err("three");
        assert!(format!("{err:#}").contains("at most 2"), "{err:#}");
        assert_eq!(
            slot.fingerprints().len(),
            2,
            "a refused bundle changes nothing"
        );
        assert!(slot.replace("not pem").is_err());
    }

    #[test]
    fn a_file_slot_follows_the_file_and_keeps_the_last_good_cas() {
        let dir = std::env::temp_dir().join(format!("hawser-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("ca.pem");
        let (a, b) = (
            Ca::generate("a").expect("ca"),
            Ca::generate("b").expect("ca"),
        );
        std::fs::write(&path, a.cert_pem()).expect("write");
        let slot = TrustSlot::from_file(&path).expect("slot");
        // A different length and a later time: the change is seen even on coarse clocks.
        let both = format!("{}{}", a.cert_pem(), b.cert_pem());
        std::fs::write(&path, &both).expect("write");
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(later))
            .expect("touch");
        let _ = slot.roots();
        assert_eq!(slot.fingerprints().len(), 2, "the new file is read");
        std::fs::write(&path, "garbage").expect("write");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(later + std::time::Duration::from_secs(5)))
            .expect("touch");
        let _ = slot.roots();
        assert_eq!(
            slot.fingerprints().len(),
            2,
            "garbage keeps the last good CAs"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
