//! Where the Kubernetes API is and how to authenticate to it: the pod's service account when
//! running in a cluster, a kubeconfig file otherwise (`$KUBECONFIG`, then `~/.kube/config`).
//!
//! Only what a storage controller needs of kubeconfig: the current context's server,
//! certificate authority (file or data, or `insecure-skip-tls-verify`), namespace, and a
//! bearer token (inline or file) or a client certificate and key. Exec and auth-provider
//! plugins are refused with a clear error rather than ignored.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;

/// The service account files every pod gets.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How long a token read from a file is used before the file is read again. Projected
/// service account tokens are rotated by the kubelet (they expire after an hour by default).
const TOKEN_REREAD: Duration = Duration::from_secs(60);

/// Why no usable way to the API server was found.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not in a pod, no `$KUBECONFIG`, and no `$HOME` to find `~/.kube/config` in.
    #[error("no Kubernetes credentials: not in a pod, $KUBECONFIG unset and no $HOME")]
    NoCredentials,
    /// The service account was asked for outside a pod.
    #[error("KUBERNETES_SERVICE_HOST is not set")]
    NotInPod,
    /// A file cannot be read: the kubeconfig, a file it names, or a service account file.
    #[error("read {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a kubeconfig (YAML of the wrong shape).
    #[error("kubeconfig {} is not valid: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    /// The kubeconfig parses, but its current context cannot be used.
    #[error("kubeconfig {}: {problem}", path.display())]
    Context {
        path: PathBuf,
        problem: ContextProblem,
    },
}

/// What is wrong with a kubeconfig's current context.
#[derive(Debug, thiserror::Error)]
pub enum ContextProblem {
    #[error("no current-context")]
    NoCurrentContext,
    /// A context, cluster or user it names is not in the file.
    #[error("{what} {name:?} is not defined")]
    Undefined { what: &'static str, name: String },
    /// Exec and auth-provider plugins are refused rather than ignored.
    #[error(
        "user {0:?} authenticates through an exec or auth-provider plugin, which Hawser does \
         not run; use a token or a client certificate"
    )]
    Plugin(String),
    #[error("{what} data is not base64: {reason}")]
    NotBase64 { what: &'static str, reason: String },
    #[error("a client certificate needs both certificate and key")]
    HalfCertificate,
    /// A file it names (relative to the kubeconfig's directory) cannot be read.
    #[error("read {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How to reach and authenticate to the API server.
#[derive(Clone, Debug)]
pub struct KubeConfig {
    /// `https://host:port`, no trailing slash.
    pub server: String,
    /// The namespace of the context or of the pod (may be overridden by the store URL).
    pub namespace: Option<String>,
    /// PEM certificates to trust; none with `insecure`.
    pub ca_pem: Option<Vec<u8>>,
    /// `insecure-skip-tls-verify` (test clusters only).
    pub insecure: bool,
    pub auth: Auth,
    /// Where this came from, for errors and logs.
    pub source: String,
}

#[derive(Clone, Debug)]
pub enum Auth {
    None,
    Token(String),
    /// Re-read every [`TOKEN_REREAD`].
    TokenFile(PathBuf),
    /// Client certificate and key, PEM, concatenated.
    ClientCert(Vec<u8>),
}

impl KubeConfig {
    /// In a pod (`KUBERNETES_SERVICE_HOST` set): the service account. Otherwise the
    /// kubeconfig in `$KUBECONFIG` (its first file) or `~/.kube/config`.
    pub fn discover() -> Result<KubeConfig, ConfigError> {
        if let Ok(p) = std::env::var("KUBECONFIG") {
            if let Some(first) = std::env::split_paths(&p).find(|p| !p.as_os_str().is_empty()) {
                return KubeConfig::from_kubeconfig(&first);
            }
        }
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            return KubeConfig::in_cluster(Path::new(SERVICE_ACCOUNT_DIR));
        }
        let home = std::env::var_os("HOME").ok_or(ConfigError::NoCredentials)?;
        KubeConfig::from_kubeconfig(&Path::new(&home).join(".kube/config"))
    }

    /// The pod's service account (token, CA and namespace files under `dir`).
    pub fn in_cluster(dir: &Path) -> Result<KubeConfig, ConfigError> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| ConfigError::NotInPod)?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let ca_path = dir.join("ca.crt");
        let ca = std::fs::read(&ca_path).map_err(|source| ConfigError::Read {
            what: "service account CA",
            path: ca_path,
            source,
        })?;
        let namespace = std::fs::read_to_string(dir.join("namespace"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        Ok(KubeConfig {
            server: format!("https://{host}:{port}"),
            namespace,
            ca_pem: Some(ca),
            insecure: false,
            auth: Auth::TokenFile(dir.join("token")),
            source: format!("service account in {}", dir.display()),
        })
    }

    /// The current context of a kubeconfig file.
    pub fn from_kubeconfig(path: &Path) -> Result<KubeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            what: "kubeconfig",
            path: path.to_path_buf(),
            source,
        })?;
        let kc: Kubeconfig = serde_yaml::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        kc.resolve(base).map_err(|problem| ConfigError::Context {
            path: path.to_path_buf(),
            problem,
        })
    }
}

