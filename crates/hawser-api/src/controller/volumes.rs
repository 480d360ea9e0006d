//! Volumes (`/v1/volumes`): create, attach, expand, force-promote, restore, and the volume
//! the controller answers with its replicas and placement.

use serde::{Deserialize, Serialize};

use crate::quorum_loss::QuorumLoss;
use crate::replica_state::ReplicaState;

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
