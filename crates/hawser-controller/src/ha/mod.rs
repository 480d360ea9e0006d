//! Failover on Kubernetes: when the node running a volume's engine stops heartbeating for
//! [`HaConfig::after_ms`] (or for [`HaConfig::confirm_ms`], if its host is silent to its
//! peers too: `confirm.rs`), or its engine has lost quorum that long (a replica it cannot
//! reach and may not outdate, seen in the agent's status), the leader moves the pods that use
//! the volume to another node.
//!
//! In this order, for each volume [`plan::stranded`] vouches for:
//! 1. **Fence**: one compare-and-swap on the volume record: detached, epoch + 1. It is a
//!    leader-fenced write, so a controller that lost its lease fails here and does nothing
//!    else; and the old engine's outdate reports are refused from now on, so it cannot
//!    acknowledge a write that misses a replica. Replicas refuse it for good once the new
//!    engine has connected at a higher epoch.
//! 2. **Free the attachment**: the volume leaves the node's `status.volumesInUse` (the
//!    attach/detach controller would otherwise wait six minutes for a dead kubelet) and its
//!    VolumeAttachments to that node are deleted.
//! 3. **Move the pods**: the node is tainted `NoSchedule` (`taints.rs`: a silent node until
//!    its agent is back, a node whose engine lost quorum until it reaches its peers again),
//!    and the pods are deleted at once, so their StatefulSet or Deployment recreates them
//!    elsewhere.
//! 4. **Tell**: an Event on each PVC (and on pods left alone).
//!
//! Pods annotated `hawser.dev/failover: "false"` are left alone with their volumes, and so
//! are volumes nobody can vouch for; both get an Event once per outage. Volumes without a
//! PersistentVolume (attached with the CLI) are not Kubernetes' to move.

pub(crate) mod confirm;
pub mod kube;
pub(crate) mod plan;
pub mod taints;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hawser_api::controller::VolumeState;

use crate::errors::ControllerError;
use crate::ha::kube::{Kube, PodUse, Tainted};
use crate::ha::plan::Stranded;
use crate::state::AppState;
use crate::store::leader::Role;
use crate::store::model::now_ms;

/// How often the leader looks for stranded volumes.
pub const HA_TICK: Duration = Duration::from_millis(500);

pub struct HaConfig {
    /// Silence after which a node's volumes are failed over.
    pub after_ms: u64,
    /// Silence after which a node's peers are asked whether its host answers them, and its
    /// volumes failed over at once if it does not (`confirm.rs`); 0: not before `after_ms`.
    pub confirm_ms: u64,
}

