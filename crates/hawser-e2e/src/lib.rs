//! Fixtures for end-to-end tests: a cluster of real `hawser` processes on loopback, a
//! multi-host cluster in network namespaces for fault tests, a verifying writer (NBD client
//! with a write log and checker, and the check that a snapshot is a cut of its run), commands
//! with deadlines, guards that undo mounts, loop devices and FUSE mounts even when a test
//! fails, whole-cluster invariant checks, commands in a real Linux kernel (a QEMU guest,
//! `guest`), and PostgreSQL 15 on a volume (`postgres`).
//! Processes are stopped by the PIDs this fixture started, nothing else.
//!
//! The binary comes from `HAWSER_BIN` (set by `make test`), else `target/release/hawser`.

pub mod api;
pub mod backups;
pub mod capture;
pub mod cluster;
pub mod compare;
pub mod csi;
pub mod cut;
pub mod fio;
pub mod fs_app;
pub mod garbage;
pub mod grants;
pub mod guest;
pub mod invariants;
pub mod k8s;
pub mod k8s_sidecars;
pub mod mounts;
pub mod nbd_client;
pub mod netns;
pub mod peer_conn;
pub mod postgres;
pub mod probe;
pub mod run;
pub mod s3;
pub mod sanity;
pub mod tokens;
pub mod write_log;
pub mod writer;

pub use cluster::{Cluster, ClusterOptions};
pub use compare::{assert_file_is, assert_same_contents};
pub use csi::{k8s_tool, CsiOptions, CsiProc};
pub use cut::{CutError, CutReport, CutWindow};
pub use invariants::{assert_volumes_whole, volume_problems, wait_volumes_whole};
pub use mounts::{FuseExport, LoopDevice, Mount, SmallFs};
pub use nbd_client::{NbdConn, NbdTarget};
pub use netns::{NetCluster, NetHost};
pub use run::{assert_fsck_clean, have, qemu_io, rss_kib, run_ok, sh, wait_until, within, TempDir};
pub use s3::S3Server;
pub use tokens::TokenFiles;
pub use write_log::{WriteLog, BLOCK_BYTES};
pub use writer::{verify_file, verify_nbd, VerifyReport, Writer, WriterOptions, WriterStats};
