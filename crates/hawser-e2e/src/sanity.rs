//! Running csi-sanity against a `hawser csi` and reading its ginkgo JSON report.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::{k8s_tool, CsiProc};

/// csi-sanity against `csi`, with its kubelet directories, 64 MiB test volumes grown to
/// 128 MiB, a 20-minute bound and the JSON report written to `report`; callers add their
/// own flags.
pub fn csi_sanity(csi: &CsiProc, report: &Path) -> Command {
    let mut cmd = Command::new(k8s_tool("csi-sanity"));
    cmd.arg(format!("--csi.endpoint={}", csi.endpoint.display()))
        .arg(format!(
            "--csi.mountdir={}",
            csi.kubelet_dir.join("target").display()
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            csi.kubelet_dir.join("staging").display()
        ))
        .arg(format!("--csi.testvolumesize={}", 64 << 20))
        .arg(format!("--csi.testvolumeexpandsize={}", 128 << 20))
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .arg("--ginkgo.timeout=20m");
    cmd
}

/// (state, "Container > spec", message) of every spec in a ginkgo JSON report.
pub fn specs(report: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(report).expect("read the ginkgo report");
    let suites: Vec<Value> = serde_json::from_str(&text).expect("parse the ginkgo report");
    let mut out = Vec::new();
    for suite in &suites {
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            let leaf = spec["LeafNodeText"].as_str().unwrap_or("");
            if leaf.is_empty() {
                continue; // suite-level setup nodes
            }
            let path: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            out.push((
                spec["State"].as_str().unwrap_or("?").to_string(),
                format!("{} > {leaf}", path.join(" > ")),
                spec["Failure"]["Message"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            ));
        }
    }
    out
}
