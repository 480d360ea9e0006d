//! The NBD server: the agent's export of each attached volume to NBD clients (the kernel's
//! nbd driver, nbdfuse, qemu, libnbd) over TCP or a unix socket, with TLS where the node has
//! an identity.
//!
//! Owns the protocol only: option haggling ([`handshake`]), the transmission phase
//! ([`transmission`], [`request`], [`buffers`], [`errno`]) and the listeners ([`server`]). It
//! serves any [`crate::frontends::block::BlockDevice`] and may not reach past that seam: it
//! knows no engines, replicas or pools.

pub mod buffers;
pub mod errno;
pub mod handshake;
mod own_wake;
pub mod request;
pub mod server;
pub mod transmission;
