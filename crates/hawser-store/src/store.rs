//! The `Store` trait: a versioned key/value space with compare-and-swap, and its errors.
//!
//! The shape follows etcd v3 so an etcd backend can implement it directly: a version is the
//! revision of the last modification of a key (etcd's `mod_revision`), revisions are global
//! and only grow, and every write can be conditioned on the version the caller read.

use std::path::PathBuf;

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
}

impl StoreError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A versioned key/value store. Object safe: use it as `Arc<dyn Store>`.
#[async_trait]
pub trait Store: Send + Sync {
    async fn get(&self, key: &str) -> Result<Option<Versioned>>;
    /// Every key starting with `prefix`, sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>>;
    /// Writes `value` if `expect` holds and returns the new version.
    async fn put(&self, key: &str, value: Vec<u8>, expect: Expect) -> Result<u64>;
    /// Deletes `key` if `expect` holds. Deleting an absent key under `Any` or `Absent` is a
    /// no-op, like etcd's delete of a missing key.
    async fn delete(&self, key: &str, expect: Expect) -> Result<()>;
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