/// A bearer token source that re-reads its file now and then.
pub struct TokenSource {
    auth: Auth,
    cached: std::sync::Mutex<Option<(String, Instant)>>,
}

impl TokenSource {
    pub fn new(auth: Auth) -> TokenSource {
        TokenSource {
            auth,
            cached: std::sync::Mutex::new(None),
        }
    }

    /// The `Authorization` header value, if this auth uses one.
    pub fn bearer(&self) -> Result<Option<String>, ConfigError> {
        match &self.auth {
            Auth::None | Auth::ClientCert(_) => Ok(None),
            Auth::Token(t) => Ok(Some(format!("Bearer {t}"))),
            Auth::TokenFile(path) => {
                let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((t, at)) = &*cached {
                    if at.elapsed() < TOKEN_REREAD {
                        return Ok(Some(format!("Bearer {t}")));
                    }
                }
                let t = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read {
                        what: "token",
                        path: path.clone(),
                        source,
                    })?
                    .trim()
                    .to_string();
                *cached = Some((t.clone(), Instant::now()));
                Ok(Some(format!("Bearer {t}")))
            }
        }
    }
}

// --- kubeconfig file format (the parts used here) ---

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(default)]
    current_context: String,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: String,
    #[serde(default)]
    certificate_authority: Option<String>,
    #[serde(default)]
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct User {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    token_file: Option<String>,
    #[serde(default)]
    client_certificate: Option<String>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key: Option<String>,
    #[serde(default)]
    client_key_data: Option<String>,
    #[serde(default)]
    exec: Option<serde_yaml::Value>,
    #[serde(default)]
    auth_provider: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    namespace: Option<String>,
}

fn find<'a, T>(
    list: &'a [Named<T>],
    name: &str,
    what: &'static str,
) -> Result<&'a T, ContextProblem> {
    list.iter()
        .find(|n| n.name == name)
        .map(|n| &n.value)
        .ok_or_else(|| ContextProblem::Undefined {
            what,
            name: name.to_string(),
        })
}

/// Inline base64 data or a file relative to the kubeconfig's directory.
fn data_or_file(
    data: &Option<String>,
    file: &Option<String>,
    base: &Path,
    what: &'static str,
) -> Result<Option<Vec<u8>>, ContextProblem> {
    if let Some(d) = data {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map_err(|e| ContextProblem::NotBase64 {
                what,
                reason: e.to_string(),
            })?;
        return Ok(Some(bytes));
    }
    match file {
        Some(f) => {
            let path = base.join(f);
            std::fs::read(&path)
                .map(Some)
                .map_err(|source| ContextProblem::Read { what, path, source })
        }
        None => Ok(None),
    }
}

