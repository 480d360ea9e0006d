//! The current certificate of a process, replaced while it runs: servers and clients built
//! by this crate read it at every handshake, so a renewed certificate is used by the next
//! connection and the open ones carry on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use anyhow::Context;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;

use crate::ca::CLOCK_SKEW;
use crate::credentials::Credentials;
use crate::pair_files::PairLayout;
use crate::peer::{peer_of, Peer};
use crate::pem::certs_from_pem;

struct Current {
    key: Arc<CertifiedKey>,
    peer: Peer,
    not_before_unix: u64,
    not_after_unix: u64,
    /// The SHA-256 of the CA certificate after the certificate in the chain, if any.
    issuer: Option<[u8; 32]>,
}

/// Holds the certificate a process presents.
pub struct CertSlot {
    current: RwLock<Current>,
    /// For [`CertSlot::from_dir`]: the files and their modification times when read.
    files: Option<std::sync::Mutex<Files>>,
}

struct Files {
    dir: PathBuf,
    layout: &'static PairLayout,
    /// The two paths watched for a change (links to the current generation, or an older
    /// build's plain files).
    chain: PathBuf,
    key: PathBuf,
    seen: (Option<SystemTime>, Option<SystemTime>),
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
            files: None,
        }))
    }

    /// The certificate and key kept in `dir` as `layout` says, which another process renews
    /// (the node's, which the CSI node plugin presents beside its agent): read again at the
    /// first handshake after either file changed. The pair is read by the layout's rules, so
    /// an older build's cut save yields the pair that belongs together; a pair that does not
    /// load leaves the last good one in force until the next change.
    pub fn from_dir(dir: &Path, layout: &'static PairLayout) -> anyhow::Result<Arc<CertSlot>> {
        let (chain, key) = (dir.join(layout.cert), dir.join(layout.key));
        let seen = (modified(&chain), modified(&key));
        let current = load(&read_dir_pair(dir, layout)?)
            .with_context(|| format!("the certificate in {}", dir.display()))?;
        Ok(Arc::new(CertSlot {
            current: RwLock::new(current),
            files: Some(std::sync::Mutex::new(Files {
                dir: dir.into(),
                layout,
                chain,
                key,
                seen,
            })),
        }))
    }

    /// For a slot read from files: reads them again if either changed since.
    fn refresh(&self) {
        let Some(files) = &self.files else { return };
        let mut f = files.lock().unwrap_or_else(|p| p.into_inner());
        let now = (modified(&f.chain), modified(&f.key));
        if now == f.seen {
            return;
        }
        f.seen = now;
        let peer = self.peer();
        let next = read_dir_pair(&f.dir, f.layout)
            .and_then(|c| load(&c))
            .and_then(|next| {
                anyhow::ensure!(
                    next.peer == peer,
                    "they name {} instead of {peer}",
                    next.peer
                );
                Ok(next)
            });
        match next {
            Ok(next) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = next;
                tracing::info!(file = %f.chain.display(), "presenting the renewed certificate");
            }
            Err(e) => {
                tracing::warn!(file = %f.chain.display(), error = %format!("{e:#}"), "the certificate files do not load now; presenting the last good ones")
            }
        }
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

    /// How long to wait before renewing: until two thirds of the current certificate's
    /// life have passed (at least a second).
    pub fn renew_in(&self) -> std::time::Duration {
        let (from, to) = {
            let c = self.current.read().unwrap_or_else(|p| p.into_inner());
            (c.not_before_unix, c.not_after_unix)
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        std::time::Duration::from_secs(renew_at(from, to).saturating_sub(now).max(1))
    }

    /// When the current certificate expires (seconds since the Unix epoch).
    pub fn not_after_unix(&self) -> u64 {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .not_after_unix
    }

    /// The SHA-256 of the CA that issued the current certificate (the chain's second).
    pub fn issuer(&self) -> Option<[u8; 32]> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .issuer
    }

    fn key(&self) -> Arc<CertifiedKey> {
        self.refresh();
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .key
            .clone()
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read_dir_pair(dir: &Path, layout: &PairLayout) -> anyhow::Result<Credentials> {
    match layout.load(dir)? {
        Some(found) => Ok(found.creds),
        None => anyhow::bail!("no {} and {} in {}", layout.cert, layout.key, dir.display()),
    }
}

fn load(creds: &Credentials) -> anyhow::Result<Current> {
    let chain = certs_from_pem(&creds.chain_pem)?;
    let leaf = chain.first().context("no certificate in the chain")?;
    let peer = peer_of(leaf).context("the certificate")?;
    let (not_before_unix, not_after_unix) = validity(leaf)?;
    let issuer = chain.get(1).map(|c| crate::join::ca_fingerprint(c));
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
        not_before_unix,
        not_after_unix,
        issuer,
    })
}

/// When a certificate valid from `not_before` to `not_after` is renewed: at two thirds of
/// its life, which began [`CLOCK_SKEW`] after `not_before` (the CA backdates certificates
/// for clocks that lag; counting that as life would renew short-lived ones at once).
fn renew_at(not_before: u64, not_after: u64) -> u64 {
    let issued = not_before
        .saturating_add(CLOCK_SKEW.as_secs())
        .min(not_after);
    let life = not_after.saturating_sub(issued);
    issued.saturating_add(life.saturating_mul(2) / 3)
}

