//! Hawser's replication core. The volume engine is a state machine: it takes client requests,
//! replica replies and control-plane answers as inputs and returns commands (send this to that
//! replica, complete that request, ask the controller to outdate a replica). It does no I/O and
//! knows no clock or runtime, so the agent drives it with tokio and a simulator can drive it
//! from one seed.

pub mod activity;
pub mod bitmap;
pub mod constants;
pub mod driver;
pub mod engine;
pub mod id_map;
pub mod io_error;
mod membership;
pub mod range_lock;
pub mod recovery_plan;
pub mod types;

pub use activity::ActivityLog;
pub use bitmap::ChunkMap;
pub use engine::grow::GrowError;
pub use engine::repair::Integrity;
pub use engine::resync::ResyncPoint;
pub use engine::scrub::ScrubView;
pub use engine::{
    Engine, EngineConfig, Initial, Membership, NoQuorum, Quorum, ReplicaSpec, ReplicaView,
};
pub use id_map::IdMap;
pub use io_error::IoError;
pub use recovery_plan::Plan;
pub use types::{
    ClientOp, Command, ReplicaFailure, ReplicaIdx, ReplicaOp, ReplicaResult, SubId, Tag,
};

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod grow_tests;
#[cfg(test)]
mod repair_tests;
#[cfg(test)]
mod scrub_tests;
