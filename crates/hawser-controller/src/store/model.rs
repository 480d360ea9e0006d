//! The records the controller keeps in the cluster store, their keys, and their conversion
//! to API types.
//!
//! Records accept unknown fields (unlike API requests) so an older controller can read what a
//! newer one wrote after a rollback.

use hawser_api::controller::{
    Labels, Node, NodeState, PoolInfo, QuorumLoss, Replica, ReplicaState, Snapshot, SnapshotState,
    Volume, VolumePlacement, VolumeSource, VolumeState, ZONE_LABEL,
};
use serde::{Deserialize, Serialize};

const NODES_PREFIX: &str = "nodes/";
const VOLUMES_PREFIX: &str = "volumes/";
const NODE_SETTINGS_PREFIX: &str = "node-settings/";

pub fn node_key(name: &str) -> String {
    format!("{NODES_PREFIX}{name}")
}

pub fn volume_key(name: &str) -> String {
    format!("{VOLUMES_PREFIX}{name}")
}

pub fn node_settings_key(name: &str) -> String {
    format!("{NODE_SETTINGS_PREFIX}{name}")
}

pub fn node_settings_prefix() -> &'static str {
    NODE_SETTINGS_PREFIX
}

pub fn nodes_prefix() -> &'static str {
    NODES_PREFIX
}

pub fn volumes_prefix() -> &'static str {
    VOLUMES_PREFIX
}

/// A node as last reported by its agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    pub admin_addr: String,
    pub replica_addr: String,
    pub nbd_addr: Option<String>,
    pub nbd_socket: Option<String>,
    /// The NBD TCP listener requires TLS (absent in records written before it could).
    #[serde(default)]
    pub nbd_tls: bool,
    /// Unix milliseconds of the last registration or heartbeat.
    pub last_seen_ms: u64,
    pub pools: Vec<PoolInfo>,
    /// As last reported; absent in records written before labels existed.
    #[serde(default)]
    pub labels: Labels,
}

impl NodeRecord {
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(ZONE_LABEL).map(String::as_str)
    }

    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.last_seen_ms)
    }

    pub fn is_online(&self, now_ms: u64, timeout_ms: u64) -> bool {
        self.age_ms(now_ms) <= timeout_ms
    }

    pub fn to_api(&self, now_ms: u64, timeout_ms: u64) -> Node {
        Node {
            name: self.name.clone(),
            admin_addr: self.admin_addr.clone(),
            replica_addr: self.replica_addr.clone(),
            nbd_addr: self.nbd_addr.clone(),
            nbd_socket: self.nbd_socket.clone(),
            last_seen_ms: self.last_seen_ms,
            state: if self.is_online(now_ms, timeout_ms) {
                NodeState::Online
            } else {
                NodeState::Offline
            },
            labels: self.labels.clone(),
            evacuating: false,
            cluster: None,
        }
    }
}

/// What an operator decided about a node. Kept apart from [`NodeRecord`], which every
/// heartbeat overwrites.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSettings {
    /// `hawser node evacuate`: no new replicas here, and every replica here is moved off
    /// (added elsewhere first, then removed), until `hawser node restore`.
    #[serde(default)]
    pub evacuate: bool,
}

