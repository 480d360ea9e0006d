//! The failover's two taints, both `NoSchedule`, so the scheduler puts the moved pods
//! elsewhere:
//! - [`UNREACHABLE_TAINT`] on a node whose agent stopped heartbeating; lifted when it
//!   heartbeats again.
//! - [`QUORUM_LOST_TAINT`] on a node whose engine lost quorum. That node heartbeats, so the
//!   controller cannot see what is wrong: its path to a replica's node. It is lifted when the
//!   node's agent reaches the replica port of every heartbeating peer ([`peers_reached`]).
//!   A node is not given this taint when it is the last heartbeating node without one: the
//!   moved pods would have nowhere to go, and a fault that cuts one node off from every
//!   other looks the same from each of them.
//!
//! Both are found again on the nodes after a controller restart or a change of leader, so
//! nothing about them is kept only in memory.

use std::collections::HashMap;
use std::time::Duration;

use hawser_api::agent::{PeerAddr, ProbePeers};

use crate::cluster::agent_client::AgentClient;
use crate::cluster::agent_client::AgentError;
use crate::ha::kube::{Kube, Tainted};
pub use crate::ha::kube::{QUORUM_LOST_TAINT, UNREACHABLE_TAINT};
use crate::state::AppState;
use crate::store::model::NodeRecord;

/// A whole probe call (the agent probes its peers at once, each for at most a second).
const PROBE_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// The node records of one round, and who of them heartbeats.
#[derive(Clone, Copy)]
pub struct Beats<'a> {
    pub nodes: &'a [NodeRecord],
    pub now: u64,
    /// The failover timeout: a node silent longer does not heartbeat.
    pub after_ms: u64,
    /// Nodes whose peers confirm them down (`confirm.rs`): they do not heartbeat either.
    pub down: &'a HashMap<String, String>,
}

impl<'a> Beats<'a> {
    /// The nodes heartbeating within the timeout.
    pub fn live(self) -> impl Iterator<Item = &'a NodeRecord> {
        self.nodes.iter().filter(move |n| {
            n.age_ms(self.now) <= self.after_ms && !self.down.contains_key(&n.name)
        })
    }
}

/// Lifts the unreachable taint of every node heartbeating again, and (with `probe`) the
/// quorum-lost taint of every node that reaches its peers again.
pub async fn lift_recovered(
    st: &AppState,
    kube: &Kube,
    beats: Beats<'_>,
    names: &K8sNames,
    tainted: &mut Tainted,
    probe: bool,
) -> Result<(), String> {
    for n in beats.live() {
        let k = names.of(&n.name);
        if tainted.unreachable.contains(&k) {
            kube.set_taint(&k, UNREACHABLE_TAINT, false).await?;
            tainted.unreachable.remove(&k);
            tracing::info!(node = %k, "agent heartbeating again: untainted");
        }
    }
    if !probe || tainted.quorum_lost.is_empty() {
        return Ok(());
    }
    let checks = beats
        .live()
        .filter(|n| tainted.quorum_lost.contains(&names.of(&n.name)))
        .map(|n| async move { (n, peers_reached(&st.agents, beats, n).await) });
    for (n, reached) in futures_util::future::join_all(checks).await {
        let k = names.of(&n.name);
        match reached {
            Ok(peers) => {
                kube.set_taint(&k, QUORUM_LOST_TAINT, false).await?;
                tainted.quorum_lost.remove(&k);
                tracing::info!(
                    node = %k,
                    "node reaches the replica ports of its peers again ({}): \
                     taint {QUORUM_LOST_TAINT} lifted",
                    peers.join(", ")
                );
            }
            Err(why) => tracing::debug!(node = %k, "quorum-lost taint kept: {why}"),
        }
    }
    Ok(())
}

