//! `GET /v1/status`: the cluster's health at a glance (`hawser status`): nodes down or
//! evacuating, volumes with fewer in-sync replicas than they should have, and the resyncs
//! under way with their rate and time left (asked of the agents where volumes are attached,
//! one call per node, best effort).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use hawser_api::agent::AgentStatus;
use hawser_api::controller::{
    ClusterStatus, DegradedVolume, ReplicaState, ResyncProgress, ScrubProgress, VolumeState,
};

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::VolumeRecord;

/// How long the status waits for each agent.
const AGENT_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn show(State(st): State<Arc<AppState>>) -> Result<Json<ClusterStatus>, ControllerError> {
    let nodes = st.records.nodes().await?;
    let volumes = st.records.volumes().await?;
    let settings = st.records.node_settings().await?;
    let mut agents: BTreeMap<String, Option<AgentStatus>> = BTreeMap::new();
    for v in volumes.iter().filter(|v| needs_engine_view(v)) {
        let Some(name) = v.attached_node.clone() else {
            continue;
        };
        if agents.contains_key(&name) {
            continue;
        }
        let status = match nodes.iter().find(|n| n.name == name) {
            Some(n) => tokio::time::timeout(AGENT_STATUS_TIMEOUT, st.agents.status(n.agent()))
                .await
                .ok()
                .and_then(Result::ok),
            None => None,
        };
        agents.insert(name, status);
    }
    let mut out = ClusterStatus {
        nodes: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
        nodes_offline: nodes
            .iter()
            .filter(|n| !st.is_online(n))
            .map(|n| n.name.clone())
            .collect(),
        nodes_evacuating: settings
            .iter()
            .filter(|(_, s)| s.evacuate)
            .map(|(n, _)| n.clone())
            .collect(),
        volumes: u32::try_from(volumes.len()).unwrap_or(u32::MAX),
        degraded: volumes.iter().filter_map(degraded).collect(),
        resyncs: Vec::new(),
        scrubs: Vec::new(),
    };
    for v in volumes.iter() {
        let agent = v
            .attached_node
            .as_ref()
            .and_then(|n| agents.get(n))
            .and_then(Option::as_ref);
        if let Some(agent) = agent {
            out.resyncs.extend(resyncs(v, agent));
            out.scrubs.extend(scrub(v, agent));
        }
    }
    Ok(Json(out))
}

/// Every attached volume: its engine reports resyncs and scrubs (one call per node).
fn needs_engine_view(v: &VolumeRecord) -> bool {
    v.state == VolumeState::Attached
}

/// `v`'s scrub pass, if one runs or the last one found bad blocks.
fn scrub(v: &VolumeRecord, agent: &AgentStatus) -> Option<ScrubProgress> {
    let e = agent.engines.iter().find(|e| e.volume == v.name)?;
    let s = e.scrub?;
    (s.running || s.found_blocks > 0).then(|| ScrubProgress {
        volume: v.name.clone(),
        node: agent.node.clone(),
        scrub: s,
    })
}

fn degraded(v: &VolumeRecord) -> Option<DegradedVolume> {
    let in_sync = v.in_sync().count();
    if in_sync >= v.replica_count as usize {
        return None;
    }
    let lagging = v
        .replicas
        .iter()
        .filter(|r| r.state != ReplicaState::InSync)
        .map(|r| {
            let state = serde_json::to_value(r.state)
                .ok()
                .and_then(|s| s.as_str().map(String::from))
                .unwrap_or_default();
            let blank = if r.blank { ", blank" } else { "" };
            format!("{} on {} ({state}{blank})", r.id, r.node)
        })
        .collect();
    Some(DegradedVolume {
        name: v.name.clone(),
        state: v.state,
        in_sync: u32::try_from(in_sync).unwrap_or(u32::MAX),
        replica_count: v.replica_count,
        lagging,
    })
}

/// The replicas of `v` its engine (in `agent`'s status) has chunks left to copy to.
fn resyncs(v: &VolumeRecord, agent: &AgentStatus) -> Vec<ResyncProgress> {
    let Some(engine) = agent.engines.iter().find(|e| e.volume == v.name) else {
        return Vec::new();
    };
    v.replicas
        .iter()
        .filter(|r| r.state != ReplicaState::InSync)
        .filter_map(|r| {
            let e = engine.replicas.iter().find(|e| e.replica_id == r.id)?;
            let rate = e.resync_bytes_per_sec;
            Some(ResyncProgress {
                volume: v.name.clone(),
                replica: r.id.clone(),
                node: r.node.clone(),
                blank: r.blank,
                state: e.state.clone(),
                copied_bytes: e.copied_bytes,
                remaining_bytes: e.dirty_bytes,
                bytes_per_sec: rate,
                eta_secs: (rate > 0).then(|| e.dirty_bytes.div_ceil(rate)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_api::agent::{EngineReplicaStatus, EngineStatus};
    use hawser_api::controller::Replica;

    fn volume() -> VolumeRecord {
        let r = |id: &str, state, blank| Replica {
            id: id.into(),
            node: format!("node-{id}"),
            pool: "p".into(),
            state,
            blank,
            engine: None,
        };
        VolumeRecord {
            state: VolumeState::Attached,
            epoch: 3,
            attached_node: Some("node-a".into()),
            replicas: vec![
                r("a", ReplicaState::InSync, false),
                r("b", ReplicaState::Outdated, true),
            ],
            ..VolumeRecord::new("v", 1 << 30, 2)
        }
    }

    #[test]
    fn a_volume_short_of_in_sync_replicas_is_degraded_and_says_which() {
        let d = degraded(&volume()).unwrap();
        assert_eq!((d.in_sync, d.replica_count), (1, 2));
        assert_eq!(d.lagging, vec!["b on node-b (outdated, blank)".to_string()]);
        let mut healthy = volume();
        healthy.replicas[1].state = ReplicaState::InSync;
        assert!(degraded(&healthy).is_none());
        // Attached, its engine is asked anyway: for its scrubs. Detached, there is none.
        assert_eq!(healthy.state, VolumeState::Attached);
        assert!(needs_engine_view(&healthy));
        healthy.state = VolumeState::Detached;
        assert!(!needs_engine_view(&healthy));
    }

    #[test]
    fn resync_progress_has_an_eta_from_the_engines_rate() {
        let engine_replica = |id: &str, dirty, rate| EngineReplicaStatus {
            replica_id: id.into(),
            state: "syncing".into(),
            connected: true,
            dirty_bytes: dirty,
            copied_bytes: 100 << 20,
            resync_bytes_per_sec: rate,
            ..Default::default()
        };
        let agent = |rate| AgentStatus {
            node: "node-a".into(),
            pools: vec![],
            replicas: vec![],
            trash: vec![],
            cluster_id: None,
            engines: vec![EngineStatus {
                volume: "v".into(),
                epoch: 3,
                size_bytes: 1 << 30,
                in_sync: vec!["a".into()],
                replicas: vec![
                    engine_replica("a", 0, 0),
                    engine_replica("b", 300 << 20, rate),
                ],
                recovery: None,
                active_extents: 0,
                qos: Default::default(),
                scrub: None,
            }],
        };
        let r = resyncs(&volume(), &agent(100 << 20));
        assert_eq!(r.len(), 1, "only the replica not in sync: {r:?}");
        assert_eq!((r[0].replica.as_str(), r[0].eta_secs), ("b", Some(3)));
        assert!(r[0].blank);
        assert_eq!(resyncs(&volume(), &agent(0))[0].eta_secs, None);
    }
}
