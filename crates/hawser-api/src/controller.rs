//! The controller's REST API (`/v1/...`), used by the CLI, the agents and the tests.
//!
//! | method | path                                   | body → response                 |
//! |--------|----------------------------------------|---------------------------------|
//! | PUT    | /v1/nodes/{node}                       | `RegisterNode` → `Node`         |
//! | GET    | /v1/nodes                              | → `Vec<Node>`                   |
//! | GET    | /v1/nodes/{node}                       | → `Node`                        |
//! | GET    | /v1/pools                              | → `Vec<PoolInfo>`               |
//! | POST   | /v1/volumes                            | `CreateVolume` → `Volume`       |
//! | GET    | /v1/volumes                            | → `Vec<Volume>`                 |
//! | GET    | /v1/volumes/{name}                     | → `Volume`                      |
//! | DELETE | /v1/volumes/{name}                     | → 204                           |
//! | POST   | /v1/volumes/{name}/attach              | `Attach` → `Volume`             |
//! | POST   | /v1/volumes/{name}/detach              | → `Volume`                      |
//! | POST   | /v1/volumes/{name}/expand              | `ExpandVolume` → `Volume`       |
//! | POST   | /v1/volumes/{name}/force-promote       | `ForcePromote` → `Volume`       |
//! | POST   | /v1/volumes/{name}/replicas/{id}/outdate | `Outdate` → `Volume`          |
//! | POST   | /v1/volumes/{name}/replicas/{id}/in-sync | `MarkInSync` → `Volume`       |

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::pool::{PoolInfo, PoolKind};
pub use crate::quorum_loss::QuorumLoss;
pub use crate::replica_state::ReplicaState;
use crate::ApiError;

/// The node label placement reads as the failure domain: replicas of one volume go to
/// distinct zones (see [`ZoneSpread`]).
pub const ZONE_LABEL: &str = "zone";

/// Labels per node; a few (zone, rack, disk type) is the use, so this only bounds records.
pub const MAX_NODE_LABELS: usize = 16;

/// Node labels, `key=value`, e.g. `zone=a`.
pub type Labels = BTreeMap<String, String>;

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
    /// The NBD TCP listener requires TLS (STARTTLS with a certificate of the cluster): its
    /// URIs are `nbds://`.
    #[serde(default)]
    pub nbd_tls: bool,
    pub pools: Vec<PoolInfo>,
    /// The agent's `--label`s, e.g. `zone=a`; see [`validate_labels`].
    #[serde(default)]
    pub labels: Labels,
    /// The cluster the node's replicas belong to, if it has joined one. A controller whose
    /// store is of another cluster refuses the node (see `hawser cluster recover`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// TLS nodes: which CAs the node trusts and which issued its certificate, so that a CA
    /// rotation goes to its next step only when every node is ready for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<NodeTlsReport>,
}

/// What an agent reports about a volume attached to it, for the volume's events (and the
/// Kubernetes Events on its PVC): `POST /v1/nodes/{node}/events`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceEvent {
    pub volume: String,
    pub reason: DeviceEventReason,
    /// What happened, in words (at most [`DEVICE_EVENT_MESSAGE_MAX`] bytes are kept).
    pub message: String,
}

/// The longest message of a [`DeviceEvent`] the controller keeps.
pub const DEVICE_EVENT_MESSAGE_MAX: usize = 1024;

/// Why an agent reports: the events a node may tell about its own kernel devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceEventReason {
    /// `frontend: auto` passed over a better kernel frontend (ublk) for the next one.
    FrontendFallback,
    /// `frontend: auto` found no kernel frontend at all (the CSI node then uses nbdfuse).
    NoKernelFrontend,
    /// A device left by the agent's last life was failed with EIO, not served again: its
    /// volume moved, was replaced by a namesake, or was never confirmed.
    DeviceFailed,
}

impl DeviceEventReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceEventReason::FrontendFallback => "FrontendFallback",
            DeviceEventReason::NoKernelFrontend => "NoKernelFrontend",
            DeviceEventReason::DeviceFailed => "DeviceFailed",
        }
    }
}

