//! TLS on the agent: the node's identity in the cluster ([`node`]: its key and certificate,
//! how it joins and renews, and the configuration of each of its listeners), and TLS records on
//! replica connections that keep the outbox's direct writes ([`conn`]).
//!
//! The certificates and trust themselves are `hawser_tls`'s; this folder only applies them to
//! the agent's sockets. docs/security.md says who may connect to which port.

pub mod conn;
pub mod node;
pub mod sealer;