/// When a certificate becomes valid and when it expires (seconds since the Unix epoch).
fn validity(cert_der: &[u8]) -> anyhow::Result<(u64, u64)> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(cert_der)
        .map_err(|_| anyhow::anyhow!("malformed certificate"))?;
    let v = cert.validity();
    let secs = |t: i64| u64::try_from(t).unwrap_or(0);
    Ok((
        secs(v.not_before.timestamp()),
        secs(v.not_after.timestamp()),
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::CertificateDer;

    #[test]
    fn renewal_comes_at_two_thirds_of_the_life_not_counting_the_backdating() {
        let skew = CLOCK_SKEW.as_secs();
        // Issued at 1000 for 6 s: valid from 1000 - skew to 1006; renewed at 1004.
        assert_eq!(renew_at(1000 - skew, 1006), 1004);
        assert_eq!(renew_at(1000 - skew, 1000 + 30 * 86400), 1000 + 20 * 86400);
        // A certificate that does not look like ours: never past its end.
        assert_eq!(renew_at(0, 10), 10);
    }

    #[test]
    fn a_file_slot_presents_the_renewed_pair_and_keeps_the_last_good_one() {
        let ca = crate::Ca::generate("c").expect("ca");
        let dir = std::env::temp_dir().join(format!("hawser-slot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (chain, key) = (dir.join("node.pem"), dir.join("node.key"));
        let node = Peer::Node("n1".into());
        let write = |at: u64| {
            let (issued, key_pem) = ca
                .issue_with_key(&node, std::time::Duration::from_secs(3600))
                .expect("issue");
            std::fs::write(&key, key_pem).expect("key");
            std::fs::write(&chain, &issued.chain_pem).expect("chain");
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(at);
            for p in [&key, &chain] {
                std::fs::File::options()
                    .write(true)
                    .open(p)
                    .and_then(|f| f.set_modified(t))
                    .expect("touch");
            }
            issued.chain_pem
        };
        write(1_000_000);
        let slot = CertSlot::from_dir(&dir, &crate::NODE_IDENTITY).expect("slot");
        let first = slot.key().cert[0].clone();
        write(2_000_000);
        let second = slot.key().cert[0].clone();
        assert_ne!(first, second, "the renewed certificate is presented");
        // A key that does not match the chain: the last good pair stays.
        std::fs::write(&key, crate::new_key().expect("key").0).expect("key");
        std::fs::File::options()
            .write(true)
            .open(&key)
            .and_then(|f| {
                f.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(3_000_000))
            })
            .expect("touch");
        assert_eq!(slot.key().cert[0], second);
        assert_eq!(slot.peer(), node);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Two renewals' pairs of node `n1`, the first and the second.
    fn two_pairs() -> (Credentials, Credentials) {
        let ca = crate::Ca::generate("c").expect("ca");
        let pair = || {
            let (issued, key_pem) = ca
                .issue_with_key(
                    &Peer::Node("n1".into()),
                    std::time::Duration::from_secs(3600),
                )
                .expect("issue");
            Credentials {
                chain_pem: issued.chain_pem,
                key_pem,
            }
        };
        (pair(), pair())
    }

    /// The leaf the slot in `dir` presents, as the CSI node plugin loads it.
    fn presented(dir: &Path) -> anyhow::Result<CertificateDer<'static>> {
        let slot = CertSlot::from_dir(dir, &crate::NODE_IDENTITY)?;
        let leaf = slot.key().cert[0].clone();
        Ok(leaf)
    }

    fn leaf(creds: &Credentials) -> CertificateDer<'static> {
        certs_from_pem(&creds.chain_pem).expect("chain")[0].clone()
    }

    #[test]
    fn the_csi_node_plugin_after_a_renewal_cut_between_key_and_certificate_presents_the_new_pair() {
        // An older agent renamed the new key over node.key and died before renaming the new
        // certificate (written to node.new) over node.pem: new key, old certificate.
        let (old, new) = two_pairs();
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("node.key"), &new.key_pem).expect("key");
        std::fs::write(dir.path().join("node.pem"), &old.chain_pem).expect("cert");
        std::fs::write(dir.path().join("node.new"), &new.chain_pem).expect("leftover");
        assert_eq!(presented(dir.path()).expect("loads"), leaf(&new));
        // Read only: the agent beside it repairs the directory, not the plugin.
        assert!(dir.path().join("node.new").exists());
    }

    #[test]
    fn the_csi_node_plugin_with_the_new_certificate_beside_the_old_key_presents_the_new_pair() {
        // The other half: the certificate's rename landed, the key's did not (node.new).
        let (old, new) = two_pairs();
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("node.key"), &old.key_pem).expect("key");
        std::fs::write(dir.path().join("node.pem"), &new.chain_pem).expect("cert");
        std::fs::write(dir.path().join("node.new"), &new.key_pem).expect("leftover");
        assert_eq!(presented(dir.path()).expect("loads"), leaf(&new));
        // With no half of the new pair anywhere, nothing matches: refused, naming the files.
        std::fs::remove_file(dir.path().join("node.new")).expect("rm");
        let e = format!("{:#}", presented(dir.path()).expect_err("no pair"));
        assert!(
            e.contains("node.key: a private key") && e.contains("node.pem"),
            "{e}"
        );
    }

    #[test]
    fn a_fresh_certificate_is_renewed_later_not_now() {
        let ca = crate::Ca::generate("c").expect("ca");
        for lifetime in [6, 3600] {
            let (issued, key_pem) = ca
                .issue_with_key(&Peer::Controller, std::time::Duration::from_secs(lifetime))
                .expect("issue");
            let slot = CertSlot::new(&Credentials {
                chain_pem: issued.chain_pem,
                key_pem,
            })
            .expect("slot");
            let wait = slot.renew_in().as_secs();
            let want = lifetime * 2 / 3;
            assert!(wait + 2 >= want && wait <= want, "{lifetime}: {wait}");
        }
    }
}
