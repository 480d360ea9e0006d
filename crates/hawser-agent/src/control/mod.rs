//! The agent's side of the controller: its calls to the controller ([`link`]: registration,
//! heartbeats, and the engine's membership changes) and the admin API the controller and
//! operators call ([`admin_api`]: start and stop engines, replicas, snapshots, metrics;
//! [`held`]: the replicas it holds, for the reconcile round; [`peers`]: whether this node
//! reaches the others).
//!
//! This is the one folder that sees every other: it turns requests into calls on them. No
//! other folder calls into it, except engines reporting membership through [`link`].

pub mod admin_api;
pub mod device_api;
pub mod held;
pub mod link;
pub mod peers;
