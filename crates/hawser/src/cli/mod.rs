//! The client commands of `hawser` (`volume`, `node`, `pool`): blocking HTTP calls to the
//! controller and human or JSON output.

pub mod args;
pub mod backup;
pub mod backup_schedule;
pub mod client;
pub mod client_cert;
pub mod cluster;
pub mod device;
pub mod events;
pub mod node;
pub mod output;
pub mod pool;
pub mod qos;
pub mod replica;
pub mod rotate_ca;
pub mod snapshot;
pub mod standby;
pub mod status;
pub mod token;
pub mod volume;
