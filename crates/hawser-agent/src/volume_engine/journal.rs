//! The driver's side of the journal (format: `hawser_wire::journal`; rules: `hawser_core::activity`):
//! admitting modifying requests into the activity log, committing the journal to every replica
//! requests go to, bringing a returning replica into that set, and saving a resync's progress
//! (a resyncing replica's persisted dirty map shrinks only there, after a flush of it).
//!
//! One lock (`journal`, async) orders commits and joins: a replica joins the set of replicas
//! requests go to only while holding it, after it received the last committed journal, so no
//! commit can miss a replica that gets requests under it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use hawser_core::{ChunkMap, Engine, IoError, Membership, ReplicaIdx, ResyncPoint};
use hawser_wire::journal::{Journal, JournalError, OutReplica, ACTIVITY_EXTENT_BYTES};

use super::{Handle, VolumeEngine};
use crate::constants::{ACTIVITY_IDLE_TICKS, RESYNC_SAVE_INTERVAL};
use crate::replica_access::Access;
use hawser_core::activity::to_runs;
use hawser_core::recovery_plan::{add_out, out_entry, returning_lacks};

/// The journal as last committed, and what is needed for the next one.
#[derive(Default)]
pub(crate) struct JournalState {
    /// Sequence number of the last commit.
    pub seq: u64,
    /// Commits of this engine's life start here; a replica whose journal is older than that
    /// holds a previous engine's log.
    pub first_seq: u64,
    /// Persisted dirty maps of replicas not in sync (`None`: unknown). A map grows with the
    /// engine's (every commit adds what the engine marks) and shrinks only by a resync save
    /// (`save_resync`): a resync copy is durable only once a flush sent after it was
    /// acknowledged succeeded, so the map may forget a chunk only after such a flush.
    pub out: HashMap<usize, Option<ChunkMap>>,
    /// The last committed journal, for replicas that join.
    pub last: Option<Bytes>,
}

/// The last save of what a resyncing replica lacks (`save_resync`): when, and the bytes
/// copied to it by then.
#[derive(Clone, Copy)]
pub(super) struct ResyncSave {
    at: Instant,
    copied: u64,
    running: bool,
}

/// A map to commit instead of replica `replica`'s persisted one: a resync point whose
/// replica has been flushed since it was taken, on the driver's session `gen`.
struct Shrink {
    replica: usize,
    point: ResyncPoint,
    gen: u64,
}

impl VolumeEngine {
    pub(super) fn idx(i: usize) -> ReplicaIdx {
        ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS"))
    }

    /// Direct access to replica `i` while it is connected.
    pub(super) fn access(&self, i: usize) -> Option<Access> {
        match &self.handles[i] {
            Handle::Local(r) => Some(Access::Local(r.clone())),
            Handle::Remote { .. } => self.client(Self::idx(i)).map(|client| Access::Remote {
                id: self.replica_ids[i].clone(),
                client,
            }),
        }
    }

    /// Wait until every extent of `[offset, offset+len)` is in the committed activity log,
    /// then count the request as in flight there.
    pub(super) async fn admit(&self, offset: u64, len: u64) -> Result<(), IoError> {
        loop {
            let mut commits = self.commits.subscribe();
            if self.lock_activity().try_begin(offset, len) {
                return Ok(());
            }
            self.kick_commit(ACTIVITY_IDLE_TICKS);
            if commits.changed().await.is_err()
                || self.stopped.load(Ordering::Acquire)
                || self.is_fenced()
            {
                return Err(IoError::ShutDown);
            }
        }
    }

    /// Start a commit unless one is running (which picks up whatever is wanted by then).
    pub(super) fn kick_commit(&self, min_idle: u64) {
        if self.committing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        self.rt.spawn(async move {
            loop {
                me.commit(min_idle).await;
                me.committing.store(false, Ordering::Release);
                let more = me.lock_activity().wants_commit(u64::MAX);
                if !more || me.committing.swap(true, Ordering::AcqRel) {
                    break;
                }
            }
        });
    }

    /// Write the next journal to every replica requests go to. A replica that fails it is
    /// disconnected (it leaves like any failed replica); the log is then committed for the
    /// others.
    pub(crate) async fn commit(&self, min_idle: u64) {
        let js = self.journal.lock().await;
        self.commit_locked(js, min_idle, None).await;
    }