/// A volume: its replicas, attachment and epoch. Every change is a compare-and-swap on this
/// one record, which is what makes outdating a replica and fencing an engine atomic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub name: String,
    pub size_bytes: u64,
    pub replica_count: u32,
    pub thin: bool,
    pub state: VolumeState,
    pub epoch: u64,
    pub attached_node: Option<String>,
    pub replicas: Vec<Replica>,
    /// Absent in records written before placement rules existed, which were placed without
    /// zones or a pool selector, as the default says.
    #[serde(default)]
    pub placement: VolumePlacement,
    /// Absent in older records: the default (suspend).
    #[serde(default)]
    pub on_quorum_loss: QuorumLoss,
    /// Replicas removed from the volume (replaced or moved) whose files may still exist on
    /// their nodes: deleted when their node answers, then dropped from this list. Never
    /// written to, read from or counted in the in-sync set.
    #[serde(default)]
    pub retired: Vec<Replica>,
    /// While detached: the node running an engine (not exported) that syncs the volume's
    /// blank replicas (see `healing/self_heal.rs`). Attaching stops it.
    #[serde(default)]
    pub sync_node: Option<String>,
    /// Its snapshots (`snapshots/create.rs`), oldest first. In the volume's record so that a
    /// snapshot and the replica set it was taken on change together.
    #[serde(default)]
    pub snapshots: Vec<SnapshotRecord>,
    /// A clone's source, as asked (a CSI CreateVolume retried must name the same one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<VolumeSource>,
    /// Set while its replicas are being restored to this snapshot (`volumes/restore.rs`):
    /// they may differ until the restore ends, so nothing attaches, grows or copies it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restoring: Option<String>,
    /// Limits on its client requests (`volumes/qos.rs`), applied by its engine's node.
    #[serde(default, skip_serializing_if = "hawser_api::Qos::is_unlimited")]
    pub qos: hawser_api::Qos,
    /// An encrypted volume's data key, wrapped (`volumes/keys.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<crate::volumes::keys::WrappedKey>,
    /// Its replicas keep block checksums: every replica created for it asks for them.
    /// Chosen at create, never changed. False in records written before checksums existed,
    /// whose replicas have none (a new volume's record says true unless asked otherwise).
    #[serde(default)]
    pub checksums: bool,
    /// When the last scrub pass its engine completed finished (ms since the Unix epoch): the
    /// engine watch starts the next one a scrub interval later (`cluster/engine_watch.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrubbed_ms: Option<u64>,
    /// A standby volume (`snapshots/standby.rs`): `restoring` says so while this is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<hawser_api::backup::Standby>,
    /// The backup a volume made with `--from-backup` is being restored from, while
    /// `restoring` says so (`snapshots/restores.rs`): the leader starts it again on every
    /// replica whose job is not done, across restarts and leader changes, until all are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<BackupRef>,
    /// Backups on a schedule, one per target (`snapshots/schedules.rs`); on Kubernetes the
    /// HawserVolume's `spec.backup_schedules`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backup_schedules: Vec<hawser_api::backup::BackupSchedule>,
    /// Its identity for life (`hawser_api::uid`), given at create and recorded in every
    /// replica's metadata (so `cluster recover` gives it back). A namesake created after a
    /// delete has another: NBD client certificates and kernel devices name it. None in
    /// records written before volumes had uids; such a volume never gets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The epoch its current attachment began at (set by each attach; read only while
    /// attached, see `hawser_api::controller::Volume::attached_epoch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached_epoch: Option<u64>,
}

/// A new volume uid: 16 random bytes.
pub fn new_volume_uid() -> String {
    let bytes: [u8; hawser_api::uid::UID_BYTES] = rand::random();
    hawser_api::uid::uid_text(&bytes)
}

/// A backup on a target, by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupRef {
    pub target: String,
    pub backup: String,
}

/// A snapshot of the volume whose record holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub name: String,
    /// Its copies' name on the replicas.
    pub id: String,
    pub size_bytes: u64,
    pub created_ms: u64,
    pub state: SnapshotState,
    /// Replica ids holding a copy.
    pub replicas: Vec<String>,
    #[serde(default)]
    pub pause_micros: Option<u64>,
    #[serde(default)]
    pub how: Option<String>,
}

impl SnapshotRecord {
    pub fn to_api(&self, volume: &str) -> Snapshot {
        Snapshot {
            name: self.name.clone(),
            volume: volume.into(),
            id: self.id.clone(),
            size_bytes: self.size_bytes,
            created_ms: self.created_ms,
            state: self.state,
            replicas: self.replicas.clone(),
            pause_micros: self.pause_micros,
            how: self.how.clone(),
        }
    }
}

