//! Scrub passes (docs/checksums.md): started by `POST /v1/volumes/{name}/scrub` or, a scrub
//! interval after the last one finished, by the engine watch (`cluster/engine_watch.rs`). A pass runs
//! in the attached volume's engine; the controller only asks for one and records when the last
//! finished, so the schedule survives engine moves and controller restarts.

use hawser_api::agent::EngineStatus;
use hawser_api::controller::VolumeState;

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::VolumeRecord;

/// Asks the attached engine of `name` for a scrub pass (one under way goes on); returns the
/// record and the engine's status.
pub async fn start(
    st: &AppState,
    name: &str,
) -> Result<(VolumeRecord, EngineStatus), ControllerError> {
    let rec = st
        .records
        .volume(name)
        .await?
        .ok_or_else(|| ControllerError::VolumeNotFound {
            volume: name.into(),
        })?;
    let (VolumeState::Attached, Some(node)) = (rec.state, &rec.attached_node) else {
        return Err(ControllerError::Refused {
            message: format!(
                "volume {name:?} is not attached: a scrub runs in its engine (attach it first)"
            ),
        });
    };
    let node = st
        .records
        .node(node)
        .await?
        .ok_or_else(|| ControllerError::NodeNotFound { node: node.clone() })?;
    let status = st
        .agents
        .start_scrub(node.agent(), name)
        .await
        .map_err(|source| ControllerError::Agent {
            node: node.name.clone(),
            op: "start a scrub".into(),
            source,
        })?;
    tracing::info!(volume = %name, node = %node.name, "scrub pass asked for");
    Ok((rec, status))
}

/// What the engine watch does about `v`'s scrubs, given its engine's status: record a pass
/// that finished since the record's, or start one when the last is `interval_ms` old (a
/// volume never scrubbed counts from its first round here).
pub async fn schedule(st: &AppState, v: &VolumeRecord, engine: &EngineStatus, interval_ms: u64) {
    let now = crate::store::model::now_ms();
    let finished_ms = engine
        .scrub
        .and_then(|s| s.finished_at)
        .map(|secs| secs.saturating_mul(1000));
    let recorded = v.scrubbed_ms;
    let newer = match (finished_ms, recorded) {
        (Some(f), Some(r)) => (f > r).then_some(f),
        (Some(f), None) => Some(f),
        (None, None) => Some(now),
        (None, Some(_)) => None,
    };
    if let Some(at) = newer {
        let stored = st
            .records
            .update_volume(&v.name, |r| {
                r.scrubbed_ms = Some(at);
                Ok(())
            })
            .await;
        if let Err(e) = stored {
            tracing::warn!(volume = %v.name, error = %e, "cannot record the last scrub");
        }
        return;
    }
    let running = engine.scrub.is_some_and(|s| s.running);
    let due = recorded.is_some_and(|r| now.saturating_sub(r) >= interval_ms);
    if interval_ms > 0 && due && !running && v.state == VolumeState::Attached {
        if let Err(e) = start(st, &v.name).await {
            tracing::warn!(volume = %v.name, error = %e, "cannot start the scheduled scrub");
        }
    }
}
