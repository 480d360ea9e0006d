//! "Hawser on Kubernetes", acceptance a (issue 15): `helm lint` passes; `helm template`
//! validates with `kubeconform -strict` against schemas made from the real apiserver's
//! OpenAPI (and the check catches a misspelt field); `helm install` into a real
//! kube-apiserver creates every object, the CRDs of the cluster state among them;
//! with the cluster's snapshot API (the VolumeSnapshot CRDs) the chart adds the snapshotter
//! sidecar and a VolumeSnapshotClass (issue 20), validated and installed like the rest;
//! `helm uninstall` removes them, keeping only the token Secret (agents hold the tokens; a
//! reinstall must find the same ones) and the CRDs (Helm never deletes them: the state
//! survives). The chart's controller runs in the cluster on its service account, keeps its
//! state in the CRDs, makes the cluster CA in a Secret of its own (also kept: nodes hold
//! certificates it issued) and serves its API over TLS only.

use std::path::{Path, PathBuf};
use std::process::Command;

use hawser_e2e::k8s::KubeCluster;
use hawser_e2e::{k8s_tool, run_ok, TempDir};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/hawser")
}

/// Values that keep the test's pods off every node: they would change the host (hostPath
/// directories, /dev) and their images cannot be pulled here.
const NOWHERE: &[&str] = &[
    "--set",
    "image.pullPolicy=Never",
    "--set",
    "sidecars.pullPolicy=Never",
    "--set",
    "controller.nodeSelector.hawser-test/none=none",
    "--set",
    "node.nodeSelector.hawser-test/none=none",
];

/// The second VolumeSnapshotClass, whose snapshots are backups to a target (docs/backup.md).
const BACKUP_CLASS: &[&str] = &[
    "--set",
    "snapshots.backupClass.enabled=true",
    "--set",
    "snapshots.backupClass.target=offsite",
];

fn kubeconform(schemas: &Path, manifest: &Path) -> std::process::Output {
    Command::new(k8s_tool("kubeconform"))
        .args(["-strict", "-summary", "-schema-location"])
        .arg(format!(
            "{}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
            schemas.display()
        ))
        .arg(manifest)
        .output()
        .expect("run kubeconform")
}

/// (kind, name, namespaced) of every object in a rendered manifest.
fn objects(manifest: &str) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for doc in manifest.split("\n---") {
        let field = |key: &str, indent: &str| {
            doc.lines()
                .find_map(|l| l.strip_prefix(&format!("{indent}{key}: ")))
                .map(|v| v.trim().trim_matches('"').to_string())
        };
        if let (Some(kind), Some(name)) = (field("kind", ""), field("name", "  ")) {
            let cluster_wide = matches!(
                kind.as_str(),
                "ClusterRole"
                    | "ClusterRoleBinding"
                    | "CSIDriver"
                    | "StorageClass"
                    | "VolumeSnapshotClass"
            );
            out.push((kind, name, !cluster_wide));
        }
    }
    out
}

