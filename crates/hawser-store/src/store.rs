//! The `Store` trait: a versioned key/value space with compare-and-swap, and its errors.
//!
//! The shape follows etcd v3 so the etcd backend implements it directly: a version is the
//! revision of the last modification of a key (etcd's `mod_revision`), revisions are global
//! and only grow, and every write can be conditioned on the version the caller read.
//!
//! Leases and fences are what leader election needs: a key written under a lease disappears
//! when its holder stops renewing it, and a write under a [`Fence`] happens only if the fence
//! key still has the version the writer saw when it became leader, checked atomically with
//! the write itself (a check before the write would race with losing the lease).

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};

/// A stored value and the revision at which it was last written (never 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: Vec<u8>,
    pub version: u64,
}

/// The condition a write is made under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Unconditional.
    Any,
    /// The key must not exist (create).
    Absent,
    /// The key must exist with exactly this version (compare-and-swap).
    Version(u64),
}

impl Expect {
    /// Whether a key whose current version is `found` (None = absent) satisfies this condition.
    pub fn matches(self, found: Option<u64>) -> bool {
        match self {
            Expect::Any => true,
            Expect::Absent => found.is_none(),
            Expect::Version(v) => found == Some(v),
        }
    }
}

/// A lease: keys written under it are deleted when it expires or is revoked.
pub type LeaseId = i64;

/// A write's precondition on another key: `key` must exist with exactly `version`. A leader
/// passes its leader key and the version it created it at; once it lost the lease (the key
/// expired) or another leader took over (a new version), its writes fail with
/// [`StoreError::Fenced`] and change nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub version: u64,
}

/// Options of a write besides its [`Expect`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Attach the key to this lease (puts only).
    pub lease: Option<LeaseId>,
    /// Write only while this fence holds.
    pub fence: Option<Fence>,
}

/// A change seen by a [`Watch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// `key` was written; `value.version` is the revision of the write.
    Put { key: String, value: Versioned },
    /// `key` was deleted (or its lease expired) at `revision`.
    Delete { key: String, revision: u64 },
}

impl WatchEvent {
    pub fn key(&self) -> &str {
        match self {
            WatchEvent::Put { key, .. } | WatchEvent::Delete { key, .. } => key,
        }
    }

    pub fn revision(&self) -> u64 {
        match self {
            WatchEvent::Put { value, .. } => value.version,
            WatchEvent::Delete { revision, .. } => *revision,
        }
    }
}

/// A stream of the changes under a prefix, in revision order. Ends (`None`) or yields an
/// error when the backend drops it; the caller re-reads and watches again from the last
/// revision it saw.
pub struct Watch {
    rx: tokio::sync::mpsc::Receiver<Result<WatchEvent>>,
    /// Stops the task feeding `rx` when the watch is dropped.
    task: Option<tokio::task::AbortHandle>,
}

impl Watch {
    /// A watch fed through `rx` by a backend (this crate's, or hawser-kube's); `task`, the
    /// feeding task, is aborted when the watch is dropped.
    pub fn new(
        rx: tokio::sync::mpsc::Receiver<Result<WatchEvent>>,
        task: Option<tokio::task::AbortHandle>,
    ) -> Watch {
        Watch { rx, task }
    }

    /// The next change, or `None` once the watch has ended.
    pub async fn next(&mut self) -> Option<Result<WatchEvent>> {
        self.rx.recv().await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{key:?} changed: expected {expected:?}, found version {found:?}")]
    Conflict {
        key: String,
        expected: Expect,
        found: Option<u64>,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store file {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("store file {path} is in use by another process (lock {lock})")]
    Locked { path: PathBuf, lock: PathBuf },
    #[error("value of {key:?} is not valid JSON for its type: {source}")]
    Decode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("encode value of {key:?}: {source}")]
    Encode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// The backend could not be reached or failed the request. Whether a write that got
    /// this error took effect is unknown; re-read before retrying a conditional write.
    #[error("cluster store {endpoint} failed {op} {key:?}: {reason}")]
    Unavailable {
        endpoint: String,
        op: &'static str,
        key: String,
        reason: String,
    },
    /// The write's fence no longer holds: the writer is not (or no longer) the leader.
    #[error(
        "write to {key:?} refused: fence {fence_key:?} expected version {expected}, \
         found {found:?} (leadership lost)"
    )]
    Fenced {
        key: String,
        fence_key: String,
        expected: u64,
        found: Option<u64>,
    },
    #[error("lease {lease} has expired or does not exist")]
    LeaseExpired { lease: LeaseId },
    /// A watch asked for revisions the backend no longer has.
    #[error("cannot watch {prefix:?} after revision {after}: history starts at {oldest}")]
    Compacted {
        prefix: String,
        after: u64,
        oldest: u64,
    },
}

