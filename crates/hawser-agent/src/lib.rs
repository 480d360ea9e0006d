//! The Hawser node agent. One per node: it owns the node's storage pools and replicas, serves
//! them to engines on other nodes (replica server), runs the engine of every volume attached on
//! this node and exports those volumes over NBD.
//!
//! The folders, from the disk up (docs/ARCHITECTURE.md walks a write through them):
//! - [`storage`] holds this node's pools and the threads that do their blocking I/O;
//! - [`replica`] speaks the replica protocol, both ends: the server of this node's replicas
//!   and the engine's connections to replicas elsewhere;
//! - [`engine`] runs each attached volume's engine (`hawser_core`'s driver with real I/O), and
//!   what stands between it and its frontends: QoS, snapshot pauses, encryption;
//! - [`frontends`] holds the block-device seam every frontend serves;
//! - [`nbd`] is the NBD server, one frontend;
//! - [`tls`] holds the node's identity in the cluster, and TLS on replica connections;
//! - [`control`] is the agent's side of the controller: its calls out and its admin API;
//! - [`observe`] counts and reports: metrics.
//!
//! [`agent`] starts them all; [`constants`] holds every bound and timing.

pub mod agent;
pub mod backup;
pub mod constants;
pub mod control;
pub mod engine;
pub mod frontends;
pub mod nbd;
pub mod observe;
pub mod replica;
pub mod storage;
pub mod tls;

pub use agent::{run, AgentArgs};
