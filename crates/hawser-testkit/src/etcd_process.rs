//! A real single-member etcd server started by tests (store conformance, controller leader
//! election, end to end): random free loopback ports, its own data directory, killed with
//! SIGKILL and restarted on the same data directory to test outages.
//!
//! [`EtcdProcess::start_secure`] runs etcd as production should: TLS, client certificates
//! required and etcd's authentication on (users `hawser` and `hawser-pw` may read and write
//! every key under `/`; `intruder` is a known user with no role; `root` sets it up).
//!
//! Tests must not silently pass without etcd, so a missing `etcd` binary is an error that
//! says how to install it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::etcd_pki::EtcdPki;
use crate::test_ports::free_loopback_port;
use hawser_store::EtcdConfig;

/// How long etcd gets to answer `/health` after a start.
pub const ETCD_START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running (or killed) etcd process of a test.
pub struct EtcdProcess {
    data_dir: PathBuf,
    log: PathBuf,
    client_port: u16,
    peer_port: u16,
    /// Serves `/health` over plain HTTP, whatever the client port asks of its clients.
    metrics_port: u16,
    child: Option<Child>,
    secure: Option<Secure>,
}

/// The certificates and the password user of a [`EtcdProcess::start_secure`] etcd.
struct Secure {
    pki: EtcdPki,
    password: String,
}

/// The user and role every Hawser client of a secure test etcd acts as.
pub const SECURE_USER: &str = "hawser";
/// The user that logs in with a password instead of a certificate.
pub const PASSWORD_USER: &str = "hawser-pw";
/// A user etcd knows that has no role: authenticated, and allowed nothing.
pub const NO_ROLE_USER: &str = "intruder";

impl EtcdProcess {
    /// Starts etcd with its data in `dir/etcd-data` and its log in `dir/etcd.log`, and waits
    /// until it is healthy.
    pub fn start(dir: &Path) -> Result<EtcdProcess, String> {
        let mut etcd = EtcdProcess::new(dir, None)?;
        etcd.restart()?;
        Ok(etcd)
    }

    /// Starts etcd with TLS on its client port, client certificates required, and
    /// authentication enabled (see the module documentation for its users).
    pub fn start_secure(dir: &Path) -> Result<EtcdProcess, String> {
        let pki = EtcdPki::create(&dir.join("etcd-pki"), &["root", SECURE_USER, NO_ROLE_USER])?;
        let password = format!("{:032x}", rand::random::<u128>());
        let mut etcd = EtcdProcess::new(dir, Some(Secure { pki, password }))?;
        etcd.restart()?;
        etcd.enable_auth()?;
        Ok(etcd)
    }

    fn new(dir: &Path, secure: Option<Secure>) -> Result<EtcdProcess, String> {
        Ok(EtcdProcess {
            data_dir: dir.join("etcd-data"),
            log: dir.join("etcd.log"),
            client_port: free_loopback_port()?,
            peer_port: free_loopback_port()?,
            metrics_port: free_loopback_port()?,
            child: None,
            secure,
        })
    }

