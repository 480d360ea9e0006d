//! Hawser's replication core. The volume engine is a state machine: it takes client requests,
//! replica replies and control-plane answers as inputs and returns commands (send this to that
//! replica, complete that request, ask the controller to outdate a replica). It does no I/O and
//! knows no clock or runtime, so the agent drives it with tokio and the simulator drives it
//! from one seed.

pub mod io_error;

pub use io_error::IoError;
