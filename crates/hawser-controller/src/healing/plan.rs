//! Self-healing decisions, as a pure function of the records, so every rule is unit-tested
//! without a cluster. `healing/self_heal.rs` carries them out.
//!
//! Rules:
//! 1. A replica whose node has been offline longer than `replace_after` (default 5 minutes;
//!    LINSTOR waits 60, Longhorn 10) is replaced: a blank replica is placed on another node
//!    and the old one retired (deleted when its node returns). An in-sync replica of an
//!    attached volume is left to its engine, which outdates it first (or keeps it `Down` for
//!    want of a quorum: then replacing it would change nothing the engine waits for). A
//!    failed replica (disk error) is replaced at once, wherever it is.
//! 2. A replica on an evacuating node gets a blank replica elsewhere first; it is retired only
//!    once the volume has `replica_count` in-sync replicas without it, so redundancy never
//!    drops during a move.
//! 3. Rebuilds are bounded: at most `max_rebuilds` blank replicas at once, one per volume;
//!    and none at all while more than a third of the nodes are offline, so a network blip or
//!    a rack power cut does not start a storm of copies.
//! 4. Nothing is replaced without a source: the volume must keep an in-sync replica on an
//!    online node.
//! 5. Retired replicas are deleted once their node is online again.
//! 6. A detached volume with a blank replica gets an engine (not exported) on the node of an
//!    online in-sync replica, which syncs it; the engine stops once no replica is blank (or
//!    its node went offline; then another is chosen). Attaching the volume stops it too.
//! 7. A volume marked `restoring` (to a snapshot, from a backup, or a standby applying
//!    backups) is neither rebuilt nor synced: its replicas may differ until that ends.

use std::collections::BTreeMap;

use hawser_api::controller::{ReplicaState, SnapshotState, VolumeState};

use crate::store::model::VolumeRecord;

#[derive(Clone, Copy, Debug)]
pub struct HealConfig {
    /// Milliseconds a node may be offline before its replicas are replaced.
    pub replace_after_ms: u64,
    pub max_rebuilds: usize,
}

/// A node as the planner sees it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub online: bool,
    /// Milliseconds since its last heartbeat.
    pub age_ms: u64,
    pub evacuate: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Place a blank replica elsewhere instead of `replica`, which is retired.
    Replace { volume: String, replica: String },
    /// Place a blank replica elsewhere in addition to `replica` (on an evacuating node).
    AddFor { volume: String, replica: String },
    /// `replica` is not needed any more (moved): retire it.
    Retire { volume: String, replica: String },
    /// Delete retired `replica` from its node, which answers again.
    DeleteRetired { volume: String, replica: String },
    /// Start an engine on `node` that syncs the blank replicas of a detached volume.
    SyncDetached { volume: String, node: String },
    /// Stop the sync engine of a detached volume (done, or its node is gone).
    EndSync { volume: String },
}

#[derive(Debug, Default)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Why something that looks needed is not done now (logged once per change).
    pub held: Vec<String>,
}

/// A ready snapshot of which retired replica `id` holds a copy and no replica of the volume
/// (failed ones aside) does: deleting the retired replica would lose it.
fn only_copy<'a>(v: &'a VolumeRecord, id: &str) -> Option<&'a str> {
    v.snapshots
        .iter()
        .filter(|s| s.state == SnapshotState::Ready && s.replicas.iter().any(|h| h == id))
        .find(|s| {
            !v.replicas
                .iter()
                .any(|r| r.state != ReplicaState::Failed && s.replicas.contains(&r.id))
        })
        .map(|s| s.name.as_str())
}

