//! The embedded backend: the whole key space in memory, rewritten to one file on every
//! mutation.
//!
//! Crash safety: each mutation writes `FILE.tmp`, fsyncs it, renames it over `FILE` and fsyncs
//! the directory, so after a crash `FILE` is either the old or the new state, never a mix.
//! A mutation is applied in memory only once it is durable (it is rolled back if the write
//! fails), so a caller never sees a version that a restart would lose.
//!
//! File format: one header line `hawser-store 1 <crc32c of body, 8 hex> <body length>\n`
//! followed by a JSON body. JSON parsing alone would catch truncation but not a flipped bit
//! inside a value, which would silently change cluster state; the checksum and length catch
//! both, and the header's format number lets a later version change the body.
//!
//! A global revision counter is stored in the file, so versions keep growing across restarts
//! (and a deleted-then-recreated key never reuses a version). An exclusive lock on
//! `FILE.lock` keeps two controllers from writing the same file.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::store::{Expect, Result, Store, StoreError, Versioned};

const MAGIC: &str = "hawser-store";
const FORMAT: u32 = 1;

/// The embedded, single-file store.
pub struct EmbeddedStore {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// Held for the store's lifetime: the OS releases the lock when the file is closed.
    _lock: File,
}

struct Inner {
    revision: u64,
    entries: BTreeMap<String, Versioned>,
}

/// One entry on disk. Values that are UTF-8 (JSON, in practice) are stored as text so the
/// file stays readable by an operator; anything else is hex.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskEntry {
    version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskState {
    revision: u64,
    entries: BTreeMap<String, DiskEntry>,
}

