//! "Kubernetes CSI driver", acceptance a: csi-sanity (kubernetes-csi/csi-test v5.6.0) passes
//! with zero failures against `hawser csi` on a local cluster, for filesystem volumes and for
//! raw block volumes, its snapshot and cloning specs included (issue 20, acceptance a) and its
//! ModifyVolume specs with the volume limits as mutable parameters (issue 21); the only
//! skipped specs are for capabilities Hawser does not advertise
//! (docs/csi.md lists them with why), and the run leaves nothing behind.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use hawser_e2e::sanity::{csi_sanity, specs};
use hawser_e2e::{Cluster, CsiProc};

/// Skip messages csi-sanity gives for capabilities Hawser does not advertise. Anything else
/// skipped fails the test: a skip must be a decision, written down in docs/csi.md.
const ALLOWED_SKIPS: &[&str] = &[
    // Group snapshots (VolumeGroupSnapshot, alpha in Kubernetes): not yet.
    "GroupControllerService not supported",
    // A snapshot, like a volume, is usable from every node: no topology to report.
    "SNAPSHOT_ACCESSIBILITY_CONSTRAINTS not supported",
    // CSI 1.13's health RPCs; Hawser speaks 1.12 (VolumeCondition, which Kubernetes reads).
    "ControllerGetVolumeHealth not supported",
    "ControllerListVolumeHealth not supported",
    "NodeGetVolumeHealth not supported",
    "NodeGetStorageHealth not supported",
    // Read-only is honoured per pod by NodePublish; the engine has no read-only attach.
    "ControllerPublishVolume.readonly field not supported",
    // No attach limit per node (max_volumes_per_node 0).
    "No MaxVolumesPerNode",
    // One pod per volume and node at a time (no SINGLE_NODE_MULTI_WRITER).
    "Service does not have single node multi writer capability",
];

fn run_sanity(csi: &CsiProc, kind: &str, extra: &[&str]) {
    let report = csi.dir.join(format!("sanity-{kind}.json"));
    // A VolumeAttributesClass's parameters: the volume's limits (issue 21).
    let mutable = csi.dir.join("mutable-parameters.yaml");
    std::fs::write(
        &mutable,
        "writeIopsLimit: \"5000\"\nbandwidthLimit: \"200MiB\"\n",
    )
    .expect("write the mutable parameters");
    let start = Instant::now();
    let out = csi_sanity(csi, &report)
        .arg("--csi.testnodevolumeattachlimit")
        .arg(format!(
            "--csi.testvolumemutableparameters={}",
            mutable.display()
        ))
        .args(extra)
        .output()
        .expect("run csi-sanity");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let specs = specs(&report);
    // "pending": specs the suite itself disables (XIt).
    let failed: Vec<_> = specs
        .iter()
        .filter(|s| !matches!(s.0.as_str(), "passed" | "skipped" | "pending"))
        .collect();
    let passed = specs.iter().filter(|s| s.0 == "passed").count();
    let snapshot_specs = specs
        .iter()
        .filter(|s| s.0 == "passed" && s.1.contains("Snapshot"))
        .count();
    let bad_skips: Vec<_> = specs
        .iter()
        .filter(|s| s.0 == "skipped" && !ALLOWED_SKIPS.iter().any(|a| s.2.contains(a)))
        .collect();
    eprintln!(
        "csi-sanity ({kind}): {passed} passed, {} failed, {} skipped in {:?}",
        failed.len(),
        specs.iter().filter(|s| s.0 == "skipped").count(),
        start.elapsed()
    );
    assert!(
        failed.is_empty() && out.status.success(),
        "csi-sanity ({kind}) failed ({}): {failed:#?}\n{}",
        out.status,
        &stdout[stdout.len().saturating_sub(6000)..]
    );
    assert!(
        bad_skips.is_empty(),
        "specs skipped for no listed reason: {bad_skips:#?}"
    );
    let mut skips: Vec<&str> = specs
        .iter()
        .filter(|s| s.0 == "skipped")
        .map(|s| s.2.as_str())
        .collect();
    skips.sort_unstable();
    skips.dedup();
    eprintln!("skipped ({kind}), for: {skips:?}; {snapshot_specs} snapshot specs passed");
    // The snapshot and cloning specs ran, not skipped (issue 20).
    for clone_spec in [
        "should create volume from an existing source snapshot",
        "should create volume from an existing source volume",
        "should fail when the volume source snapshot is not found",
        "should fail when the volume source volume is not found",
    ] {
        assert!(
            specs
                .iter()
                .any(|s| s.0 == "passed" && s.1.ends_with(clone_spec)),
            "{clone_spec:?} did not pass ({kind})"
        );
    }
    // ModifyVolume (VolumeAttributesClass) ran, not skipped (issue 21).
    let modify_specs = specs
        .iter()
        .filter(|s| s.0 == "passed" && s.1.contains("ModifyVolume"))
        .count();
    assert!(
        modify_specs >= 5,
        "only {modify_specs} ModifyVolume specs passed ({kind})"
    );
    assert!(
        snapshot_specs >= 15,
        "only {snapshot_specs} snapshot specs passed ({kind})"
    );
    assert!(
        passed >= 40,
        "only {passed} specs passed ({kind}): {specs:#?}"
    );
}

/// Nothing of the driver's is left on the machine: no mount under its directories, no loop
/// device on its exports, no nbdfuse process, no staged-volume record.
fn assert_nothing_left(csi: &CsiProc) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let dir = csi.dir.display().to_string();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&dir)).collect();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
    let loops = Command::new("losetup")
        .arg("-a")
        .output()
        .expect("losetup -a");
    let loops = String::from_utf8_lossy(&loops.stdout);
    assert!(!loops.contains(&dir), "loop devices left behind: {loops}");
    // Records (`<volume>.json`) and per-volume FUSE directories, pid and log files.
    let list = |d: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(d)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let mut records: Vec<_> = list(&csi.state_dir);
    records.retain(|p| p.extension().is_some_and(|e| e == "json"));
    records.extend(list(&csi.state_dir.join("fuse")));
    assert!(
        records.is_empty(),
        "staged-volume state left behind: {records:?}"
    );
}

#[test]
fn csi_sanity_passes_for_filesystem_and_raw_block_volumes() {
    let c = Cluster::start("csisanity", 2);
    let csi = CsiProc::start(&c, "n1", &c.dir.path().join("csi"));
    run_sanity(&csi, "mount", &[]);
    run_sanity(&csi, "block", &["--csi.testvolumeaccesstype=block"]);
    assert_nothing_left(&csi);
    assert!(c.volumes().is_empty(), "volumes left: {:?}", c.volumes());
}