#[test]
fn the_chart_lints_validates_strictly_installs_every_object_and_uninstalls() {
    let helm = k8s_tool("helm");
    let helm = helm.to_str().expect("helm path");
    let chart = chart().display().to_string();
    run_ok(helm, &["lint", &chart, "--strict"]);
    let dir = TempDir::new("helmchart");
    let k = KubeCluster::up(&dir.path().join("k8s"));
    // The cluster's snapshot API (external-snapshotter's CRDs), as a cluster with snapshots
    // has it: the chart then adds the snapshotter and a VolumeSnapshotClass.
    let snapshot_crds = k8s_tool("snapshot-crds").display().to_string();
    k.kubectl_ok(&["apply", "--server-side", "-f", &snapshot_crds]);
    let ns = "hawser-system";
    let mut template = vec![
        "template",
        "t",
        &chart,
        "--namespace",
        ns,
        "--kube-version",
        "1.33.0",
    ];
    template.extend_from_slice(NOWHERE);
    template.extend_from_slice(BACKUP_CLASS);
    // Without the snapshot API: neither the sidecar nor the classes (the install would fail).
    let plain = run_ok(helm, &template);
    assert!(
        !plain.contains("csi-snapshotter") && !plain.contains("VolumeSnapshotClass"),
        "snapshots rendered without the snapshot API"
    );
    template.extend_from_slice(&["--api-versions", "snapshot.storage.k8s.io/v1"]);
    let manifest = run_ok(helm, &template);
    for needed in [
        "name: csi-snapshotter",
        "kind: VolumeSnapshotClass",
        "resources: [volumesnapshotcontents/status]",
    ] {
        assert!(manifest.contains(needed), "{needed} missing:\n{manifest}");
    }
    // The backup class, beside the snapshot class; without a target it is refused.
    assert_eq!(manifest.matches("kind: VolumeSnapshotClass").count(), 2);
    assert!(
        manifest.contains("name: hawser-backup")
            && manifest.contains("type: backup")
            && manifest.contains("target: \"offsite\""),
        "{manifest}"
    );
    let mut no_target = template.clone();
    no_target.extend_from_slice(&["--set", "snapshots.backupClass.target="]);
    let out = Command::new(helm)
        .args(&no_target)
        .output()
        .expect("run helm");
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("snapshots.backupClass.target"),
        "a backup class without a target rendered: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = dir.path().join("rendered.yaml");
    std::fs::write(&rendered, &manifest).expect("write manifest");
    // Schemas from the running apiserver, strict.
    let openapi = dir.path().join("openapi.json");
    let mut doc = String::new();
    // A new CRD's kinds reach the published OpenAPI a moment after it is established.
    hawser_e2e::wait_until(
        "the snapshot CRDs in the OpenAPI",
        std::time::Duration::from_secs(60),
        || {
            doc = k.kubectl_ok(&["get", "--raw", "/openapi/v2"]);
            doc.contains("io.k8s.storage.snapshot.v1.VolumeSnapshotClass")
        },
    );
    std::fs::write(&openapi, &doc).expect("write");
    let schemas = dir.path().join("schemas");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/k8s/openapi2schemas.py");
    run_ok(
        "python3",
        &[
            &script.display().to_string(),
            &openapi.display().to_string(),
            &schemas.display().to_string(),
        ],
    );
    let out = kubeconform(&schemas, &rendered);
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kubeconform -strict:\n{summary}");
    let objs = objects(&manifest);
    assert!(
        summary.contains(&format!("Valid: {}, Invalid: 0", objs.len())),
        "{summary}"
    );
    // Metrics: the Services are in every render (validated above); the ServiceMonitors and
    // the Grafana dashboard's ConfigMap when asked (the Prometheus Operator's CRDs are not
    // in this cluster to validate them against, so their fields are checked here).
    let mut with_monitoring = template.clone();
    with_monitoring.extend_from_slice(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
    ]);
    let monitored = run_ok(helm, &with_monitoring);
    assert_eq!(
        monitored.matches("kind: ServiceMonitor").count(),
        2,
        "{monitored}"
    );
    for needed in [
        "serverName: controller.hawser.internal",
        "serverName: node.hawser.internal",
        "key: metrics.token",
        "name: t-ca",
        "hawser.json: |-",
    ] {
        assert!(monitored.contains(needed), "{needed} missing:\n{monitored}");
    }
    assert_eq!(
        manifest.matches("hawser.dev/metrics: \"true\"").count(),
        2,
        "the two metrics Services"
    );
    // The check can fail: a misspelt field is caught.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        manifest.replace("  podInfoOnMount: false", "  podInfoOnMounts: false"),
    )
    .expect("write");
    assert!(
        !kubeconform(&schemas, &bad).status.success(),
        "kubeconform missed a typo"
    );

    // The CRDs (not in `helm template`'s output, and kubeconform cannot load the recursive
    // CRD schema): the API server itself validates them, strictly, without creating them.
    let crds = format!("{chart}/crds/hawser.dev.yaml");
    let out = k.kubectl_ok(&[
        "create",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        &crds,
    ]);
    assert_eq!(out.matches("created (server dry run)").count(), 4, "{out}");
    let crd_names: Vec<(String, String, bool)> = [
        "hawservolumes",
        "hawsernodes",
        "hawsernodesettings",
        "hawserrecords",
    ]
    .iter()
    .map(|p| {
        (
            "CustomResourceDefinition".to_string(),
            format!("{p}.hawser.dev"),
            false,
        )
    })
    .collect();
    let objs: Vec<(String, String, bool)> = objs.into_iter().chain(crd_names).collect();

    let kubeconfig = k.kubeconfig().display().to_string();
    let mut install = vec![
        "install",
        "t",
        &chart,
        "--namespace",
        ns,
        "--create-namespace",
    ];
    install.extend_from_slice(NOWHERE);
    install.extend_from_slice(BACKUP_CLASS);
    install.extend_from_slice(&["--kubeconfig", &kubeconfig]);
    run_ok(helm, &install);
    for (kind, name, namespaced) in &objs {
        let mut args = vec!["get", kind.as_str(), name.as_str()];
        if *namespaced {
            args.extend_from_slice(&["-n", ns]);
        }
        assert!(
            k.kubectl(&args).status.success(),
            "{kind} {name} was not created"
        );
    }
    run_ok(
        helm,
        &[
            "uninstall",
            "t",
            "--namespace",
            ns,
            "--kubeconfig",
            &kubeconfig,
        ],
    );
    for (kind, name, namespaced) in &objs {
        let mut args = vec![
            "get",
            kind.as_str(),
            name.as_str(),
            "--ignore-not-found",
            "-o",
            "name",
        ];
        if *namespaced {
            args.extend_from_slice(&["-n", ns]);
        }
        let left = k.kubectl_ok(&args);
        // Kept: the tokens (agents hold them) and the CRDs, so the state survives.
        let kept =
            (kind == "Secret" && name.ends_with("-tokens")) || kind == "CustomResourceDefinition";
        assert_eq!(
            !left.trim().is_empty(),
            kept,
            "{kind} {name} after uninstall: {left:?}"
        );
    }
}

