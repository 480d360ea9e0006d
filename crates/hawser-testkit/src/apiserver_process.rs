//! A real kube-apiserver (and the etcd under it) started by tests: the Kubernetes store's
//! conformance suite and the controller's tests on Kubernetes. Nothing else of Kubernetes
//! runs (no controller-manager, scheduler or kubelet), so it starts in seconds.
//!
//! The binary comes from `$HAWSER_K8S_BIN` (default `~/.cache/hawser-k8s/bin`), where
//! `scripts/k8s/build.sh` (run by `make test`) builds it; a missing binary is an error that
//! says so, never a skipped test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::etcd_process::EtcdProcess;
use crate::test_ports::free_loopback_port;
use hawser_kube::api::{Api, ApiError};
use hawser_kube::{Auth, KubeConfig};

/// How long the API server gets to become ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the Kubernetes binaries are.
pub fn k8s_bin_dir() -> PathBuf {
    std::env::var_os("HAWSER_K8S_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home =
                std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
            home.join(".cache/hawser-k8s/bin")
        })
}

pub struct ApiserverProcess {
    child: Option<Child>,
    _etcd: EtcdProcess,
    port: u16,
    token: String,
    log: PathBuf,
    kubeconfig: PathBuf,
}

impl ApiserverProcess {
    /// Starts etcd and kube-apiserver with their state under `dir` and waits until the API
    /// server is ready. The admin token is in `dir/admin.kubeconfig`.
    pub async fn start(dir: &Path) -> Result<ApiserverProcess, String> {
        let bin = k8s_bin_dir().join("kube-apiserver");
        if !bin.exists() {
            return Err(format!(
                "no kube-apiserver at {}: run scripts/k8s/build.sh (make test does) or set \
                 HAWSER_K8S_BIN",
                bin.display()
            ));
        }
        let etcd_dir = dir.join("etcd");
        std::fs::create_dir_all(&etcd_dir).map_err(|e| format!("{}: {e}", etcd_dir.display()))?;
        let etcd = tokio::task::spawn_blocking(move || EtcdProcess::start(&etcd_dir))
            .await
            .map_err(|e| e.to_string())??;
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).map_err(|e| format!("{}: {e}", pki.display()))?;
        let sa_key = pki.join("sa.key");
        let sa_pub = pki.join("sa.pub");
        run("openssl", &["genrsa", "-out", path_str(&sa_key)?, "2048"])?;
        run(
            "openssl",
            &[
                "rsa",
                "-in",
                path_str(&sa_key)?,
                "-pubout",
                "-out",
                path_str(&sa_pub)?,
            ],
        )?;
        let token: String = (0..16)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        let tokens = dir.join("tokens.csv");
        std::fs::write(&tokens, format!("{token},admin,admin,\"system:masters\"\n"))
            .map_err(|e| format!("{}: {e}", tokens.display()))?;
        let port = free_loopback_port()?;
        let log = dir.join("kube-apiserver.log");
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&bin)
            .arg(format!("--etcd-servers=http://{}", etcd.endpoint()))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", pki.display()))
            .arg(format!("--token-auth-file={}", tokens.display()))
            .arg("--authorization-mode=RBAC")
            .arg(format!("--service-account-key-file={}", sa_pub.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa_key.display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg("--service-cluster-ip-range=10.96.0.0/24")
            .arg("--endpoint-reconciler-type=none")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster: {{server: \"https://127.0.0.1:{port}\", insecure-skip-tls-verify: true}}\nusers:\n- name: admin\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: t\n  context: {{cluster: t, user: admin, namespace: default}}\ncurrent-context: t\n"
            ),
        )
        .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
        let mut p = ApiserverProcess {
            child: Some(child),
            _etcd: etcd,
            port,
            token,
            log,
            kubeconfig,
        };
        p.wait_ready().await?;
        Ok(p)
    }

    /// The admin's view: server, token, no CA check (the server's certificate is self-made).
    pub fn config(&self) -> KubeConfig {
        KubeConfig {
            server: format!("https://127.0.0.1:{}", self.port),
            namespace: None,
            ca_pem: None,
            insecure: true,
            auth: Auth::Token(self.token.clone()),
            source: "test kube-apiserver".into(),
        }
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    fn api(&self) -> Result<Api, String> {
        Api::new(&self.config(), Duration::from_secs(10)).map_err(|e| e.to_string())
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let api = self.api()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(format!(
                        "kube-apiserver exited with {status}; log: {}",
                        self.log_tail()
                    ));
                }
            }
            // Namespaces are served once the bootstrap is done.
            if api.get("/api/v1/namespaces/default").await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "kube-apiserver not ready after {START_TIMEOUT:?}; log: {}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates a namespace (tests use one each).
    pub async fn create_namespace(&self, name: &str) -> Result<(), String> {
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        match self.api()?.post("/api/v1/namespaces", &body).await {
            Ok(_) | Err(ApiError::Conflict) => Ok(()),
            Err(e) => Err(format!("create namespace {name}: {e}")),
        }
    }

    /// The end of the API server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(3000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }
}

impl Drop for ApiserverProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("run {cmd}: {e} (make deps installs it)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
