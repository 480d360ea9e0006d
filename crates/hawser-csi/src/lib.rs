//! Hawser's CSI driver (`hawser csi`): the CSI Identity, Controller and Node services on a
//! unix socket, backed by the controller's REST API and the node's agent, plus the kubelet's
//! plugin-registration service so no node-driver-registrar sidecar is needed.
//!
//! | file                    | owns                                                       |
//! |-------------------------|------------------------------------------------------------|
//! | `server.rs`             | sockets, modes, shutdown                                   |
//! | `identity.rs`           | Identity: name, capabilities, probe                        |
//! | `controller.rs`         | Controller: create, delete, list, capacity, expand, get    |
//! | `controller_publish.rs` | Controller: publish / unpublish (attach / detach, fencing) |
//! | `node.rs`               | Node: stage, publish, stats, expand, info                  |
//! | `node_device.rs`        | a volume's block device on the node (nbdfuse + loop)       |
//! | `mounts.rs`             | mkfs, mount, bind mounts, statvfs, filesystem growth       |
//! | `registration.rs`       | the kubelet's plugin registration                          |
//! | `authority.rs`          | fixes the registration client's invalid HTTP/2 authority   |
//! | `controller/snapshots.rs` | Controller: snapshots, and clones of snapshots and volumes |
//! | `snapshot_backups.rs`   | Controller: snapshots that are backups, restores of them   |
//! | `capability.rs`, `capacity.rs`, `params.rs`, `names.rs` | pure request checks    |
//! | `snapshot_class.rs`     | pure: a VolumeSnapshotClass's parameters, backup ids       |
//! | `api.rs`                | the controller REST client; its errors as gRPC codes       |

pub mod api;
pub mod authority;
pub mod capability;
pub mod capacity;
pub mod controller;
pub mod controller_publish;
pub mod identity;
pub mod inflight;
pub mod mounts;
pub mod names;
pub mod node;
pub mod node_device;
pub mod paging;
pub mod params;
pub mod proto;
pub mod registration;
pub mod server;
pub mod snapshot_backups;
pub mod snapshot_class;

pub use server::{run, CsiArgs, Mode};
