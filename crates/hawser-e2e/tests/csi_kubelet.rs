//! "Kubernetes CSI driver", acceptance b: a real kube-apiserver, controller-manager,
//! scheduler and kubelet (v1.33, built by scripts/k8s/build.sh) with containerd use Hawser
//! through its CSI driver. The node service registers itself with the kubelet; the sidecars'
//! work (provision, attach, resize) is done by `k8s_sidecars` over the CSI Controller service,
//! since their images cannot be pulled here. With a StorageClass for 2-replica volumes:
//! files written by a pod to an ext4 PVC are read back by a new pod; the same on xfs; a raw
//! block PVC is written and read by pods; an expanded PVC shows the larger filesystem to the
//! next pod; a deleted PVC's replicas are gone from the pools.

use std::time::{Duration, Instant};

use hawser_e2e::k8s::{quantity_bytes, KubeCluster, CSI_DRIVER_OBJECT};
use hawser_e2e::k8s_sidecars::Sidecars;
use hawser_e2e::{wait_until, Cluster, CsiOptions, CsiProc};

const IMAGE: &str = "hawser.local/busybox:1";
const POD_TIMEOUT: Duration = Duration::from_secs(120);

/// With the CSIDriver object ([`CSI_DRIVER_OBJECT`]).
const DRIVER_AND_CLASSES: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: hawser-2r}
provisioner: csi.hawser.dev
parameters: {replicas: "2"}
reclaimPolicy: Delete
allowVolumeExpansion: true
volumeBindingMode: Immediate
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: hawser-2r-xfs}
provisioner: csi.hawser.dev
parameters: {replicas: "2", csi.storage.k8s.io/fstype: xfs}
reclaimPolicy: Delete
allowVolumeExpansion: true
volumeBindingMode: Immediate
"#;

fn pvc(name: &str, class: &str, size: &str, block: bool) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {class}
  volumeMode: {}
  resources: {{requests: {{storage: {size}}}}}
"#,
        if block { "Block" } else { "Filesystem" }
    )
}

/// A pod that runs `script` once with the PVC at /data (or as /dev/xvda for a block PVC).
fn pod(name: &str, claim: &str, block: bool, script: &str) -> String {
    let attach = if block {
        "volumeDevices: [{name: v, devicePath: /dev/xvda}]"
    } else {
        "volumeMounts: [{name: v, mountPath: /data}]"
    };
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  # No pod network: nothing here talks to anything.
  hostNetwork: true
  containers:
  - name: c
    image: {IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", {script:?}]
    {attach}
  volumes: [{{name: v, persistentVolumeClaim: {{claimName: {claim}}}}}]
"#
    )
}

/// Runs a pod to completion, requires success, deletes it; returns its logs.
fn run_pod(k: &KubeCluster, name: &str, claim: &str, block: bool, script: &str) -> String {
    let start = Instant::now();
    k.apply(&pod(name, claim, block, script));
    let (phase, logs) = k.wait_pod_done(name, POD_TIMEOUT);
    let describe = if phase == "Succeeded" {
        String::new()
    } else {
        k.kubectl_ok(&["describe", "pod", name])
    };
    assert_eq!(phase, "Succeeded", "pod {name}: {logs}\n{describe}");
    eprintln!("pod {name}: done in {:?}", start.elapsed());
    k.delete_pod(name, POD_TIMEOUT);
    logs
}

/// Waits for a claim to be bound before a pod uses it. A pod created first is scheduled
/// against an unbound claim, fails, and waits in the scheduler's unschedulable queue until an
/// event it takes as a hint, or for up to 5 minutes. Once, a writer pod was never placed
/// within the pod timeout (no attach was ever started for it) although its volume had been
/// created at once: that is the scheduler's business, not what this test is about.
fn wait_bound(k: &KubeCluster, claim: &str) {
    wait_until(
        &format!("claim {claim} to be bound"),
        Duration::from_secs(60),
        || {
            k.get_json(&["pvc", claim])
                .is_some_and(|p| p["status"]["phase"].as_str() == Some("Bound"))
        },
    );
}

const WRITE_FILES: &str = "mkdir -p /data/d && for i in 1 2 3 4 5; do \
    dd if=/dev/urandom of=/data/d/f$i bs=64k count=16 2>/dev/null || exit 1; done && \
    sync && sha256sum /data/d/* > /data/sums && cat /data/sums";
const READ_FILES: &str = "sha256sum -c /data/sums >&2 && cat /data/sums";

fn files_survive_a_new_pod(k: &KubeCluster, claim: &str, class: &str, size: &str) {
    let start = Instant::now();
    k.apply(&pvc(claim, class, size, false));
    wait_bound(k, claim);
    let written = run_pod(k, &format!("{claim}-writer"), claim, false, WRITE_FILES);
    eprintln!(
        "{claim}: PVC created to first pod done: {:?}",
        start.elapsed()
    );
    assert_eq!(written.lines().count(), 5, "{written}");
    let read = run_pod(k, &format!("{claim}-reader"), claim, false, READ_FILES);
    assert_eq!(
        read, written,
        "a new pod reads other files than were written"
    );
}

