//! Failing a node over before the timeout when its peers confirm that its host is silent.
//!
//! The timeout ([`super::HaConfig::after_ms`], 10 s by default) must outlast any pause of a
//! live agent, or pods move off nodes that are fine. Most of it is waiting for certainty that
//! the peers of a node can give sooner: once a node with attached volumes has not heartbeated
//! for [`super::HaConfig::confirm_ms`] (one missed heartbeat and a margin), the leader asks
//! up to [`MAX_WITNESSES`] heartbeating nodes' agents to probe its replica port
//! (`POST /v1/peers/probe`). The node counts as down at once when at least one answered and
//! every answer says its host did not answer at all: no TCP answer within the probe's second,
//! or the network reports it unreachable. That is a host that lost power, crashed or lost its
//! link. It does not count as down when any peer reached it, or its kernel refused the
//! connection (an agent restarting on a live host: a pause to its volumes, which
//! survive it, not a reason to move pods), or accepted it without a handshake (a hung agent),
//! or nobody could tell (agents too old to say). Those wait for the timeout, as before.
//!
//! A node found down stays so until it heartbeats again; one found alive is asked about again
//! after [`PROBE_AGAIN`].

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use hawser_api::agent::{PeerAddr, PeerReach, ProbePeers};
use hawser_api::controller::VolumeState;

use crate::cluster::agent_client::AgentClient;
use crate::state::AppState;
use crate::store::model::{NodeRecord, VolumeRecord};

/// At most this many heartbeating nodes are asked about one silent node.
pub const MAX_WITNESSES: usize = 3;

/// A node found alive is probed again after this long, while it stays silent.
const PROBE_AGAIN: Duration = Duration::from_secs(2);

/// One probe call (the agent gives each peer a second).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The silent nodes the leader has asked about, each with the heartbeat it was silent since.
#[derive(Default)]
pub struct Confirmations {
    /// Down: node -> (its last heartbeat, the peers' findings).
    down: HashMap<String, (u64, String)>,
    /// Alive or unknown: node -> (its last heartbeat, when asked).
    not_down: HashMap<String, (u64, Instant)>,
}

impl Confirmations {
    /// The nodes found down, with what their peers found.
    pub fn down(&self) -> HashMap<String, String> {
        self.down
            .iter()
            .map(|(n, (_, why))| (n.clone(), why.clone()))
            .collect()
    }

    /// Forgets what heartbeats since made stale, then asks about each node that has been
    /// silent for more than `confirm_ms` (and not yet `after_ms`) and runs an engine.
    pub async fn update(
        &mut self,
        st: &AppState,
        nodes: &[NodeRecord],
        volumes: &[VolumeRecord],
        now: u64,
        confirm_ms: u64,
        after_ms: u64,
    ) {
        let last_seen: HashMap<&str, u64> = nodes
            .iter()
            .map(|n| (n.name.as_str(), n.last_seen_ms))
            .collect();
        let fresh = |node: &String, seen: u64| last_seen.get(node.as_str()) == Some(&seen);
        self.down.retain(|n, (seen, _)| fresh(n, *seen));
        self.not_down
            .retain(|n, (seen, at)| fresh(n, *seen) && at.elapsed() < PROBE_AGAIN);
        if confirm_ms == 0 {
            return;
        }
        let engines: HashSet<&str> = volumes
            .iter()
            .filter(|v| v.state == VolumeState::Attached)
            .filter_map(|v| v.attached_node.as_deref())
            .collect();
        let silent = |n: &&NodeRecord| {
            let age = n.age_ms(now);
            age > confirm_ms && age <= after_ms
        };
        let suspects: Vec<&NodeRecord> = nodes
            .iter()
            .filter(silent)
            .filter(|n| engines.contains(n.name.as_str()) && !n.replica_addr.is_empty())
            .filter(|n| !self.down.contains_key(&n.name) && !self.not_down.contains_key(&n.name))
            .collect();
        if suspects.is_empty() {
            return;
        }
        let witnesses: Vec<&NodeRecord> = nodes
            .iter()
            .filter(|n| n.age_ms(now) <= confirm_ms)
            .collect();
        let asks = suspects.iter().map(|s| async {
            let chosen: Vec<&NodeRecord> = witnesses
                .iter()
                .filter(|w| w.name != s.name)
                .take(MAX_WITNESSES)
                .copied()
                .collect();
            (*s, ask(&st.agents, s, &chosen).await)
        });
        for (s, finding) in futures_util::future::join_all(asks).await {
            match finding {
                Finding::Down(why) => {
                    tracing::warn!(node = %s.name, "no heartbeat, and its host is silent to its peers: {why}");
                    self.down.insert(s.name.clone(), (s.last_seen_ms, why));
                }
                Finding::NotDown(why) => {
                    tracing::info!(node = %s.name, "no heartbeat, but not confirmed down (failover waits for the timeout): {why}");
                    self.not_down
                        .insert(s.name.clone(), (s.last_seen_ms, Instant::now()));
                }
            }
        }
    }
}