/// The image `scripts/image.sh` makes from the release binary imports into containerd
/// without a registry, and a pod runs hawser and the tools the CSI node service needs.
#[test]
fn the_image_imports_without_a_registry_and_runs_hawser_and_the_node_tools() {
    let dir = TempDir::new("helmimage");
    let tar = dir.path().join("hawser-image.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/image.sh");
    run_ok(
        "bash",
        &[&script.display().to_string(), &tar.display().to_string()],
    );
    let k = KubeCluster::up(&dir.path().join("k8s"));
    let sock = k
        .env
        .get("CONTAINERD_SOCK")
        .expect("containerd socket")
        .clone();
    run_ok(
        "ctr",
        &[
            "-a",
            &sock,
            "-n",
            "k8s.io",
            "images",
            "import",
            &tar.display().to_string(),
        ],
    );
    let version = env!("CARGO_PKG_VERSION");
    k.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: image}}
spec:
  restartPolicy: Never
  hostNetwork: true
  containers:
  - name: c
    image: hawser.local/hawser:{version}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c"]
    args: ["hawser --version && mkfs.ext4 -V 2>&1 && mkfs.xfs -V && nbdfuse --version && losetup --version && blkid -V"]
"#
    ));
    let (phase, out) = k.wait_pod_done("image", std::time::Duration::from_secs(120));
    assert_eq!(phase, "Succeeded", "{out}");
    for tool in [
        "hawser", "mke2fs", "mkfs.xfs", "nbdfuse", "losetup", "blkid",
    ] {
        assert!(
            out.contains(tool),
            "{tool} did not run in the image:\n{out}"
        );
    }
    controller_runs_in_the_cluster_on_its_crds(&k);
}

