//! "Hawser on Kubernetes", acceptance c (issue 15): failover end to end on a real control
//! plane (kube-apiserver, controller-manager, scheduler) with two real kubelets, node 2 in a
//! network namespace of its own (scripts/k8s/up.sh with HAWSER_K8S_NODES=2). The Hawser
//! controller keeps its state in the CRDs and runs the failover; each node runs an agent and
//! the CSI node plugin; the sidecars' work is done by `k8s_sidecars`.
//!
//! A StatefulSet pod on node 2 appends numbers to a file on a 2-replica Hawser volume, each
//! fsynced, and records every number once it is acknowledged (in a host directory). Node 2 then loses power: every
//! process in its namespace (kubelet, containerd, the pod, the agent with its engine, the
//! CSI plugin) is killed with SIGKILL and its link cut. The test prints when the failover
//! fenced the volume and deleted the pod, when the pod runs on node 1, and when it wrote its
//! first number there; requires the first write within 30 s of the fault; checks that every
//! number acknowledged on node 2 is in the file; and brings node 2's agent back to start the
//! old engine at its old epoch, whose writes the replicas refuse.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hawser_api::agent::{EngineReplica, StartEngine};
use hawser_api::controller::{Node, QuorumLoss, Volume};
use hawser_bench::cluster_figures::{self, FailoverFigure, Figure, Spread};
use hawser_e2e::cluster::{free_port, hawser_bin};
use hawser_e2e::k8s::{KubeCluster, CSI_DRIVER_OBJECT};
use hawser_e2e::k8s_sidecars::Sidecars;
use hawser_e2e::{
    run_ok, wait_until, CsiOptions, CsiProc, NbdConn, NbdTarget, TempDir, TokenFiles,
};

const NS: &str = "hawser-system";
/// The acceptance bound: the pod writes again on another node within this of the fault.
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

/// With the CSIDriver object ([`CSI_DRIVER_OBJECT`]).
const CLASS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: hawser-2r}
provisioner: csi.hawser.dev
parameters: {replicas: "2"}
reclaimPolicy: Delete
volumeBindingMode: Immediate
"#;

/// Appends n+1 after the last number in the file, fsyncs, then records `ack UID n` in the
/// test's ack log (a host directory: it outlives the pod, whose own log the kubelet removes
/// with it). At start it checks the file: `start UID have L` where lines 1..L are exactly 1..L.
const WRITER: &str = r#"
touch /data/log
L=$(awk 'BEGIN{n=0} $0==n+1 {n=$0; next} {exit} END{print n}' /data/log)
echo "start $POD_UID have $L" >> /acks/log
i=$L
while true; do
  i=$((i+1))
  echo "$i" | dd of=/data/log oflag=append conv=notrunc,fsync 2>/dev/null || { echo "write error at $i"; exit 1; }
  echo "ack $POD_UID $i" >> /acks/log
  sleep 0.05
done
"#;

fn statefulset(acks: &Path) -> String {
    let acks = acks.display();
    format!(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: writer, namespace: default}}
spec:
  replicas: 1
  serviceName: writer
  selector: {{matchLabels: {{app: writer}}}}
  template:
    metadata: {{labels: {{app: writer}}}}
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: hawser.local/busybox:1
        imagePullPolicy: Never
        command: ["sh", "-c", {WRITER:?}]
        env: [{{name: POD_UID, valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}}}]
        volumeMounts: [{{name: data, mountPath: /data}}, {{name: acks, mountPath: /acks}}]
      volumes: [{{name: acks, hostPath: {{path: {acks}, type: Directory}}}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: hawser-2r
      resources: {{requests: {{storage: 64Mi}}}}
"#
    )
}

/// A process of this test, SIGKILLed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(netns: Option<&str>, args: &[&str], log: &Path) -> Proc {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}")).arg(hawser_bin());
            c
        }
        None => Command::new(hawser_bin()),
    };
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open log");
    let err = out.try_clone().expect("clone log");
    let child = cmd
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn hawser");
    Proc(child)
}

