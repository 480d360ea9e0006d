//! "Hawser on Kubernetes", acceptance a (issue 15): `helm lint` passes; `helm template`
//! validates with `kubeconform -strict` against schemas made from the real apiserver's
//! OpenAPI (and the check catches a misspelt field); `helm install` into a real
//! kube-apiserver creates every object; `helm uninstall` removes them, keeping only the token
//! Secret (agents hold the tokens; a reinstall must find the same ones).

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
                "ClusterRole" | "ClusterRoleBinding" | "CSIDriver" | "StorageClass"
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
    let manifest = run_ok(helm, &template);
    let rendered = dir.path().join("rendered.yaml");
    std::fs::write(&rendered, &manifest).expect("write manifest");
    // Schemas from the running apiserver, strict.
    let openapi = dir.path().join("openapi.json");
    std::fs::write(&openapi, k.kubectl_ok(&["get", "--raw", "/openapi/v2"])).expect("write");
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
        let kept = kind == "Secret" && name.ends_with("-tokens");
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
}
