//! Whole-cluster checks after a fault: what the controller's records say about volumes and
//! their replicas must match, one for one, what the agents hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hawser_api::controller::VolumeState;

use crate::cluster::Cluster;

/// Every volume that exists is whole and nothing else exists:
/// - no volume is left `Creating` or `Deleting` (an operation stopped half-way);
/// - each volume lists exactly `replica_count` replicas, with distinct ids;
/// - each of those replicas is on the agents exactly once, on the node its record names;
/// - no agent holds a replica that no volume references (an orphan), nor a replica file
///   (data, metadata, journal) in its pools' directories.
///
/// Panics with every problem found, listed.
pub fn assert_volumes_whole(c: &Cluster) {
    let problems = volume_problems(c);
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Waits until [`assert_volumes_whole`] holds (the leader repairs interrupted operations
/// and orphans in the background); panics with the problems left after `timeout`.
pub fn wait_volumes_whole(c: &Cluster, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let problems = volume_problems(c);
        if problems.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {} problem(s) after {timeout:?}:\n{}",
            problems.len(),
            problems.join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What [`assert_volumes_whole`] checks, as a list of problems.
pub fn volume_problems(c: &Cluster) -> Vec<String> {
    let volumes = c.volumes();
    // replica id -> nodes that hold it
    let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in &c.agents {
        for r in c.agent_status(&a.name).replicas {
            held.entry(r.replica_id).or_default().push(a.name.clone());
        }
    }
    let mut problems = Vec::new();
    let mut referenced = BTreeMap::new();
    for v in &volumes {
        if matches!(v.state, VolumeState::Creating | VolumeState::Deleting) {
            problems.push(format!("volume {} is left {:?}", v.name, v.state));
        }
        if v.replicas.len() != v.replica_count as usize {
            problems.push(format!(
                "volume {} lists {} replicas, wants {}",
                v.name,
                v.replicas.len(),
                v.replica_count
            ));
        }
        for r in &v.replicas {
            if referenced.insert(r.id.clone(), v.name.clone()).is_some() {
                problems.push(format!("replica {} is listed twice", r.id));
            }
            let nodes = held.get(&r.id).cloned().unwrap_or_default();
            if nodes != [r.node.clone()] {
                problems.push(format!(
                    "replica {} of volume {} (on {} by its record) is held by {nodes:?}",
                    r.id, v.name, r.node
                ));
            }
        }
    }
    for (id, nodes) in &held {
        if !referenced.contains_key(id) {
            problems.push(format!(
                "orphan replica {id} on {nodes:?}: no volume lists it"
            ));
        }
    }
    for a in &c.agents {
        for file in replica_files(&a.data_dir) {
            let id = file
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            if !referenced.contains_key(id) {
                problems.push(format!("orphan replica file {}", file.display()));
            }
        }
    }
    problems
}

/// The files in `<data_dir>/pool-*/replicas/` (where the agent keeps the default pool).
fn replica_files(data_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pool-"))
        .filter_map(|e| std::fs::read_dir(e.path().join("replicas")).ok())
        .flat_map(|files| files.flatten().map(|f| f.path()))
        .collect()
}
