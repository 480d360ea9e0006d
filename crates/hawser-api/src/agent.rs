//! The agent's admin API (`/v1/...`), called by the controller.
//!
//! | method | path                    | body → response                       |
//! |--------|-------------------------|---------------------------------------|
//! | POST   | /v1/replicas            | `CreateReplica` → `ReplicaStatus`     |
//! | DELETE | /v1/replicas/{id}       | → 204                                 |
//! | POST   | /v1/replicas/{id}/trash | → 204 (moved to the pool's trash)     |
//! | POST   | /v1/replicas/{id}/grow  | `GrowReplica` → `ReplicaStatus`       |
//! | PUT    | /v1/replicas/{id}/wrapped-key | `WrappedKey` → `ReplicaStatus` (a key rotation) |
//! | POST   | /v1/engines             | `StartEngine` → `EngineStatus`        |
//! | GET    | /v1/engines             | → `[EngineStatus]` (engines only: what the controller polls) |
//! | DELETE | /v1/engines/{volume}    | → 204 (flushes, then stops)           |
//! | POST   | /v1/engines/{volume}/grow | `GrowEngine` → `EngineStatus`       |
//! | GET    | /v1/devices             | → `[Device]` (its kernel block devices) |
//! | GET    | /v1/status              | → `AgentStatus`                       |
//! | GET    | /v1/replicas/inventory  | → `[ReplicaInventory]` (reads journals) |
//! | GET    | /v1/replicas/held       | → `[HeldReplica]`, `ETag`; 304 to a matching `If-None-Match` |
//! | POST   | /v1/peers/probe         | `ProbePeers` → `[PeerReach]` (can this node reach them) |

use serde::{Deserialize, Serialize};

use crate::pool::PoolInfo;
use crate::quorum_loss::QuorumLoss;
use crate::replica_state::ReplicaState;

/// Header naming the node an admin call is meant for. An agent refuses a call for another
/// node (`Conflict`): an address can change hands (a node restarted elsewhere, ports reused),
/// and a replica created on the wrong node would silently put two copies on one node.
pub const NODE_HEADER: &str = "x-hawser-node";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateReplica {
    pub replica_id: String,
    pub volume: String,
    pub size_bytes: u64,
    pub pool: String,
    pub thin: bool,
    /// The controller's cluster, recorded in the replica's metadata; an agent of another
    /// cluster refuses the create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// Start as a copy of this snapshot of a replica on the same node (a clone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<SnapshotRef>,
    /// An encrypted volume's key check, recorded in the replica's metadata: an engine whose
    /// grant names another is refused (docs/security.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_check: Option<crate::KeyCheck>,
    /// Keep a checksum per 4 KiB block and check every read (docs/checksums.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checksums: bool,
    /// An encrypted volume's wrapped data key, as its record holds it (its `check` is
    /// `key_check`): kept in the replica's metadata, so `hawser cluster recover` can rebuild
    /// the record (docs/encryption.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapped_key: Option<crate::WrappedKey>,
    /// Its volume's uid (`crate::uid`), recorded in the replica's metadata so that `hawser
    /// cluster recover` gives the rebuilt volume the same identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_uid: Option<String>,
}

/// A snapshot of a replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRef {
    pub replica_id: String,
    pub snapshot: String,
}

/// `POST /v1/replicas/{id}/snapshots`: take a snapshot of the replica's data as it is now.
/// The caller holds its writes (a paused engine, or a detached volume).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TakeSnapshot {
    pub snapshot: String,
    /// The volume's epoch: refused if the replica has seen a newer one.
    pub epoch: u64,
}

/// A snapshot a replica holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaSnapshot {
    pub replica_id: String,
    pub snapshot: String,
    pub size_bytes: u64,
    /// Bytes its file occupies (extents shared with the replica or other snapshots counted).
    pub allocated_bytes: u64,
    /// When just taken: "reflink" or "copy", and the time the flush and copy took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
    #[serde(default)]
    pub micros: u64,
}

/// `POST /v1/replicas/{id}/snapshots/{snapshot}/fetch`: give the replica a copy of a snapshot
/// it lacks, from a replica on another node that holds it (only the 64 KiB blocks that differ
/// from the replica's own data cross the network). The answer's `how` is "fetch" and
/// `micros` the time it took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchSnapshot {
    /// The holder: its replica id, its node and that node's replica server address.
    pub from_replica: String,
    pub from_node: String,
    pub from_addr: String,
    /// The controller's snapshot-read grant for this node (base64; `hawser_wire::grant`),
    /// in a cluster whose replica servers check grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
}

