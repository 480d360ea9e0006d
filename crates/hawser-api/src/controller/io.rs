//! Live I/O counters (`GET /v1/io`).

use serde::{Deserialize, Serialize};

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