/// A TLS node's CAs, as it reports them with every heartbeat (SHA-256 of each CA
/// certificate's DER, hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeTlsReport {
    /// The CAs the node accepts peers of.
    pub trusts_sha256: Vec<String>,
    /// The CA that issued the certificate the node presents.
    pub issuer_sha256: String,
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
    #[serde(default)]
    pub labels: Labels,
    /// `hawser node evacuate`: takes no new replicas and its replicas are being moved off,
    /// until `hawser node restore`.
    #[serde(default)]
    pub evacuating: bool,
    /// In the answer to a registration: the cluster the node joins, and the public key
    /// (Ed25519, base64) its replica server checks engines' epoch grants with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterJoin>,
}

/// What a registering agent learns of its cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterJoin {
    pub id: String,
    pub grant_key: String,
    /// SHA-256 digests (hex) of the metrics tokens valid now (the current one, and after a
    /// rotation the previous one during its grace): the agent's `/metrics` takes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics_sha256: Vec<String>,
    /// During and after a CA rotation (TLS clusters): the CAs to trust and the one that
    /// issues certificates now. A node trusts what this says, and renews its certificate
    /// at once when another CA issued it. Absent when the cluster's CA never rotated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<ClusterCa>,
}

/// The cluster's CAs as a rotation has left them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterCa {
    /// The CA certificates to trust, PEM (one, or two during a rotation).
    pub trust_pem: String,
    /// SHA-256 (hex) of the CA that issues certificates now.
    pub issuer_sha256: String,
}

/// A step of `hawser cluster rotate-ca` (`POST /v1/cluster/ca-rotation`, admin).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaRotationStep {
    /// Make a new CA and trust it beside the current one (nothing is reissued yet).
    Trust,
    /// Issue every certificate from the new CA: the controllers' at once, each node's at
    /// its next heartbeat. Refused until every online node trusts the new CA.
    Issue,
    /// Stop trusting the old CA and forget its key. Refused until every online node's
    /// certificate is of the new CA.
    Retire,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartCaRotationStep {
    pub step: CaRotationStep,
}

/// Where a CA rotation stands (`GET`/`POST /v1/cluster/ca-rotation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaRotation {
    /// The last step taken (`None`: the CA never rotated).
    pub step: Option<CaRotationStep>,
    /// SHA-256 (hex) of the CA being replaced, and of its replacement.
    pub old_sha256: Option<String>,
    pub new_sha256: Option<String>,
    /// What clients should trust now (the CLI writes it to its CA file).
    pub trust_pem: String,
    /// Online nodes not yet ready for the next step: after `trust`, those that do not trust
    /// the new CA yet; after `issue`, those whose certificate is not of the new CA yet.
    pub waiting_for: Vec<String>,
    /// Nodes that are offline: they rejoin with a join token once the old CA is retired.
    pub offline: Vec<String>,
}

/// Checks node labels: at most [`MAX_NODE_LABELS`]; keys 1-63 characters of
/// `[A-Za-z0-9._/-]` and values 1-63 of `[A-Za-z0-9._-]`, both starting and ending with a
/// letter or digit. These are Kubernetes' rules for label values and short keys, so
/// `topology.kubernetes.io/zone=eu-1a` can be copied from a Kubernetes node as it is.
pub fn validate_labels(labels: &Labels) -> Result<(), ApiError> {
    if labels.len() > MAX_NODE_LABELS {
        return Err(ApiError::invalid(format!(
            "{} labels; a node may have at most {MAX_NODE_LABELS}",
            labels.len()
        )));
    }
    for (k, v) in labels {
        validate_label(k, v)?;
    }
    Ok(())
}

