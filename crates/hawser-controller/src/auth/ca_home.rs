//! Where a controller keeps the cluster's CA: files in its data directory, or a Kubernetes
//! Secret shared by the chart's controllers (`--ca-secret`). Either holds:
//!
//! - `ca.pem`: the CA's certificate, then during a rotation the CA trusted beside it (so
//!   that the CLI, the CSI driver and Prometheus, which are given this file, trust both);
//! - `ca.key`: the CA's key (mode 0600), never beside a `ca.pem` it does not belong to: in
//!   the data directory both are links into `ca-<n>/`, replaced together by one rename
//!   ([`CA_FILES`]);
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
use hawser_tls::{Ca, Credentials, KeyOf, PairLayout};

const CA_CERT_FILE: &str = "ca.pem";
const CA_KEY_FILE: &str = "ca.key";
const GRANT_ROOT_FILE: &str = "grant-root.key";

/// The CA's certificate and key in the data directory: `ca -> ca-<n>/` with `ca.pem` and
/// `ca.key` links into it, so that a new trust or a new CA replaces both in one rename
/// (`hawser_tls::PairLayout` argues the layout). Builds before wrote a retired CA's
/// replacement as `ca-next.key` then `ca-next.pem` (each through `ca-next.tmp`, as
/// `ca.pem` went through `ca.tmp`) and renamed them over the CA's, key first; a start that
/// finds such a cut keeps the pair that belongs together, the new CA's first, and never
/// puts a key in place whose certificate is missing. A rotation record that retires the
/// CA this leaves is applied again (`ca_rotation::apply`), its key unsealed from the store.
const CA_FILES: PairLayout = PairLayout {
    cert: CA_CERT_FILE,
    key: CA_KEY_FILE,
    link: "ca",
    leftovers: &["ca-next.pem", "ca-next.key", "ca-next.tmp", "ca.tmp"],
    key_of: KeyOf::Any,
    remedy: "restore ca.pem and ca.key from another controller of this cluster (a new CA \
             would lock every node out)",
};

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

    /// Keeps `trust_pem` (the kept CA's certificate first) as what clients trust; `kept` is
    /// the kept CA, whose key a data directory writes beside it again.
    pub async fn keep_trust(&self, kept: &Ca, trust_pem: &str) -> anyhow::Result<()> {
        match self {
            CaHome::Files(dir) => save_files(dir, trust_pem, kept),
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
                // Before the CA: a cut between leaves the old CA with the root it derives
                // from itself or was given, the same root.
                write_replace(&dir.join(GRANT_ROOT_FILE), &root, 0o600)?;
                save_files(dir, next.cert_pem(), next)
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
    let Some(creds) = CA_FILES.recover(dir).context("read the cluster CA")? else {
        return create_files(dir, hint);
    };
    let ca = Ca::from_pem(&creds.chain_pem, &creds.key_pem)
        .with_context(|| format!("the cluster CA in {}", dir.display()))?;
    let root_path = dir.join(GRANT_ROOT_FILE);
    let root = if root_path.exists() {
        Some(
            std::fs::read_to_string(&root_path)
                .with_context(|| format!("read {}", root_path.display()))?,
        )
    } else {
        None
    };
    let grant_root =
        grant_root(&ca, root.as_deref()).with_context(|| format!("{}", root_path.display()))?;
    Ok(Kept {
        ca,
        trust_pem: creds.chain_pem,
        grant_root,
    })
}

/// A new CA for a data directory that has none.
fn create_files(dir: &Path, hint: &str) -> anyhow::Result<Kept> {
    let ca = Ca::generate(hint)?;
    save_files(dir, ca.cert_pem(), &ca)?;
    tracing::info!(
        ca = %dir.join(CA_CERT_FILE).display(),
        "made the cluster's certificate authority; give {CA_CERT_FILE} to the CLI and the \
         CSI driver, and both files (their contents: `cp`, not `cp -a`) to any other \
         controller of this cluster"
    );
    Ok(Kept {
        trust_pem: ca.cert_pem().to_string(),
        grant_root: grant_root(&ca, None)?,
        ca,
    })
}

/// Replaces `ca.pem` with `trust_pem` and `ca.key` with `ca`'s key, in one step.
fn save_files(dir: &Path, trust_pem: &str, ca: &Ca) -> anyhow::Result<()> {
    let pair = Credentials {
        chain_pem: trust_pem.into(),
        key_pem: ca.key_pem(),
    };
    CA_FILES
        .save(dir, &pair)
        .context("save the cluster CA's certificate and key")
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
        home.keep_trust(&old, &both).await.expect("trust");
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
        assert_eq!(key, next.key_pem());
        // Both files name one generation, the only one: the old key is gone.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["ca", "ca-3", "ca.key", "ca.pem", "grant-root.key"]);
        let old_key = old.key_pem();
        let everywhere = walk(dir.path());
        assert!(!everywhere.contains(&old_key), "the old key is gone");
    }

    /// The contents of every file under `dir`.
    fn walk(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).expect("list") {
            let path = e.expect("entry").path();
            let meta = path.symlink_metadata().expect("meta");
            if meta.is_dir() {
                out.extend(walk(&path));
            } else if meta.is_file() {
                out.push(std::fs::read_to_string(&path).expect("read"));
            }
        }
        out
    }

    /// An older build's data directory: plain files, as it wrote them.
    fn older_build(dir: &Path, files: &[(&str, &str)]) -> CaHome {
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write");
        }
        CaHome::Files(dir.into())
    }

    /// Starts the controller's CA from `dir` and checks that it kept `want`, and that `gone`
    /// (the half-written file of the cut that did not win) is no longer there.
    async fn starts_with(dir: &Path, want: &Ca, gone: &str) -> Kept {
        let home = CaHome::Files(dir.into());
        let kept = home.load_or_create("c").await.expect("starts");
        assert_eq!(
            kept.ca.fingerprint(),
            want.fingerprint(),
            "the pair that matches"
        );
        assert!(!dir.join(gone).exists(), "{gone} is left");
        kept
    }

    /// A data directory and two CAs of one cluster: the one in use and the next.
    fn cut_fixture() -> (tempfile::TempDir, Ca, Ca) {
        let dir = tempfile::tempdir().expect("dir");
        let old = Ca::generate("c").expect("old");
        let next = Ca::generate("c").expect("new");
        (dir, old, next)
    }

    fn read(dir: &Path, name: &str) -> String {
        std::fs::read_to_string(dir.join(name)).expect("read")
    }

    #[tokio::test]
    async fn a_retirement_cut_before_the_new_certificate_was_written_starts_with_the_old_ca() {
        // An older build's retirement wrote ca-next.key, then died (or found the disk full)
        // writing ca-next.pem through ca-next.tmp. Its next start renamed ca-next.key over
        // ca.key, beside a ca.pem it does not belong to, and refused for good.
        let (dir, old, next) = cut_fixture();
        let cut_short = &next.cert_pem()[..40];
        let files = [
            (CA_CERT_FILE, old.cert_pem()),
            (CA_KEY_FILE, &old.key_pem()),
            ("ca-next.key", &next.key_pem()),
            ("ca-next.tmp", cut_short),
        ];
        let home = older_build(dir.path(), &files);
        let kept = starts_with(dir.path(), &old, "ca-next.key").await;
        assert_eq!(read(dir.path(), CA_KEY_FILE), old.key_pem());
        // The rotation's retirement, applied again from the store, lands whole.
        home.keep_new(&next, &kept.grant_root)
            .await
            .expect("retire");
        let after = home.load_or_create("c").await.expect("starts again");
        assert_eq!(after.ca.fingerprint(), next.fingerprint());
    }

    #[tokio::test]
    async fn a_retirement_cut_with_the_new_certificate_but_not_its_key_starts_with_the_old_ca() {
        // The other half: ca-next.pem beside the old ca.key, ca-next.key gone (its rename
        // lost, the older build ignoring a failed directory sync, or ca.key restored). The
        // older build took a lone ca-next.pem to mean the key was in place, renamed it over
        // ca.pem, and refused.
        let (dir, old, next) = cut_fixture();
        let files = [
            (CA_CERT_FILE, old.cert_pem()),
            (CA_KEY_FILE, &old.key_pem()),
            ("ca-next.pem", next.cert_pem()),
        ];
        older_build(dir.path(), &files);
        starts_with(dir.path(), &old, "ca-next.pem").await;
        assert_eq!(read(dir.path(), CA_CERT_FILE), old.cert_pem());
    }

    #[tokio::test]
    async fn a_retirement_cut_between_the_key_and_the_certificate_starts_with_the_new_ca() {
        // The older build's key rename landed, its certificate's did not: the new pair is
        // ca.key and ca-next.pem.
        let (dir, old, next) = cut_fixture();
        let files = [
            (CA_CERT_FILE, old.cert_pem()),
            (CA_KEY_FILE, &next.key_pem()),
            ("ca-next.pem", next.cert_pem()),
        ];
        older_build(dir.path(), &files);
        starts_with(dir.path(), &next, "ca-next.pem").await;
        assert_eq!(read(dir.path(), CA_CERT_FILE), next.cert_pem());
    }

    #[tokio::test]
    async fn a_cut_that_leaves_no_pair_refuses_naming_the_files_and_what_to_do() {
        let (dir, old, next) = cut_fixture();
        let files = [
            (CA_CERT_FILE, old.cert_pem()),
            (CA_KEY_FILE, &next.key_pem()),
        ];
        let home = older_build(dir.path(), &files);
        let e = format!(
            "{:#}",
            home.load_or_create("c").await.err().expect("refused")
        );
        for want in [
            "ca.pem: 1 certificate(s)",
            "ca.key: a private key",
            "restore ca.pem",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        assert_eq!(
            read(dir.path(), CA_KEY_FILE),
            next.key_pem(),
            "nothing changed"
        );
    }
}