fn volume_of(k: &KubeCluster, claim: &str) -> String {
    k.get_json(&["pvc", claim])
        .and_then(|p| p["spec"]["volumeName"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("pvc {claim} is not bound"))
}

fn df_kib(logs: &str) -> u64 {
    // busybox `df -k /data`: a header, then "dev  total used avail ..." (maybe wrapped).
    let fields: Vec<&str> = logs
        .lines()
        .skip(1)
        .flat_map(str::split_whitespace)
        .collect();
    fields
        .get(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no size in df output: {logs}"))
}

#[test]
fn pods_on_a_real_kubelet_use_hawser_volumes() {
    let c = Cluster::start("k8scsi", 2);
    let k = KubeCluster::up(&c.dir.path().join("k8s"));
    let node = CsiProc::start_with(
        &c,
        "n1",
        &c.dir.path().join("csi-node"),
        CsiOptions {
            mode: "node",
            kubelet_dir: Some(k.kubelet_root.clone()),
            endpoint: Some(k.kubelet_root.join("plugins/csi.hawser.dev/csi.sock")),
            register: true,
            // As the chart runs it: the node's certificate, not the admin token.
            node_identity: Some(c.agent("n1").data_dir.join("tls")),
            ..Default::default()
        },
    );
    let ctl = CsiProc::start_with(
        &c,
        "n1",
        &c.dir.path().join("csi-controller"),
        CsiOptions {
            mode: "controller",
            ..Default::default()
        },
    );
    wait_until(
        "the kubelet to register the driver",
        Duration::from_secs(60),
        || {
            k.get_json(&["csinode", &k.node]).is_some_and(|n| {
                n["spec"]["drivers"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|d| d["name"] == "csi.hawser.dev"))
            })
        },
    );
    k.apply(CSI_DRIVER_OBJECT);
    k.apply(DRIVER_AND_CLASSES);
    let _sidecars = Sidecars::start(k.kube.clone(), ctl.endpoint.clone());

    files_survive_a_new_pod(&k, "data-ext4", "hawser-2r", "64Mi");
    files_survive_a_new_pod(&k, "data-xfs", "hawser-2r-xfs", "320Mi");
    let ext4 = volume_of(&k, "data-ext4");
    assert_eq!(
        c.volume(&ext4).replicas.len(),
        2,
        "a 2-replica class made {:?}",
        c.volume(&ext4)
    );

    // Raw block: one pod writes a pattern to the device, another reads it back.
    k.apply(&pvc("data-block", "hawser-2r", "32Mi", true));
    wait_bound(&k, "data-block");
    let wrote = run_pod(
        &k,
        "block-writer",
        "data-block",
        true,
        "dd if=/dev/urandom of=/tmp/p bs=64k count=64 2>/dev/null && \
         dd if=/tmp/p of=/dev/xvda bs=64k conv=fsync 2>/dev/null && sha256sum < /tmp/p",
    );
    let read = run_pod(
        &k,
        "block-reader",
        "data-block",
        true,
        "dd if=/dev/xvda bs=64k count=64 2>/dev/null | sha256sum",
    );
    assert_eq!(read, wrote, "the block device reads back other bytes");

    // Expansion (offline): no pod uses the claim; the next pod sees the larger filesystem.
    let before = df_kib(&run_pod(&k, "df-before", "data-ext4", false, "df -k /data"));
    k.kubectl_ok(&[
        "patch",
        "pvc",
        "data-ext4",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}"#,
    ]);
    wait_until("the PV to grow", Duration::from_secs(60), || {
        k.get_json(&["pv", &ext4]).and_then(|p| {
            p["spec"]["capacity"]["storage"]
                .as_str()
                .and_then(quantity_bytes)
        }) == Some(128 << 20)
    });
    let after = df_kib(&run_pod(
        &k,
        "df-after",
        "data-ext4",
        false,
        "df -k /data && sha256sum -c /data/sums >&2",
    ));
    assert!(
        after > before + 50 * 1024,
        "filesystem did not grow: {before} KiB -> {after} KiB"
    );
    wait_until(
        "the PVC to report its new size",
        Duration::from_secs(60),
        || {
            k.get_json(&["pvc", "data-ext4"]).and_then(|p| {
                p["status"]["capacity"]["storage"]
                    .as_str()
                    .and_then(quantity_bytes)
            }) == Some(128 << 20)
        },
    );

    // Deleting the claims deletes the volumes and their replicas.
    for claim in ["data-ext4", "data-xfs", "data-block"] {
        k.kubectl_ok(&["delete", "pvc", claim, "--wait=false"]);
    }
    wait_until("the volumes to be deleted", Duration::from_secs(60), || {
        c.volumes().is_empty()
    });
    for a in &c.agents {
        assert!(
            c.agent_status(&a.name).replicas.is_empty(),
            "replica left on {}",
            a.name
        );
    }
    drop(node);
}