/// Checks one `key=value` label; see [`validate_labels`].
pub fn validate_label(key: &str, value: &str) -> Result<(), ApiError> {
    fn ok(s: &str, extra: &[u8]) -> bool {
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        (1..=63).contains(&s.len())
            && s.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c) || extra.contains(&c))
            && edge(s.chars().next())
            && edge(s.chars().last())
    }
    if !ok(key, b"/") {
        return Err(ApiError::invalid(format!(
            "invalid label key {key:?}: use 1-63 characters A-Z, a-z, 0-9, '.', '_', '-', '/', \
             starting and ending with a letter or digit"
        )));
    }
    if !ok(value, b"") {
        return Err(ApiError::invalid(format!(
            "invalid value {value:?} of label {key:?}: use 1-63 characters A-Z, a-z, 0-9, \
             '.', '_', '-', starting and ending with a letter or digit"
        )));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Online,
    /// No heartbeat for longer than the controller's node timeout.
    Offline,
}

/// Replicas per volume, at most: what the controller accepts and the CSI driver's `replicas`
/// parameter allows. Five copies is already more than any failure model needs, and within
/// what an engine takes ([`crate::agent::ENGINE_MAX_REPLICAS`]).
pub const MAX_VOLUME_REPLICAS: u32 = 5;
const _: () = assert!(MAX_VOLUME_REPLICAS as usize <= crate::agent::ENGINE_MAX_REPLICAS);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    pub size_bytes: u64,
    pub replicas: u32,
    /// Thin (sparse) replicas unless false.
    #[serde(default = "default_true")]
    pub thin: bool,
    /// Place replicas only in pools of this name.
    #[serde(default)]
    pub pool: Option<String>,
    /// How replicas spread over zones. Unset: `strict` if any registered node has a `zone`
    /// label, else `none`; the resolved value is stored with the volume.
    #[serde(default)]
    pub zone_spread: Option<ZoneSpread>,
    /// Put one replica on this node if it can take one (data locality: the node the volume
    /// will be attached to reads locally). A preference: if the node is offline or full the
    /// replicas go elsewhere. It must be a registered node, so a typo is an error.
    #[serde(default)]
    pub prefer_node: Option<String>,
    /// What writes do when too few replicas are left to form a quorum.
    #[serde(default)]
    pub on_quorum_loss: QuorumLoss,
    /// A clone: start with the data of this snapshot or volume (at least its size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<VolumeSource>,
    /// Limits on its client requests; none by default.
    #[serde(default, skip_serializing_if = "crate::Qos::is_unlimited")]
    pub qos: crate::Qos,
    /// Encrypt its data at rest (XTS-AES-256 in the engine, a data key of its own). A clone
    /// is encrypted when its source is, with the source's key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// Keep a CRC-32C per 4 KiB block on every replica and check every read. Unset:
    /// [`DEFAULT_CHECKSUMS`] (a clone too: its replicas are summed from the copied data).
    /// Chosen at create, never changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksums: Option<bool>,
    /// Start with the data of this backup, `TARGET/BACKUP` (docs/backup.md): every replica's
    /// node reads it from the target; the volume stays `restoring` until all have. Its size
    /// is at least the backup's (0: the backup's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_backup: Option<String>,
    /// A standby of another cluster's volume, `TARGET/VOLUME` (docs/backup.md): it starts as
    /// the volume's newest backup on the target, applies each new one as it lands, and
    /// cannot be attached until `POST /v1/volumes/{name}/activate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_of: Option<String>,
    /// Back it up on these schedules (one per target), from its creation on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backup_schedules: Vec<crate::backup::NewBackupSchedule>,
}

/// Whether a volume whose create request does not say keeps block checksums. Volumes
/// created before checksums existed have none (their records say false).
pub const DEFAULT_CHECKSUMS: bool = true;

impl CreateVolume {
    /// Whether the volume is to keep block checksums, the default applied.
    pub fn wants_checksums(&self) -> bool {
        self.checksums.unwrap_or(DEFAULT_CHECKSUMS)
    }
}

/// Where a clone's data comes from: exactly one of the two.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSource {
    /// A ready snapshot, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// A volume, attached or not: a snapshot of it is taken for the clone, then deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

/// How a volume's replicas spread over the nodes' `zone` labels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZoneSpread {
    /// Every replica in a different zone; nodes without a zone label are not used. Creating
    /// fails, naming the zones, when there are fewer zones with room than replicas.
    Strict,
    /// As many zones as possible, then several replicas per zone (still one per node).
    Preferred,
    /// Zones are ignored (one replica per node still holds).
    #[default]
    None,
}

