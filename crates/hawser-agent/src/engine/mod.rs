//! The engines of the volumes attached on this node.
//!
//! - [`volume`] drives one `hawser_core::Engine` with real I/O: the local replica through the
//!   I/O threads, remote ones through replica connections, and the controller for membership.
//!   [`recovery`] repairs what a dead engine left half-written before it serves.
//! - [`registry`] holds every engine on this node behind its export, with what is applied at
//!   the export before a request reaches the engine: [`qos`], snapshot pauses
//!   ([`registry::pause`]), and an engine swap.
//! - [`crypt`] encrypts a volume's data; [`rate_limit`] holds resync to its rate.
//!
//! Frontends see an engine only through [`crate::frontends::block`]; the engine knows no
//! frontend.

pub mod crypt;
pub mod qos;
pub mod rate_limit;
pub mod recovery;
pub mod registry;
pub mod volume;
