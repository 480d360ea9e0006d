//! A real Kubernetes for tests: `scripts/k8s/up.sh` starts etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, containerd and one kubelet on this machine; the
//! guard runs `scripts/k8s/down.sh` when dropped (also when the test fails). `kubectl` runs
//! against it with the admin kubeconfig.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::run::wait_until;

fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/k8s")
}

pub struct KubeCluster {
    state: PathBuf,
    /// What up.sh wrote to `<state>/env`.
    pub env: HashMap<String, String>,
    /// The kubelet's `--root-dir` (the CSI node service's `--kubelet-dir`).
    pub kubelet_root: PathBuf,
    /// The Kubernetes node's name.
    pub node: String,
    pub kube: Kubectl,
}

/// kubectl with the cluster's admin kubeconfig; cheap to clone into another thread.
#[derive(Clone, Debug)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    /// The kubelet's `podLogsDir`: container logs are read from there, since `kubectl logs`
    /// would need the node to have an address the apiserver can reach, and a kubelet on
    /// loopback has none (Kubernetes refuses a loopback node IP).
    pod_logs: PathBuf,
}

/// The stdout lines of a CRI container log (`<time> <stream> <P|F> <text>` per line; `P`
/// is a partial line continued on the next one).
pub fn cri_stdout(log: &str) -> String {
    let mut out = String::new();
    for line in log.lines() {
        let mut f = line.splitn(4, ' ');
        let (_, stream, tag, text) = (f.next(), f.next(), f.next(), f.next().unwrap_or(""));
        if stream == Some("stdout") {
            out.push_str(text);
            if tag != Some("P") {
                out.push('\n');
            }
        }
    }
    out
}

impl std::ops::Deref for KubeCluster {
    type Target = Kubectl;
    fn deref(&self) -> &Kubectl {
        &self.kube
    }
}

/// `KEY=value` lines (values optionally quoted), as up.sh writes them.
fn parse_env(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("export ").or(Some(l.trim())))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                k.to_string(),
                v.trim_matches(|c| c == '"' || c == '\'').to_string(),
            )
        })
        .collect()
}

impl KubeCluster {
    /// Starts the cluster in `state` (a fresh directory); panics with up.sh's output if it
    /// cannot.
    pub fn up(state: &Path) -> KubeCluster {
        Self::up_nodes(state, 1)
    }