/// `POST /v1/replicas/{id}/restore`: replace the replica's data with one of its snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreReplica {
    pub snapshot: String,
}

/// `POST /v1/engines/{volume}/pause`: hold the volume's requests (new ones wait; those in
/// flight finish), flush every replica, and keep holding until resumed or `lease_ms` passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseEngine {
    pub lease_ms: u64,
}

/// The volume is paused: nothing changes its replicas until the resume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnginePaused {
    pub pause_id: u64,
    pub epoch: u64,
    /// Replica ids in the engine's in-sync set: those that hold the volume's data now.
    pub in_sync: Vec<String>,
    /// Time to drain the requests in flight and flush.
    pub drain_micros: u64,
}

/// `POST /v1/engines/{volume}/resume`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeEngine {
    pub pause_id: u64,
}

/// The pause ended here, intact: requests were held from the pause to this resume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineResumed {
    /// From the request that started the pause to the resume: what client requests waited
    /// at most.
    pub held_micros: u64,
}

/// Grow a replica of a detached volume to `size_bytes` (growing to its size is a no-op).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrowReplica {
    pub size_bytes: u64,
}

/// Grow a running engine, its export and the volume's kernel device on that node, after
/// every replica has grown (online expansion).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrowEngine {
    pub size_bytes: u64,
    /// Only say whether the volume could grow here now (its device can follow): asked before
    /// any replica grows.
    #[serde(default)]
    pub check_only: bool,
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
    /// Why the agent cannot serve the replica (it could not be loaded: corrupt metadata, a
    /// data file of the wrong size); such a replica is `failed` and left on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The cluster recorded in its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// The key check recorded in its metadata (an encrypted volume's replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_check: Option<crate::KeyCheck>,
    /// It keeps block checksums.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checksums: bool,
    /// The wrapped data key recorded in its metadata (an encrypted volume's replica created
    /// by a controller that sends it; an older agent sends none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapped_key: Option<crate::WrappedKey>,
    /// Its volume's uid as its metadata records it (None: created before volumes had uids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_uid: Option<String>,
}

/// A replica an agent holds, as the controller's reconcile round reads it
/// (`GET /v1/replicas/held`): what it needs to find orphans and failed replicas, without the
/// metadata and disk usage [`AgentStatus`] reads and ships for every replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldReplica {
    pub replica_id: String,
    pub volume: String,
    /// The agent cannot serve it (see [`ReplicaStatus::failed`]).
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
    /// Its state in the store: the engine resyncs outdated ones and never uses failed ones.
    #[serde(default = "in_sync")]
    pub state: ReplicaState,
    /// Outdated and empty (see `controller::Replica::blank`): copy everything to it.
    #[serde(default)]
    pub blank: bool,
}

fn in_sync() -> ReplicaState {
    ReplicaState::InSync
}

/// Start the engine of a volume on this agent and export it over NBD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartEngine {
    pub volume: String,
    pub size_bytes: u64,
    pub epoch: u64,
    /// Every replica of the volume with its store state. Writes go to the in-sync ones;
    /// outdated ones are resynced when reachable.
    pub replicas: Vec<EngineReplica>,
    /// Where the engine reports a lost replica (`POST .../outdate`).
    pub controller_url: String,
    #[serde(default)]
    pub on_quorum_loss: QuorumLoss,
    /// Serve it over NBD. False for the engine that syncs new replicas of a detached volume:
    /// nobody should write to a volume its user detached.
    #[serde(default = "yes")]
    pub export: bool,
    /// The controller's signed grant (base64; `hawser_wire::grant`) for this engine: this
    /// volume, this node, this epoch. Sent in every Hello; required by agents of a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// The volume's limits on client requests (none by default). They belong to the volume's
    /// export on the node and carry over to the engines that replace this one.
    #[serde(default, skip_serializing_if = "crate::Qos::is_unlimited")]
    pub qos: crate::Qos,
    /// An encrypted volume's data key (64 bytes, base64): the engine encrypts writes and
    /// decrypts reads with it (`hawser-agent` `volume_crypt.rs`). Kept in memory only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_key: Option<crate::Secret>,
    /// The volume's uid (`crate::uid`): an engine of the same name but another uid is another
    /// volume (a namesake created after a delete), which the agent never swaps in under the
    /// old one's clients and devices. None for a volume without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

