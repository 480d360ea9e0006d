//! The credentials of a test cluster. The fixture makes them before any controller starts
//! and hands the same ones to every controller (which adopt them at cluster init), so
//! clusters with several controllers on etcd share one set:
//! - the admin and agent tokens (`--admin-token-file`, `--agent-token-file`; the CLI's
//!   `HAWSER_TOKEN_FILE`; agents' `--token-file` in `--insecure` clusters only);
//! - the cluster CA (`ca.pem` and `ca.key` in every controller's data directory, as an
//!   operator copies them; the CLI's and the CSI driver's `--ca-file`);
//! - once a controller serves, a join token for the agents (`--join-token-file`).
//!
//! The fixture also uses the CA the way the controller does, to talk to agents' admin
//! APIs, which admit only the controller's certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hawser_tls::{Ca, CertSlot, Credentials, Peer};
use rand::RngCore;

#[derive(Clone, Debug)]
pub struct TokenFiles {
    pub admin: PathBuf,
    pub agent: PathBuf,
    /// The cluster CA's certificate (what `--ca-file` takes).
    pub ca_file: PathBuf,
    /// Where the agents' join token is written once a controller serves.
    pub join: PathBuf,
    ca_pem: String,
    ca_key_pem: String,
}

impl TokenFiles {
    /// Writes two new random tokens (256 bits, hex) and a new CA certificate into `dir`,
    /// mode 0600 (the CA key stays in memory until [`Self::install_ca`]).
    pub fn seed(dir: &Path) -> TokenFiles {
        let ca = Ca::generate("e2e").expect("make a CA");
        let files = TokenFiles {
            admin: dir.join("admin.token"),
            agent: dir.join("agent.token"),
            ca_file: dir.join("ca.pem"),
            join: dir.join("join.token"),
            ca_pem: ca.cert_pem().to_string(),
            ca_key_pem: ca.key_pem(),
        };
        for path in [&files.admin, &files.agent] {
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            write_private(path, &format!("{token}\n"));
        }
        write_private(&files.ca_file, &files.ca_pem);
        files
    }

    /// Gives the controller whose data directory is `data_dir` the cluster's CA.
    pub fn install_ca(&self, data_dir: &Path) {
        std::fs::create_dir_all(data_dir).expect("make the controller's data dir");
        write_private(&data_dir.join("ca.pem"), &self.ca_pem);
        write_private(&data_dir.join("ca.key"), &self.ca_key_pem);
    }

    /// The controller arguments naming the token files.
    pub fn controller_args(&self) -> Vec<String> {
        vec![
            "--admin-token-file".into(),
            self.admin.display().to_string(),
            "--agent-token-file".into(),
            self.agent.display().to_string(),
        ]
    }

    /// `Authorization` header value for the admin API.
    pub fn admin_bearer(&self) -> String {
        bearer(&self.admin)
    }

    /// `Authorization` header value for agents' admin API in `--insecure` clusters.
    pub fn agent_bearer(&self) -> String {
        bearer(&self.agent)
    }

    /// The cluster CA, key included (what a controller's data dir holds).
    pub fn ca(&self) -> Ca {
        Ca::from_pem(&self.ca_pem, &self.ca_key_pem).expect("the cluster CA")
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A blocking HTTPS client that presents a controller certificate of this cluster and
    /// accepts only `expect` (the controller, or one node's agent); calls time out after 20 s.
    pub fn http(&self, expect: Peer) -> reqwest::blocking::Client {
        self.http_within(expect, Duration::from_secs(20))
    }

    /// [`Self::http`] with calls that time out after `timeout`.
    pub fn http_within(&self, expect: Peer, timeout: Duration) -> reqwest::blocking::Client {
        let config = self.tls_client(expect, &Peer::Controller);
        reqwest::blocking::Client::builder()
            .use_preconfigured_tls((*config).clone())
            .timeout(timeout)
            .build()
            .expect("HTTPS client")
    }
}

impl TokenFiles {
    /// A TLS client configuration that presents a certificate of this cluster naming
    /// `me` (issued now, valid a day) and accepts only a server that is `expect`.
    pub fn tls_client(&self, expect: Peer, me: &Peer) -> Arc<hawser_tls::rustls::ClientConfig> {
        let slot = CertSlot::new(&self.credentials(me)).expect("certificate slot");
        hawser_tls::client_config(&self.ca_pem, expect, Some(slot)).expect("client config")
    }

    /// A new key and a certificate of this cluster naming `me`, valid a day.
    pub fn credentials(&self, me: &Peer) -> Credentials {
        let ca = self.ca();
        let (issued, key_pem) = ca
            .issue_with_key(me, Duration::from_secs(24 * 3600))
            .expect("issue a certificate");
        Credentials {
            chain_pem: issued.chain_pem,
            key_pem,
        }
    }
}

/// The certificate chain in `dir/cert` and its key in `dir/key` (as `hawser volume
/// client-cert` or an agent writes them).
pub fn read_credentials(dir: &Path, cert: &str, key: &str) -> Credentials {
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.join(f).display()))
    };
    Credentials {
        chain_pem: read(cert),
        key_pem: read(key),
    }
}

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

fn bearer(path: &Path) -> String {
    let token = std::fs::read_to_string(path).expect("read token file");
    format!("Bearer {}", token.trim())
}
