//! Which attached volumes a failover should move: the pure decision, from the records and
//! what the engines report.
//!
//! A volume is *stranded* when it is attached on a node whose agent has not heartbeated for
//! the failover timeout, or when its engine has lost quorum for that long: it reports a
//! replica `down` that it may not outdate (the quorum forbids it), so the writes that replica
//! missed wait, while the volume's node itself is fine. It may be moved only if the
//! controller can *vouch* for it: some
//! in-sync replica lives on another node that is heartbeating, so a new engine there has
//! every acknowledged write. A controller cut off from the agents sees every node silent and
//! vouches for nothing, so it moves nothing.

use std::collections::HashMap;

use hawser_api::controller::{ReplicaState, VolumeState};

use crate::store::model::{NodeRecord, VolumeRecord};

/// A volume attached on a silent node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stranded {
    pub volume: String,
    pub node: String,
    /// The epoch of the attachment to fence.
    pub epoch: u64,
    /// Milliseconds since the node's last heartbeat, or since its engine lost quorum.
    pub silent_ms: u64,
    /// The node heartbeats; its engine lost quorum.
    pub quorum_lost: bool,
    /// Silent for less than the timeout, but its peers confirm its host is silent too
    /// (`confirm.rs`): what they found.
    pub confirmed: Option<String>,
    /// The heartbeating node of an in-sync replica, or why there is none.
    pub vouch: Result<String, String>,
}