impl VolumeRecord {
    /// A detached, thin volume of `size_bytes` at epoch 0, with no replicas, no uid and
    /// every option at its default. The base that create, `cluster recover` and the tests
    /// fill in with struct update syntax (`VolumeRecord { epoch: 3, ..VolumeRecord::new(..) }`),
    /// so that a new field is given its default in one place.
    pub fn new(name: &str, size_bytes: u64, replica_count: u32) -> Self {
        VolumeRecord {
            name: name.to_owned(),
            size_bytes,
            replica_count,
            thin: true,
            state: VolumeState::Detached,
            epoch: 0,
            attached_node: None,
            replicas: Vec::new(),
            placement: VolumePlacement::default(),
            on_quorum_loss: QuorumLoss::default(),
            retired: Vec::new(),
            sync_node: None,
            snapshots: Vec::new(),
            origin: None,
            restoring: None,
            qos: hawser_api::Qos::default(),
            encryption: None,
            checksums: false,
            scrubbed_ms: None,
            standby: None,
            restore_from: None,
            backup_schedules: Vec::new(),
            uid: None,
            attached_epoch: None,
        }
    }

    pub fn in_sync(&self) -> impl Iterator<Item = &Replica> {
        self.replicas
            .iter()
            .filter(|r| r.state == ReplicaState::InSync)
    }

    /// The API view. `attached` is the record of the node it is attached to, if known, for
    /// the NBD addresses.
    pub fn to_api(&self, attached: Option<&NodeRecord>) -> Volume {
        let node = match (&self.attached_node, attached) {
            (Some(name), Some(n)) if self.state == VolumeState::Attached && *name == n.name => {
                Some(n)
            }
            _ => None,
        };
        let nbd_uri = node.and_then(|n| {
            let scheme = if n.nbd_tls { "nbds" } else { "nbd" };
            let addr = n.nbd_addr.as_ref()?;
            Some(format!("{scheme}://{addr}/{}", self.name))
        });
        let nbd_unix_uri = node
            .and_then(|n| n.nbd_socket.as_ref())
            .map(|sock| format!("nbd+unix:///{}?socket={sock}", self.name));
        Volume {
            name: self.name.clone(),
            size_bytes: self.size_bytes,
            replica_count: self.replica_count,
            thin: self.thin,
            state: self.state,
            epoch: self.epoch,
            attached_node: self.attached_node.clone(),
            replicas: self.replicas.clone(),
            nbd_uri,
            nbd_unix_uri,
            placement: self.placement.clone(),
            on_quorum_loss: self.on_quorum_loss,
            engine: None,
            sync_node: self.sync_node.clone(),
            origin: self.origin.clone(),
            restoring: self.restoring.clone(),
            qos: self.qos,
            encrypted: self.encryption.is_some(),
            checksums: self.checksums,
            last_scrub_ms: self.scrubbed_ms,
            standby: self.standby.clone(),
            backup_schedules: self
                .backup_schedules
                .iter()
                .map(crate::snapshots::cron::view)
                .collect(),
            uid: self.uid.clone(),
            attached_epoch: self
                .attached_epoch
                .filter(|_| self.state == VolumeState::Attached),
        }
    }
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_api::controller::ZoneSpread;

    /// Records written before labels and placement rules existed still load, with the
    /// defaults that describe how they were placed.
    #[test]
    fn older_records_load() {
        let node: NodeRecord = serde_json::from_str(
            r#"{"name": "n1", "admin_addr": "h:1", "replica_addr": "h:2", "nbd_addr": null,
                "nbd_socket": null, "last_seen_ms": 5, "pools": []}"#,
        )
        .unwrap();
        assert!(node.labels.is_empty());
        assert_eq!(node.zone(), None);
        let volume: VolumeRecord = serde_json::from_str(
            r#"{"name": "v", "size_bytes": 4096, "replica_count": 1, "thin": true,
                "state": "detached", "epoch": 0, "attached_node": null, "replicas": []}"#,
        )
        .unwrap();
        assert_eq!(volume.placement.zone_spread, ZoneSpread::None);
        assert_eq!(volume.placement.pool, None);
        assert_eq!(volume.to_api(None).placement, volume.placement);
        // Its replicas were made before checksums existed and have none: nor does it.
        assert!(!volume.checksums);
        assert!(!volume.to_api(None).checksums);
    }
}