/// The numbers the writer incarnation `uid` acknowledged, and what it found at its start.
fn acks(log: &str, uid: &str) -> (Vec<u64>, Option<u64>) {
    let mut acked = Vec::new();
    let mut have = None;
    for l in log.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["ack", u, n] if *u == uid => acked.extend(n.parse::<u64>().ok()),
            ["start", u, "have", n] if *u == uid => have = n.parse().ok(),
            _ => {}
        }
    }
    (acked, have)
}

struct Agent {
    proc: Proc,
    args: Vec<String>,
    netns: Option<String>,
    log: std::path::PathBuf,
}

impl Agent {
    fn start(netns: Option<&str>, args: Vec<String>, log: std::path::PathBuf) -> Agent {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        Agent {
            proc: spawn(netns, &a, &log),
            args,
            netns: netns.map(str::to_string),
            log,
        }
    }

    fn restart(&mut self) {
        let a: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.proc = spawn(self.netns.as_deref(), &a, &self.log);
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
}

/// How many power losses to run: 1 in `make test`, 10 in `make bench`.
fn trials() -> usize {
    std::env::var("HAWSER_FAILOVER_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

/// When each step of a failover was seen, from the fault.
struct Times {
    /// The fault, in Unix milliseconds (to line the components' logs up with it).
    fault_unix_ms: u128,
    fenced: Duration,
    deleted: Duration,
    running: Duration,
    first_write: Duration,
}

/// The writer pod's incarnations and the ack log they share.
struct Writers<'a> {
    k: &'a KubeCluster,
    acks: &'a Path,
}

impl Writers<'_> {
    fn uid(&self) -> String {
        self.k
            .get_json(&["pod", "writer-0"])
            .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
            .expect("writer pod")
    }

    /// What the incarnation `uid` acknowledged and found.
    fn acks(&self, uid: &str) -> (Vec<u64>, Option<u64>) {
        acks(&std::fs::read_to_string(self.acks).unwrap_or_default(), uid)
    }

    /// Waits until a writer other than `not_uid` runs on `node` and acknowledged 40 numbers.
    fn running_on(&self, node: &str, not_uid: Option<&str>) {
        wait_until(
            &format!("the writer to acknowledge writes on {node}"),
            Duration::from_secs(180),
            || {
                let Some(p) = self.k.get_json(&["pod", "writer-0"]) else {
                    return false;
                };
                let uid = p["metadata"]["uid"].as_str().unwrap_or_default();
                p["spec"]["nodeName"] == node
                    && Some(uid) != not_uid
                    && self.acks(uid).0.len() >= 40
            },
        );
    }

    /// Every number incarnation `old` acknowledged is in the file incarnation `new` found.
    fn kept(&self, old: &str, new: &str) {
        let (acked, _) = self.acks(old);
        let last = *acked.iter().max().expect("acknowledged writes");
        let have = self
            .acks(new)
            .1
            .unwrap_or_else(|| panic!("no start line from the writer {new}"));
        eprintln!("acknowledged 1..={last}; the next writer found 1..={have}");
        assert!(
            have >= last,
            "acknowledged writes lost: {last} acknowledged, the file holds 1..={have}"
        );
    }
}

/// Cuts node 2's power (SIGKILL to every process in its namespace, link down) and waits
/// until the writer runs and writes on node 1.
fn power_loss(
    w: &Writers,
    k: &KubeCluster,
    netns2: &str,
    node1: &str,
    old_uid: &str,
    old_epoch: u64,
    show: &dyn Fn() -> Volume,
) -> Times {
    let fault = Instant::now();
    let fault_unix_ms = now_ms();
    let pids = run_ok("ip", &["netns", "pids", netns2]);
    for pid in pids.split_whitespace() {
        // One may have exited since the listing (a short-lived child): nothing to say.
        let _ = Command::new("kill")
            .args(["-9", pid])
            .stderr(Stdio::null())
            .status();
    }
    run_ok("ip", &["link", "set", "hawserk8s2", "down"]);
    let (mut fenced, mut deleted, mut running) = (None, None, None);
    let mut new_uid = String::new();
    wait_until("the writer to run on node 1", FAILOVER_BOUND, || {
        if fenced.is_none() && show().epoch > old_epoch {
            fenced = Some(fault.elapsed());
        }
        let p = k.get_json(&["pod", "writer-0"]);
        let uid = p
            .as_ref()
            .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string));
        if deleted.is_none() && uid.as_deref() != Some(old_uid) {
            deleted = Some(fault.elapsed());
        }
        let on1 =
            p.is_some_and(|p| p["spec"]["nodeName"] == node1 && p["status"]["phase"] == "Running");
        if on1 && running.is_none() {
            running = Some(fault.elapsed());
            new_uid = uid.unwrap_or_default();
        }
        running.is_some()
    });
    let mut first_write = None;
    wait_until("the first write on node 1", FAILOVER_BOUND, || {
        if !w.acks(&new_uid).0.is_empty() {
            first_write = Some(fault.elapsed());
        }
        first_write.is_some()
    });
    Times {
        fault_unix_ms,
        fenced: fenced.expect("fenced before the pod moved"),
        deleted: deleted.expect("old pod deleted"),
        running: running.expect("running"),
        first_write: first_write.expect("first write"),
    }
}

