//! Where a controller keeps the cluster's CA: files in its data directory, or a Kubernetes
//! Secret shared by the chart's controllers (`--ca-secret`). Either holds:
//!
//! - `ca.pem`: the CA's certificate, then during a rotation the CA trusted beside it (so
//!   that the CLI, the CSI driver and Prometheus, which are given this file, trust both);
//! - `ca.key`: the CA's key (mode 0600);
//! - `grant-root.key`, once the CA has rotated: the secret the epoch grant key is derived
//!   from, taken from the first CA (`Ca::secret_root`), so that grants keep their key when
//!   the CA that made it is retired.
//!
//! The CA is not in the cluster store: a wiped or rolled-back store must not cost the nodes
//! their identity (they could not reach the controller to be recovered). Controllers that
//! share a store are given the same files, as they are given the same agent token; a CA
//! rotation reaches each of them through the store (`ca_rotation`), sealed under the CA they
//! hold.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use hawser_tls::Ca;

const CA_CERT_FILE: &str = "ca.pem";
const CA_KEY_FILE: &str = "ca.key";
const GRANT_ROOT_FILE: &str = "grant-root.key";
/// A retired CA's replacement is written under these names, then renamed over the CA's:
/// a crash between the renames is finished at the next start.
const NEXT_CERT_FILE: &str = "ca-next.pem";
const NEXT_KEY_FILE: &str = "ca-next.key";

/// Where the CA is kept.
pub enum CaHome {
    Files(PathBuf),
    Secret {
        kube: Arc<crate::ha::kube::Kube>,
        namespace: String,
        name: String,
        /// The trusted CAs' certificates are also written to `<data_dir>/ca.pem` for the
        /// processes beside the controller (the chart's CSI controller in the same pod).
        data_dir: PathBuf,
    },
}

/// The CA as kept.
pub struct Kept {
    pub ca: Ca,
    /// What `ca.pem` holds: the CA's certificate, and during a rotation the other CA's.
    pub trust_pem: String,
    /// The grant key's root (`grant-root.key`, else the CA's own).
    pub grant_root: [u8; 32],
}

impl CaHome {
    /// The kept CA, made (and kept) if there is none; `hint` names a new CA.
    pub async fn load_or_create(&self, hint: &str) -> anyhow::Result<Kept> {
        match self {
            CaHome::Files(dir) => load_files(dir, hint),
            CaHome::Secret {
                kube,
                namespace,
                name,
                data_dir,
            } => {
                let kept = load_secret(kube, namespace, name).await?;
                write_replace(&data_dir.join(CA_CERT_FILE), &kept.trust_pem, 0o644)?;
                Ok(kept)
            }
        }
    }

    /// Keeps `trust_pem` (the kept CA's certificate first) as what clients trust.
    pub async fn keep_trust(&self, trust_pem: &str) -> anyhow::Result<()> {
        match self {
            CaHome::Files(dir) => write_replace(&dir.join(CA_CERT_FILE), trust_pem, 0o644),
            CaHome::Secret {
                data_dir,
                namespace,
                name,
                kube,
            } => {
                update_secret(kube, namespace, name, |data| {
                    data.insert(CA_CERT_FILE.into(), trust_pem.into());
                })
                .await?;
                write_replace(&data_dir.join(CA_CERT_FILE), trust_pem, 0o644)
            }
        }
    }

    /// Replaces the kept CA with `next` (the old one's key is gone afterwards), keeping
    /// `grant_root` for the grant key.
    pub async fn keep_new(&self, next: &Ca, grant_root: &[u8; 32]) -> anyhow::Result<()> {
        let root = b64(grant_root);
        match self {
            CaHome::Files(dir) => {
                write_replace(&dir.join(GRANT_ROOT_FILE), &root, 0o600)?;
                write_replace(&dir.join(NEXT_KEY_FILE), &next.key_pem(), 0o600)?;
                write_replace(&dir.join(NEXT_CERT_FILE), next.cert_pem(), 0o644)?;
                finish_files(dir)
            }
            CaHome::Secret {
                kube,
                namespace,
                name,
                data_dir,
            } => {
                let key = next.key_pem();
                update_secret(kube, namespace, name, |data| {
                    data.insert(CA_CERT_FILE.into(), next.cert_pem().into());
                    data.insert(CA_KEY_FILE.into(), key.clone());
                    data.insert(GRANT_ROOT_FILE.into(), root.clone());
                })
                .await?;
                write_replace(&data_dir.join(CA_CERT_FILE), next.cert_pem(), 0o644)
            }
        }
    }
}