    /// Creates the users and the role, then turns authentication on, as `root` (by its
    /// certificate) with `etcdctl`.
    fn enable_auth(&self) -> Result<(), String> {
        let secure = self.secure.as_ref().ok_or("not a secure etcd")?;
        let role_everything = ["role", "grant-permission", SECURE_USER, "--prefix=true"];
        let steps: Vec<Vec<&str>> = vec![
            vec!["user", "add", "root", "--no-password"],
            vec!["user", "grant-role", "root", "root"],
            vec!["role", "add", SECURE_USER],
            [&role_everything[..], &["readwrite", "/"]].concat(),
            vec!["user", "add", SECURE_USER, "--no-password"],
            vec!["user", "grant-role", SECURE_USER, SECURE_USER],
            vec!["user", "add", PASSWORD_USER, "--interactive=false"],
            vec!["user", "grant-role", PASSWORD_USER, SECURE_USER],
            vec!["user", "add", NO_ROLE_USER, "--no-password"],
            vec!["auth", "enable"],
        ];
        let (cert, key) = secure.pki.pair("root");
        for step in steps {
            let mut cmd = Command::new("etcdctl");
            cmd.env("ETCDCTL_API", "3")
                .arg(format!("--endpoints=https://{}", self.endpoint()))
                .arg(format!("--cacert={}", secure.pki.ca_file().display()))
                .arg(format!("--cert={}", cert.display()))
                .arg(format!("--key={}", key.display()))
                .args(&step)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd.spawn().map_err(|e| {
                format!("run etcdctl (apt-get install etcd-client, or `make deps`): {e}")
            })?;
            if let Some(mut stdin) = child.stdin.take() {
                // `user add --interactive=false` reads the password from stdin.
                let _ = writeln!(stdin, "{}", secure.password);
            }
            let out = child
                .wait_with_output()
                .map_err(|e| format!("etcdctl {step:?}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "etcdctl {step:?}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        Ok(())
    }

    /// The configuration of a client of this etcd under `prefix`: for a secure etcd, TLS
    /// with the certificate of `client` (a user's name) if given.
    pub fn client_config(&self, prefix: &str, client: Option<&str>) -> Result<EtcdConfig, String> {
        let cfg = EtcdConfig::parse(&self.store_url(prefix)).map_err(|e| e.to_string())?;
        match &self.secure {
            Some(s) => Ok(cfg.with_tls(s.pki.tls(client)?)),
            None => Ok(cfg),
        }
    }

    /// The password of [`PASSWORD_USER`] (secure etcd only).
    pub fn password(&self) -> Option<&str> {
        self.secure.as_ref().map(|s| s.password.as_str())
    }

    /// The certificates (secure etcd only).
    pub fn pki(&self) -> Option<&EtcdPki> {
        self.secure.as_ref().map(|s| &s.pki)
    }

    /// The `hawser controller` flags that reach this etcd as [`SECURE_USER`] (none for a
    /// plaintext etcd).
    pub fn controller_args(&self) -> Vec<String> {
        let Some(s) = &self.secure else {
            return Vec::new();
        };
        let (cert, key) = s.pki.pair(SECURE_USER);
        vec![
            format!("--etcd-ca-file={}", s.pki.ca_file().display()),
            format!("--etcd-cert-file={}", cert.display()),
            format!("--etcd-key-file={}", key.display()),
        ]
    }

    /// `host:port` of the client URL.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// `etcd://host:port/prefix` for `hawser controller --store`.
    pub fn store_url(&self, prefix: &str) -> String {
        format!("etcd://{}/{}", self.endpoint(), prefix.trim_matches('/'))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data directory (after [`Self::kill`]) and
    /// waits until it is healthy.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("open {}: {e}", self.log.display()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("dup {}: {e}", self.log.display()))?;
        let scheme = if self.secure.is_some() {
            "https"
        } else {
            "http"
        };
        let client = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new("etcd");
        if let Some(s) = &self.secure {
            let (cert, key) = s.pki.pair("server");
            cmd.arg(format!("--cert-file={}", cert.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--trusted-ca-file={}", s.pki.ca_file().display()))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.data_dir.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg(format!(
                "--listen-metrics-urls=http://127.0.0.1:{}",
                self.metrics_port
            ))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    "the `etcd` binary is not on PATH: install it (`apt-get install \
                     etcd-server`, or `make deps`); the etcd tests need a real etcd"
                        .to_string()
                } else {
                    format!("start etcd: {e}")
                }
            })?;
        self.child = Some(child);
        self.wait_healthy()
    }

    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + ETCD_START_TIMEOUT;
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(format!(
                        "etcd exited with {status} during start-up; log: {}",
                        self.log_tail()
                    ));
                }
            }
            if health(self.metrics_port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "etcd not healthy after {ETCD_START_TIMEOUT:?}; log: {}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The end of etcd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether etcd's `/health` (on its metrics port) says it is healthy (it has a raft leader).
fn health(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}
