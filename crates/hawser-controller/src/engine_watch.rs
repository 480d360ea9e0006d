//! Engines come back by themselves. An agent that restarted (its node rebooted, or the process
//! was killed) runs no engines; the volumes attached to it would stay unserved until someone
//! attached them again. The leader checks every attached volume's node periodically and
//! starts the engine again where it is missing, in the same epoch, as attaching to the same
//! node does (the only other engine of that epoch ran in that agent's previous life). The new
//! engine runs crash recovery before it serves I/O. A start that fails (its replicas are not
//! reachable yet) is tried again at the next round.

use std::sync::Arc;
use std::time::Duration;

use hawser_api::controller::VolumeState;

use crate::agent_client::Agent;
use crate::leader::Role;
use crate::model::VolumeRecord;
use crate::state::AppState;
use crate::volume_attach::ensure_engine;
use crate::volume_create::find_node;

/// Runs until the task is aborted; `every` zero disables it.
pub async fn run(st: Arc<AppState>, every: Duration) {
    if every.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if matches!(st.leadership.role(), Role::Follower { .. }) {
            continue;
        }
        round(&st).await;
    }
}

async fn round(st: &AppState) {
    let (Ok(volumes), Ok(nodes)) = (st.records.volumes().await, st.records.nodes().await) else {
        return;
    };
    for v in &volumes {
        let Some(node) = engine_node(v) else {
            continue;
        };
        let Ok(node) = find_node(&nodes, node) else {
            continue;
        };
        if !st.is_online(node) || engine_current(st, node.agent(), v).await != Some(false) {
            continue;
        }
        // Under the volume's lock, and on a fresh record: an attach or detach may have run.
        let _guard = st.volume_locks.lock(&v.name).await;
        let Ok(current) = st.records.existing_volume(&v.name).await else {
            continue;
        };
        let same = current.state == v.state
            && engine_node(&current) == engine_node(v)
            && current.epoch == v.epoch;
        if !same || engine_current(st, node.agent(), v).await != Some(false) {
            continue;
        }
        match ensure_engine(st, &current, node, &nodes).await {
            Ok(()) => tracing::warn!(
                volume = %v.name, node = %node.name, epoch = v.epoch,
                "engine was missing or of an older epoch; started it"
            ),
            Err(e) => tracing::warn!(
                volume = %v.name, node = %node.name, error = %e,
                "engine is missing and could not be started yet; will retry"
            ),
        }
    }
}

/// Where `v`'s engine should run: the node it is attached to, or while detached the node
/// syncing its new replicas (`self_heal.rs`).
fn engine_node(v: &VolumeRecord) -> Option<&str> {
    match v.state {
        VolumeState::Attached => v.attached_node.as_deref(),
        VolumeState::Detached => v.sync_node.as_deref(),
        VolumeState::Creating | VolumeState::Deleting => None,
    }
}

/// Whether `agent` runs the engine of `v` in its current epoch; `None` if it
/// does not answer. An engine of an older epoch counts as missing: a membership change
/// (`self_heal.rs`) whose engine swap failed left it there, and starting the current one
/// swaps it out.
async fn engine_current(st: &AppState, agent: Agent<'_>, v: &VolumeRecord) -> Option<bool> {
    let status = tokio::time::timeout(Duration::from_secs(2), st.agents.status(agent))
        .await
        .ok()?
        .ok()?;
    Some(
        status
            .engines
            .iter()
            .any(|e| e.volume == v.name && e.epoch >= v.epoch),
    )
}
