//! csi-sanity's node specs with volumes staged on the agent's kernel devices (`frontend:
//! nbd`, then `frontend: ublk`), in a real kernel: NodeStage asks the agent for `/dev/nbdN`
//! or `/dev/ublkbN`, NodeUnstage ends it, and nothing is left. The outer test boots Debian's kernel (`scripts/kvm/boot.sh`) and runs the inner one,
//! this same binary, inside it with the whole cluster, as `kernel_nbd.rs` does.

use std::process::Command;

use hawser_e2e::sanity::{csi_sanity, specs};
use hawser_e2e::{k8s_tool, Cluster, CsiOptions, CsiProc};

const FRONTEND: &str = "HAWSER_E2E_FRONTEND";

fn in_guest(frontend: &str) {
    // The Kubernetes tools' directory, as this process finds it (make test may set it).
    let sanity = k8s_tool("csi-sanity");
    let bin_dir = sanity.parent().expect("tool dir").display().to_string();
    hawser_e2e::guest::run_inner_test(
        "inner_csi_sanity_node_specs",
        &[("HAWSER_K8S_BIN", &bin_dir), (FRONTEND, frontend)],
    );
}

#[test]
fn csi_sanity_node_specs_on_kernel_nbd() {
    in_guest("nbd");
}

#[test]
fn csi_sanity_node_specs_on_ublk() {
    in_guest("ublk");
}

#[test]
#[ignore = "runs inside a guest kernel: csi_sanity_node_specs_on_kernel_nbd and _on_ublk start it"]
fn inner_csi_sanity_node_specs() {
    hawser_e2e::guest::assert_in_guest();
    let frontend: &'static str = match std::env::var(FRONTEND).as_deref() {
        Ok("ublk") => "ublk",
        _ => "nbd",
    };
    let c = Cluster::start("kcsi", 2);
    let csi = CsiProc::start_with(
        &c,
        "n1",
        &c.dir.path().join("csi"),
        CsiOptions {
            frontend: Some(frontend),
            ..CsiOptions::default()
        },
    );
    let params = csi.dir.join("parameters.yaml");
    std::fs::write(&params, format!("frontend: {frontend}\n")).expect("write the parameters");
    let report = csi.dir.join("sanity-node.json");
    // The guest's pools are on its /tmp, a tmpfs of half its memory: small volumes.
    let out = csi_sanity(&csi, &report)
        .arg(format!("--csi.testvolumeparameters={}", params.display()))
        .arg("--ginkgo.focus=Node Service")
        .output()
        .expect("run csi-sanity");
    let specs = specs(&report);
    let failed: Vec<_> = specs
        .iter()
        .filter(|s| !matches!(s.0.as_str(), "passed" | "skipped" | "pending"))
        .collect();
    let passed = specs.iter().filter(|s| s.0 == "passed").count();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        failed.is_empty() && out.status.success(),
        "csi-sanity node specs failed ({}): {failed:#?}\n{}",
        out.status,
        &stdout[stdout.len().saturating_sub(6000)..]
    );
    let log = std::fs::read_to_string(csi.dir.join("csi-all.log")).expect("csi log");
    let kernel_stages = log
        .matches("staged on a kernel device served by the agent")
        .count();
    eprintln!(
        "REPORT kernel-csi node specs on {frontend}: {passed} passed, {} skipped; {kernel_stages} stages on a kernel device",
        specs.iter().filter(|s| s.0 == "skipped").count()
    );
    assert!(passed >= 10, "only {passed} node specs passed: {specs:#?}");
    assert!(
        kernel_stages >= 3,
        "NodeStage used a kernel device {kernel_stages} times"
    );
    assert!(
        !log.contains("staging through nbdfuse"),
        "a stage fell back to nbdfuse"
    );
    // NodeUnstage ended every device: the agent serves none, and the kernel has none of ours.
    let sock = c.agent("n1").data_dir.join("device.sock");
    let listed = Command::new(hawser_e2e::cluster::hawser_bin())
        .args(["device", "list", "-o", "json", "--socket"])
        .arg(&sock)
        .output()
        .expect("hawser device list");
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).trim(),
        "[]",
        "devices left: {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let ours: Vec<String> = std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .filter_map(Result::ok)
        .filter_map(|e| {
            std::fs::read_to_string(e.path().join("backend"))
                .ok()
                .filter(|b| b.starts_with("hawser:"))
        })
        .collect();
    assert!(ours.is_empty(), "kernel devices left: {ours:?}");
    let ublk_left: Vec<_> = std::fs::read_dir("/sys/class/ublk-char")
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(ublk_left.is_empty(), "ublk devices left: {ublk_left:?}");
}
