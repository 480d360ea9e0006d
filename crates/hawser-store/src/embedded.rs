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
//!
//! Leases and watches are in-process: a lease lives only as long as the process holding the
//! store, so keys written under a lease are not written to the file (after a restart they
//! are gone, as if expired). Watchers get events through bounded channels, and a watch may
//! start up to [`MAX_WATCH_HISTORY`] events in the past.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Mutex, Notify};
use tokio::time::Instant;

use crate::store::{
    Expect, Fence, LeaseId, Result, Store, StoreError, Versioned, Watch, WatchEvent, WriteOptions,
};

const MAGIC: &str = "hawser-store";
const FORMAT: u32 = 1;

/// Events kept in memory so a watch can start at a recent revision.
pub const MAX_WATCH_HISTORY: usize = 1024;
/// Events a watcher may fall behind by; a watcher further behind is dropped (its stream
/// ends) rather than letting memory grow.
pub const MAX_WATCH_BACKLOG: usize = 4096;
/// Live leases at once.
pub const MAX_LEASES: usize = 4096;

/// The embedded, single-file store.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    /// Held for the store's lifetime: the OS releases the lock when the file is closed.
    _lock: File,
}

struct Shared {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// Wakes the lease expiry task when a lease is granted or renewed.
    expiry: Arc<Notify>,
}

struct Entry {
    value: Versioned,
    lease: Option<LeaseId>,
}

struct Lease {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

struct Watcher {
    prefix: String,
    tx: mpsc::Sender<Result<WatchEvent>>,
}

struct Inner {
    revision: u64,
    entries: BTreeMap<String, Entry>,
    leases: HashMap<LeaseId, Lease>,
    next_lease: LeaseId,
    expiry_task: bool,
    history: VecDeque<WatchEvent>,
    /// A watch may start after any revision >= this one.
    history_start: u64,
    watchers: Vec<Watcher>,
}

/// One change of a mutation.
enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: String,
    },
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
        let (revision, entries) = match fs::read(&path) {
            Ok(bytes) => decode(&path, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0, BTreeMap::new()),
            Err(source) => {
                return Err(StoreError::Io {
                    op: "read",
                    path,
                    source,
                })
            }
        };
        tracing::debug!(path = %path.display(), revision, "opened store");
        let inner = Inner {
            revision,
            entries,
            leases: HashMap::new(),
            next_lease: 1,
            expiry_task: false,
            history: VecDeque::new(),
            history_start: revision,
            watchers: Vec::new(),
        };
        Ok(EmbeddedStore {
            shared: Arc::new(Shared {
                path,
                inner: Mutex::new(inner),
                expiry: Arc::new(Notify::new()),
            }),
            _lock: lock,
        })
    }

    /// The keys and values of the store file at `path` as last written, read without taking
    /// its lock (a controller may hold it): for inspection and tests, never for writing.
    pub fn read_file(path: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
        let bytes = fs::read(path).map_err(|source| StoreError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        })?;
        let (_, entries) = decode(path, &bytes)?;
        Ok(entries
            .into_iter()
            .map(|(k, e)| (k, e.value.value))
            .collect())
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }
}

impl Shared {
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