/// Where a volume's replicas may go, as decided at create time and kept with the volume so
/// a replacement replica follows the same rules. Part of the controller's volume records,
/// which accept unknown fields (so an older controller reads a newer one's records); it is
/// never a request body, so it does not refuse them either.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumePlacement {
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(default)]
    pub zone_spread: ZoneSpread,
    #[serde(default)]
    pub prefer_node: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replica {
    pub id: String,
    pub node: String,
    pub pool: String,
    pub state: ReplicaState,
    /// Created empty for a volume that already held data (a replacement, or a move off a
    /// node): it lacks everything until its first resync completes, whatever any journal
    /// says. Outdated until then; cleared when it becomes in-sync.
    #[serde(default, skip_serializing_if = "is_false")]
    pub blank: bool,
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
    #[serde(default)]
    pub placement: VolumePlacement,
    #[serde(default)]
    pub on_quorum_loss: QuorumLoss,
    /// The attached engine's live view (best effort: absent when its agent does not answer).
    #[serde(default)]
    pub engine: Option<VolumeEngineView>,
    /// While detached: the node whose engine (not exported) syncs new replicas.
    #[serde(default)]
    pub sync_node: Option<String>,
    /// A clone: the snapshot or volume it was created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<VolumeSource>,
    /// A restore to this snapshot is under way or stopped half-way (`hawser volume restore`
    /// again finishes it); the volume cannot attach until it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restoring: Option<String>,
    /// Limits on its client requests (none by default; `POST /v1/volumes/{name}/qos`).
    #[serde(default, skip_serializing_if = "crate::Qos::is_unlimited")]
    pub qos: crate::Qos,
    /// Its data is encrypted at rest (chosen at create).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// Its replicas keep a CRC-32C per 4 KiB block, checked on every read (chosen at
    /// create; false for volumes created before checksums existed).
    #[serde(default)]
    pub checksums: bool,
    /// The scrub schedule's reference (ms since the Unix epoch; docs/checksums.md): when the
    /// last completed pass finished, or when the schedule first saw the volume attached. The
    /// next pass is due a scrub interval later.
    #[serde(default)]
    pub last_scrub_ms: Option<u64>,
    /// A standby volume: what it follows, and the backup it holds (its recovery point).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<crate::backup::Standby>,
    /// Its backups on a schedule, one per target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backup_schedules: Vec<crate::backup::BackupSchedule>,
    /// Its identity for life (`crate::uid`): a volume created later under the same name has
    /// another. None for a volume created before volumes had uids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// While attached: the epoch its attachment began at (later epochs of the same attachment
    /// come from replica changes). A kernel device made at this epoch or later belongs to this
    /// attachment; one made before it belongs to an earlier one, whose page cache and queued
    /// writes predate whatever was written since. None while detached, or for an attachment
    /// made before this was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached_epoch: Option<u64>,
}

/// `POST /v1/volumes/{name}/restore`: put a detached volume's data back to one of its
/// snapshots. Writes made after the snapshot are discarded; the snapshot, and every other
/// snapshot of the volume, are kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreVolume {
    pub snapshot: String,
}

/// What the attached engine reports about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeEngineView {
    pub epoch: u64,
    /// Crash recovery when it started.
    pub recovery: Option<crate::agent::RecoveryReport>,
    /// Extents (4 MiB) in its activity log now.
    pub active_extents: u64,
    /// The limits its node applies now (the record's, once the node has them).
    #[serde(default, skip_serializing_if = "crate::Qos::is_unlimited")]
    pub qos: crate::Qos,
    /// Its scrub pass under way, or the last one it ran.
    #[serde(default)]
    pub scrub: Option<crate::agent::ScrubStatus>,
    /// The kernel block device its node serves the volume as (ublk or kernel NBD); absent
    /// when none (NBD clients only, such as nbdfuse), or when the agent is older.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<crate::agent::Device>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attach {
    pub node: String,
}

/// Grow a detached volume to `size_bytes` (a multiple of 4 KiB, not smaller than now; the
/// same size is a no-op). Every replica grows first, then the volume record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpandVolume {
    pub size_bytes: u64,
}

