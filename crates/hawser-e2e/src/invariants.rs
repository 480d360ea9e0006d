//! Whole-cluster checks after a fault: what the controller's records say about volumes and
//! their replicas must match, one for one, what the agents hold.

use std::collections::BTreeMap;

use hawser_api::controller::VolumeState;

use crate::cluster::Cluster;

/// Every volume that exists is whole and nothing else exists:
/// - no volume is left `Creating` or `Deleting` (an operation stopped half-way);
/// - each volume lists exactly `replica_count` replicas, with distinct ids;
/// - each of those replicas is on the agents exactly once, on the node its record names;
/// - no agent holds a replica that no volume references (an orphan).
///
/// Panics with every problem found, listed.
pub fn assert_volumes_whole(c: &Cluster) {
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
    assert!(
        problems.is_empty(),
        "{} problem(s) across {} volumes:\n{}",
        problems.len(),
        volumes.len(),
        problems.join("\n")
    );
}