/// Asks `n`'s agent to probe the replica port of every other heartbeating node: the peers it
/// reached, or why the taint stays. An agent too old to probe gets the taint lifted, as
/// before this taint existed.
async fn peers_reached(
    agents: &AgentClient,
    beats: Beats<'_>,
    n: &NodeRecord,
) -> Result<Vec<String>, String> {
    let peers: Vec<PeerAddr> = beats
        .live()
        .filter(|p| p.name != n.name && !p.replica_addr.is_empty())
        .map(|p| PeerAddr {
            node: p.name.clone(),
            replica_addr: p.replica_addr.clone(),
        })
        .collect();
    let names: Vec<String> = peers.iter().map(|p| p.node.clone()).collect();
    let req = ProbePeers { peers };
    let call = agents.probe_peers(n.agent(), &req);
    match tokio::time::timeout(PROBE_CALL_TIMEOUT, call).await {
        Err(_) => Err(format!(
            "its agent did not answer the probe within {} s",
            PROBE_CALL_TIMEOUT.as_secs()
        )),
        Ok(Err(AgentError::Refused { status: 404, .. })) => Ok(names),
        Ok(Err(e)) => Err(format!("probe failed: {e}")),
        Ok(Ok(answers)) => {
            let missed: Vec<String> = answers
                .iter()
                .filter(|a| !a.reached)
                .map(|a| {
                    format!(
                        "{}: {}",
                        a.node,
                        a.error.as_deref().unwrap_or("not reached")
                    )
                })
                .collect();
            let answered = names.iter().all(|p| answers.iter().any(|a| a.node == *p));
            match (missed.is_empty(), answered) {
                (true, true) => Ok(names),
                (_, false) => Err("the probe did not answer for every peer".into()),
                (false, _) => Err(missed.join("; ")),
            }
        }
    }
}

/// Whether `node` (a Kubernetes name) may get the quorum-lost taint: some other heartbeating
/// node known to Kubernetes carries neither taint.
pub fn may_taint_quorum_lost(
    node: &str,
    beats: Beats<'_>,
    names: &K8sNames,
    tainted: &Tainted,
) -> bool {
    beats.live().map(|n| names.of(&n.name)).any(|k| {
        k != node && !tainted.unreachable.contains(&k) && !tainted.quorum_lost.contains(&k)
    })
}

/// The Kubernetes name of each Hawser node ([`Kube::node_names`]).
pub struct K8sNames(pub HashMap<String, String>);

impl K8sNames {
    /// Its Kubernetes name: the same one when the CSINodes do not say.
    pub fn of(&self, hawser: &str) -> String {
        self.0.get(hawser).cloned().unwrap_or_else(|| hawser.into())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ha::plan::tests::node;

    const NOW: u64 = 100_000;
    const AFTER: u64 = 10_000;

    fn set(names: &[&str]) -> std::collections::HashSet<String> {
        names.iter().map(|n| (*n).to_string()).collect()
    }

    #[test]
    fn the_last_heartbeating_untainted_node_is_not_tainted_for_a_lost_quorum() {
        let nodes = [node("a", NOW), node("b", NOW), node("c", NOW - AFTER - 1)];
        let none = HashMap::new();
        let beats = Beats {
            nodes: &nodes,
            now: NOW,
            after_ms: AFTER,
            down: &none,
        };
        let same = K8sNames(HashMap::new());
        let mut t = Tainted::default();
        // b heartbeats and carries no taint: a may be tainted.
        assert!(may_taint_quorum_lost("a", beats, &same, &t));
        // b carries one: a is the last. c is silent, so it does not count either way.
        t.quorum_lost = set(&["b"]);
        assert!(!may_taint_quorum_lost("a", beats, &same, &t));
        t.quorum_lost.clear();
        t.unreachable = set(&["b"]);
        assert!(!may_taint_quorum_lost("a", beats, &same, &t));
        // Kubernetes names: b is "k-b" there, and a taint on "k-b" is b's.
        let k = K8sNames(
            ["a", "b", "c"]
                .iter()
                .map(|n| ((*n).to_string(), format!("k-{n}")))
                .collect(),
        );
        t.unreachable = set(&["k-b"]);
        assert!(!may_taint_quorum_lost("k-a", beats, &k, &t));
        t.unreachable = set(&["b"]);
        assert!(may_taint_quorum_lost("k-a", beats, &k, &t));
    }
}
