//! The Hawser node agent. One per node: it owns the node's storage pools and replicas, serves
//! them to engines on other nodes (replica server), runs the engine of every volume attached on
//! this node and exports those volumes over NBD.

pub mod admin_api;
pub mod agent;
pub mod block;
pub mod constants;
pub mod controller_link;
pub mod engine_pause;
pub mod engines;
pub mod frame_io;
pub mod grants;
pub mod io_pool;
pub mod metrics;
mod metrics_state;
pub mod nbd_buffers;
pub mod nbd_errno;
pub mod nbd_handshake;
pub mod nbd_request;
pub mod nbd_server;
pub mod nbd_transmission;
pub mod node_storage;
pub mod node_tls;
pub mod outbox;
mod own_wake;
pub mod qos;
pub mod rate_limit;
pub mod recovery;
pub mod replica_access;
pub mod replica_client;
pub mod replica_server;
pub mod snapshot_fetch;
mod snapshot_session;
pub mod tls_conn;
pub mod volume_crypt;
pub mod volume_engine;

pub use agent::{run, AgentArgs};
