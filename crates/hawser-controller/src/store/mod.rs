//! The cluster state in the store: the records and their shapes (`records`, `model`), the
//! per-volume locks that serialise operations in the leader (`locks`), retries of store
//! calls that failed for a moment (`retry`), leader election and the fenced store only the
//! leader may write through (`leader`), the etcd client's credentials (`etcd_access`), and
//! the watch-fed copy of the volume records the controller's loops read (`volume_cache`).
//! Nothing here talks to agents or decides anything; the rest of the controller reads and
//! writes the cluster state only through `Records` and the fenced store.

pub(crate) mod etcd_access;
pub(crate) mod leader;
pub(crate) mod locks;
pub(crate) mod model;
pub(crate) mod records;
pub(crate) mod retry;
pub(crate) mod volume_cache;
