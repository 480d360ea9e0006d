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

//!
//! One file per resource, as the controller's routes (`hawser-controller/src/api/`); every
//! type is re-exported here, so callers name `hawser_api::controller::Volume`.

mod ca_rotation;
mod certificates;
mod cluster;
mod io;
mod nodes;
mod replicas;
mod snapshots;
mod status;
mod tokens;
mod volumes;

pub use ca_rotation::*;
pub use certificates::*;
pub use cluster::*;
pub use io::*;
pub use nodes::*;
pub use replicas::*;
pub use snapshots::*;
pub use status::*;
pub use tokens::*;
pub use volumes::*;

pub use crate::pool::{PoolInfo, PoolKind};
pub use crate::quorum_loss::QuorumLoss;
pub use crate::replica_state::ReplicaState;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