/// `POST /v1/volumes/{name}/force-promote`: let a detached volume attach without the in-sync
/// replicas it would wait for (DRBD's `--force primary`). Crash recovery refuses to start when
/// no reachable replica is sure to hold every acknowledged write and an in-sync one cannot be
/// reached, since that one may hold them. Forcing outdates every in-sync replica but the
/// kept ones, as blank (copied in full when they return): writes only they held are lost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForcePromote {
    /// The in-sync replica to keep; none: every in-sync replica whose node is online.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Must be true: the operator accepts that acknowledged writes held only by the
    /// outdated replicas are lost.
    pub accept_data_loss: bool,
}

/// `GET /v1/replicas[/{id}]`: one replica with its volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaInfo {
    pub volume: String,
    pub replica: Replica,
    /// Removed from the volume (replaced or moved); its file is deleted when its node answers.
    pub retired: bool,
}

/// `GET /v1/events`: one thing that happened in the cluster (an outdate, a resync done, a
/// failover, a replica replaced by self-healing, a node going silent or coming back), as
/// the leader saw it. Kept in the leader's memory, the newest few hundred; a new leader
/// starts with none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterEvent {
    /// Increases by one per event of this leader's term.
    pub seq: u64,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// A warning (something is wrong or was lost) rather than a normal event.
    pub warning: bool,
    /// A CamelCase word, as Kubernetes event reasons are: `Degraded`, `Resynced`, ...
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub message: String,
}

/// `GET /v1/io` on the controller: the request counters of every attached volume, asked of
/// the nodes that export them (one call per node, best effort), for live rates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterIo {
    /// When the controller asked, Unix milliseconds.
    pub at_ms: u64,
    pub volumes: Vec<crate::agent::VolumeIoCounters>,
    /// Nodes that did not answer in time.
    pub unreachable: Vec<String>,
}

/// A snapshot's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    /// Being taken; not usable yet.
    Creating,
    /// Every replica in sync when it was taken holds it.
    Ready,
    /// Its copies are being removed.
    Deleting,
}

/// A crash-consistent snapshot of a volume: its data at one point between two
/// acknowledged writes, kept on the replicas that were in sync then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// Unique in the cluster.
    pub name: String,
    pub volume: String,
    /// The name of its copies on the replicas (the name and a random suffix, so a name used
    /// again never meets a stale copy).
    pub id: String,
    pub size_bytes: u64,
    /// Unix milliseconds.
    pub created_ms: u64,
    pub state: SnapshotState,
    /// Replica ids holding a copy.
    pub replicas: Vec<String>,
    /// How long the volume's requests were held while it was taken (an attached volume),
    /// microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_micros: Option<u64>,
    /// How the replicas copied it: "reflink" (shared extents), "copy", or "mixed".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
}

/// `POST /v1/snapshots`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    pub name: String,
    pub volume: String,
}