/// What the witnesses found about a silent node.
#[derive(Debug, PartialEq, Eq)]
enum Finding {
    Down(String),
    NotDown(String),
}

/// Asks each witness's agent to probe `node`'s replica port.
async fn ask(agents: &AgentClient, node: &NodeRecord, witnesses: &[&NodeRecord]) -> Finding {
    let req = ProbePeers {
        peers: vec![PeerAddr {
            node: node.name.clone(),
            replica_addr: node.replica_addr.clone(),
        }],
    };
    let calls = witnesses.iter().map(|w| {
        let req = &req;
        async move {
            let call = tokio::time::timeout(CALL_TIMEOUT, agents.probe_peers(w.agent(), req));
            let answer = match call.await {
                Ok(Ok(answers)) => answers.into_iter().find(|a| a.node == node.name),
                Ok(Err(_)) | Err(_) => None,
            };
            (w.name.as_str(), answer)
        }
    });
    judge(&futures_util::future::join_all(calls).await)
}

/// Down only when some witness answered and every answer says the host did not answer.
fn judge(answers: &[(&str, Option<PeerReach>)]) -> Finding {
    let said: Vec<(&str, &PeerReach)> = answers
        .iter()
        .filter_map(|(w, a)| a.as_ref().map(|a| (*w, a)))
        .collect();
    if said.is_empty() {
        return Finding::NotDown("no witness could probe it".into());
    }
    let describe = |w: &str, a: &PeerReach| {
        let what = if a.reached {
            "reached it"
        } else {
            a.error.as_deref().unwrap_or("not reached")
        };
        format!("{w}: {what}")
    };
    let all: Vec<String> = said.iter().map(|(w, a)| describe(w, a)).collect();
    if said
        .iter()
        .all(|(_, a)| !a.reached && a.host_answered == Some(false))
    {
        Finding::Down(all.join("; "))
    } else {
        Finding::NotDown(all.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(reached: bool, host_answered: Option<bool>) -> Option<PeerReach> {
        Some(PeerReach {
            node: "n3".into(),
            reached,
            error: (!reached).then(|| "connect to 10.0.0.3:4000: timed out".into()),
            host_answered,
        })
    }

    #[test]
    fn only_a_host_silent_to_every_witness_that_answered_is_down() {
        let down = |a: &[(&str, Option<PeerReach>)]| matches!(judge(a), Finding::Down(_));
        let silent = reach(false, Some(false));
        assert!(down(&[("n1", silent.clone())]));
        // A witness that could not probe does not count either way.
        assert!(down(&[("n1", silent.clone()), ("n2", None)]));
        assert!(!down(&[("n1", None), ("n2", None)]), "nobody could tell");
        assert!(!down(&[]));
        // One witness that reached it, or whose connection its kernel refused (an agent
        // restarting), or accepted (a hung agent), or that cannot tell (an old agent).
        for other in [
            reach(true, None),
            reach(false, Some(true)),
            reach(false, None),
        ] {
            assert!(!down(&[("n1", silent.clone()), ("n2", other)]));
        }
        let Finding::Down(why) = judge(&[("n1", silent.clone()), ("n2", silent)]) else {
            unreachable!()
        };
        assert_eq!(
            why,
            "n1: connect to 10.0.0.3:4000: timed out; n2: connect to 10.0.0.3:4000: timed out"
        );
    }
}
