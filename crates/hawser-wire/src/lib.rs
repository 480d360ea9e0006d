//! Hawser's wire and on-disk formats. Every decoder here takes untrusted bytes and returns a
//! `Result`; none of them panics on any input (each has a fuzz target under `fuzz/`).
//!
//! This crate does no I/O and depends on no runtime, so the replication core and the simulator
//! can use it directly.

pub mod constants;
pub mod frame;
pub mod grant;
pub mod journal;
pub mod meta;
pub mod nbd;

pub use frame::{FrameError, FrameHeader, Op, Status};
