//! The embedded backend: the whole key space in memory, on disk as a snapshot file and a
//! log of the changes since (`file.rs`, `log.rs`).
//!
//! Crash safety: a mutation appends its changes to `FILE.log` and fsyncs it. It is applied
//! in memory, and acknowledged, only once that is durable; it is rolled back if the write
//! fails. So a caller never sees a version that a restart would lose. When the log has
//! grown larger than the snapshot, the mutation also writes a new snapshot (atomically:
//! `FILE.tmp`, fsync, rename) and empties the log. A crash between the two leaves records
//! the snapshot already holds, which the next open skips. Checksums on both files catch a
//! flipped bit as well as truncation.
//!
//! A global revision counter is kept on disk, so versions keep growing across restarts
//! (and a deleted-then-recreated key never reuses a version). An exclusive lock on
//! `FILE.lock` keeps two controllers from writing the same files. Whoever deletes `FILE`
//! to start afresh deletes `FILE.log` too: a log without its snapshot is refused at open.
//!
//! Leases and watches are in-process: a lease lives only as long as the process holding the
//! store, so keys written under a lease are not written to the file (after a restart they
//! are gone, as if expired). Watchers get events through bounded channels, and a watch may
//! start up to [`MAX_WATCH_HISTORY`] events in the past.

mod file;
mod log;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, Mutex, Notify};
use tokio::time::Instant;

use crate::store::{
    Expect, Fence, LeaseId, Result, Store, StoreError, Versioned, Watch, WatchEvent, WriteOptions,
};

use file::{sibling, write_atomic};
use log::{Change, Log};

/// The log is folded into a new snapshot once it is larger than the snapshot and than this.
const FOLD_AT_LEAST: u64 = 1 << 20;

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

/// The files, as the writer sees them.
struct Disk {
    log: Log,
    /// The snapshot's size, and its format (0: no snapshot yet).
    snapshot_len: u64,
    snapshot_format: u32,
}

struct Inner {
    revision: u64,
    disk: Disk,
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

impl EmbeddedStore {
    /// Opens (or creates, if absent) the store file at `path`. The parent directory must exist.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let lock = lock_file(&path)?;
        let (snapshot, replay) = read_files(&path)?;
        let snapshot_len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let (snapshot_format, mut revision, mut entries) =
            (snapshot.format, snapshot.revision, snapshot.entries);
        let logged = replay.records.len();
        for record in replay.records {
            revision = record.revision;
            for change in record.changes {
                match change {
                    Change::Put { key, value } => {
                        let value = Versioned {
                            value,
                            version: revision,
                        };
                        entries.insert(key, Entry { value, lease: None });
                    }
                    Change::Delete { key } => {
                        entries.remove(&key);
                    }
                }
            }
        }
        let log = Log::open(sibling(&path, ".log"), replay.good_len)?;
        tracing::debug!(path = %path.display(), logged, "replayed the store's log");
        tracing::debug!(path = %path.display(), revision, "opened store");
        let inner = Inner {
            revision,
            disk: Disk {
                log,
                snapshot_len,
                snapshot_format,
            },
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
        let (snapshot, replay) = read_files(path)?;
        let mut out: BTreeMap<String, Vec<u8>> = snapshot
            .entries
            .into_iter()
            .map(|(k, e)| (k, e.value.value))
            .collect();
        for change in replay.records.into_iter().flat_map(|r| r.changes) {
            match change {
                Change::Put { key, value } => out.insert(key, value),
                Change::Delete { key } => out.remove(&key),
            };
        }
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }
}

impl Shared {
    /// Makes `changes` (the mutation that took `inner.revision`, already applied in
    /// memory) durable; on failure the caller rolls them back.
    async fn persist(&self, inner: &mut Inner, changes: &[Change]) -> Result<()> {
        // A snapshot of an older format (or none) first: a binary that knows only format 1
        // would open it without the log's changes.
        if inner.disk.snapshot_format != file::FORMAT || !inner.disk.log.usable() {
            return self.fold(inner).await;
        }
        let record = log::encode(inner.revision, changes)?;
        inner.disk.log.append(record).await?;
        if inner.disk.log.len() > inner.disk.snapshot_len.max(FOLD_AT_LEAST) {
            // The change is durable already: a failed fold only leaves the log longer.
            if let Err(e) = self.fold(inner).await {
                tracing::warn!(error = %e, "cannot fold the store's log into a snapshot; \
                    will try again at the next write");
            }
        }
        Ok(())
    }

