//! A real S3 server for the backup tests: SeaweedFS's S3 gateway (built by
//! `scripts/s3/build.sh` into the Kubernetes tools' cache), on loopback ports, with one access
//! key, so a request without it is refused. Faults: [`S3Server::kill`] (down),
//! [`S3Server::pause`] (hangs), [`S3Server::throttle`] (503 SlowDown, from SeaweedFS's own
//! circuit breaker), its data directory (corrupt a block, fill the disk).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cluster::free_port;
use crate::run::wait_until;

pub const ACCESS_KEY: &str = "AKHAWSERTEST";
pub const SECRET_KEY: &str = "sk-hawser-test-secret";

pub struct S3Server {
    child: Option<Child>,
    dir: PathBuf,
    pub port: u16,
    filer_port: u16,
    /// `host:port.grpcport` of the master and the filer, as `weed shell` takes them.
    master: String,
    filer: String,
    metrics_port: u16,
    pub bucket: String,
    /// The unix sockets weed makes for its own gRPC services, at paths it fixes in /tmp
    /// (`weed/command/server.go`) and leaves behind: removed on drop.
    grpc_sockets: [PathBuf; 4],
}

impl S3Server {
    /// Starts the server with its data in `dir/data` and makes bucket `bucket`.
    pub fn start(dir: &Path, bucket: &str) -> S3Server {
        let weed = crate::k8s_tool("weed");
        let data = dir.join("data");
        std::fs::create_dir_all(&data).expect("s3 data dir");
        let identities = serde_json::json!({"identities": [{
            "name": "hawser",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]});
        let config = dir.join("s3-identities.json");
        std::fs::write(&config, identities.to_string()).expect("s3 identities");
        let (s3, filer, metrics) = (free_port(), free_port(), free_port());
        let (master_port, master_grpc, filer_grpc) = (free_port(), free_port(), free_port());
        let (volume_grpc, s3_grpc) = (free_port(), free_port());
        let flag = |k: &str, v: String| format!("-{k}={v}");
        let args = vec![
            // Its log files in its directory, not the system's temp directory.
            flag("logdir", dir.display().to_string()),
            "server".to_owned(),
            flag("dir", data.display().to_string()),
            flag("ip", "127.0.0.1".into()),
            flag("ip.bind", "127.0.0.1".into()),
            // No statistics leave the machine.
            flag("master.telemetry", "false".into()),
            // Prometheus metrics on loopback: what the S3 gateway received, per bucket.
            flag("metricsPort", metrics.to_string()),
            flag("master.port", master_port.to_string()),
            flag("master.port.grpc", master_grpc.to_string()),
            flag("volume.port", free_port().to_string()),
            flag("volume.port.grpc", volume_grpc.to_string()),
            flag("volume.preStopSeconds", "0".into()),
            flag("filer.port", filer.to_string()),
            flag("filer.port.grpc", filer_grpc.to_string()),
            flag(
                "filer.localSocket",
                dir.join("filer.sock").display().to_string(),
            ),
            "-s3".to_owned(),
            flag("s3.port", s3.to_string()),
            flag("s3.port.grpc", s3_grpc.to_string()),
            flag("s3.port.iceberg", "0".into()),
            flag("s3.port.lance", "0".into()),
            flag("s3.localSocket", dir.join("s3.sock").display().to_string()),
            flag("s3.config", config.display().to_string()),
        ];
        let log = std::fs::File::create(dir.join("weed.log")).expect("weed log");
        let child = Command::new(weed)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start weed");
        let mut server = S3Server {
            child: Some(child),
            dir: dir.to_owned(),
            port: s3,
            filer_port: filer,
            master: format!("127.0.0.1:{master_port}.{master_grpc}"),
            filer: format!("127.0.0.1:{filer}.{filer_grpc}"),
            metrics_port: metrics,
            bucket: bucket.to_owned(),
            grpc_sockets: [
                ("master", master_grpc),
                ("volume", volume_grpc),
                ("filer", filer_grpc),
                ("s3", s3_grpc),
            ]
            .map(|(name, port)| PathBuf::from(format!("/tmp/seaweedfs-{name}-grpc-{port}.sock"))),
        };
        server.wait_serving();
        // The filer makes a bucket as a folder under /buckets (no signed request needed).
        let url = format!("http://127.0.0.1:{filer}/buckets/{bucket}/");
        wait_until(
            "the s3 server's filer makes the bucket",
            Duration::from_secs(60),
            || {
                reqwest::blocking::Client::new()
                    .post(&url)
                    .send()
                    .is_ok_and(|r| r.status().is_success())
            },
        );
        server
    }

    fn wait_serving(&mut self) {
        let url = self.endpoint();
        let log = self.dir.join("weed.log");
        wait_until("the s3 server to answer", Duration::from_secs(90), || {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("weed exited ({st}); its log:\n{tail}");
            }
            reqwest::blocking::get(&url).is_ok()
        });
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Where its data lives (volume files: corrupt them or fill their disk).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A credentials file for `hawser backup target add --credentials-file` (mode 0600).
    pub fn credentials_file(&self) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir.join("s3-credentials");
        let body = format!("access_key_id = {ACCESS_KEY}\nsecret_access_key = {SECRET_KEY}\n");
        std::fs::write(&p, body).expect("credentials file");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        p
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// kill -9: the server is down.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP: the server hangs (connections accepted by the kernel, never answered).
    pub fn pause(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    pub fn resume(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    /// Runs `commands` (`;`-separated) in `weed shell` against this server, as an operator
    /// would; panics with its output unless it succeeds. Returns what it printed.
    pub fn shell(&self, commands: &str) -> String {
        use std::io::Write;
        let weed = crate::k8s_tool("weed");
        let mut child = Command::new(weed)
            .args(["shell", &format!("-master={}", self.master)])
            .arg(format!("-filer={}", self.filer))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start weed shell");
        let mut stdin = child.stdin.take().expect("weed shell stdin");
        stdin
            .write_all(format!("{commands}\n").as_bytes())
            .expect("write to weed shell");
        drop(stdin);
        let out = child.wait_with_output().expect("run weed shell");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "weed shell {commands:?}: {text}");
        text
    }

    /// SeaweedFS's S3 circuit breaker (`s3.circuitBreaker`): while on, every read and write
    /// is over a limit of 0 simultaneous requests and answered `503 SlowDown`, as a store
    /// that throttles does. The gateway applies it when the filer tells it of the change
    /// (within a second): wait on a request's answer, not on this call.
    pub fn throttle(&self, on: bool) {
        let cmd = if on {
            "s3.circuitBreaker -global -type Count -actions Read,Write -values 0,0 -apply"
        } else {
            "s3.circuitBreaker -delete -apply"
        };
        self.shell(cmd);
    }

    /// The bytes the S3 gateway has received from clients into the bucket, as the server
    /// counts them (its `SeaweedFS_s3_bucket_traffic_received_bytes_total`).
    pub fn received_bytes(&self) -> u64 {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        let body = reqwest::blocking::get(&url)
            .and_then(|r| r.text())
            .unwrap_or_else(|e| panic!("scrape {url}: {e}"));
        let series = format!(
            "SeaweedFS_s3_bucket_traffic_received_bytes_total{{bucket=\"{}\"}} ",
            self.bucket
        );
        let value = body
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        // Prometheus writes counters as floats: a byte count, far below 2^53 and never
        // negative here.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let bytes = value.round() as u64;
        bytes
    }

    /// `hawser backup target add NAME --s3 ...` on cluster `c`: this server's bucket, under
    /// `prefix` ("" for none), with its access key.
    pub fn add_to(&self, c: &crate::cluster::Cluster, name: &str, prefix: &str) {
        let (endpoint, creds) = (self.endpoint(), self.credentials_file());
        let creds = creds.display().to_string();
        let mut args = vec!["backup", "target", "add", name, "--s3", &endpoint];
        args.extend(["--bucket", &self.bucket, "--credentials-file", &creds]);
        if !prefix.is_empty() {
            args.extend(["--prefix", prefix]);
        }
        c.cli_ok(&args);
    }

    /// The target [`S3Server::add_to`] added, opened here as a node opens it, its requests
    /// retried for `retry_secs`.
    pub fn target(&self, name: &str, prefix: &str, retry_secs: u64) -> hawser_backup::Target {
        let spec = hawser_backup::TargetSpec::S3 {
            endpoint: self.endpoint(),
            bucket: self.bucket.clone(),
            prefix: prefix.into(),
            region: None,
        };
        let key = hawser_backup::S3Credentials {
            access_key_id: ACCESS_KEY.into(),
            secret_access_key: SECRET_KEY.into(),
        };
        hawser_backup::Target::open_with(name, &spec, Some(&key), retry_secs)
            .expect("open the target")
    }

    /// The filer's port (an unsigned HTTP API onto the same files, for tests that look).
    pub fn filer_port(&self) -> u16 {
        self.filer_port
    }
}

fn signal(pid: u32, sig: i32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    if pid > 0 {
        // SAFETY: kill(2) on a child this fixture started and has not reaped.
        unsafe { libc::kill(pid, sig) };
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        for s in &self.grpc_sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}