pub fn plan(volumes: &[VolumeRecord], nodes: &BTreeMap<String, NodeView>, cfg: HealConfig) -> Plan {
    let mut p = Plan::default();
    let offline = nodes.values().filter(|n| !n.online).count();
    let storm = offline * 3 > nodes.len();
    if storm {
        p.held.push(format!(
            "{offline} of {} nodes offline (more than a third): no rebuilds until more return",
            nodes.len()
        ));
    }
    let online = |node: &str| nodes.get(node).is_some_and(|n| n.online);
    let mut rebuilds = volumes
        .iter()
        .filter(|v| matches!(v.state, VolumeState::Attached | VolumeState::Detached))
        .map(|v| v.replicas.iter().filter(|r| r.blank).count())
        .sum::<usize>();
    for v in volumes {
        for r in v.retired.iter().filter(|r| online(&r.node)) {
            if let Some(s) = only_copy(v, &r.id) {
                // Kept until a replica of the volume fetched it (`snapshots/catchup.rs`).
                p.held.push(format!(
                    "retired replica {} of {} kept: it holds the only copy of snapshot {s}",
                    r.id, v.name
                ));
                continue;
            }
            p.actions.push(Action::DeleteRetired {
                volume: v.name.clone(),
                replica: r.id.clone(),
            });
        }
        if !matches!(v.state, VolumeState::Attached | VolumeState::Detached) {
            continue;
        }
        // Being restored (to a snapshot, from a backup) or a standby applying backups: its
        // replicas may differ until that ends, so none is a source to copy from.
        if let Some(why) = &v.restoring {
            if v.replicas
                .iter()
                .any(|r| r.blank || r.state != ReplicaState::InSync)
            {
                p.held
                    .push(format!("volume {}: no rebuild while {why}", v.name));
            }
            continue;
        }
        if let Some(a) = retire_moved(v, nodes) {
            p.actions.push(a);
            continue;
        }
        if let Some(a) = detached_sync(v, nodes) {
            p.actions.push(a);
        }
        if storm || v.replicas.iter().any(|r| r.blank) {
            continue; // one rebuild per volume at a time
        }
        let Some(action) = rebuild(v, nodes, cfg, &mut p.held) else {
            continue;
        };
        if rebuilds >= cfg.max_rebuilds {
            p.held.push(format!(
                "volume {}: waits for one of {rebuilds} rebuilds under way (limit {})",
                v.name, cfg.max_rebuilds
            ));
            continue;
        }
        rebuilds += 1;
        p.actions.push(action);
    }
    p
}

/// Rule 6.
fn detached_sync(v: &VolumeRecord, nodes: &BTreeMap<String, NodeView>) -> Option<Action> {
    if v.state != VolumeState::Detached {
        return None;
    }
    let online = |n: &str| nodes.get(n).is_some_and(|n| n.online);
    let blank = v.replicas.iter().any(|r| r.blank);
    match &v.sync_node {
        Some(n) if !blank || !online(n) => Some(Action::EndSync {
            volume: v.name.clone(),
        }),
        Some(_) => None,
        None if blank => v
            .replicas
            .iter()
            .find(|r| r.state == ReplicaState::InSync && online(&r.node))
            .map(|r| Action::SyncDetached {
                volume: v.name.clone(),
                node: r.node.clone(),
            }),
        None => None,
    }
}

/// Rule 2, second half: a replica on an evacuating node once the others suffice.
fn retire_moved(v: &VolumeRecord, nodes: &BTreeMap<String, NodeView>) -> Option<Action> {
    let evacuating = |node: &str| nodes.get(node).is_some_and(|n| n.evacuate);
    let leaving = v.replicas.iter().find(|r| evacuating(&r.node))?;
    let staying_in_sync = v
        .replicas
        .iter()
        .filter(|r| !evacuating(&r.node) && r.state == ReplicaState::InSync)
        .count();
    (staying_in_sync >= v.replica_count as usize).then(|| Action::Retire {
        volume: v.name.clone(),
        replica: leaving.id.clone(),
    })
}

