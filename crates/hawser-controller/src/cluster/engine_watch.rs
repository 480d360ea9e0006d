//! Engines come back by themselves. An agent that restarted (its node rebooted, or the process
//! was killed) runs no engines; the volumes attached to it would stay unserved until someone
//! attached them again. The leader checks every attached volume's node periodically and
//! starts the engine again where it is missing, in the same epoch, as attaching to the same
//! node does (the only other engine of that epoch ran in that agent's previous life). The new
//! engine runs crash recovery before it serves I/O. A start that fails (its replicas are not
//! reachable yet) is tried again at the next round. The same round gives a running engine
//! the volume's limits (QoS) when it reports others (`volumes/qos.rs`), and starts its scrub
//! passes on their schedule (`volumes/scrub.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hawser_api::agent::EngineStatus;
use hawser_api::controller::VolumeState;

use crate::cluster::agent_client::Agent;
use crate::cluster::agent_client::AgentClient;
use crate::state::AppState;
use crate::store::leader::Role;
use crate::store::model::{NodeRecord, VolumeRecord};
use crate::volumes::attach::ensure_engine;
use crate::volumes::create::find_node;

/// Runs until the task is aborted; `every` zero disables it. `scrub_every`: the scrub
/// schedule (zero: none).
pub async fn run(st: Arc<AppState>, every: Duration, scrub_every: Duration) {
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
        round(&st, scrub_every).await;
    }
}

/// What a restarted agent asks for as soon as it has registered (`POST
/// /v1/nodes/{node}/engines`): the missing engines of the volumes `node` should run, started
/// now rather than at the next round. Its kernel devices hold I/O until then, so this is
/// most of the pause an application sees across an agent restart or upgrade.
pub async fn start_missing_on(st: Arc<AppState>, node: String) {
    let (Ok(volumes), Ok(nodes)) = (st.records.volumes().await, st.records.nodes().await) else {
        return;
    };
    let Ok(record) = find_node(&nodes, &node) else {
        return;
    };
    let mut statuses = Statuses::default();
    for v in volumes
        .iter()
        .filter(|v| engine_node(v) == Some(node.as_str()))
    {
        if statuses.engine(&st, record, v).await == Some(Engine::Missing) {
            restart(&st, v, record, &nodes).await;
        }
    }
}

async fn round(st: &AppState, scrub_every: Duration) {
    let (Ok(volumes), Ok(nodes)) = (st.records.volumes_seen().await, st.records.nodes().await)
    else {
        return;
    };
    let mut statuses = Statuses::default();
    for v in volumes.iter() {
        let Some(node) = engine_node(v) else {
            continue;
        };
        let Ok(node) = find_node(&nodes, node) else {
            continue;
        };
        if !st.is_online(node) {
            continue;
        }
        match statuses.engine(st, node, v).await {
            Some(Engine::Missing) => restart(st, v, node, &nodes).await,
            Some(Engine::Current(e)) if v.state == VolumeState::Attached => {
                if e.qos != v.qos {
                    give_limits(st, v).await;
                }
                let ms = u64::try_from(scrub_every.as_millis()).unwrap_or(u64::MAX);
                crate::volumes::scrub::schedule(st, v, &e, ms).await;
            }
            _ => {}
        }
    }
}

/// Starts `v`'s missing engine on `node`.
async fn restart(st: &AppState, v: &VolumeRecord, node: &NodeRecord, nodes: &[NodeRecord]) {
    // Under the volume's lock, and on a fresh record: an attach or detach may have run.
    let _guard = st.volume_locks.lock(&v.name).await;
    let Ok(current) = st.records.existing_volume(&v.name).await else {
        return;
    };
    let same = current.state == v.state
        && engine_node(&current) == engine_node(v)
        && current.epoch == v.epoch;
    if !same || engine_state(st, node.agent(), v).await != Some(Engine::Missing) {
        return;
    }
    match ensure_engine(st, &current, node, nodes).await {
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

/// Gives the engine's node the volume's limits, which it missed (`volumes/qos.rs`).
async fn give_limits(st: &AppState, v: &VolumeRecord) {
    let _guard = st.volume_locks.lock(&v.name).await;
    let Ok(current) = st.records.existing_volume(&v.name).await else {
        return;
    };
    match crate::volumes::qos::push(st, &current).await {
        Ok(()) => tracing::info!(
            volume = %v.name, qos = %current.qos.describe(),
            "the engine ran with other limits than the volume's; gave it the volume's"
        ),
        Err(e) => tracing::warn!(
            volume = %v.name, error = %e,
            "the engine runs with other limits than the volume's and did not take them; will retry"
        ),
    }
}

/// Where `v`'s engine should run: the node it is attached to, or while detached the node
/// syncing its new replicas (`healing/self_heal.rs`).
fn engine_node(v: &VolumeRecord) -> Option<&str> {
    match v.state {
        VolumeState::Attached => v.attached_node.as_deref(),
        VolumeState::Detached => v.sync_node.as_deref(),
        VolumeState::Creating | VolumeState::Deleting => None,
    }
}

/// How `agent` runs the engine of `v`.
#[derive(Debug, PartialEq, Eq)]
enum Engine {
    /// Not at all, or in an older epoch: a membership change (`healing/self_heal.rs`) whose engine
    /// swap failed left it there, and starting the current one swaps it out.
    Missing,
    /// In the current epoch, with this status.
    Current(Box<EngineStatus>),
}

/// Each node's engines, asked once per round and read for every volume of the node. Asked
/// per volume, a round cost volumes × engines: with 300 volumes attached to one node, 90,000
/// engine statuses every 5 s, a third of that agent's core and a sixth of the controller's
/// while every volume was idle (issue 44). Engines only (`GET /v1/engines`), not the full
/// status: that lists every replica of the node too. What a round read is at most one round
/// old; `restart` asks again before it acts.
#[derive(Default)]
struct Statuses {
    by_node: HashMap<String, Option<Vec<EngineStatus>>>,
}

impl Statuses {
    /// How `node` runs `v`'s engine; `None` if the agent did not answer this round.
    async fn engine(
        &mut self,
        st: &AppState,
        node: &NodeRecord,
        v: &VolumeRecord,
    ) -> Option<Engine> {
        if !self.by_node.contains_key(&node.name) {
            let engines = agent_engines(&st.agents, node.agent()).await;
            self.by_node.insert(node.name.clone(), engines);
        }
        let engines = self.by_node.get(&node.name)?.as_ref()?;
        Some(engine_in(engines, v))
    }
}

/// `None` if the agent does not answer within 2 s.
async fn agent_engines(agents: &AgentClient, agent: Agent<'_>) -> Option<Vec<EngineStatus>> {
    tokio::time::timeout(Duration::from_secs(2), agents.engines(agent))
        .await
        .ok()?
        .ok()
}

fn engine_in(engines: &[EngineStatus], v: &VolumeRecord) -> Engine {
    engines
        .iter()
        .find(|e| e.volume == v.name && e.epoch >= v.epoch)
        .map_or(Engine::Missing, |e| Engine::Current(Box::new(e.clone())))
}

/// How `agent` runs `v`'s engine now (asked now); `None` if the agent does not answer.
async fn engine_state(st: &AppState, agent: Agent<'_>, v: &VolumeRecord) -> Option<Engine> {
    Some(engine_in(&agent_engines(&st.agents, agent).await?, v))
}