    /// Applies `ops` at the next revision, durably, and tells the watchers. Rolls back the
    /// in-memory change if the write fails.
    async fn mutate(&self, inner: &mut Inner, ops: Vec<Op>) -> Result<u64> {
        let old_revision = inner.revision;
        let revision = old_revision.checked_add(1).ok_or_else(|| StoreError::Io {
            op: "take the next revision of",
            path: self.path.clone(),
            source: std::io::Error::other("revision counter exhausted"),
        })?;
        let mut undo: Vec<(String, Option<Entry>)> = Vec::with_capacity(ops.len());
        let mut events = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    let value = Versioned {
                        value,
                        version: revision,
                    };
                    events.push(WatchEvent::Put {
                        key: key.clone(),
                        value: value.clone(),
                    });
                    let old = inner.entries.insert(key.clone(), Entry { value, lease });
                    undo.push((key, old));
                }
                Op::Delete { key } => {
                    let old = inner.entries.remove(&key);
                    if old.is_some() {
                        events.push(WatchEvent::Delete {
                            key: key.clone(),
                            revision,
                        });
                    }
                    undo.push((key, old));
                }
            }
        }
        inner.revision = revision;
        if let Err(e) = self.persist(inner).await {
            inner.revision = old_revision;
            for (key, old) in undo.into_iter().rev() {
                match old {
                    Some(old) => inner.entries.insert(key, old),
                    None => inner.entries.remove(&key),
                };
            }
            return Err(e);
        }
        for (key, _) in &undo {
            inner.relink_lease(key);
        }
        for event in events {
            inner.publish(event);
        }
        Ok(revision)
    }

    /// Deletes the keys of every lease past its deadline, one revision per lease.
    async fn expire_due(&self, inner: &mut Inner) -> Result<()> {
        let now = Instant::now();
        let due: Vec<LeaseId> = inner
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.end_lease(inner, id).await?;
        }
        Ok(())
    }

    /// Removes lease `id` and deletes its keys (one revision), if it exists.
    async fn end_lease(&self, inner: &mut Inner, id: LeaseId) -> Result<()> {
        let Some(lease) = inner.leases.remove(&id) else {
            return Ok(());
        };
        tracing::debug!(lease = id, keys = lease.keys.len(), "lease ended");
        if lease.keys.is_empty() {
            return Ok(());
        }
        let ops = lease
            .keys
            .iter()
            .map(|k| Op::Delete { key: k.clone() })
            .collect();
        if let Err(e) = self.mutate(inner, ops).await {
            // Keep the lease so a later pass deletes its keys.
            inner.leases.insert(id, lease);
            return Err(e);
        }
        Ok(())
    }

    /// Runs while the store exists: ends leases at their deadlines, so their keys disappear
    /// (and watchers hear of it) without waiting for the next call.
    async fn expiry_loop(me: Weak<Shared>) {
        loop {
            let Some(shared) = me.upgrade() else { return };
            let next = {
                let mut inner = shared.inner.lock().await;
                if let Err(e) = shared.expire_due(&mut inner).await {
                    tracing::warn!(error = %e, "cannot expire leases; retrying");
                }
                inner.leases.values().map(|l| l.deadline).min()
            };
            let notify = shared.expiry.clone();
            drop(shared);
            let wake = notify.notified();
            let deadline = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            tokio::select! {
                _ = wake => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// The lock, with due leases already expired: every call sees the state as of now.
    async fn lock(&self) -> Result<tokio::sync::MutexGuard<'_, Inner>> {
        let mut inner = self.inner.lock().await;
        self.expire_due(&mut inner).await?;
        Ok(inner)
    }
}

impl Inner {
    /// Records `key`'s current lease (if any) in that lease's key set, and forgets it in the
    /// others.
    fn relink_lease(&mut self, key: &str) {
        let lease = self.entries.get(key).and_then(|e| e.lease);
        for (id, l) in self.leases.iter_mut() {
            if Some(*id) == lease {
                l.keys.insert(key.to_string());
            } else {
                l.keys.remove(key);
            }
        }
    }

    fn publish(&mut self, event: WatchEvent) {
        self.watchers.retain(|w| {
            if !event.key().starts_with(&w.prefix) {
                return !w.tx.is_closed();
            }
            match w.tx.try_send(Ok(event.clone())) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(prefix = %w.prefix, "watcher fell behind; dropping it");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
        self.history.push_back(event);
        while self.history.len() > MAX_WATCH_HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.history_start = self.history_start.max(old.revision());
            }
        }
    }

    fn check_fence(&self, key: &str, fence: Option<&Fence>) -> Result<()> {
        let Some(f) = fence else { return Ok(()) };
        let found = self.entries.get(&f.key).map(|e| e.value.version);
        if found != Some(f.version) {
            return Err(StoreError::Fenced {
                key: key.into(),
                fence_key: f.key.clone(),
                expected: f.version,
                found,
            });
        }
        Ok(())
    }

    /// The compare-and-swap precondition of every mutation, in one place: `expect` must
    /// match the key's current version (or absence). Returns that version.
    fn check_expect(&self, key: &str, expect: Expect) -> Result<Option<u64>> {
        let found = self.entries.get(key).map(|e| e.value.version);
        if !expect.matches(found) {
            return Err(StoreError::Conflict {
                key: key.into(),
                expected: expect,
                found,
            });
        }
        Ok(found)
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        let inner = self.shared.lock().await?;
        Ok(inner.entries.get(key).map(|e| e.value.clone()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>> {
        Ok(self.list_at(prefix).await?.0)
    }

    async fn list_at(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64)> {
        let inner = self.shared.lock().await?;
        let list = inner
            .entries
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (k.clone(), e.value.clone()))
            .collect();
        Ok((list, inner.revision))
    }

    async fn put_with(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Expect,
        opts: &WriteOptions,
    ) -> Result<u64> {
        let mut inner = self.shared.lock().await?;
        inner.check_fence(key, opts.fence.as_ref())?;
        inner.check_expect(key, expect)?;
        if let Some(lease) = opts.lease {
            if !inner.leases.contains_key(&lease) {
                return Err(StoreError::LeaseExpired { lease });
            }
        }
        let op = Op::Put {
            key: key.into(),
            value,
            lease: opts.lease,
        };
        self.shared.mutate(&mut inner, vec![op]).await
    }

    async fn delete_with(&self, key: &str, expect: Expect, opts: &WriteOptions) -> Result<()> {
        let mut inner = self.shared.lock().await?;
        inner.check_fence(key, opts.fence.as_ref())?;
        let found = inner.check_expect(key, expect)?;
        if found.is_some() {
            let op = Op::Delete { key: key.into() };
            self.shared.mutate(&mut inner, vec![op]).await?;
        }
        Ok(())
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        let mut inner = self.shared.lock().await?;
        if inner.leases.len() >= MAX_LEASES {
            return Err(StoreError::Unavailable {
                endpoint: self.describe(),
                op: "grant lease",
                key: String::new(),
                reason: format!("{MAX_LEASES} leases are live already"),
            });
        }
        let ttl = ttl_secs(ttl);
        let id = inner.next_lease;
        inner.next_lease += 1;
        inner.leases.insert(
            id,
            Lease {
                ttl,
                deadline: Instant::now() + ttl,
                keys: BTreeSet::new(),
            },
        );
        if !inner.expiry_task {
            inner.expiry_task = true;
            tokio::spawn(Shared::expiry_loop(Arc::downgrade(&self.shared)));
        }
        self.shared.expiry.notify_one();
        Ok(id)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        let mut inner = self.shared.lock().await?;
        let l = inner
            .leases
            .get_mut(&lease)
            .ok_or(StoreError::LeaseExpired { lease })?;
        l.deadline = Instant::now() + l.ttl;
        Ok(())
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let mut inner = self.shared.lock().await?;
        self.shared.end_lease(&mut inner, lease).await
    }

    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch> {
        let mut inner = self.shared.lock().await?;
        if after < inner.history_start {
            return Err(StoreError::Compacted {
                prefix: prefix.into(),
                after,
                oldest: inner.history_start,
            });
        }
        let (tx, rx) = mpsc::channel(MAX_WATCH_BACKLOG);
        for event in &inner.history {
            if event.revision() > after && event.key().starts_with(prefix) {
                // Cannot fail: the history is shorter than the channel.
                let _ = tx.try_send(Ok(event.clone()));
            }
        }
        inner.watchers.push(Watcher {
            prefix: prefix.into(),
            tx,
        });
        Ok(Watch::new(rx, None))
    }

    async fn revision(&self) -> Result<u64> {
        Ok(self.shared.lock().await?.revision)
    }

    fn describe(&self) -> String {
        self.shared.path.display().to_string()
    }
}

/// A TTL in whole seconds, at least one, as etcd counts it.
fn ttl_secs(ttl: Duration) -> Duration {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
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
        .filter(|(_, e)| e.lease.is_none())
        .map(|(k, e)| {
            let v = &e.value;
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

fn decode(path: &Path, bytes: &[u8]) -> Result<(u64, BTreeMap<String, Entry>)> {
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
        let value = Versioned {
            value,
            version: e.version,
        };
        entries.insert(key, Entry { value, lease: None });
    }
    // Every write takes the next revision; a file at the top of the range could take none
    // (found by the store_record fuzz target: the next write overflowed).
    if state.revision >= u64::MAX / 2 {
        return Err(corrupt(format!(
            "store revision {} is beyond any this store could reach",
            state.revision
        )));
    }
    Ok((state.revision, entries))
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