    /// With `nodes` = 2, node 2 runs in its own network namespace (see up.sh).
    pub fn up_nodes(state: &Path, nodes: u32) -> KubeCluster {
        std::fs::create_dir_all(state).expect("create k8s state dir");
        let out = Command::new("bash")
            .arg(scripts_dir().join("up.sh"))
            .arg(state)
            .env("HAWSER_K8S_NODES", nodes.to_string())
            .output()
            .expect("run scripts/k8s/up.sh");
        if !out.status.success() {
            let _ = Command::new("bash")
                .arg(scripts_dir().join("down.sh"))
                .arg(state)
                .output();
            panic!(
                "scripts/k8s/up.sh failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let env = parse_env(&std::fs::read_to_string(state.join("env")).expect("read env"));
        let get = |k: &str| {
            env.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("{k} missing from {}/env", state.display()))
        };
        KubeCluster {
            state: state.to_path_buf(),
            kubelet_root: PathBuf::from(get("KUBELET_ROOT")),
            node: get("K8S_NODE"),
            kube: Kubectl {
                bin: PathBuf::from(get("K8S_BIN")).join("kubectl"),
                kubeconfig: state.join("admin.kubeconfig"),
                pod_logs: state.join("pod-logs"),
            },
            env,
        }
    }
}

impl Kubectl {
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubelet's pod log directory (node 1's).
    pub fn pod_logs_dir(&self) -> PathBuf {
        self.pod_logs.clone()
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// `kubectl get <kinds> --watch-only -o name` as a child whose stdout gets a line per
    /// change: what lets a loop wake on a change instead of at its next poll.
    pub fn watch(&self, kinds: &str) -> std::io::Result<std::process::Child> {
        Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["get", kinds, "-A", "--watch-only", "-o", "name"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
    }

    /// Runs kubectl and requires success; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) {
        use std::io::Write;
        let mut child = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl apply");
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(yaml.as_bytes()).expect("write manifest");
        }
        let out = child.wait_with_output().expect("wait for kubectl apply");
        assert!(
            out.status.success(),
            "kubectl apply failed: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kubectl get ... -o json`, parsed; `None` when kubectl fails (not found).
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut a: Vec<&str> = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl(&a);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Waits at most `timeout` for pod `name` to finish; returns its phase (whatever it is
    /// then, so the caller can say more than "timed out": `describe` tells why a pod never
    /// ran) and its stdout.
    pub fn wait_pod_done(&self, name: &str, timeout: Duration) -> (String, String) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let phase = self
                .get_json(&["pod", name])
                .and_then(|p| p["status"]["phase"].as_str().map(str::to_string))
                .unwrap_or_default();
            let done = phase == "Succeeded" || phase == "Failed";
            if done || std::time::Instant::now() >= deadline {
                return (phase, self.pod_stdout(name));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What pod `name` (namespace default, container `c`) wrote to stdout.
    pub fn pod_stdout(&self, name: &str) -> String {
        pod_stdout_in(&self.pod_logs, name)
    }

    /// Deletes pod `name` and waits until it is gone (its volumes unpublished).
    pub fn delete_pod(&self, name: &str, timeout: Duration) {
        self.kubectl(&["delete", "pod", name, "--wait=false"]);
        wait_until(&format!("pod {name} to be gone"), timeout, || {
            self.get_json(&["pod", name]).is_none()
        });
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for log in ["kubelet", "kube-controller-manager", "containerd"] {
                let text =
                    std::fs::read_to_string(self.state.join("logs").join(format!("{log}.log")))
                        .unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(25).collect();
                eprintln!("--- last lines of {log}.log ---");
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        let out = Command::new("bash")
            .arg(scripts_dir().join("down.sh"))
            .arg(&self.state)
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "scripts/k8s/down.sh failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("run scripts/k8s/down.sh: {e}"),
        }
    }
}

/// What every pod `name` of namespace default (container `c`) wrote to stdout, from a
/// kubelet's pod log directory (every incarnation: each has its own directory).
pub fn pod_stdout_in(pod_logs: &Path, name: &str) -> String {
    let prefix = format!("default_{name}_");
    let Ok(dirs) = std::fs::read_dir(pod_logs) else {
        return String::new();
    };
    let mut out = String::new();
    for d in dirs.filter_map(Result::ok) {
        if !d.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let log = std::fs::read_to_string(d.path().join("c").join("0.log")).unwrap_or_default();
        out.push_str(&cri_stdout(&log));
    }
    out
}

/// The CSIDriver object of Hawser as the chart makes it (tests that do not install the chart
/// apply this).
pub const CSI_DRIVER_OBJECT: &str = r#"
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: csi.hawser.dev}
spec:
  attachRequired: true
  podInfoOnMount: false
  volumeLifecycleModes: [Persistent]
  fsGroupPolicy: File
"#;

/// A Kubernetes quantity (`64Mi`, `1Gi`, `1000000`, `1G`) in bytes.
pub fn quantity_bytes(q: &str) -> Option<u64> {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_env_parse() {
        assert_eq!(quantity_bytes("64Mi"), Some(64 << 20));
        assert_eq!(quantity_bytes("1G"), Some(1_000_000_000));
        assert_eq!(quantity_bytes("4096"), Some(4096));
        assert_eq!(quantity_bytes("1.5Gi"), None);
        let log = "t stdout F a\nt stderr F b\nt stdout P c\nt stdout F d e\n";
        assert_eq!(cri_stdout(log), "a\ncd e\n");
        let env = parse_env("export KUBECONFIG=/a/b\nK8S_NODE=\"n\"\n");
        assert_eq!(env["KUBECONFIG"], "/a/b");
        assert_eq!(env["K8S_NODE"], "n");
    }
}
