//! Snapshots: taking one on every in-sync replica at one cut of the write stream
//! (`create`), and bringing a replica that missed a snapshot up to it (`catchup`). The
//! routes are in `api::snapshots`; restoring a volume from one is `volumes::restore`.

pub(crate) mod catchup;
pub(crate) mod create;
