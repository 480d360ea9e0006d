//! CSI volume names to Hawser volume ids, and the driver's constant names.
//!
//! A CSI name is any string of up to 128 characters; a Hawser volume name is a DNS label
//! (`hawser_api::validate_name`). Names that already are valid volume names (Kubernetes'
//! `pvc-<uuid>`) are kept, so `hawser volume list` shows the PV names; others map to
//! `csi-` and 40 hex digits of their SHA-256. The map is a pure function, so CreateVolume is
//! idempotent by name with nothing stored besides the volume itself.

use sha2::{Digest, Sha256};

/// The CSI driver name (CSIDriver object, StorageClass provisioner).
pub const DRIVER_NAME: &str = "csi.hawser.dev";
/// Topology key of the node a volume can be used on (every node runs an agent).
pub const TOPOLOGY_NODE_KEY: &str = "topology.hawser.dev/node";
/// Topology key of the node's zone, from the agent's `zone` label.
pub const TOPOLOGY_ZONE_KEY: &str = "topology.hawser.dev/zone";
/// The CSI spec allows names of at most this many bytes.
pub const MAX_CSI_NAME_LEN: usize = 128;

/// The Hawser volume id for a CSI volume name.
pub fn volume_id_for(csi_name: &str) -> String {
    hawser_name_for(csi_name)
}

/// The Hawser snapshot name for a CSI snapshot name (external-snapshotter's
/// `snapshot-<uuid>` is kept). Snapshot names are unique in the cluster, apart from volumes'.
pub fn snapshot_id_for(csi_name: &str) -> String {
    hawser_name_for(csi_name)
}

/// Whether a CSI id can name a Hawser volume or snapshot at all: one that cannot was never
/// given by this driver, so it does not exist.
pub fn is_hawser_name(id: &str) -> bool {
    hawser_api::validate_name("volume", id).is_ok()
}

fn hawser_name_for(csi_name: &str) -> String {
    if is_hawser_name(csi_name) {
        return csi_name.to_string();
    }
    let digest = Sha256::digest(csi_name.as_bytes());
    let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_are_kept_and_others_hashed_stably() {
        assert_eq!(volume_id_for("pvc-0a1b"), "pvc-0a1b");
        let a = volume_id_for("sanity-Create-4A1B2C3D-00FF00FF");
        assert_eq!(a, volume_id_for("sanity-Create-4A1B2C3D-00FF00FF"));
        assert_ne!(a, volume_id_for("sanity-Create-4A1B2C3D-00FF00FE"));
        assert!(a.starts_with("csi-") && a.len() == 44, "{a}");
        assert!(hawser_api::validate_name("volume", &a).is_ok());
        let long = "x".repeat(MAX_CSI_NAME_LEN);
        assert!(hawser_api::validate_name("volume", &volume_id_for(&long)).is_ok());
    }
}