/// `GET /v1/status`: what `hawser status` summarises.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterStatus {
    pub nodes: u32,
    /// Nodes without a heartbeat for longer than the node timeout.
    pub nodes_offline: Vec<String>,
    pub nodes_evacuating: Vec<String>,
    pub volumes: u32,
    /// Volumes with fewer in-sync replicas than their replica count.
    pub degraded: Vec<DegradedVolume>,
    /// Replicas being copied to by an engine now.
    pub resyncs: Vec<ResyncProgress>,
    /// Scrub passes of attached volumes: under way, or the last one where it found bad
    /// blocks (docs/checksums.md).
    #[serde(default)]
    pub scrubs: Vec<ScrubProgress>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubProgress {
    pub volume: String,
    /// Where its engine runs.
    pub node: String,
    pub scrub: crate::agent::ScrubStatus,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DegradedVolume {
    pub name: String,
    pub state: VolumeState,
    pub in_sync: u32,
    pub replica_count: u32,
    /// Each replica not in sync: "id on node (outdated, blank)".
    pub lagging: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResyncProgress {
    pub volume: String,
    pub replica: String,
    pub node: String,
    pub blank: bool,
    /// The engine's state of the replica (syncing, marking, outdated while it is away, ...).
    pub state: String,
    pub copied_bytes: u64,
    pub remaining_bytes: u64,
    pub bytes_per_sec: u64,
    /// `remaining_bytes / bytes_per_sec`, when there is a rate.
    pub eta_secs: Option<u64>,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn labels() {
        for (k, v) in [
            ("zone", "a"),
            ("topology.kubernetes.io/zone", "eu-west-1a"),
            ("rack", "R_12"),
        ] {
            assert!(validate_label(k, v).is_ok(), "{k}={v}");
        }
        for (k, v) in [
            ("", "a"),
            ("zone", ""),
            ("-zone", "a"),
            ("zone", "a/b"),
            ("zo ne", "a"),
            ("zone", "a="),
            ("zone", &"a".repeat(64)),
        ] {
            assert!(validate_label(k, v).is_err(), "{k}={v}");
        }
        let many: Labels = (0..=MAX_NODE_LABELS)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        assert!(validate_labels(&many).is_err());
    }

    #[test]
    fn pool_kinds() {
        assert!(PoolKind::Any.allows(true) && PoolKind::Any.allows(false));
        assert!(PoolKind::Thin.allows(true) && !PoolKind::Thin.allows(false));
        assert!(!PoolKind::Thick.allows(true) && PoolKind::Thick.allows(false));
    }

    /// Requests and answers of the previous version, without labels, pool kinds and
    /// placement, still parse (agents and CLIs are upgraded one at a time).
    #[test]
    fn older_json_parses_with_defaults() {
        let pool: PoolInfo = serde_json::from_str(
            r#"{"node": "n1", "name": "p", "path": "/p", "capacity_bytes": 1,
                "free_bytes": 1, "provisioned_bytes": 0, "overprovision_ratio": 1.0,
                "replicas": 0}"#,
        )
        .unwrap();
        assert_eq!(pool.kind, PoolKind::Any);
        let reg: RegisterNode = serde_json::from_str(
            r#"{"admin_addr": "h:1", "replica_addr": "h:2", "nbd_addr": null,
                "nbd_socket": null, "pools": []}"#,
        )
        .unwrap();
        assert!(reg.labels.is_empty());
        let create: CreateVolume =
            serde_json::from_str(r#"{"name": "v", "size_bytes": 4096, "replicas": 1}"#).unwrap();
        // A request that does not say asks for checksums.
        assert_eq!((create.checksums, create.wants_checksums()), (None, true));
        assert_eq!(
            (create.pool, create.zone_spread, create.prefer_node),
            (None, None, None)
        );
        let plain: CreateVolume = serde_json::from_str(
            r#"{"name": "v", "size_bytes": 4096, "replicas": 1, "checksums": false}"#,
        )
        .unwrap();
        assert!(!plain.wants_checksums());
        let spread: CreateVolume = serde_json::from_str(
            r#"{"name": "v", "size_bytes": 4096, "replicas": 1, "zone_spread": "preferred"}"#,
        )
        .unwrap();
        assert_eq!(spread.zone_spread, Some(ZoneSpread::Preferred));
    }
}

/// `GET /v1/trash`: a replica in a node's pool trash (an orphan: moved there instead of
/// deleted, and purged by its agent after the grace period).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrphanReplica {
    pub node: String,
    #[serde(flatten)]
    pub replica: crate::agent::TrashedReplica,
}

/// `GET /v1/cluster`: the cluster's identity and the nodes it refuses because their
/// replicas belong to another cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterInfo {
    pub id: String,
    pub created_ms: u64,
    pub waiting: Vec<WaitingNode>,
}

/// A node that asked to join while its replicas name another cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitingNode {
    pub node: String,
    pub cluster_id: String,
    pub admin_addr: String,
    /// Unix milliseconds of its last attempt.
    pub last_seen_ms: u64,
}

