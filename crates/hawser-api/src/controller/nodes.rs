//! Nodes: what an agent registers and reports (`PUT /v1/nodes/{node}`, `POST /v1/nodes/{node}/events`),
//! what the controller answers, and the labels placement reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ca_rotation::ClusterCa;
use crate::pool::PoolInfo;
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
}
