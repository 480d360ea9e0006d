//! Fixtures for end-to-end tests: a cluster of real `hawser` processes on loopback, commands
//! with deadlines, and guards that undo mounts, loop devices and FUSE mounts even when a test
//! fails. Processes are stopped by the PIDs this fixture started, nothing else.
//!
//! The binary comes from `HAWSER_BIN` (set by `make test`), else `target/release/hawser`.

pub mod cluster;
pub mod compare;
pub mod mounts;
pub mod run;

pub use cluster::{Cluster, ClusterOptions};
pub use compare::assert_same_contents;
pub use mounts::{FuseExport, LoopDevice, Mount, SmallFs};
pub use run::{have, run_ok, sh, wait_until, TempDir};
