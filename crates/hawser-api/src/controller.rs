//! The controller's REST API (`/v1/...`), used by the CLI, the agents and the tests.
//!
//! | method | path                                   | body → response                 |
//! |--------|----------------------------------------|---------------------------------|
//! | PUT    | /v1/nodes/{node}                       | `RegisterNode` → `Node`         |
//! | GET    | /v1/nodes                              | → `Vec<Node>`                   |
//! | GET    | /v1/pools                              | → `Vec<PoolInfo>`               |
//! | POST   | /v1/volumes                            | `CreateVolume` → `Volume`       |
//! | GET    | /v1/volumes                            | → `Vec<Volume>`                 |
//! | GET    | /v1/volumes/{name}                     | → `Volume`                      |
//! | DELETE | /v1/volumes/{name}                     | → 204                           |
//! | POST   | /v1/volumes/{name}/attach              | `Attach` → `Volume`             |
//! | POST   | /v1/volumes/{name}/detach              | → `Volume`                      |
//! | POST   | /v1/volumes/{name}/replicas/{id}/outdate | `Outdate` → `Volume`          |
//! | POST   | /v1/volumes/{name}/replicas/{id}/in-sync | `MarkInSync` → `Volume`       |

use serde::{Deserialize, Serialize};

/// What an agent tells the controller about itself (registration and heartbeat).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterNode {
    /// Agent admin API, `host:port`.
    pub admin_addr: String,
    /// Replica protocol listener, `host:port`.
    pub replica_addr: String,
    /// NBD TCP listener, `host:port`, if any.
    pub nbd_addr: Option<String>,
    /// NBD unix socket path, if any.
    pub nbd_socket: Option<String>,
    pub pools: Vec<PoolInfo>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    pub admin_addr: String,
    pub replica_addr: String,
    pub nbd_addr: Option<String>,
    pub nbd_socket: Option<String>,
    /// Unix milliseconds of the last registration or heartbeat.
    pub last_seen_ms: u64,
    pub state: NodeState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Online,
    /// No heartbeat for longer than the controller's node timeout.
    Offline,
}

/// A storage pool on a node, as reported by its agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolInfo {
    pub node: String,
    pub name: String,
    pub path: String,
    /// Size of the filesystem the pool lives on (or its configured limit).
    pub capacity_bytes: u64,
    /// Free bytes on that filesystem.
    pub free_bytes: u64,
    /// Sum of the sizes of replicas placed in the pool (thin replicas count at full size).
    pub provisioned_bytes: u64,
    /// Thin replicas may be placed while provisioned <= capacity * this ratio.
    pub overprovision_ratio: f64,
    pub replicas: u32,
}

impl PoolInfo {
    /// Whether a new replica of `size` fits: thick replicas need real free space, thin ones
    /// must stay within the overprovision limit.
    pub fn fits(&self, size: u64, thin: bool) -> bool {
        if thin {
            let limit = self.capacity_bytes as f64 * self.overprovision_ratio;
            (self.provisioned_bytes.saturating_add(size)) as f64 <= limit
        } else {
            size <= self.free_bytes
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    pub size_bytes: u64,
    pub replicas: u32,
    /// Thin (sparse) replicas unless false.
    #[serde(default = "default_true")]
    pub thin: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeState {
    /// Replicas being created.
    Creating,
    /// All replicas exist; not attached.
    Detached,
    Attached,
    /// Being deleted; replicas are removed.
    Deleting,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Has every acknowledged write; receives all new writes.
    InSync,
    /// Missed writes; removed from the in-sync set by compare-and-swap. Never read from.
    Outdated,
    /// Disk error or corruption; never read from.
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replica {
    pub id: String,
    pub node: String,
    pub pool: String,
    pub state: ReplicaState,
    /// The attached engine's live view of this replica (resync progress), when the volume is
    /// attached and its agent answered. Never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<crate::agent::EngineReplicaStatus>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    pub size_bytes: u64,
    pub replica_count: u32,
    pub thin: bool,
    pub state: VolumeState,
    /// Incremented on every attach; engines act in this epoch and replicas refuse older ones.
    pub epoch: u64,
    pub attached_node: Option<String>,
    pub replicas: Vec<Replica>,
    /// Where to connect an NBD client while attached, e.g. `nbd://127.0.0.1:10809/demo`.
    pub nbd_uri: Option<String>,
    /// `nbd+unix:///demo?socket=...` while attached on a node with a unix socket.
    pub nbd_unix_uri: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attach {
    pub node: String,
}

/// Sent by an engine that lost a replica: remove it from the in-sync set. Succeeds only while
/// `epoch` is the volume's current epoch (compare-and-swap), so a fenced engine cannot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outdate {
    pub epoch: u64,
    pub reason: String,
    /// A disk error: the replica becomes `failed` (never resynced automatically) instead of
    /// `outdated`.
    #[serde(default)]
    pub failed: bool,
}

/// Sent by an engine that resynced an outdated replica (every chunk it missed copied and
/// flushed): make it in-sync again. Succeeds only while `epoch` is the volume's current epoch
/// and the replica is `outdated` (a failed replica stays failed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkInSync {
    pub epoch: u64,
}
