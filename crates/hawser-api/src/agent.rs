//! The agent's admin API (`/v1/...`), called by the controller.
//!
//! | method | path                    | body → response                       |
//! |--------|-------------------------|---------------------------------------|
//! | POST   | /v1/replicas            | `CreateReplica` → `ReplicaStatus`     |
//! | DELETE | /v1/replicas/{id}       | → 204                                 |
//! | POST   | /v1/engines             | `StartEngine` → `EngineStatus`        |
//! | DELETE | /v1/engines/{volume}    | → 204 (flushes, then stops)           |
//! | GET    | /v1/status              | → `AgentStatus`                       |

use serde::{Deserialize, Serialize};

use crate::controller::PoolInfo;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateReplica {
    pub replica_id: String,
    pub volume: String,
    pub size_bytes: u64,
    pub pool: String,
    pub thin: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaStatus {
    pub replica_id: String,
    pub volume: String,
    pub pool: String,
    pub size_bytes: u64,
    pub thin: bool,
    pub epoch: u64,
    /// Bytes the data file occupies on disk.
    pub allocated_bytes: u64,
    pub data_path: String,
    pub failed: bool,
}

/// One replica an engine writes to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineReplica {
    pub replica_id: String,
    pub node: String,
    /// Replica server address of `node`; unused when the replica is local.
    pub replica_addr: String,
}

/// Start the engine of a volume on this agent and export it over NBD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartEngine {
    pub volume: String,
    pub size_bytes: u64,
    pub epoch: u64,
    /// The in-sync replicas. Writes go to all of them.
    pub replicas: Vec<EngineReplica>,
    /// Where the engine reports a lost replica (`POST .../outdate`).
    pub controller_url: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineStatus {
    pub volume: String,
    pub epoch: u64,
    pub size_bytes: u64,
    /// Replica ids currently in the engine's in-sync set.
    pub in_sync: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStatus {
    pub node: String,
    pub pools: Vec<PoolInfo>,
    pub replicas: Vec<ReplicaStatus>,
    pub engines: Vec<EngineStatus>,
}