    /// Writes the whole state as a snapshot, then empties the log.
    async fn fold(&self, inner: &mut Inner) -> Result<()> {
        let bytes = file::encode(inner.revision, &inner.entries)?;
        let len = bytes.len() as u64;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomic(&path, &bytes))
            .await
            .map_err(|e| StoreError::Io {
                op: "join writer task for",
                path: self.path.clone(),
                source: std::io::Error::other(e.to_string()),
            })??;
        inner.disk.snapshot_len = len;
        inner.disk.snapshot_format = file::FORMAT;
        // The snapshot holds every record, so what is left in the log is skipped at open.
        if let Err(e) = inner.disk.log.clear().await {
            tracing::warn!(error = %e, "cannot empty the store's log after a snapshot");
        }
        Ok(())
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
        let mut changes = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    // Leased keys are never on disk: for the log, a put under a lease
                    // takes away whatever the key held there.
                    changes.push(match lease {
                        None => Change::Put {
                            key: key.clone(),
                            value: value.clone(),
                        },
                        Some(_) => Change::Delete { key: key.clone() },
                    });
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
                    changes.push(Change::Delete { key: key.clone() });
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
        if let Err(e) = self.persist(inner, &changes).await {
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

impl EmbeddedStore {
    /// Runs `work` on the store to its end in a task of its own, even when the caller goes
    /// away: an HTTP handler whose client hung up drops its future at whatever await it is
    /// in. A mutation is applied in memory, then its log record written, then the log's new
    /// length kept; cut between the last two, the next write would land at the same offset
    /// and leave a log that no longer opens (a gap in its revisions). Reads run the same
    /// way, since taking the lock ends due leases, which is a mutation too.
    async fn run<T, Fut>(&self, work: impl FnOnce(Arc<Shared>) -> Fut) -> Result<T>
    where
        T: Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        tokio::spawn(work(self.shared.clone()))
            .await
            .map_err(|e| StoreError::Io {
                op: "finish a store call on",
                path: self.shared.path.clone(),
                source: std::io::Error::other(e.to_string()),
            })?
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        let key = key.to_string();
        self.run(move |shared| async move {
            let inner = shared.lock().await?;
            Ok(inner.entries.get(&key).map(|e| e.value.clone()))
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>> {
        Ok(self.list_at(prefix).await?.0)
    }

    async fn list_at(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64)> {
        let prefix = prefix.to_string();
        self.run(move |shared| async move {
            let inner = shared.lock().await?;
            let list = inner
                .entries
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .map(|(k, e)| (k.clone(), e.value.clone()))
                .collect();
            Ok((list, inner.revision))
        })
        .await
    }

    async fn put_with(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Expect,
        opts: &WriteOptions,
    ) -> Result<u64> {
        let (key, fence, lease) = (key.to_string(), opts.fence.clone(), opts.lease);
        self.run(move |shared| async move {
            let mut inner = shared.lock().await?;
            inner.check_fence(&key, fence.as_ref())?;
            inner.check_expect(&key, expect)?;
            if let Some(lease) = lease {
                if !inner.leases.contains_key(&lease) {
                    return Err(StoreError::LeaseExpired { lease });
                }
            }
            let op = Op::Put { key, value, lease };
            shared.mutate(&mut inner, vec![op]).await
        })
        .await
    }

    async fn delete_with(&self, key: &str, expect: Expect, opts: &WriteOptions) -> Result<()> {
        let (key, fence) = (key.to_string(), opts.fence.clone());
        self.run(move |shared| async move {
            let mut inner = shared.lock().await?;
            inner.check_fence(&key, fence.as_ref())?;
            let found = inner.check_expect(&key, expect)?;
            if found.is_some() {
                let op = Op::Delete { key };
                shared.mutate(&mut inner, vec![op]).await?;
            }
            Ok(())
        })
        .await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        let describe = self.describe();
        self.run(move |shared| async move {
            let mut inner = shared.lock().await?;
            if inner.leases.len() >= MAX_LEASES {
                return Err(StoreError::Unavailable {
                    endpoint: describe,
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
                tokio::spawn(Shared::expiry_loop(Arc::downgrade(&shared)));
            }
            shared.expiry.notify_one();
            Ok(id)
        })
        .await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        self.run(move |shared| async move {
            let mut inner = shared.lock().await?;
            let l = inner
                .leases
                .get_mut(&lease)
                .ok_or(StoreError::LeaseExpired { lease })?;
            l.deadline = Instant::now() + l.ttl;
            Ok(())
        })
        .await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.run(move |shared| async move {
            let mut inner = shared.lock().await?;
            shared.end_lease(&mut inner, lease).await
        })
        .await
    }

    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch> {
        let prefix = prefix.to_string();
        self.run(move |shared| async move {
            let mut inner = shared.lock().await?;
            if after < inner.history_start {
                return Err(StoreError::Compacted {
                    prefix,
                    after,
                    oldest: inner.history_start,
                });
            }
            let (tx, rx) = mpsc::channel(MAX_WATCH_BACKLOG);
            for event in &inner.history {
                if event.revision() > after && event.key().starts_with(&prefix) {
                    // Cannot fail: the history is shorter than the channel.
                    let _ = tx.try_send(Ok(event.clone()));
                }
            }
            inner.watchers.push(Watcher { prefix, tx });
            Ok(Watch::new(rx, None))
        })
        .await
    }

    async fn revision(&self) -> Result<u64> {
        self.run(|shared| async move { Ok(shared.lock().await?.revision) })
            .await
    }

    fn describe(&self) -> String {
        self.shared.path.display().to_string()
    }
}

/// The snapshot at `path` (absent: empty) and what its log holds after it.
fn read_files(path: &Path) -> Result<(file::Snapshot, log::Replay)> {
    let snapshot = match fs::read(path) {
        Ok(bytes) => file::decode(path, &bytes)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => file::Snapshot {
            format: 0,
            revision: 0,
            entries: BTreeMap::new(),
        },
        Err(source) => {
            return Err(StoreError::Io {
                op: "read",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let replay = log::read(&sibling(path, ".log"), snapshot.revision)?;
    Ok((snapshot, replay))
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
