//! Changing a volume's limits (QoS) while it runs: the record first, then the engine's node.
//!
//! The record is the truth. Every engine start carries its limits (attach, an engine watch
//! restart, a replica swap), and the engine watch (`cluster/engine_watch.rs`) gives them to an engine
//! that reports others, so a node that misses the push here (offline, restarting, a lost
//! reply) has them within a round of the watch. The push only makes a change take effect at
//! once. Limits never touch data, so applying them twice or late is harmless.

use hawser_api::controller::VolumeState;
use hawser_api::QosPatch;

use crate::cluster::agent_client::AgentError;
use crate::constants::QOS_PUSH_TIMEOUT;
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::VolumeRecord;

/// Applies `patch` to `name`'s limits; returns the record.
pub async fn set_qos(
    st: &AppState,
    name: &str,
    patch: QosPatch,
) -> Result<VolumeRecord, ControllerError> {
    if patch.is_empty() {
        return Err(ControllerError::invalid(
            "no limit given: set read_iops, write_iops, iops, read_bytes_per_sec, \
             write_bytes_per_sec or bytes_per_sec (0 removes one)",
        ));
    }
    let _guard = st.volume_locks.lock(name).await;
    let (rec, ()) = st
        .records
        .update_volume(name, |v| {
            let qos = v.qos.patched(&patch);
            qos.validate()
                .map_err(|e| ControllerError::invalid(e.message))?;
            v.qos = qos;
            Ok(())
        })
        .await?;
    tracing::info!(volume = %name, qos = %rec.qos.describe(), "volume limits changed");
    if let Err(e) = push(st, &rec).await {
        tracing::warn!(
            volume = %name, error = %e,
            "the engine's node did not take the new limits now; the engine watch retries"
        );
    }
    Ok(rec)
}

/// Gives the attached engine's node the record's limits. A detached volume has no client
/// requests to limit: its next attach carries them.
pub(crate) async fn push(st: &AppState, rec: &VolumeRecord) -> Result<(), ControllerError> {
    let (VolumeState::Attached, Some(node)) = (rec.state, &rec.attached_node) else {
        return Ok(());
    };
    let node = st
        .records
        .node(node)
        .await?
        .ok_or_else(|| ControllerError::NodeNotFound { node: node.clone() })?;
    let agent = node.agent();
    let set = st.agents.set_qos(agent, &rec.name, &rec.qos);
    let answer = tokio::time::timeout(QOS_PUSH_TIMEOUT, set)
        .await
        .unwrap_or_else(|_| {
            Err(AgentError::Unreachable {
                addr: agent.addr.into(),
                connect: false,
                reason: format!("no answer within {QOS_PUSH_TIMEOUT:?}"),
            })
        });
    answer.map(|_| ()).map_err(|source| ControllerError::Agent {
        node: node.name.clone(),
        op: "set volume limits".into(),
        source,
    })
}
