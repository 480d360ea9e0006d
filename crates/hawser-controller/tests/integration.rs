//! The controller's integration tests, in one test binary: a real controller (on its HTTP
//! API) against the fake agents of `common`. One binary rather than one per file, because
//! each binary compiled and linked `common` (an axum server) and the controller again; the
//! files are modules here and keep their paths.
#![allow(clippy::unwrap_used)]

mod common;

mod api_expand;
mod api_input;
mod api_outdate;
mod api_placement;
mod api_snapshots;
mod api_volumes;
mod ca_home_k8s;
mod ha_failover;
mod key_rotation;
mod leader_election;
mod openapi;
mod self_heal;
mod volume_keys_k8s;