/// `POST /v1/cluster/recover`: adopt the waiting nodes' cluster (only into a store without
/// volumes) and rebuild the record of every volume whose replicas the nodes hold but the
/// store does not know.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverCluster {
    /// Wait at most this long for the adopted nodes to register again (default 30).
    #[serde(default)]
    pub wait_secs: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverReport {
    pub cluster_id: String,
    /// The store took the nodes' cluster id (it was empty, wiped or of a new cluster).
    pub adopted: bool,
    pub volumes: Vec<Volume>,
    /// Volumes or replicas left alone, with why.
    pub skipped: Vec<String>,
}

/// `POST /v1/join-tokens` (admin): a token that lets new nodes join (TLS clusters).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateJoinToken {
    /// How long the token is valid, in seconds (default 3600, at most 7 days).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// How many nodes may join with it (default 1, at most 1000).
    #[serde(default)]
    pub uses: Option<u32>,
    /// Only a node of this name may join with it; and it may take the name over from a node
    /// that is still online (a reinstalled machine), which a token for any name may not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinTokenCreated {
    /// `hjt1.<id>.<secret>.<CA fingerprint>`: give it to the agent (`--join-token-file`).
    pub token: String,
    pub expires_ms: u64,
    pub uses: u32,
}

/// `POST /v1/join` (the join token authenticates): a node's first certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinNode {
    pub node: String,
    pub token: String,
    /// The node's public key: DER SubjectPublicKeyInfo, base64. The key never leaves it.
    pub public_key: String,
    /// DNS names and IP addresses clients dial the node by (its listen addresses and
    /// `--tls-san`), also put in its certificate for clients that check names (libnbd,
    /// Prometheus); at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// `POST /v1/nodes/{node}/certificate` (the node's current certificate authenticates): a
/// renewed certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewCertificate {
    /// As in [`JoinNode`].
    pub public_key: String,
    /// As in [`JoinNode`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeCertificate {
    /// The node's certificate then the CA's, PEM.
    pub chain_pem: String,
    /// The cluster's CA certificate, PEM.
    pub ca_pem: String,
    pub not_after_unix: u64,
}

/// `POST /v1/client-certificates` (admin): a certificate for an NBD client of some volumes
/// (`hawser volume client-cert`). The client makes its key and sends only the public half.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateClientCertificate {
    /// The volumes whose NBD exports it opens (1 to 64 existing volumes).
    pub volumes: Vec<String>,
    /// Only at this node's NBD port (an existing node); at any node's without it.
    #[serde(default)]
    pub node: Option<String>,
    /// How long it is valid, in seconds (default 86400, at most 30 days).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// As in [`JoinNode`].
    pub public_key: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCertificate {
    /// The client's certificate then the CA's, PEM.
    pub chain_pem: String,
    /// The cluster's CA certificate, PEM.
    pub ca_pem: String,
    pub not_after_unix: u64,
    /// The volumes it opens, sorted.
    pub volumes: Vec<String>,
    pub node: Option<String>,
}

/// `POST /v1/cluster/volume-key`: what rotating the key-encryption key did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeKeyRotated {
    /// The new key-encryption key's id.
    pub kek: u32,
    /// The volumes whose data keys were re-wrapped under it.
    pub rewrapped: Vec<String>,
    /// After the rotation: how many volumes each key-encryption key wraps. A key that wraps
    /// none, when `behind` is empty, can be deleted; one below the new id that still wraps
    /// some (a volume created during the rotation) is taken by rotating again.
    pub wrapping: std::collections::BTreeMap<u32, u64>,
    /// The replicas whose copy of their volume's wrapped data key the rotation could not
    /// update (a node down), each with why: they may still hold a copy under an older key.
    /// Rotating again once their nodes are back updates them. Left out when empty, so a CLI
    /// from before it still reads the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<String>,
}

/// `POST /v1/cluster/admin-token` and `/v1/cluster/agent-token`: replace a cluster token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateToken {
    /// How long the previous token still works, in seconds (default 3600, at most 7 days;
    /// 0: not at all).
    #[serde(default)]
    pub grace_secs: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRotated {
    /// The new token (shown once; the store keeps its digest).
    pub token: String,
    /// When the previous token stops working, Unix milliseconds.
    pub previous_valid_until_ms: u64,
}