/// The stranded volumes, in name order. A node without a record counts as silent since
/// forever; a node in `down` (confirmed by its peers, with their findings) as silent past the
/// timeout.
pub fn stranded(
    nodes: &[NodeRecord],
    volumes: &[VolumeRecord],
    now_ms: u64,
    after_ms: u64,
    quorum_lost_ms: &HashMap<String, u64>,
    down: &HashMap<String, String>,
) -> Vec<Stranded> {
    let age = |name: &str| {
        nodes
            .iter()
            .find(|n| n.name == name)
            .map_or(u64::MAX, |n| n.age_ms(now_ms))
    };
    let live = |name: &str| age(name) <= after_ms && !down.contains_key(name);
    let mut out: Vec<Stranded> = volumes
        .iter()
        .filter(|v| v.state == VolumeState::Attached)
        .filter_map(|v| {
            let node = v.attached_node.as_deref()?;
            let mut silent_ms = age(node);
            let mut quorum_lost = false;
            let confirmed = down.get(node).cloned();
            if silent_ms <= after_ms && confirmed.is_none() {
                match quorum_lost_ms.get(&v.name) {
                    Some(&ms) if ms > after_ms => {
                        silent_ms = ms;
                        quorum_lost = true;
                    }
                    _ => return None,
                }
            }
            let in_sync_elsewhere: Vec<&str> = v
                .replicas
                .iter()
                .filter(|r| r.state == ReplicaState::InSync && r.node != node)
                .map(|r| r.node.as_str())
                .collect();
            let vouch = match in_sync_elsewhere.iter().find(|n| live(n)) {
                Some(n) => Ok((*n).to_string()),
                None if in_sync_elsewhere.is_empty() => Err(format!(
                    "no in-sync replica outside node {node}: only it has every acknowledged write"
                )),
                None => Err(format!(
                    "the nodes of its other in-sync replicas ({}) are not heartbeating either",
                    in_sync_elsewhere.join(", ")
                )),
            };
            Some(Stranded {
                volume: v.name.clone(),
                node: node.to_string(),
                epoch: v.epoch,
                silent_ms,
                quorum_lost,
                confirmed,
                vouch,
            })
        })
        .collect();
    out.sort_by(|a, b| a.volume.cmp(&b.volume));
    out
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_api::controller::Replica;

    /// A node record last seen at `last_seen_ms`, with nothing else in it.
    pub(crate) fn node(name: &str, last_seen_ms: u64) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            admin_addr: String::new(),
            replica_addr: String::new(),
            nbd_addr: None,
            nbd_socket: None,
            nbd_tls: false,
            last_seen_ms,
            pools: vec![],
            labels: Default::default(),
        }
    }

    fn volume(name: &str, on: &str, replicas: &[(&str, ReplicaState)]) -> VolumeRecord {
        let count = u32::try_from(replicas.len()).unwrap();
        VolumeRecord {
            state: VolumeState::Attached,
            epoch: 4,
            attached_node: Some(on.into()),
            replicas: replicas
                .iter()
                .enumerate()
                .map(|(i, (n, s))| Replica {
                    id: format!("r{i}"),
                    node: (*n).into(),
                    pool: "p".into(),
                    state: *s,
                    blank: false,
                    engine: None,
                })
                .collect(),
            ..VolumeRecord::new(name, 1, count)
        }
    }

    const NOW: u64 = 100_000;
    const AFTER: u64 = 10_000;

    #[test]
    fn only_volumes_on_silent_nodes_with_a_live_in_sync_copy_are_vouched_for() {
        use ReplicaState::*;
        let nodes = [
            node("a", NOW - 11_000),
            node("b", NOW - 500),
            node("c", NOW - 9_999),
        ];
        let vols = [
            volume("v1", "a", &[("a", InSync), ("b", InSync)]),
            volume("v2", "c", &[("c", InSync), ("b", InSync)]), // c only slow
            volume("v3", "a", &[("a", InSync), ("b", Outdated)]),
            volume("v4", "a", &[("a", InSync), ("d", InSync)]), // d unknown
            volume("v5", "gone", &[("gone", InSync), ("b", InSync)]),
        ];
        let s = stranded(
            &nodes,
            &vols,
            NOW,
            AFTER,
            &Default::default(),
            &Default::default(),
        );
        let names: Vec<&str> = s.iter().map(|x| x.volume.as_str()).collect();
        assert_eq!(names, ["v1", "v3", "v4", "v5"]);
        assert_eq!(s[0].vouch, Ok("b".into()));
        assert_eq!((s[0].epoch, s[0].silent_ms), (4, 11_000));
        assert!(s[1]
            .vouch
            .as_ref()
            .unwrap_err()
            .contains("no in-sync replica outside"));
        assert!(s[2].vouch.as_ref().unwrap_err().contains("(d)"));
        assert_eq!(s[3].vouch, Ok("b".into()));
        assert_eq!(s[3].silent_ms, u64::MAX);
    }

    #[test]
    fn a_controller_that_hears_no_node_moves_nothing() {
        use ReplicaState::*;
        let nodes = [node("a", 0), node("b", 0)];
        let vols = [volume("v1", "a", &[("a", InSync), ("b", InSync)])];
        let s = stranded(
            &nodes,
            &vols,
            NOW,
            AFTER,
            &Default::default(),
            &Default::default(),
        );
        assert!(s[0].vouch.is_err());
        // Detached volumes are never stranded.
        let mut v = vols[0].clone();
        v.state = VolumeState::Detached;
        assert!(stranded(
            &nodes,
            &[v],
            NOW,
            AFTER,
            &Default::default(),
            &Default::default()
        )
        .is_empty());
    }

    #[test]
    fn an_engine_without_quorum_long_enough_strands_its_volume() {
        use ReplicaState::*;
        let nodes = [
            node("a", NOW - 100),
            node("b", NOW - 100),
            node("c", NOW - 100),
        ];
        let vols = [
            volume("v1", "a", &[("a", InSync), ("b", InSync), ("c", InSync)]),
            volume("v2", "a", &[("a", InSync), ("b", InSync)]),
        ];
        let lost = [("v1".to_string(), 12_000), ("v2".to_string(), 3_000)].into();
        let s = stranded(&nodes, &vols, NOW, AFTER, &lost, &Default::default());
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].volume.as_str(), s[0].quorum_lost), ("v1", true));
        assert_eq!(s[0].silent_ms, 12_000);
        assert_eq!(s[0].vouch, Ok("b".into()));
    }

    #[test]
    fn a_node_its_peers_confirm_down_strands_its_volumes_before_the_timeout() {
        use ReplicaState::*;
        let nodes = [
            node("a", NOW - 5_000),
            node("b", NOW - 500),
            node("c", NOW - 5_000),
        ];
        let vols = [
            volume("v1", "a", &[("a", InSync), ("b", InSync)]),
            volume("v2", "b", &[("b", InSync), ("c", InSync)]),
            volume("v3", "a", &[("a", InSync), ("c", InSync)]),
        ];
        let (no_loss, none) = (HashMap::new(), HashMap::new());
        assert!(stranded(&nodes, &vols, NOW, AFTER, &no_loss, &none).is_empty());
        let down: HashMap<String, String> = [("a", "b: no answer"), ("c", "b: no answer")]
            .into_iter()
            .map(|(n, w)| (n.to_string(), w.to_string()))
            .collect();
        let s = stranded(&nodes, &vols, NOW, AFTER, &no_loss, &down);
        let names: Vec<&str> = s.iter().map(|x| x.volume.as_str()).collect();
        assert_eq!(names, ["v1", "v3"], "{s:?}");
        assert_eq!(s[0].vouch, Ok("b".into()));
        assert_eq!((s[0].silent_ms, s[0].quorum_lost), (5_000, false));
        assert_eq!(s[0].confirmed.as_deref(), Some("b: no answer"));
        // c heartbeated 5 s ago, within the timeout, but is down too: it vouches for nothing.
        assert!(s[1].vouch.as_ref().unwrap_err().contains("(c)"), "{s:?}");
    }
}