/// What one outage has been reported as already: (volume, node, reason).
type Reported = HashSet<(String, String, &'static str)>;

/// What the failover keeps from one round to the next while it leads.
#[derive(Default)]
struct Memory {
    reported: Reported,
    /// Nodes carrying the failover's taints; `None` until it has looked (after it starts
    /// leading).
    tainted: Option<Tainted>,
    confirm: confirm::Confirmations,
}

pub async fn run(st: Arc<AppState>, kube: Arc<Kube>, cfg: HaConfig) {
    let mut tick = tokio::time::interval(HA_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut memory = Memory::default();
    let mut quorum = QuorumWatch::default();
    let mut round_no: u64 = 0;
    loop {
        tick.tick().await;
        if !matches!(st.leadership.role(), Role::Leader { .. } | Role::Sole) {
            memory.tainted = None;
            continue;
        }
        round_no += 1;
        let check = round_no.is_multiple_of(QUORUM_CHECK_ROUNDS);
        if check {
            quorum.check(&st).await;
        }
        let lost = quorum.lost_ms();
        let r = round(&st, &kube, &cfg, &lost, &mut memory, check);
        if let Err(e) = r.await {
            tracing::warn!(error = %e, "failover round failed");
        }
    }
}

async fn round(
    st: &AppState,
    kube: &Kube,
    cfg: &HaConfig,
    quorum_lost_ms: &HashMap<String, u64>,
    memory: &mut Memory,
    probe: bool,
) -> Result<(), String> {
    let nodes = st.records.nodes().await.map_err(|e| e.to_string())?;
    let volumes = st.records.volumes_seen().await.map_err(|e| e.to_string())?;
    let now = now_ms();
    let Memory {
        reported,
        tainted,
        confirm,
    } = memory;
    let tainted = match tainted {
        Some(t) => t,
        None => tainted.insert(kube.tainted_nodes().await?),
    };
    confirm
        .update(st, &nodes, &volumes, now, cfg.confirm_ms, cfg.after_ms)
        .await;
    let down = confirm.down();
    let stranded = plan::stranded(&nodes, &volumes, now, cfg.after_ms, quorum_lost_ms, &down);
    let beats = taints::Beats {
        nodes: &nodes,
        now,
        after_ms: cfg.after_ms,
        down: &down,
    };
    // Nodes heartbeating again: a later outage is reported anew.
    for n in beats.live() {
        reported.retain(|(_, node, _)| *node != n.name);
    }
    if stranded.is_empty() && tainted.is_empty() {
        return Ok(());
    }
    // ... and their taints are lifted.
    let names = taints::K8sNames(kube.node_names().await?);
    taints::lift_recovered(st, kube, beats, &names, tainted, probe).await?;
    if stranded.is_empty() {
        return Ok(());
    }
    let pvs = kube.hawser_pvs().await?;
    let mut pods_by_node: HashMap<String, Vec<PodUse>> = HashMap::new();
    for s in &stranded {
        let Some(pv) = pvs.iter().find(|p| p.volume == s.volume) else {
            continue; // not a Kubernetes volume
        };
        let node = names.of(&s.node);
        if !pods_by_node.contains_key(&s.node) {
            let pods = kube.pods_on(&node, &pvs).await?;
            pods_by_node.insert(s.node.clone(), pods);
        }
        let users: Vec<&PodUse> = pods_by_node[&s.node]
            .iter()
            .filter(|p| p.volumes.iter().any(|(v, _)| *v == s.volume))
            .collect();
        let mut once =
            |reason: &'static str| reported.insert((s.volume.clone(), s.node.clone(), reason));
        if let Some(p) = users.iter().find(|p| p.opted_out) {
            if once("opted-out") {
                let msg = format!(
                    "{}; pod {} opted out of failover (hawser.dev/failover: \"false\"), \
                     volume {} left attached there",
                    what_happened(s),
                    p.name,
                    s.volume
                );
                kube.event("Pod", &p.namespace, &p.name, true, "FailoverSkipped", &msg)
                    .await?;
            }
            continue;
        }
        if let Err(why) = &s.vouch {
            if once("blocked") {
                let msg = format!(
                    "{}, but volume {} cannot be moved: {why}",
                    what_happened(s),
                    s.volume
                );
                tracing::warn!(volume = %s.volume, node = %s.node, "{msg}");
                st.events.keep(
                    Some(&s.volume),
                    Some(&s.node),
                    true,
                    "FailoverBlocked",
                    &msg,
                );
                kube.event(
                    "PersistentVolumeClaim",
                    &pv.claim_namespace,
                    &pv.claim,
                    true,
                    "FailoverBlocked",
                    &msg,
                )
                .await?;
                for p in &users {
                    kube.event("Pod", &p.namespace, &p.name, true, "FailoverBlocked", &msg)
                        .await?;
                }
            }
            continue;
        }
        let started = std::time::Instant::now();
        let Some(epoch) = fence(st, s).await.map_err(|e| e.to_string())? else {
            continue; // moved or re-attached meanwhile
        };
        kube.release_volumes_in_use(&node, std::slice::from_ref(&s.volume))
            .await?;
        let attachments = kube.delete_attachments(&pv.pv, &node).await?;
        taint(kube, beats, &names, tainted, s, &node, reported).await?;
        for p in &users {
            kube.force_delete_pod(p).await?;
        }
        let pods: Vec<&str> = users.iter().map(|p| p.name.as_str()).collect();
        let msg = format!(
            "{}: volume {} fenced at epoch {epoch} (an in-sync replica is on {}), \
             {attachments} attachment(s) and pod(s) [{}] deleted so they start elsewhere",
            what_happened(s),
            s.volume,
            s.vouch.as_deref().unwrap_or("?"),
            pods.join(", ")
        );
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(took_ms, "{msg}");
        st.events
            .keep(Some(&s.volume), Some(&s.node), true, "FailedOver", &msg);
        kube.event(
            "PersistentVolumeClaim",
            &pv.claim_namespace,
            &pv.claim,
            true,
            "FailedOver",
            &msg,
        )
        .await?;
    }
    Ok(())
}

/// Keeps new pods off the node the volume was moved from (`taints.rs`).
async fn taint(
    kube: &Kube,
    beats: taints::Beats<'_>,
    names: &taints::K8sNames,
    tainted: &mut Tainted,
    s: &Stranded,
    node: &str,
    reported: &mut Reported,
) -> Result<(), String> {
    if !s.quorum_lost {
        if tainted.unreachable.insert(node.to_string()) {
            kube.set_taint(node, taints::UNREACHABLE_TAINT, true)
                .await?;
        }
        return Ok(());
    }
    if tainted.quorum_lost.contains(node) {
        return Ok(());
    }
    if taints::may_taint_quorum_lost(node, beats, names, tainted) {
        kube.set_taint(node, taints::QUORUM_LOST_TAINT, true)
            .await?;
        tainted.quorum_lost.insert(node.to_string());
        tracing::warn!(
            node,
            "tainted {} until it reaches its peers again",
            taints::QUORUM_LOST_TAINT
        );
    } else if reported.insert((String::new(), s.node.clone(), "last-node")) {
        tracing::warn!(
            node,
            "not tainted {}: no other heartbeating node is free of the failover's taints",
            taints::QUORUM_LOST_TAINT
        );
    }
    Ok(())
}

/// The outage, for events: "node n1 stopped heartbeating 12 s ago".
fn what_happened(s: &Stranded) -> String {
    if s.quorum_lost {
        format!(
            "the engine on node {} has lost quorum for {} s (a replica it cannot reach and may \
             not outdate)",
            s.node,
            s.silent_ms / 1000
        )
    } else if let Some(found) = &s.confirmed {
        format!(
            "node {} stopped heartbeating {} s ago, and its host is silent to its peers \
             ({found})",
            s.node,
            s.silent_ms / 1000
        )
    } else {
        format!(
            "node {} stopped heartbeating {} s ago",
            s.node,
            s.silent_ms / 1000
        )
    }
}

/// Every this many rounds the engines of attached volumes are asked for their replicas.
const QUORUM_CHECK_ROUNDS: u64 = 4;

/// Since when each attached volume's engine has reported a replica `down` (in its in-sync
/// set, unreachable, not outdated: the quorum forbids it), by volume.
#[derive(Default)]
struct QuorumWatch {
    since: HashMap<String, std::time::Instant>,
}

impl QuorumWatch {
    async fn check(&mut self, st: &AppState) {
        let (Ok(volumes), Ok(nodes)) = (st.records.volumes_seen().await, st.records.nodes().await)
        else {
            return;
        };
        let mut seen = HashSet::new();
        // Each node's engines, asked once per check (`GET /v1/engines`: not its replicas).
        let mut engines = HashMap::new();
        for v in volumes.iter().filter(|v| v.state == VolumeState::Attached) {
            let Some(node) = v.attached_node.as_deref() else {
                continue;
            };
            let Some(rec) = nodes.iter().find(|n| n.name == node) else {
                continue;
            };
            if !engines.contains_key(node) {
                let answer =
                    tokio::time::timeout(Duration::from_secs(2), st.agents.engines(rec.agent()));
                let answer = answer.await.ok().and_then(Result::ok);
                engines.insert(node.to_string(), answer);
            }
            let Some(Some(on_node)) = engines.get(node) else {
                continue;
            };
            let lost = on_node.iter().any(|e| {
                e.volume == v.name
                    && e.epoch == v.epoch
                    && e.replicas.iter().any(|r| r.state == "down")
            });
            if lost {
                seen.insert(v.name.clone());
                self.since
                    .entry(v.name.clone())
                    .or_insert_with(std::time::Instant::now);
            }
        }
        self.since.retain(|v, _| seen.contains(v));
    }

    fn lost_ms(&self) -> HashMap<String, u64> {
        self.since
            .iter()
            .map(|(v, t)| {
                let ms = u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX);
                (v.clone(), ms)
            })
            .collect()
    }
}

/// Detaches the volume from the silent node with a new epoch, if it is still attached there
/// at the epoch the plan saw; returns the new epoch.
async fn fence(st: &AppState, s: &Stranded) -> Result<Option<u64>, ControllerError> {
    let _guard = st.volume_locks.lock(&s.volume).await;
    let (rec, changed) = st
        .records
        .update_volume(&s.volume, |v| {
            let same = v.state == VolumeState::Attached
                && v.attached_node.as_deref() == Some(s.node.as_str())
                && v.epoch == s.epoch;
            if same {
                v.state = VolumeState::Detached;
                v.attached_node = None;
                v.epoch += 1;
            }
            Ok(same)
        })
        .await?;
    Ok(changed.then_some(rec.epoch))
}