    /// `commit` under the journal lock, with `shrink` (if any) replacing that replica's
    /// persisted map when it still holds; returns whether it did.
    async fn commit_locked(
        &self,
        mut js: tokio::sync::MutexGuard<'_, JournalState>,
        min_idle: u64,
        shrink: Option<Shrink>,
    ) -> bool {
        let mut shrunk = false;
        let log = {
            let mut al = self.lock_activity();
            let log = al.next(min_idle);
            al.commit_started(&log);
            log
        };
        let sig = self.out_signature();
        let (targets, journal) = {
            let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let e = &inner.engine;
            let mut targets = Vec::new();
            for i in 0..self.handles.len() {
                let idx = Self::idx(i);
                let v = e.replica_view(idx);
                let s = shrink.as_ref().filter(|s| s.replica == i);
                shrunk |= self.note_out(&mut js.out, e, i, s);
                let writes_go_there = matches!(
                    v.membership,
                    Membership::InSync | Membership::Syncing | Membership::Marking
                );
                if writes_go_there && v.connected {
                    targets.push(i);
                }
            }
            let mut out: Vec<OutReplica> = js
                .out
                .iter()
                .map(|(&i, m)| OutReplica {
                    replica: self.replica_ids[i].clone(),
                    dirty: m.as_ref().map(ChunkMap::runs),
                })
                .collect();
            out.sort_by(|a, b| a.replica.cmp(&b.replica));
            let journal = Journal {
                epoch: self.epoch,
                seq: js.seq + 1,
                size: self.size,
                extent_bytes: ACTIVITY_EXTENT_BYTES,
                chunk_bytes: self.chunk_bytes,
                active: to_runs(log.iter().copied()),
                out,
            };
            (targets, journal)
        };
        let encoded = match encode_bounded(journal) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                // Unreachable with the fallbacks in encode_bounded; fail safe: do not commit.
                tracing::error!(volume = %self.volume, error = %e, "journal does not encode");
                self.commits.send_modify(|c| *c += 1);
                return false;
            }
        };
        let mut tasks = tokio::task::JoinSet::new();
        for i in targets {
            if let Some(a) = self.access(i) {
                let (epoch, bytes) = (self.epoch, encoded.clone());
                tasks.spawn(async move { (i, a.put_journal(epoch, bytes).await) });
            }
        }
        while let Some(done) = tasks.join_next().await {
            let Ok((i, result)) = done else { continue };
            match result {
                Ok(()) => {}
                Err(e) if e.is_stale_epoch() => self.run(|en, out| en.on_fenced(out)),
                Err(e) => {
                    tracing::warn!(volume = %self.volume, error = %e, "journal commit failed; dropping the replica");
                    self.disconnect(Self::idx(i));
                }
            }
        }
        js.seq += 1;
        js.last = Some(encoded);
        *self.out_sig.lock().unwrap_or_else(|p| p.into_inner()) = sig;
        self.lock_activity().committed(log);
        drop(js);
        self.commits.send_modify(|c| *c += 1);
        shrunk
    }

    /// Bring replica `i`'s persisted map up to the engine's (under both locks, so nothing
    /// happens between the check of a shrink and the map it leaves). True if `shrink`
    /// replaced the map.
    fn note_out(
        &self,
        out: &mut HashMap<usize, Option<ChunkMap>>,
        e: &Engine,
        i: usize,
        shrink: Option<&Shrink>,
    ) -> bool {
        let idx = Self::idx(i);
        // A shrink applies only if nothing since its point could have left a chunk copied
        // but not flushed outside it.
        let restart = shrink
            .filter(|s| e.resync_point_holds(idx, &s.point) && self.current_gen(idx) == s.gen)
            .map(|s| &s.point.lacks);
        let prev = out.remove(&i);
        let out_of_sync = !matches!(e.membership(idx), Membership::InSync | Membership::Failed);
        let shrunk = restart.is_some() && out_of_sync && !matches!(prev, Some(None));
        if let Some(entry) = out_entry(e, idx, prev, restart) {
            out.insert(i, entry);
        }
        shrunk
    }

    /// Which resyncing replicas are due a save (`RESYNC_SAVE_INTERVAL`), marked as running.
    pub(super) fn due_resync_saves(&self, e: &Engine) -> Vec<usize> {
        let mut saves = self.resync_saves.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let mut due = Vec::new();
        for (i, save) in saves.iter_mut().enumerate() {
            let v = e.replica_view(Self::idx(i));
            let resyncing = matches!(v.membership, Membership::Syncing | Membership::Marking);
            match save {
                None if resyncing => {
                    *save = Some(ResyncSave {
                        at: now,
                        copied: v.copied_bytes,
                        running: false,
                    });
                }
                Some(_) if !resyncing => *save = None,
                Some(s)
                    if v.connected
                        && !s.running
                        && v.copied_bytes > s.copied
                        && now.duration_since(s.at) >= RESYNC_SAVE_INTERVAL =>
                {
                    s.running = true;
                    due.push(i);
                }
                _ => {}
            }
        }
        due
    }

    /// The periodic save of replica `i`'s resync (`due_resync_saves`).
    pub(super) async fn save_resync_due(self: Arc<Self>, i: usize) {
        let started = Instant::now();
        let saved = self.save_resync(i, ACTIVITY_IDLE_TICKS).await;
        let mut saves = self.resync_saves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Some(s)) = saves.get_mut(i) {
            s.running = false;
            s.at = started;
            if let Some(copied) = saved {
                s.copied = copied;
            }
        }
    }

    /// Save what resyncing replica `i` still lacks as its persisted map, so that the next
    /// engine resumes its resync instead of copying the whole map again: take its resync
    /// point (its dirty chunks and copies in flight), flush it (every copy acknowledged
    /// before the point is then durable there), then commit the point as its map, with
    /// whatever the engine marked since. Nothing is saved if the replica had a new session
    /// or its dirty map grew in between (`Engine::resync_point_holds`). Returns the bytes
    /// copied to it at the point if its map was saved.
    pub(super) async fn save_resync(&self, i: usize, min_idle: u64) -> Option<u64> {
        let idx = Self::idx(i);
        let (point, gen, copied) = {
            let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let point = inner.engine.resync_point(idx)?;
            let copied = inner.engine.replica_view(idx).copied_bytes;
            (point, self.current_gen(idx), copied)
        };
        let a = self.access(i)?;
        if let Err(e) = a.flush(self.epoch).await {
            if e.is_stale_epoch() {
                self.run(|en, out| en.on_fenced(out));
            }
            tracing::debug!(volume = %self.volume, error = %e, "flush for a resync save failed");
            return None;
        }
        let lacks = point.lacks.bytes();
        let js = self.journal.lock().await;
        let shrink = Shrink {
            replica: i,
            point,
            gen,
        };
        if !self.commit_locked(js, min_idle, Some(shrink)).await {
            tracing::debug!(volume = %self.volume, replica = %self.replica_ids[i], "resync save skipped: new session or more to copy");
            return None;
        }
        tracing::debug!(volume = %self.volume, replica = %self.replica_ids[i], lacks, copied, "resync progress saved");
        Some(copied)
    }

    /// Replica `i` is connected again and is about to receive requests: add to what it lacks
    /// the log of a previous engine's journal it holds (writes only it may have received),
    /// give it the current journal, then tell the engine. False if it failed meanwhile.
    pub(super) async fn join(&self, i: usize, rebooted: bool) -> bool {
        let mut js = self.journal.lock().await;
        let Some(a) = self.access(i) else {
            return false;
        };
        let idx = Self::idx(i);
        // What its own journal says it may lack (`None` inside: unknown, everything).
        let own: Option<Option<ChunkMap>> = match a
            .get_journal(self.epoch)
            .await
            .map(|s| s.map(|s| s.journal))
        {
            Ok(Some(j)) if j.epoch == self.epoch && j.seq >= js.first_seq => None,
            Ok(Some(j)) => {
                let in_sync: Vec<&str> = {
                    let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                    let ids = inner.engine.may_be_reference();
                    ids.iter()
                        .map(|r| self.replica_ids[usize::from(r.0)].as_str())
                        .collect()
                };
                let lacks = returning_lacks(
                    &j,
                    &self.replica_ids[i],
                    &in_sync,
                    self.size,
                    self.chunk_bytes,
                )
                .unwrap_or_else(|| ChunkMap::full(self.size, self.chunk_bytes));
                if !lacks.is_empty() {
                    tracing::info!(volume = %self.volume, replica = %self.replica_ids[i], bytes = lacks.bytes(), "adding what a previous engine's journal says may differ to what the replica lacks");
                }
                self.run(|e, _| e.add_dirty(idx, &lacks));
                Some(Some(lacks))
            }
            Ok(None) => {
                tracing::warn!(volume = %self.volume, replica = %self.replica_ids[i], "replica has no readable journal; copying it in full");
                let full = ChunkMap::full(self.size, self.chunk_bytes);
                self.run(|e, _| e.add_dirty(idx, &full));
                Some(None)
            }
            Err(e) => {
                tracing::warn!(volume = %self.volume, error = %e, "reading the journal of a returning replica failed");
                self.join_failed(idx, &e);
                return false;
            }
        };
        if let Some(own) = &own {
            // Its own journal is about to be overwritten: what it said must live on, in the
            // journal it is given and in every later commit.
            match (js.out.get_mut(&i), own) {
                (Some(Some(m)), Some(own)) => m.union(own),
                (Some(entry @ Some(_)), None) => *entry = None,
                (Some(None), _) => {}
                (None, own) => {
                    js.out.insert(i, own.clone());
                }
            }
        }
        if let Some(last) = js.last.clone() {
            let given = match &own {
                None => Ok(last),
                Some(own) => Journal::decode(&last).and_then(|mut j| {
                    add_out(&mut j, &self.replica_ids[i], own.as_ref());
                    encode_bounded(j).map(Bytes::from)
                }),
            };
            let given = match given {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(volume = %self.volume, error = %e, "journal does not encode");
                    return false;
                }
            };
            if let Err(e) = a.put_journal(self.epoch, given).await {
                tracing::warn!(volume = %self.volume, error = %e, "writing the journal to a returning replica failed");
                self.join_failed(idx, &e);
                return false;
            }
        }
        self.run(|e, out| e.on_replica_connected(idx, rebooted, out));
        true
    }

    /// A join failed: a disk error fails the replica for good (shown in `hawser volume show`,
    /// never retried); anything else is retried by the next reconnect.
    fn join_failed(&self, idx: ReplicaIdx, e: &crate::replica_access::AccessError) {
        if e.is_disk_error() {
            self.run(|en, out| en.on_replica_disk_error(idx, out));
        }
    }

    /// Per replica, membership and dirty bytes now.
    fn out_signature(&self) -> Vec<(Membership, u64)> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (0..self.handles.len())
            .map(|i| {
                let v = inner.engine.replica_view(Self::idx(i));
                (v.membership, v.dirty_bytes)
            })
            .collect()
    }

    /// Whether the journal's dirty maps are behind the engine: a replica changed state, or
    /// lacks more than at the last commit.
    pub(super) fn out_changed(&self) -> bool {
        let now = self.out_signature();
        let then = self.out_sig.lock().unwrap_or_else(|p| p.into_inner());
        then.len() != now.len() || then.iter().zip(&now).any(|(a, b)| a.0 != b.0 || b.1 > a.1)
    }

    fn lock_activity(&self) -> std::sync::MutexGuard<'_, hawser_core::ActivityLog> {
        self.activity.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Encode, falling back to coarser content when too large for one frame: dirty maps become
/// unknown (full copies), then the log covers the whole volume. Both only cost copying.
fn encode_bounded(mut j: Journal) -> Result<Vec<u8>, JournalError> {
    match j.encode() {
        Err(JournalError::TooLarge { .. }) => {}
        other => return other,
    }
    for o in &mut j.out {
        o.dirty = None;
    }
    match j.encode() {
        Err(JournalError::TooLarge { .. }) => {}
        other => return other,
    }
    let extents = j.size.div_ceil(j.extent_bytes);
    j.active = if extents == 0 {
        vec![]
    } else {
        vec![(0, extents)]
    };
    j.encode()
}