#[test]
fn a_statefulset_pod_moves_off_a_dead_node_and_keeps_every_acknowledged_write() {
    let dir = TempDir::new("k8sfailover");
    let k = KubeCluster::up_nodes(&dir.path().join("k8s"), 2);
    let env = |key: &str| {
        k.env
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing"))
            .clone()
    };
    let (node1, node2) = (k.node.clone(), env("K8S_NODE2"));
    let (ip1, ip2, netns2) = (env("NODE_IP"), env("NODE2_IP"), env("NODE2_NETNS"));
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/hawser/crds");
    k.kubectl_ok(&["apply", "-f", &crds.display().to_string()]);
    k.kubectl_ok(&["create", "namespace", NS]);
    k.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd",
        "-l",
        "app.kubernetes.io/part-of=hawser",
    ]);

    // The Hawser controller on node 1's address, its state in the CRDs.
    let tokens = TokenFiles::seed(dir.path());
    let url = format!("https://{ip1}:{}", free_port());
    let store = format!("k8s://{NS}?kubeconfig={}", k.kubeconfig().display());
    let cdir = dir.path().join("controller");
    tokens.install_ca(&cdir);
    let _controller = spawn(
        None,
        &[
            "controller",
            "--listen",
            url.trim_start_matches("https://"),
            "--advertise-url",
            &url,
            "--data-dir",
            &cdir.display().to_string(),
            "--store",
            &store,
            "--admin-token-file",
            &tokens.admin.display().to_string(),
            "--agent-token-file",
            &tokens.agent.display().to_string(),
        ],
        &dir.path().join("controller.log"),
    );
    // An agent per node, named as its Kubernetes node.
    let agent_args = |node: &str, ip: &str| -> Vec<String> {
        let data = dir.path().join(node);
        [
            "agent",
            "--node",
            node,
            "--controller",
            &url,
            "--admin-listen",
            &format!("{ip}:{}", free_port()),
            "--replica-listen",
            &format!("{ip}:{}", free_port()),
            "--nbd-listen",
            "none",
            "--data-dir",
            &data.display().to_string(),
            "--join-token-file",
            &tokens.join.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let ca = tokens.ca_file.display().to_string();
    let cli = |args: &[&str]| -> String {
        let admin = tokens.admin.display().to_string();
        let mut a = vec![
            "--controller",
            url.as_str(),
            "--ca-file",
            &ca,
            "--token-file",
        ];
        a.push(&admin);
        a.extend_from_slice(args);
        run_ok(&hawser_bin().display().to_string(), &a)
    };
    wait_until("the controller to serve", Duration::from_secs(60), || {
        Command::new(hawser_bin())
            .args(["--controller", &url, "--ca-file", &ca, "--token-file"])
            .arg(&tokens.admin)
            .args(["node", "list"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let join = cli(&["cluster", "join-token", "--uses", "2"]);
    std::fs::write(&tokens.join, join.trim()).expect("write the join token");
    let _agent1 = Agent::start(
        None,
        agent_args(&node1, &ip1),
        dir.path().join("agent1.log"),
    );
    let mut agent2 = Agent::start(
        Some(&netns2),
        agent_args(&node2, &ip2),
        dir.path().join("agent2.log"),
    );
    wait_until("both agents to register", Duration::from_secs(60), || {
        let out = Command::new(hawser_bin())
            .args(["--controller", &url, "--ca-file", &ca, "--token-file"])
            .arg(&tokens.admin)
            .args(["node", "list", "-o", "json"])
            .output()
            .expect("run hawser");
        serde_json::from_slice::<Vec<Node>>(&out.stdout).is_ok_and(|n| n.len() == 2)
    });

    // The CSI node plugin of each node, registered with its kubelet; the controller plugin.
    let kubelet2 = std::path::PathBuf::from(env("KUBELET2_ROOT"));
    let _csi1 = CsiProc::start_for(
        &url,
        &tokens.admin,
        &node1,
        &dir.path().join("csi-node1"),
        CsiOptions {
            mode: "node",
            kubelet_dir: Some(k.kubelet_root.clone()),
            endpoint: Some(k.kubelet_root.join("plugins/csi.hawser.dev/csi.sock")),
            register: true,
            netns: None,
            ca_file: Some(tokens.ca_file.clone()),
            node_identity: None,
            ..CsiOptions::default()
        },
    );
    let mut csi2 = CsiProc::start_for(
        &url,
        &tokens.admin,
        &node2,
        &dir.path().join("csi-node2"),
        CsiOptions {
            mode: "node",
            kubelet_dir: Some(kubelet2.clone()),
            endpoint: Some(kubelet2.join("plugins/csi.hawser.dev/csi.sock")),
            register: true,
            netns: Some(netns2.clone()),
            ca_file: Some(tokens.ca_file.clone()),
            node_identity: None,
            ..CsiOptions::default()
        },
    );
    let ctl = CsiProc::start_for(
        &url,
        &tokens.admin,
        &node1,
        &dir.path().join("csi-controller"),
        CsiOptions {
            mode: "controller",
            ca_file: Some(tokens.ca_file.clone()),
            ..Default::default()
        },
    );
    for node in [&node1, &node2] {
        wait_until(
            &format!("{node}'s kubelet to register the driver"),
            Duration::from_secs(60),
            || {
                k.get_json(&["csinode", node]).is_some_and(|n| {
                    n["spec"]["drivers"]
                        .as_array()
                        .is_some_and(|d| d.iter().any(|d| d["name"] == "csi.hawser.dev"))
                })
            },
        );
    }
    k.apply(CSI_DRIVER_OBJECT);
    k.apply(CLASS);
    let sidecars = Sidecars::start(k.kube.clone(), ctl.endpoint.clone());

    // The writer starts on node 2 (node 1 cordoned meanwhile).
    k.kubectl_ok(&["cordon", &node1]);
    let acks_dir = dir.path().join("acks");
    std::fs::create_dir_all(&acks_dir).expect("create the ack directory");
    k.apply(&statefulset(&acks_dir));
    let ack_log = acks_dir.join("log");
    let w = Writers {
        k: &k,
        acks: &ack_log,
    };
    w.running_on(&node2, None);
    k.kubectl_ok(&["uncordon", &node1]);
    let pv = k
        .get_json(&["pvc", "data-writer-0"])
        .and_then(|p| p["spec"]["volumeName"].as_str().map(str::to_string))
        .expect("bound PVC");
    let show = || -> Volume {
        serde_json::from_str(&cli(&["volume", "show", &pv, "-o", "json"])).expect("volume JSON")
    };
    let trials = trials();
    let mut results = Vec::new();
    let mut volume = show();
    for trial in 1..=trials {
        volume = show();
        assert_eq!(volume.attached_node.as_deref(), Some(node2.as_str()));
        assert_eq!(volume.replicas.len(), 2);
        let old_uid = w.uid();
        let t = power_loss(&w, &k, &netns2, &node1, &old_uid, volume.epoch, &show);
        eprintln!(
            "trial {trial}: fenced {:.1} s, old pod deleted {:.1} s, new pod running {:.1} s, \
             first write {:.1} s after the fault (at Unix ms {})",
            t.fenced.as_secs_f64(),
            t.deleted.as_secs_f64(),
            t.running.as_secs_f64(),
            t.first_write.as_secs_f64(),
            t.fault_unix_ms
        );
        assert!(
            t.first_write < FAILOVER_BOUND,
            "writing again {:?} after the fault",
            t.first_write
        );
        // Every number acknowledged on node 2 is in the file the new pod found.
        w.kept(&old_uid, &w.uid());
        results.push(t);
        if trial == trials {
            break;
        }
        // Node 2 boots again; the pod goes back to it (node 1 cordoned, the pod deleted).
        run_ok("ip", &["link", "set", "hawserk8s2", "up"]);
        run_ok("bash", &[&env("NODE2_POWER_ON")]);
        let booted_ms = now_ms();
        agent2.restart();
        wait_until(
            "node 2's agent to register again",
            Duration::from_secs(60),
            || {
                serde_json::from_str::<Vec<Node>>(&cli(&["node", "list", "-o", "json"])).is_ok_and(
                    |n| {
                        n.iter()
                            .any(|n| n.name == node2 && u128::from(n.last_seen_ms) > booted_ms)
                    },
                )
            },
        );
        csi2.restart();
        wait_until(
            "node 2 to be Ready and untainted",
            Duration::from_secs(120),
            || {
                k.get_json(&["node", &node2]).is_some_and(|n| {
                    let ready = n["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    });
                    let tainted = n["spec"]["taints"].as_array().is_some_and(|t| {
                        t.iter().any(|t| t["key"] == "hawser.dev/agent-unreachable")
                    });
                    ready && !tainted
                })
            },
        );
        let on1 = w.uid();
        k.kubectl_ok(&["cordon", &node1]);
        k.kubectl_ok(&["delete", "pod", "writer-0", "--wait=false"]);
        w.running_on(&node2, Some(&on1));
        k.kubectl_ok(&["uncordon", &node1]);
        w.kept(&on1, &w.uid());
    }
    let median = |f: fn(&Times) -> Duration| {
        let mut v: Vec<f64> = results.iter().map(|t| f(t).as_secs_f64()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n.is_multiple_of(2) {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        } else {
            v[n / 2]
        };
        (median, v[n - 1])
    };
    // up.sh's setting (Kubernetes' default 10 s unless told): a kubelet mounts an attached
    // volume only after its node status listed it in use, so the figure depends on it.
    let status_secs =
        std::env::var("HAWSER_KUBELET_STATUS_SECS").unwrap_or_else(|_| "10".to_string());
    let (ha_med, ha_max) = median(|t| t.deleted);
    let (w_med, w_max) = median(|t| t.first_write);
    println!(
        "failover: {trials} trial(s), kubelet nodeStatusUpdateFrequency {status_secs} s, fault to \
         first write on the other node: median {w_med:.1} s, worst {w_max:.1} s; fault to pod deleted (Hawser's part): median {ha_med:.1} s, worst \
         {ha_max:.1} s. Published: Piraeus ha-controller ~10 s (no epoch fencing), Longhorn \
         1-7 min, Rook/Ceph RBD 7-30 min (manual taints)"
    );
    let figure = Figure::Failover(FailoverFigure {
        trials: trials as u64,
        kubelet_status_secs: status_secs.parse().unwrap_or(0),
        first_write_s: Spread {
            median: w_med,
            worst: w_max,
        },
        pod_deleted_s: Spread {
            median: ha_med,
            worst: ha_max,
        },
    });
    cluster_figures::record(&figure).expect("record the figure for make bench's charts");
    let old_epoch = volume.epoch;

    // The old engine comes back (node 2's agent restarts, its link is up) at its old epoch:
    // the replicas refuse it, and a write through it fails.
    run_ok("ip", &["link", "set", "hawserk8s2", "up"]);
    let restarted_ms = now_ms();
    agent2.restart();
    let mut nodes: Vec<Node> = Vec::new();
    wait_until(
        "node 2's agent to register again",
        Duration::from_secs(30),
        || {
            nodes = serde_json::from_str(&cli(&["node", "list", "-o", "json"])).expect("nodes");
            nodes
                .iter()
                .any(|n| n.name == node2 && u128::from(n.last_seen_ms) > restarted_ms)
        },
    );
    let addr_of = |n: &str| {
        nodes
            .iter()
            .find(|x| x.name == n)
            .map(|x| x.replica_addr.clone())
            .expect("node")
    };
    let admin2 = nodes
        .iter()
        .find(|n| n.name == node2)
        .expect("node 2")
        .admin_addr
        .clone();
    let start = StartEngine {
        volume: pv.clone(),
        size_bytes: volume.size_bytes,
        epoch: old_epoch,
        replicas: volume
            .replicas
            .iter()
            .map(|r| EngineReplica {
                replica_id: r.id.clone(),
                node: r.node.clone(),
                replica_addr: addr_of(&r.node),
                state: hawser_api::controller::ReplicaState::InSync,
                blank: false,
            })
            .collect(),
        controller_url: url.clone(),
        on_quorum_loss: QuorumLoss::default(),
        export: true,
        grant: None,
        qos: Default::default(),
        data_key: None,
        uid: None,
    };
    let resp = tokens
        .http(hawser_tls::Peer::Node(node2.clone()))
        .post(format!("https://{admin2}/v1/engines"))
        .json(&start)
        .send()
        .expect("start the old engine");
    let status = resp.status();
    let body = resp.text().unwrap_or_default();
    eprintln!("old engine at epoch {old_epoch}: start answered {status}: {body}");
    if !status.is_success() {
        assert!(
            body.to_lowercase().contains("epoch"),
            "the old engine failed to start, but not for its epoch: {body}"
        );
    } else {
        let socket = dir.path().join(&node2).join("nbd.sock");
        let target = NbdTarget {
            socket,
            export: pv.clone(),
        };
        let result = NbdConn::connect(&target).and_then(|mut c| c.write_at(0, &[0xee; 4096]));
        assert!(
            result.is_err(),
            "the old engine acknowledged a write at epoch {old_epoch}"
        );
        eprintln!("old engine's write refused: {:?}", result.err());
    }
    let after = show();
    assert_eq!(after.attached_node.as_deref(), Some(node1.as_str()));
    assert!(after.epoch > old_epoch + 1, "{after:?}");

    k.kubectl_ok(&["delete", "statefulset", "writer", "--wait=false"]);
    drop(sidecars);
    drop(csi2);
    let d = dir.path();
    keep_logs(&[
        d,
        &d.join("k8s/logs"),
        &d.join("csi-node1"),
        &d.join("csi-node2"),
        &d.join("csi-controller"),
    ]);
}

/// With `HAWSER_FAILOVER_LOGS=<dir>`, copies every component's log there (Hawser's, the
/// kubelets', the control plane's), to profile where a failover's time goes against the
/// faults' times the trials print.
fn keep_logs(from: &[&Path]) {
    let Some(to) = std::env::var_os("HAWSER_FAILOVER_LOGS") else {
        return;
    };
    let to = Path::new(&to);
    std::fs::create_dir_all(to).expect("create HAWSER_FAILOVER_LOGS");
    for dir in from {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "log") {
                let name = path.file_name().expect("a file name").to_string_lossy();
                let from = dir.file_name().expect("a directory name").to_string_lossy();
                std::fs::copy(&path, to.join(format!("{from}-{name}"))).expect("copy a log");
            }
        }
    }
}
