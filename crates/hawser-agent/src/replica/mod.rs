//! The replica protocol (`hawser_wire::frame`), both ends of it.
//!
//! - The server ([`server`], [`snapshot_session`]) serves this node's replicas to engines on
//!   any node; [`grants`] checks the controller's epoch grants it is shown.
//! - The client ([`client`]) is an engine's connection to a replica on another node;
//!   [`access`] makes direct requests to one replica outside an engine, and
//!   [`snapshot_fetch`] copies a snapshot from another node's replica.
//! - Both ends frame their bytes with [`frame_io`] and send through an [`outbox`].
//!
//! It may use the pools ([`crate::storage`]) and TLS ([`crate::tls::conn`]), never an engine:
//! the engine is its caller.

pub mod access;
pub mod client;
pub mod frame_io;
pub mod grants;
pub mod outbox;
mod replies;
pub mod server;
pub mod snapshot_fetch;
mod snapshot_session;
