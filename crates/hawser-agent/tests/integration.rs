//! The agent's integration tests, in one test binary: agents, engines and NBD servers of
//! this crate, on loopback, with the helpers of `node_support` and `nbd_support`. One binary
//! rather than one per file, because each binary compiled and linked the agent and its
//! helpers again; the files are modules here and keep their paths.
#![allow(clippy::unwrap_used)]

mod nbd_support;
mod node_support;

mod admin_auth;
mod admin_input;
mod crash_recovery;
mod engine_encrypted;
mod engine_namesake;
mod engine_replicated;
mod engine_snapshot;
mod nbd_clients;
mod nbd_protocol;
mod replica_grow;
mod replica_tls;
mod wrapped_key;