fn load_files(dir: &Path, hint: &str) -> anyhow::Result<Kept> {
    finish_files(dir)?;
    let (cert_path, key_path) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()));
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            let trust_pem = read(&cert_path)?;
            let ca = Ca::from_pem(&trust_pem, &read(&key_path)?)
                .with_context(|| format!("the cluster CA in {}", dir.display()))?;
            let root_path = dir.join(GRANT_ROOT_FILE);
            let root = if root_path.exists() {
                Some(read(&root_path)?)
            } else {
                None
            };
            let grant_root = grant_root(&ca, root.as_deref())
                .with_context(|| format!("{}", root_path.display()))?;
            Ok(Kept {
                ca,
                trust_pem,
                grant_root,
            })
        }
        (false, false) => {
            let ca = Ca::generate(hint)?;
            write_new(&key_path, &ca.key_pem(), 0o600)?;
            write_new(&cert_path, ca.cert_pem(), 0o644)?;
            tracing::info!(
                ca = %cert_path.display(),
                "made the cluster's certificate authority; give {CA_CERT_FILE} to the CLI \
                 and the CSI driver, and both files to any other controller of this cluster"
            );
            Ok(Kept {
                trust_pem: ca.cert_pem().to_string(),
                grant_root: grant_root(&ca, None)?,
                ca,
            })
        }
        _ => anyhow::bail!(
            "{} and {} must both exist or both be absent: restore the missing one (a new \
             CA would lock every node out)",
            cert_path.display(),
            key_path.display()
        ),
    }
}

/// Finishes replacing the CA's files if a start found it half done: the key first, then the
/// certificate (a `ca-next.pem` alone means the key is in place already).
fn finish_files(dir: &Path) -> anyhow::Result<()> {
    for (from, to) in [(NEXT_KEY_FILE, CA_KEY_FILE), (NEXT_CERT_FILE, CA_CERT_FILE)] {
        let from = dir.join(from);
        if from.exists() {
            std::fs::rename(&from, dir.join(to))
                .with_context(|| format!("rename {} into place", from.display()))?;
            sync_dir(dir);
        }
    }
    Ok(())
}