fn yes() -> bool {
    true
}

/// Most replicas an engine takes (the engine's replica sets are bit sets of 8).
pub const ENGINE_MAX_REPLICAS: usize = 8;

impl StartEngine {
    /// Checks what the engine would otherwise trip over or allocate by the request's word.
    pub fn validate(&self) -> Result<(), crate::ApiError> {
        use crate::ApiError;
        crate::validate_name("volume", &self.volume)?;
        crate::size::check_volume_size(self.size_bytes)?;
        let n = self.replicas.len();
        if n == 0 || n > ENGINE_MAX_REPLICAS {
            return Err(ApiError::invalid(format!(
                "an engine takes 1 to {ENGINE_MAX_REPLICAS} replicas, not {n}"
            )));
        }
        let mut ids: Vec<&str> = self
            .replicas
            .iter()
            .map(|r| r.replica_id.as_str())
            .collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(ApiError::invalid(format!(
                "replica {:?} is listed twice",
                w[0]
            )));
        }
        for r in &self.replicas {
            if r.replica_id.is_empty() || r.replica_id.len() > 128 {
                return Err(ApiError::invalid(format!(
                    "bad replica id {:?}",
                    r.replica_id
                )));
            }
            crate::validate_name("node", &r.node)?;
        }
        if self
            .replicas
            .iter()
            .all(|r| r.state != ReplicaState::InSync)
        {
            return Err(ApiError::invalid(
                "no replica is in sync: the engine would have no data to serve",
            ));
        }
        if self.epoch == 0 || self.epoch == u64::MAX {
            return Err(ApiError::invalid(format!("bad epoch {}", self.epoch)));
        }
        if let Some(uid) = &self.uid {
            crate::uid::parse_uid(uid)?;
        }
        if !(self.controller_url.starts_with("http://")
            || self.controller_url.starts_with("https://"))
        {
            return Err(ApiError::invalid(format!(
                "controller_url {:?} is not an http(s) URL",
                self.controller_url
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineStatus {
    pub volume: String,
    pub epoch: u64,
    pub size_bytes: u64,
    /// Replica ids currently in the engine's in-sync set.
    pub in_sync: Vec<String>,
    #[serde(default)]
    pub replicas: Vec<EngineReplicaStatus>,
    /// What crash recovery did when this engine started.
    #[serde(default)]
    pub recovery: Option<RecoveryReport>,
    /// Extents (4 MiB) in the activity log now: what recovery would compare after a crash.
    #[serde(default)]
    pub active_extents: u64,
    /// The limits applied to the volume's client requests now.
    #[serde(default, skip_serializing_if = "crate::Qos::is_unlimited")]
    pub qos: crate::Qos,
    /// The scrub pass under way, or the last one this engine ran (docs/checksums.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<ScrubStatus>,
}

/// A scrub pass: every block of every in-sync replica read and checked against its checksum,
/// bad ones rewritten from a good replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubStatus {
    pub running: bool,
    /// How far the pass got, of `size_bytes`.
    pub scrubbed_bytes: u64,
    pub size_bytes: u64,
    /// What this pass found: 4 KiB blocks that failed their checksum, those rewritten from a
    /// good replica, those no replica had right.
    pub found_blocks: u64,
    pub repaired_blocks: u64,
    pub unrecoverable_blocks: u64,
    /// When the last pass this engine completed finished (seconds since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
}

/// Crash recovery at engine start: the in-sync replicas compared over the previous engine's
/// activity logs, and the bytes copied to make them equal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoveryReport {
    pub replicas: u32,
    pub compared_bytes: u64,
    pub copied_bytes: u64,
    pub millis: u64,
}

/// How the engine sees one replica.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineReplicaStatus {
    pub replica_id: String,
    /// in_sync, down, outdating, outdated, syncing, marking or failed.
    pub state: String,
    pub connected: bool,
    /// Bytes of dirty chunks still to copy to it.
    pub dirty_bytes: u64,
    /// Bytes resync copied to it during this engine's life.
    pub copied_bytes: u64,
    /// Average copy rate since its current resync began (0 when not resyncing).
    #[serde(default)]
    pub resync_bytes_per_sec: u64,
    /// Blocks whose data failed its checksum on this replica, during this engine's life
    /// (docs/checksums.md); those rewritten from a good copy; those no replica had right.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub corrupt_found_blocks: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub corrupt_repaired_blocks: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub corrupt_unrecoverable_blocks: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStatus {
    pub node: String,
    pub pools: Vec<PoolInfo>,
    pub replicas: Vec<ReplicaStatus>,
    pub engines: Vec<EngineStatus>,
    /// Replicas in the pools' trash (moved there as orphans), kept for the grace period.
    #[serde(default)]
    pub trash: Vec<TrashedReplica>,
    /// The cluster this node belongs to, if it has joined one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
}

/// A replica in a pool's trash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrashedReplica {
    pub replica_id: String,
    /// From its metadata ("" if unreadable).
    pub volume: String,
    pub pool: String,
    /// Unix seconds when it was moved there.
    pub trashed_at_secs: u64,
    pub bytes: u64,
}

/// A replica with what its newest journal says, for `hawser cluster recover`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaInventory {
    pub status: ReplicaStatus,
    /// None: no readable journal.
    pub journal: Option<JournalSummary>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalSummary {
    pub epoch: u64,
    pub seq: u64,
    pub size_bytes: u64,
    /// Replicas the engine that wrote it knew to lack data.
    pub lacking: Vec<String>,
}

/// One operation's counts on a volume since its export started on the node: what
/// `GET /v1/io` answers, and what the dashboard turns into rates by looking twice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpCounters {
    pub requests: u64,
    /// Bytes moved by the requests that succeeded.
    pub bytes: u64,
    pub errors: u64,
    /// Seconds all the requests took together, arrival to answer.
    pub latency_sum_secs: f64,
}