impl EmbeddedStore {
    /// Opens (or creates, if absent) the store file at `path`. The parent directory must exist.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let lock = lock_file(&path)?;
        let inner = match fs::read(&path) {
            Ok(bytes) => decode(&path, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Inner {
                revision: 0,
                entries: BTreeMap::new(),
            },
            Err(source) => {
                return Err(StoreError::Io {
                    op: "read",
                    path,
                    source,
                })
            }
        };
        tracing::debug!(path = %path.display(), revision = inner.revision, "opened store");
        Ok(EmbeddedStore {
            path,
            inner: Mutex::new(inner),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the state durably; on failure the caller rolls its change back.
    async fn persist(&self, inner: &Inner) -> Result<()> {
        let bytes = encode(inner)?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomic(&path, &bytes))
            .await
            .map_err(|e| StoreError::Io {
                op: "join writer task for",
                path: self.path.clone(),
                source: std::io::Error::other(e.to_string()),
            })?
    }

    /// Sets `key` to `value` (None = delete) at the next revision, durably. Rolls back the
    /// in-memory change if the write fails.
    async fn mutate(&self, inner: &mut Inner, key: &str, value: Option<Vec<u8>>) -> Result<u64> {
        let old_revision = inner.revision;
        let revision = old_revision + 1;
        let old = match value {
            Some(value) => inner.entries.insert(
                key.into(),
                Versioned {
                    value,
                    version: revision,
                },
            ),
            None => inner.entries.remove(key),
        };
        inner.revision = revision;
        if let Err(e) = self.persist(inner).await {
            inner.revision = old_revision;
            match old {
                Some(old) => inner.entries.insert(key.into(), old),
                None => inner.entries.remove(key),
            };
            return Err(e);
        }
        Ok(revision)
    }
}

/// The compare-and-swap precondition of every mutation, in one place: `expect` must match
/// the key's current version (or absence). Returns that version.
fn check_expect(inner: &Inner, key: &str, expect: Expect) -> Result<Option<u64>> {
    let found = inner.entries.get(key).map(|v| v.version);
    if !expect.matches(found) {
        return Err(StoreError::Conflict {
            key: key.into(),
            expected: expect,
            found,
        });
    }
    Ok(found)
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        Ok(self.inner.lock().await.entries.get(key).cloned())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>> {
        let inner = self.inner.lock().await;
        Ok(inner
            .entries
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn put(&self, key: &str, value: Vec<u8>, expect: Expect) -> Result<u64> {
        let mut inner = self.inner.lock().await;
        check_expect(&inner, key, expect)?;
        self.mutate(&mut inner, key, Some(value)).await
    }

    async fn delete(&self, key: &str, expect: Expect) -> Result<()> {
        let mut inner = self.inner.lock().await;
        let found = check_expect(&inner, key, expect)?;
        if found.is_some() {
            self.mutate(&mut inner, key, None).await?;
        }
        Ok(())
    }
}

fn lock_file(path: &Path) -> Result<File> {
    let lock = sibling(path, ".lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .map_err(|source| StoreError::Io {
            op: "open lock file",
            path: lock.clone(),
            source,
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(StoreError::Locked {
            path: path.to_path_buf(),
            lock,
        }),
        Err(fs::TryLockError::Error(source)) => Err(StoreError::Io {
            op: "lock",
            path: lock,
            source,
        }),
    }
}

/// `path` with `suffix` appended to its file name (`store.json` -> `store.json.tmp`).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = sibling(path, ".tmp");
    let io = |op: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| StoreError::Io {
            op,
            path: p,
            source,
        }
    };
    let mut f = File::create(&tmp).map_err(io("create", &tmp))?;
    f.write_all(bytes).map_err(io("write", &tmp))?;
    f.sync_all().map_err(io("fsync", &tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(io("rename over", path))?;
    // The rename is durable only once the directory entry is.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))?;
    Ok(())
}

fn encode(inner: &Inner) -> Result<Vec<u8>> {
    let entries = inner
        .entries
        .iter()
        .map(|(k, v)| {
            let e = match std::str::from_utf8(&v.value) {
                Ok(s) => DiskEntry {
                    version: v.version,
                    text: Some(s.into()),
                    hex: None,
                },
                Err(_) => DiskEntry {
                    version: v.version,
                    text: None,
                    hex: Some(to_hex(&v.value)),
                },
            };
            (k.clone(), e)
        })
        .collect();
    let state = DiskState {
        revision: inner.revision,
        entries,
    };
    let body = serde_json::to_vec_pretty(&state).map_err(|source| StoreError::Encode {
        key: "<store>".into(),
        source,
    })?;
    let mut out = format!(
        "{MAGIC} {FORMAT} {:08x} {}\n",
        crc32c::crc32c(&body),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Ok(out)
}

fn decode(path: &Path, bytes: &[u8]) -> Result<Inner> {
    let corrupt = |reason: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| corrupt("no header".into()))?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| corrupt("bad header".into()))?;
    let body = &bytes[nl + 1..];
    let fields: Vec<&str> = header.split(' ').collect();
    let [magic, format, crc, len] = fields[..] else {
        return Err(corrupt(format!("bad header {header:?}")));
    };
    if magic != MAGIC {
        return Err(corrupt(format!("not a hawser store (header {header:?})")));
    }
    if format != FORMAT.to_string() {
        return Err(corrupt(format!(
            "unsupported format {format:?}, expected {FORMAT}"
        )));
    }
    let len: usize = len
        .parse()
        .map_err(|_| corrupt(format!("bad length {len:?}")))?;
    if body.len() != len {
        return Err(corrupt(format!(
            "body is {} bytes, header says {len} (truncated?)",
            body.len()
        )));
    }
    let crc = u32::from_str_radix(crc, 16).map_err(|_| corrupt(format!("bad checksum {crc:?}")))?;
    let actual = crc32c::crc32c(body);
    if actual != crc {
        return Err(corrupt(format!(
            "checksum {actual:08x} does not match header {crc:08x}"
        )));
    }
    let state: DiskState =
        serde_json::from_slice(body).map_err(|e| corrupt(format!("bad JSON body: {e}")))?;
    let mut entries = BTreeMap::new();
    for (key, e) in state.entries {
        let value = match (e.text, e.hex) {
            (Some(t), None) => t.into_bytes(),
            (None, Some(h)) => {
                from_hex(&h).ok_or_else(|| corrupt(format!("bad hex in {key:?}")))?
            }
            _ => {
                return Err(corrupt(format!(
                    "entry {key:?} needs exactly one of text, hex"
                )))
            }
        };
        if e.version == 0 || e.version > state.revision {
            return Err(corrupt(format!(
                "entry {key:?} has version {} but the store revision is {}",
                e.version, state.revision
            )));
        }
        entries.insert(
            key,
            Versioned {
                value,
                version: e.version,
            },
        );
    }
    Ok(Inner {
        revision: state.revision,
        entries,
    })
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
