//! Storage pools (a directory on a local filesystem) and replicas (a data file plus a metadata
//! record) on one node. Blocking I/O only: callers run it on a thread pool.

pub mod aligned;

pub use aligned::AlignedBuf;