/// Rules 1, 2 (first half) and 4 for one volume with no rebuild under way.
fn rebuild(
    v: &VolumeRecord,
    nodes: &BTreeMap<String, NodeView>,
    cfg: HealConfig,
    held: &mut Vec<String>,
) -> Option<Action> {
    let node = |name: &str| nodes.get(name);
    let gone = |name: &str| node(name).is_none_or(|n| !n.online && n.age_ms > cfg.replace_after_ms);
    let replace = v.replicas.iter().find(|r| {
        r.state == ReplicaState::Failed
            || (gone(&r.node)
                && !(r.state == ReplicaState::InSync && v.state == VolumeState::Attached))
    });
    let (target, action) = match replace {
        Some(r) => (
            r,
            Action::Replace {
                volume: v.name.clone(),
                replica: r.id.clone(),
            },
        ),
        None => {
            let r = v
                .replicas
                .iter()
                .find(|r| node(&r.node).is_some_and(|n| n.evacuate))?;
            (
                r,
                Action::AddFor {
                    volume: v.name.clone(),
                    replica: r.id.clone(),
                },
            )
        }
    };
    let source = v.replicas.iter().any(|r| {
        r.id != target.id
            && r.state == ReplicaState::InSync
            && node(&r.node).is_some_and(|n| n.online)
    });
    if !source {
        held.push(format!(
            "volume {}: replica {} needs replacing but no other in-sync replica is online",
            v.name, target.id
        ));
        return None;
    }
    Some(action)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_api::controller::Replica;

    const CFG: HealConfig = HealConfig {
        replace_after_ms: 20_000,
        max_rebuilds: 2,
    };

    fn replica(id: &str, node: &str, state: ReplicaState) -> Replica {
        Replica {
            id: id.into(),
            node: node.into(),
            pool: "p".into(),
            state,
            blank: false,
            engine: None,
        }
    }

    fn volume(name: &str, state: VolumeState, replicas: Vec<Replica>) -> VolumeRecord {
        VolumeRecord {
            state,
            epoch: 1,
            attached_node: (state == VolumeState::Attached).then(|| "n1".into()),
            replicas,
            ..VolumeRecord::new(name, 1 << 30, 2)
        }
    }

    /// Nodes n1..=n`count`, online unless listed in `down` (offline for `age_ms`).
    fn nodes(count: usize, down: &[&str], age_ms: u64) -> BTreeMap<String, NodeView> {
        (1..=count)
            .map(|i| {
                let name = format!("n{i}");
                let off = down.contains(&name.as_str());
                let view = NodeView {
                    online: !off,
                    age_ms: if off { age_ms } else { 1000 },
                    evacuate: false,
                };
                (name, view)
            })
            .collect()
    }

    fn attached_pair(name: &str, second: ReplicaState) -> VolumeRecord {
        volume(
            name,
            VolumeState::Attached,
            vec![
                replica(&format!("{name}-a"), "n1", ReplicaState::InSync),
                replica(&format!("{name}-b"), "n2", second),
            ],
        )
    }

    #[test]
    fn an_outdated_replica_is_replaced_only_after_the_delay() {
        let v = [attached_pair("v", ReplicaState::Outdated)];
        assert!(plan(&v, &nodes(4, &["n2"], 19_000), CFG).actions.is_empty());
        let p = plan(&v, &nodes(4, &["n2"], 21_000), CFG);
        assert_eq!(
            p.actions,
            vec![Action::Replace {
                volume: "v".into(),
                replica: "v-b".into()
            }]
        );
    }

    #[test]
    fn an_in_sync_replica_of_an_attached_volume_is_left_to_its_engine() {
        let v = [attached_pair("v", ReplicaState::InSync)];
        assert!(plan(&v, &nodes(4, &["n2"], 60_000), CFG).actions.is_empty());
        // Detached: nobody else will outdate it; replaced (the other one is the source).
        let mut d = attached_pair("v", ReplicaState::InSync);
        d.state = VolumeState::Detached;
        let p = plan(&[d], &nodes(4, &["n2"], 60_000), CFG);
        assert_eq!(p.actions.len(), 1, "{p:?}");
    }

    #[test]
    fn a_restoring_volume_is_not_rebuilt_until_its_restore_ends() {
        let mut d = attached_pair("v", ReplicaState::Failed);
        d.state = VolumeState::Detached;
        d.restoring = Some("standby of offsite/db".into());
        let p = plan(std::slice::from_ref(&d), &nodes(4, &[], 0), CFG);
        assert!(p.actions.is_empty(), "{p:?}");
        assert_eq!(p.held, ["volume v: no rebuild while standby of offsite/db"]);
        d.restoring = None;
        assert_eq!(plan(&[d], &nodes(4, &[], 0), CFG).actions.len(), 1);
    }

    #[test]
    fn failed_replicas_are_replaced_at_once() {
        let v = [attached_pair("v", ReplicaState::Failed)];
        let p = plan(&v, &nodes(4, &[], 0), CFG);
        assert!(matches!(&p.actions[..], [Action::Replace { replica, .. }] if replica == "v-b"));
    }

    #[test]
    fn no_rebuilds_while_more_than_a_third_of_the_nodes_are_down() {
        let v = [attached_pair("v", ReplicaState::Outdated)];
        let p = plan(&v, &nodes(5, &["n2", "n3"], 60_000), CFG);
        assert!(p.actions.is_empty(), "{p:?}");
        assert!(p.held[0].contains("2 of 5 nodes offline"), "{:?}", p.held);
        // One of three is not more than a third.
        let p = plan(&v, &nodes(3, &["n2"], 60_000), CFG);
        assert_eq!(p.actions.len(), 1);
    }

    #[test]
    fn rebuilds_are_bounded_and_one_per_volume() {
        let mut vs: Vec<VolumeRecord> = (0..4)
            .map(|i| attached_pair(&format!("v{i}"), ReplicaState::Outdated))
            .collect();
        let p = plan(&vs, &nodes(4, &["n2"], 60_000), CFG);
        assert_eq!(p.actions.len(), 2, "{p:?}");
        assert_eq!(p.held.len(), 2, "{:?}", p.held);
        // A volume with a blank replica (rebuilding) starts no second one, and counts.
        vs[0].replicas.push(Replica {
            blank: true,
            ..replica("v0-c", "n3", ReplicaState::Outdated)
        });
        let p = plan(&vs, &nodes(4, &["n2"], 60_000), CFG);
        assert_eq!(p.actions.len(), 1, "{p:?}");
        assert!(p
            .actions
            .iter()
            .all(|a| !matches!(a, Action::Replace { volume, .. } if volume == "v0")));
    }

    #[test]
    fn nothing_is_replaced_without_an_online_source() {
        let p2 = plan(
            &[volume(
                "v",
                VolumeState::Detached,
                vec![
                    replica("a", "n1", ReplicaState::Outdated),
                    replica("b", "n2", ReplicaState::InSync),
                ],
            )],
            &nodes(7, &["n1", "n2"], 60_000),
            CFG,
        );
        assert!(
            p2.actions.is_empty(),
            "the only in-sync one is offline: {p2:?}"
        );
        assert!(
            p2.held.iter().any(|h| h.contains("no other in-sync")),
            "{:?}",
            p2.held
        );
    }

    #[test]
    fn evacuation_adds_first_and_retires_only_when_the_others_suffice() {
        let mut ns = nodes(4, &[], 0);
        ns.get_mut("n2").unwrap().evacuate = true;
        let v = attached_pair("v", ReplicaState::InSync);
        let p = plan(std::slice::from_ref(&v), &ns, CFG);
        assert_eq!(
            p.actions,
            vec![Action::AddFor {
                volume: "v".into(),
                replica: "v-b".into()
            }]
        );
        // The new one is still syncing: nothing more.
        let mut moving = v.clone();
        moving.replicas.push(Replica {
            blank: true,
            ..replica("v-c", "n3", ReplicaState::Outdated)
        });
        assert!(plan(std::slice::from_ref(&moving), &ns, CFG)
            .actions
            .is_empty());
        // In sync: the evacuating one goes.
        moving.replicas[2].state = ReplicaState::InSync;
        moving.replicas[2].blank = false;
        let p = plan(&[moving], &ns, CFG);
        assert_eq!(
            p.actions,
            vec![Action::Retire {
                volume: "v".into(),
                replica: "v-b".into()
            }]
        );
    }

    #[test]
    fn a_detached_volume_gets_a_sync_engine_while_a_replica_is_blank() {
        let mut v = attached_pair("v", ReplicaState::InSync);
        v.state = VolumeState::Detached;
        v.attached_node = None;
        v.replicas.push(Replica {
            blank: true,
            ..replica("v-c", "n3", ReplicaState::Outdated)
        });
        let ns = nodes(4, &[], 0);
        let p = plan(std::slice::from_ref(&v), &ns, CFG);
        assert_eq!(
            p.actions,
            vec![Action::SyncDetached {
                volume: "v".into(),
                node: "n1".into()
            }]
        );
        v.sync_node = Some("n1".into());
        assert!(plan(std::slice::from_ref(&v), &ns, CFG).actions.is_empty());
        // Its node went away: stop (a later round picks another).
        let p = plan(std::slice::from_ref(&v), &nodes(4, &["n1"], 1_000), CFG);
        assert_eq!(p.actions, vec![Action::EndSync { volume: "v".into() }]);
        // Synced: stop.
        v.replicas[2].blank = false;
        v.replicas[2].state = ReplicaState::InSync;
        let p = plan(&[v], &ns, CFG);
        assert_eq!(p.actions, vec![Action::EndSync { volume: "v".into() }]);
    }

    #[test]
    fn retired_replicas_are_deleted_when_their_node_is_back() {
        let mut v = attached_pair("v", ReplicaState::InSync);
        v.retired.push(replica("old", "n3", ReplicaState::Outdated));
        assert!(
            plan(std::slice::from_ref(&v), &nodes(4, &["n3"], 60_000), CFG)
                .actions
                .is_empty()
        );
        let p = plan(&[v], &nodes(4, &[], 0), CFG);
        assert_eq!(
            p.actions,
            vec![Action::DeleteRetired {
                volume: "v".into(),
                replica: "old".into()
            }]
        );
    }
}
