//! `GET /v1/io`: the request counters of every attached volume, asked of the nodes that
//! export them, all at once and each for at most [`AGENT_IO_TIMEOUT`]; a node that does not
//! answer is listed as unreachable rather than failing the call. The dashboard looks every
//! few seconds and draws rates from the differences; nothing is kept here.
//!
//! `GET /v1/events`: the leader's recent events (`cluster/events.rs`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use hawser_api::controller::{ClusterEvent, ClusterIo, VolumeState};

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::now_ms;

/// How long the call waits for each node.
const AGENT_IO_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn io(State(st): State<Arc<AppState>>) -> Result<Json<ClusterIo>, ControllerError> {
    let nodes = st.records.nodes().await?;
    let volumes = st.records.volumes().await?;
    let mut serving: Vec<&str> = volumes
        .iter()
        .filter(|v| v.state == VolumeState::Attached)
        .filter_map(|v| v.attached_node.as_deref())
        .collect();
    serving.sort_unstable();
    serving.dedup();
    let asks = serving.iter().map(|name| {
        let node = nodes.iter().find(|n| n.name == *name);
        let st = &st;
        async move {
            let answer = match node {
                Some(n) => tokio::time::timeout(AGENT_IO_TIMEOUT, st.agents.io(n.agent()))
                    .await
                    .ok()
                    .and_then(Result::ok),
                None => None,
            };
            (name.to_string(), answer)
        }
    });
    let mut out = ClusterIo {
        at_ms: now_ms(),
        volumes: Vec::new(),
        unreachable: Vec::new(),
    };
    for (node, answer) in futures_util::future::join_all(asks).await {
        match answer {
            // Only what the records say is attached there: an export left on a node the
            // volume moved away from is not the volume's.
            Some(io) => out.volumes.extend(io.volumes.into_iter().filter(|c| {
                volumes.iter().any(|v| {
                    v.name == c.volume && v.attached_node.as_deref() == Some(node.as_str())
                })
            })),
            None => out.unreachable.push(node),
        }
    }
    out.volumes.sort_by(|a, b| a.volume.cmp(&b.volume));
    Ok(Json(out))
}

pub async fn events(State(st): State<Arc<AppState>>) -> Json<Vec<ClusterEvent>> {
    Json(st.events.recent())
}
