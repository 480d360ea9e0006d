//! How the controller reaches etcd: TLS with the etcd cluster's CA, a client certificate or a
//! user and password for etcd's own authentication, and the rule that keeps cluster state off
//! an open network: plaintext etcd only on loopback, or with `--insecure`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use hawser_store::{EtcdConfig, EtcdIdentity, EtcdTls, EtcdUser};

/// The `--etcd-*` flags of `hawser controller`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EtcdArgs {
    /// Talk TLS to etcd and check its members' certificates against this CA (PEM). Needed
    /// for an etcd that is not on loopback, unless --insecure.
    #[arg(long, value_name = "PATH")]
    pub etcd_ca_file: Option<PathBuf>,
    /// The client certificate (PEM) this controller presents to etcd (etcd's
    /// --client-cert-auth; with etcd's authentication on, its common name is the user).
    #[arg(long, value_name = "PATH", requires_all = ["etcd_key_file", "etcd_ca_file"])]
    pub etcd_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --etcd-cert-file.
    #[arg(long, value_name = "PATH", requires = "etcd_cert_file")]
    pub etcd_key_file: Option<PathBuf>,
    /// Log in to etcd as this user (etcd's authentication); the password is in
    /// --etcd-password-file.
    #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// A file holding the password of --etcd-user (one line).
    #[arg(long, value_name = "PATH", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdArgs {
    fn any(&self) -> bool {
        self.etcd_ca_file.is_some() || self.etcd_user.is_some()
    }

    /// Refuses `--etcd-*` flags with a store that is not etcd: they would be ignored.
    pub fn check_unused(&self, store: Option<&str>) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.any(),
            "--etcd-ca-file, --etcd-user and the like need an etcd:// store (--store is {})",
            store.unwrap_or("the default file")
        );
        Ok(())
    }

    /// The configuration of the etcd store at `url`: TLS and credentials from the flags.
    pub fn config(&self, url: &str, insecure: bool) -> anyhow::Result<EtcdConfig> {
        let mut cfg = EtcdConfig::parse(url).map_err(|e| anyhow::anyhow!(e))?;
        if let Some(ca) = &self.etcd_ca_file {
            let client = match (&self.etcd_cert_file, &self.etcd_key_file) {
                (Some(cert), Some(key)) => Some(EtcdIdentity {
                    cert_pem: read_pem(cert, "--etcd-cert-file", "CERTIFICATE")?,
                    key_pem: read_pem(key, "--etcd-key-file", "PRIVATE KEY")?,
                }),
                _ => None,
            };
            cfg = cfg.with_tls(EtcdTls {
                ca_pem: read_pem(ca, "--etcd-ca-file", "CERTIFICATE")?,
                client,
            });
        }
        if let (Some(name), Some(file)) = (&self.etcd_user, &self.etcd_password_file) {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("read --etcd-password-file {}", file.display()))?;
            let password = text.trim_end_matches(['\n', '\r']).to_string();
            anyhow::ensure!(
                !password.is_empty(),
                "--etcd-password-file {} is empty",
                file.display()
            );
            cfg.user = Some(EtcdUser {
                name: name.clone(),
                password,
            });
        }
        let endpoints = cfg.endpoints.join(",");
        match (&cfg.tls, insecure, cfg.all_loopback()) {
            (None, false, false) => anyhow::bail!(
                "etcd at {endpoints} would be reached in plaintext: cluster state, token \
                 digests and the grant key would cross the network in clear. Give \
                 --etcd-ca-file (with --etcd-cert-file/--etcd-key-file or --etcd-user/\
                 --etcd-password-file), or --insecure for a network you trust entirely"
            ),
            (None, _, _) => tracing::warn!(
                "etcd at {endpoints} is reached in plaintext (allowed: {})",
                if insecure {
                    "--insecure"
                } else {
                    "loopback only"
                }
            ),
            (Some(tls), _, _) if tls.client.is_none() && cfg.user.is_none() => tracing::warn!(
                "etcd at {endpoints}: TLS without a client certificate or a user; etcd cannot \
                 tell this controller from any other client (give --etcd-cert-file or \
                 --etcd-user)"
            ),
            _ => {}
        }
        Ok(cfg)
    }
}

/// Reads a PEM file given by `flag`, checking that it holds a `kind` block.
fn read_pem(path: &Path, flag: &str, kind: &str) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("read {flag} {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    anyhow::ensure!(
        text.contains("-----BEGIN ") && text.contains(&format!("{kind}-----")),
        "{flag} {} is not a PEM file with a {kind}",
        path.display()
    );
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args() -> EtcdArgs {
        EtcdArgs::default()
    }

    #[test]
    fn plaintext_only_on_loopback_or_with_insecure() {
        let err = args()
            .config("etcd://10.0.0.5:2379", false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("plaintext") && err.contains("--etcd-ca-file"),
            "{err}"
        );
        assert!(args().config("etcd://10.0.0.5:2379", true).is_ok());
        assert!(args()
            .config("etcd://127.0.0.1:2379,localhost:1", false)
            .is_ok());
        assert!(args()
            .config("etcd://127.0.0.1:2379,10.0.0.5:1", false)
            .is_err());
    }

    #[test]
    fn files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk");
        std::fs::write(&junk, "not pem").unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let a = EtcdArgs {
            etcd_ca_file: Some(junk),
            ..args()
        };
        let err = a
            .config("etcd://10.0.0.5:1", false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--etcd-ca-file") && err.contains("not a PEM"),
            "{err}"
        );
        let a = EtcdArgs {
            etcd_user: Some("u".into()),
            etcd_password_file: Some(empty),
            ..args()
        };
        let err = a
            .config("etcd://127.0.0.1:1", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is empty"), "{err}");
        let a = EtcdArgs {
            etcd_ca_file: Some(dir.path().join("missing")),
            ..args()
        };
        let err = format!("{:#}", a.config("etcd://127.0.0.1:1", false).unwrap_err());
        assert!(
            err.contains("missing") && err.contains("No such file"),
            "{err}"
        );
        assert!(a.check_unused(Some("k8s://")).is_err());
        assert!(args().check_unused(None).is_ok());
    }
}