impl StoreError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }

    /// The backend was unreachable or failed: retrying later may succeed.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A versioned key/value store. Object safe: use it as `Arc<dyn Store>`.
#[async_trait]
pub trait Store: Send + Sync {
    async fn get(&self, key: &str) -> Result<Option<Versioned>>;
    /// Every key starting with `prefix`, sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>>;
    /// [`Store::list`], and a revision to watch from after it: a watch from that revision
    /// misses no change made after the list, and may repeat some the list already shows.
    /// The backends answer the list's own revision, so that nothing repeats; this default
    /// (for wrappers that do not pass it on) reads the revision first.
    async fn list_at(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64)> {
        let revision = self.revision().await?;
        Ok((self.list(prefix).await?, revision))
    }
    /// Writes `value` if `expect` (and the fence, if any) holds and returns the new version.
    async fn put_with(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Expect,
        opts: &WriteOptions,
    ) -> Result<u64>;
    /// Deletes `key` if `expect` (and the fence, if any) holds. Deleting an absent key under
    /// `Any` or `Absent` is a no-op, like etcd's delete of a missing key. `opts.lease` is
    /// ignored.
    async fn delete_with(&self, key: &str, expect: Expect, opts: &WriteOptions) -> Result<()>;

    /// Writes `value` if `expect` holds and returns the new version.
    async fn put(&self, key: &str, value: Vec<u8>, expect: Expect) -> Result<u64> {
        self.put_with(key, value, expect, &WriteOptions::default())
            .await
    }

    /// Deletes `key` if `expect` holds (see [`Store::delete_with`]).
    async fn delete(&self, key: &str, expect: Expect) -> Result<()> {
        self.delete_with(key, expect, &WriteOptions::default())
            .await
    }

    /// Grants a lease that expires `ttl` after its last renewal (rounded up to seconds).
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId>;
    /// Renews `lease` for its full TTL; `LeaseExpired` if it is gone.
    async fn keep_alive(&self, lease: LeaseId) -> Result<()>;
    /// Ends `lease` now, deleting its keys. Revoking an expired lease is a no-op.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()>;
    /// The changes to keys starting with `prefix` at revisions greater than `after`.
    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch>;
    /// The store's current revision (of its last change).
    async fn revision(&self) -> Result<u64>;
    /// Where the store lives, for logs (a file path or etcd endpoints and prefix).
    fn describe(&self) -> String;
}

/// Reads `key` as JSON of type `T`, with its version.
pub async fn get_json<T: DeserializeOwned>(
    store: &dyn Store,
    key: &str,
) -> Result<Option<(T, u64)>> {
    match store.get(key).await? {
        None => Ok(None),
        Some(v) => {
            let value = serde_json::from_slice(&v.value).map_err(|source| StoreError::Decode {
                key: key.into(),
                source,
            })?;
            Ok(Some((value, v.version)))
        }
    }
}

/// Lists the keys under `prefix` as JSON of type `T`, with their versions.
pub async fn list_json<T: DeserializeOwned>(
    store: &dyn Store,
    prefix: &str,
) -> Result<Vec<(String, T, u64)>> {
    let mut out = Vec::new();
    for (key, v) in store.list(prefix).await? {
        let value = serde_json::from_slice(&v.value).map_err(|source| StoreError::Decode {
            key: key.clone(),
            source,
        })?;
        out.push((key, value, v.version));
    }
    Ok(out)
}

/// Writes `value` as JSON under `expect`; returns the new version.
pub async fn put_json<T: Serialize + ?Sized>(
    store: &dyn Store,
    key: &str,
    value: &T,
    expect: Expect,
) -> Result<u64> {
    let bytes = serde_json::to_vec(value).map_err(|source| StoreError::Encode {
        key: key.into(),
        source,
    })?;
    store.put(key, bytes, expect).await
}