/// The chart's controller, from that image, in the cluster: on its service account and the
/// chart's RBAC alone it keeps its state in the CRDs, leads through a Lease, and serves the
/// API with the tokens of the chart's Secret. (The sidecars' images cannot be pulled here;
/// their containers wait, the others run.)
fn controller_runs_in_the_cluster_on_its_crds(k: &KubeCluster) {
    let helm = k8s_tool("helm");
    let helm = helm.to_str().expect("helm path");
    let chart = chart().display().to_string();
    let kubeconfig = k.kubeconfig().display().to_string();
    let node_ip = k
        .env
        .get("NODE_IP")
        .expect("NODE_IP in the cluster's env")
        .clone();
    let api_server = k
        .env
        .get("API_SERVER")
        .expect("API_SERVER in the cluster's env");
    let port = api_server
        .rsplit(':')
        .next()
        .expect("API server port")
        .to_string();
    let ns = "hawser-system";
    let api_port = format!("controller.apiServer.port={port}");
    let api_host = format!("controller.apiServer.host={node_ip}");
    let mut install = vec![
        "install",
        "t",
        &chart,
        "--namespace",
        ns,
        "--create-namespace",
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "sidecars.pullPolicy=Never",
        "--set",
        "node.nodeSelector.hawser-test/none=none",
        "--set",
        "controller.replicas=1",
        // The pod's (the node's) address only, not every interface.
        "--set",
        "controller.listenAddress=$(POD_IP)",
        "--set",
        "controller.port=29400",
        "--set",
        &api_host,
        "--set",
    ];
    install.push(&api_port);
    run_ok(helm, &install);
    let mut leader = String::new();
    hawser_e2e::wait_until(
        "the controller to lead",
        std::time::Duration::from_secs(90),
        || {
            let out = k.kubectl(&[
                "get",
                "hawserrecords",
                "leader",
                "-n",
                ns,
                "-o",
                "jsonpath={.text}",
            ]);
            leader = String::from_utf8_lossy(&out.stdout).into_owned();
            out.status.success() && !leader.is_empty()
        },
    );
    let url = format!("https://{node_ip}:29400");
    assert_eq!(leader, url, "the leader advertises its pod's address");
    let records = k.kubectl_ok(&["get", "hawserrecords", "-n", ns]);
    assert!(records.contains("auth/tokens"), "{records}");
    let lease_holder = k.kubectl_ok(&[
        "get",
        "leases",
        "-n",
        ns,
        "-l",
        "hawser.dev/store-lease",
        "-o",
        "jsonpath={.items[*].spec.holderIdentity}",
    ]);
    assert!(lease_holder.starts_with("t-controller-"), "{lease_holder}");
    // The API answers over TLS, checked against the CA the controller made in its Secret,
    // with the admin token from the chart's Secret; plaintext gets no answer.
    let secret = |name: &str, key: &str| {
        let b64 = k.kubectl_ok(&[
            "get",
            "secret",
            name,
            "-n",
            ns,
            "-o",
            &format!("jsonpath={{.data.{}}}", key.replace('.', "\\.")),
        ]);
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .expect("secret data is base64");
        String::from_utf8(bytes).expect("secret data is text")
    };
    let token = secret("t-tokens", "admin.token");
    let ca_pem = secret("t-ca", "ca.pem");
    let config = hawser_tls::client_config(&ca_pem, hawser_tls::Peer::Controller, None)
        .expect("client config");
    let http = reqwest::blocking::Client::builder()
        .use_preconfigured_tls((*config).clone())
        .build()
        .expect("HTTPS client");
    let plain = reqwest::blocking::Client::new()
        .get(format!("http://{node_ip}:29400/v1/nodes"))
        .bearer_auth(token.trim())
        .send();
    assert!(
        plain.as_ref().map_or(true, |r| !r.status().is_success()),
        "the API answered plaintext: {plain:?}"
    );
    let resp = http
        .get(format!("{url}/v1/nodes"))
        .bearer_auth(token.trim())
        .send()
        .expect("GET /v1/nodes");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.text().expect("body").trim(), "[]");
    run_ok(
        helm,
        &[
            "uninstall",
            "t",
            "--namespace",
            ns,
            "--kubeconfig",
            &kubeconfig,
        ],
    );
}
