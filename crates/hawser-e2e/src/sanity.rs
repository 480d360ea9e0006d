//! Reading csi-sanity's ginkgo JSON report.

use std::path::Path;

use serde_json::Value;

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