async fn load_secret(
    kube: &crate::ha::kube::Kube,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Kept> {
    let what = format!("the cluster CA in Secret {namespace}/{name}");
    for _ in 0..3 {
        if let Some(data) = kube
            .secret(namespace, name)
            .await
            .map_err(|e| anyhow::anyhow!(e))?
        {
            let (Some(cert), Some(key)) = (data.get(CA_CERT_FILE), data.get(CA_KEY_FILE)) else {
                anyhow::bail!(
                    "{what} lacks {CA_CERT_FILE} or {CA_KEY_FILE}: restore it (a new CA \
                     would lock every node out)"
                );
            };
            let ca = Ca::from_pem(cert, key).with_context(|| what.clone())?;
            let grant_root = grant_root(&ca, data.get(GRANT_ROOT_FILE).map(String::as_str))
                .with_context(|| format!("{what}: {GRANT_ROOT_FILE}"))?;
            return Ok(Kept {
                ca,
                trust_pem: cert.clone(),
                grant_root,
            });
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
            return Ok(Kept {
                trust_pem: ca.cert_pem().to_string(),
                grant_root: grant_root(&ca, None)?,
                ca,
            });
        }
        // Another controller made it first: read theirs.
    }
    anyhow::bail!("{what}: created and deleted under us; check who deletes it")
}

/// Changes Secret `namespace/name`'s data with `edit`, retrying when another controller
/// changed it meanwhile (the same edit is idempotent).
async fn update_secret(
    kube: &crate::ha::kube::Kube,
    namespace: &str,
    name: &str,
    edit: impl Fn(&mut std::collections::HashMap<String, String>),
) -> anyhow::Result<()> {
    let what = format!("Secret {namespace}/{name}");
    for _ in 0..5 {
        let (mut data, version) = kube
            .secret_versioned(namespace, name)
            .await
            .map_err(|e| anyhow::anyhow!(e))?
            .with_context(|| format!("{what} is gone: restore it"))?;
        let before = data.clone();
        edit(&mut data);
        if data == before {
            return Ok(());
        }
        let pairs: Vec<(&str, &str)> = data.iter().map(|(k, v)| (&**k, &**v)).collect();
        if kube
            .replace_secret(namespace, name, &pairs, &version)
            .await
            .map_err(|e| anyhow::anyhow!(e))?
        {
            return Ok(());
        }
    }
    anyhow::bail!("{what} kept changing under five updates")
}

/// The grant key's root: the kept one (`text`, base64), else the CA's own.
fn grant_root(ca: &Ca, text: Option<&str>) -> anyhow::Result<[u8; 32]> {
    match text {
        Some(text) => decode_root(text),
        None => Ok(ca.secret_root(hawser_wire::grant::GRANT_KEY_PURPOSE)),
    }
}

/// A grant root as kept (and as sealed in a rotation): 32 bytes, base64.
pub(crate) fn decode_root(text: &str) -> anyhow::Result<[u8; 32]> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .context("not 32 bytes of base64")
}

pub(crate) fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
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

/// Writes `text` to a new file renamed over `path`.
fn write_replace(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    write_new(&tmp, text, mode)?;
    std::fs::rename(&tmp, path).with_context(|| format!("replace {}", path.display()))?;
    if let Some(d) = path.parent() {
        sync_dir(d);
    }
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_keep_the_trust_then_the_new_ca_and_the_grant_root_outlives_the_old() {
        let dir = tempfile::tempdir().expect("dir");
        let home = CaHome::Files(dir.path().into());
        let first = home.load_or_create("c").await.expect("create");
        let old = first.ca;
        assert_eq!(
            first.grant_root,
            old.secret_root(hawser_wire::grant::GRANT_KEY_PURPOSE)
        );
        let next = Ca::generate("c").expect("ca");
        let both = format!("{}{}", old.cert_pem(), next.cert_pem());
        home.keep_trust(&both).await.expect("trust");
        let again = home.load_or_create("c").await.expect("reload");
        assert_eq!(
            again.ca.fingerprint(),
            old.fingerprint(),
            "the old CA still issues"
        );
        assert_eq!(again.trust_pem, both);
        home.keep_new(&next, &first.grant_root)
            .await
            .expect("retire");
        let after = home.load_or_create("c").await.expect("reload");
        assert_eq!(after.ca.fingerprint(), next.fingerprint());
        assert_eq!(after.trust_pem, next.cert_pem());
        assert_eq!(after.grant_root, first.grant_root, "the grant key stays");
        let key = std::fs::read_to_string(dir.path().join(CA_KEY_FILE)).expect("key");
        assert_eq!(key, next.key_pem(), "the old key is gone");
    }

    #[tokio::test]
    async fn a_replacement_cut_between_its_renames_is_finished_at_the_next_start() {
        let dir = tempfile::tempdir().expect("dir");
        let home = CaHome::Files(dir.path().into());
        let old = home.load_or_create("c").await.expect("create").ca;
        let next = Ca::generate("c").expect("ca");
        // As if the process died after writing the key's rename but before the cert's.
        write_replace(&dir.path().join(CA_KEY_FILE), &next.key_pem(), 0o600).expect("key");
        write_replace(&dir.path().join(NEXT_CERT_FILE), next.cert_pem(), 0o644).expect("cert");
        let after = home.load_or_create("c").await.expect("finish");
        assert_eq!(after.ca.fingerprint(), next.fingerprint());
        assert_ne!(after.ca.fingerprint(), old.fingerprint());
        assert!(!dir.path().join(NEXT_CERT_FILE).exists());
    }
}