impl Kubeconfig {
    fn resolve(&self, base: &Path) -> Result<KubeConfig, ContextProblem> {
        if self.current_context.is_empty() {
            return Err(ContextProblem::NoCurrentContext);
        }
        let ctx = find(&self.contexts, &self.current_context, "context")?;
        let cluster = find(&self.clusters, &ctx.cluster, "cluster")?;
        let default_user = User::default();
        let user = if ctx.user.is_empty() {
            &default_user
        } else {
            find(&self.users, &ctx.user, "user")?
        };
        if user.exec.is_some() || user.auth_provider.is_some() {
            return Err(ContextProblem::Plugin(ctx.user.clone()));
        }
        let ca_pem = data_or_file(
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
            base,
            "certificate-authority",
        )?;
        let cert = data_or_file(
            &user.client_certificate_data,
            &user.client_certificate,
            base,
            "client-certificate",
        )?;
        let key = data_or_file(&user.client_key_data, &user.client_key, base, "client-key")?;
        let auth = match (&user.token, &user.token_file, cert, key) {
            (Some(t), _, _, _) => Auth::Token(t.clone()),
            (None, Some(f), _, _) => Auth::TokenFile(base.join(f)),
            (None, None, Some(mut c), Some(k)) => {
                c.push(b'\n');
                c.extend_from_slice(&k);
                Auth::ClientCert(c)
            }
            (None, None, Some(_), None) | (None, None, None, Some(_)) => {
                return Err(ContextProblem::HalfCertificate)
            }
            (None, None, None, None) => Auth::None,
        };
        Ok(KubeConfig {
            server: cluster.server.trim_end_matches('/').to_string(),
            namespace: ctx.namespace.clone().filter(|n| !n.is_empty()),
            ca_pem,
            insecure: cluster.insecure_skip_tls_verify,
            auth,
            source: format!("kubeconfig context {:?}", self.current_context),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn kubeconfig_token_and_files() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ca.pem", "CA");
        let p = write(
            dir.path(),
            "kc",
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://1.2.3.4:6443/\", certificate-authority: ca.pem}\nusers:\n- name: u\n  user: {token: abc}\ncontexts:\n- name: x\n  context: {cluster: c, user: u, namespace: ns1}\ncurrent-context: x\n",
        );
        let c = KubeConfig::from_kubeconfig(&p).unwrap();
        assert_eq!(c.server, "https://1.2.3.4:6443");
        assert_eq!(c.namespace.as_deref(), Some("ns1"));
        assert_eq!(c.ca_pem.as_deref(), Some(&b"CA"[..]));
        assert!(matches!(c.auth, Auth::Token(ref t) if t == "abc"));
    }

    #[test]
    fn kubeconfig_errors_are_clear() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("current-context: \"\"\n", "no current-context"),
            ("current-context: x\n", "context \"x\" is not defined"),
            (
                "clusters:\n- name: c\n  cluster: {server: s}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nusers:\n- name: u\n  user: {exec: {command: aws}}\ncurrent-context: x\n",
                "exec or auth-provider",
            ),
            (
                "clusters:\n- name: c\n  cluster: {server: s, certificate-authority-data: \"!!\"}\ncontexts:\n- name: x\n  context: {cluster: c}\ncurrent-context: x\n",
                "not base64",
            ),
            ("[", "not valid"),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let p = write(dir.path(), &format!("kc{i}"), text);
            let err = KubeConfig::from_kubeconfig(&p).unwrap_err();
            assert!(err.to_string().contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn token_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "token", "tok\n");
        let t = TokenSource::new(Auth::TokenFile(p));
        assert_eq!(t.bearer().unwrap().unwrap(), "Bearer tok");
        let missing = TokenSource::new(Auth::TokenFile(dir.path().join("nope")));
        let err = missing.bearer().unwrap_err();
        assert!(
            matches!(&err, ConfigError::Read { what: "token", path, .. } if path.ends_with("nope")),
            "{err}"
        );
    }
}