/// A volume's request counters on the node that exports it. They start at zero when the
/// export starts (an attach, or a failover to this node), so a rate from two looks is
/// only good while `node` and `started_ms` stay the same.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeIoCounters {
    pub volume: String,
    pub node: String,
    /// When the export started, Unix milliseconds.
    pub started_ms: u64,
    pub read: OpCounters,
    pub write: OpCounters,
    pub flush: OpCounters,
    /// Trims and write-zeroes together.
    pub other: OpCounters,
    pub in_flight: i64,
}

/// `GET /v1/io` on an agent: the counters of every volume it exports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentIo {
    pub volumes: Vec<VolumeIoCounters>,
}

/// The node-local device API (`<data-dir>/device.sock`, mode 0600): a volume attached to this
/// node made a kernel block device by the agent itself, so that it outlives a restart of the
/// agent. `POST /v1/devices` with [`AttachDevice`] answers a [`Device`]; `GET /v1/devices`
/// lists them; `DELETE /v1/devices/{volume}` ends one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachDevice {
    pub volume: String,
    /// `auto` (the best this kernel has), `ublk` or `nbd`.
    #[serde(default = "auto")]
    pub frontend: String,
    /// A ublk device's queues and queue depth, in place of the agent's `--ublk-queues` and
    /// `--ublk-queue-depth` (for measuring them: scripts/bench-ublk-settings.sh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ublk_queues: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ublk_queue_depth: Option<u16>,
}

fn auto() -> String {
    "auto".to_owned()
}

/// A kernel block device serving a volume on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub volume: String,
    /// `nbd` or `ublk`.
    pub frontend: String,
    /// `/dev/nbdN` or `/dev/ublkbN`.
    pub path: String,
    pub size_bytes: u64,
    /// Connections (nbd) or queues (ublk).
    pub connections: u32,
}

/// `POST /v1/peers/probe`: can this node reach these nodes' replica ports? The controller
/// asks a node whose engine lost quorum before it lifts the node's `hawser.dev/quorum-lost`
/// taint: only this node can see its own paths to its peers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbePeers {
    pub peers: Vec<PeerAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerAddr {
    /// The node, whose certificate the replica port must present (clusters with TLS).
    pub node: String,
    pub replica_addr: String,
}

/// One peer's answer: reached means a TCP connection and, with TLS, a mutual handshake with
/// that node's certificate, within the probe's timeout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerReach {
    pub node: String,
    pub reached: bool,
    /// Why not, when not reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When not reached: whether the peer's host answered at all. `Some(true)`: its kernel
    /// refused or accepted the connection (the host is up; its agent is down, restarting or
    /// hung). `Some(false)`: nothing answered within the timeout, or the network says the
    /// host is unreachable (a dead host or a cut link). `None`: reached, or not known (an
    /// agent too old to tell). Absent when `None`, so a controller that predates the field
    /// reads every answer that reached its peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_answered: Option<bool>,
}
