//! The journal keeper: the part of the engine's driver that keeps every replica's journal
//! (format: `hawser_wire::journal`) in step with the engine, as a state machine without I/O.
//! The agent carries out its acts with sockets and files; the simulator with simulated ones.
//! Both run this code, so what the simulator checks is what ships.
//!
//! Rules (what crash recovery relies on, see docs/protocol.md):
//! - A modifying client request reaches the engine only once every extent it touches is in
//!   the committed activity log (`hawser_core::activity`); otherwise it waits for a commit.
//! - A commit writes the next journal (the log, plus what every replica out of sync may lack)
//!   to every replica requests go to, and is done once each of them stored it or left (a
//!   failed put closes the replica's session).
//! - One operation holds the journal at a time (a commit or a join). A returning replica
//!   joins under it: its own journal is read (a previous engine's log there is added to what
//!   it lacks; no journal means it lacks everything), it is given the last committed journal,
//!   and only then is the engine told it is connected, so no commit misses a replica that
//!   gets requests.
//! - A resyncing replica's persisted map shrinks only by a resync save: take the engine's
//!   resync point, flush the replica, then commit the point as its map if the point still
//!   holds (`Engine::resync_point_holds`).
//! - A resynced replica counts as in sync only once a journal says it lacks nothing: the
//!   engine's `MarkInSync` (it copied everything and flushed the replica) is held; the next
//!   commit records the replica's final resync point (nothing) as its map, and only when
//!   the replica itself stored that journal, with the point still holding, is the store
//!   asked (`Act::MarkInSync`). Otherwise the engine hears `on_mark_abandoned`. So no
//!   engine acknowledges a write, or outdates another replica, on the strength of a replica
//!   the journals still say lacks chunks.
//!
//! The executor answers every `PutJournal`, `GetJournal` and `SaveFlush` exactly once
//! (`stored`, `read`, `save_flushed`), or says the replica's session ended (`replica_gone`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use hawser_wire::journal::{Journal, JournalError, OutReplica};

use crate::activity::to_runs;
use crate::recovery_plan::{add_out, out_entry, returning_lacks, said_lost};
use crate::{
    ActivityLog, ChunkMap, ClientOp, Command, Engine, GrowError, IoError, Membership,
    ReplicaFailure, ReplicaIdx, ResyncPoint, Tag,
};

/// Identifies one journal operation of a keeper (unique for its life).
pub type OpId = u64;

/// The keeper's tunables.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub extent_bytes: u64,
    /// The activity log's soft cap, in extents.
    pub max_extents: usize,
    /// Ticks an extent stays idle before it may leave the log.
    pub idle_ticks: u64,
    /// Ticks between two resync saves of a replica.
    pub save_ticks: u64,
    /// The in-sync commit (see the module's rules). Off only in the simulator's mutation
    /// test, which shows a pinned seed failing without it.
    pub in_sync_commit: bool,
}

/// What the keeper asks of its executor, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Act {
    /// Carry out an engine command.
    Engine(Command),
    /// Store `journal` on `replica` (answer: `stored`).
    PutJournal {
        op: OpId,
        replica: ReplicaIdx,
        journal: Journal,
    },
    /// Read `replica`'s journal (answer: `read`).
    GetJournal { op: OpId, replica: ReplicaIdx },
    /// Flush `replica` on its current session (answer: `save_flushed`).
    SaveFlush { op: OpId, replica: ReplicaIdx },
    /// Close `replica`'s session: it failed a journal put.
    Disconnect { replica: ReplicaIdx },
    /// Ask the store to mark `replica` in sync (the engine's `MarkInSync`, passed on once a
    /// journal says it lacks nothing); answer with `Engine::on_mark_in_sync_done`.
    MarkInSync { replica: ReplicaIdx },
    /// A join ended: `ok`, the engine was told the replica is connected (its commands follow
    /// this act); otherwise the executor closes the session and retries later.
    Joined { replica: ReplicaIdx, ok: bool },
    /// The commit of `seq` is done (on every replica requests go to).
    Committed { seq: u64 },
    /// `finish` is done: saves taken and a last commit made.
    Finished,
}

/// The operation holding the journal.
enum Busy {
    Commit {
        op: OpId,
        log: BTreeSet<u64>,
        journal: Journal,
        /// Replicas that have not stored it yet, and those that have.
        pending: BTreeSet<usize>,
        stored: BTreeSet<usize>,
        /// Resynced replicas this commit says lack nothing, with their final resync point.
        marks: Vec<(usize, ResyncPoint)>,
    },
    Join {
        op: OpId,
        r: usize,
        /// Whether its node rebooted since this engine last had it (`None`: this engine
        /// never had it; the journal read tells).
        rebooted: Option<bool>,
        /// Its journal was read; the put of the last committed one is under way.
        putting: bool,
    },
}

/// A resyncing replica's saves.
struct Save {
    /// Tick of the last save's start, and the bytes copied to it at the last saved point.
    at: u64,
    copied: u64,
    stage: SaveStage,
}

enum SaveStage {
    Idle,
    /// The flush `op` was asked for after `point` was taken (`copied`: bytes copied then).
    Flushing {
        op: OpId,
        point: ResyncPoint,
        copied: u64,
    },
    /// Flushed; the next commit takes the point (a `Shrink`).
    Committing,
}

/// A resync point whose replica was flushed since, waiting for the next commit.
struct Shrink {
    r: usize,
    point: ResyncPoint,
    copied: u64,
}

pub struct Keeper {
    p: Params,
    al: ActivityLog,
    epoch: u64,
    size: u64,
    chunk_bytes: u64,
    /// Replica ids, as journals name them.
    ids: Vec<String>,
    /// Sequence number of the last commit, and the first of this keeper's life (a replica
    /// whose journal is older holds a previous engine's log).
    seq: u64,
    first_seq: u64,
    /// Persisted dirty maps of replicas not in sync (`None`: unknown). A map grows with the
    /// engine's and shrinks only by a resync save.
    out: BTreeMap<usize, Option<ChunkMap>>,
    /// Replicas of `out` that may lack acknowledged writes (`OutReplica::lost`): set while
    /// the engine says so, kept while the entry lasts.
    lost: BTreeSet<usize>,
    last: Option<Journal>,
    busy: Option<Busy>,
    /// A commit was asked for while the journal was held: the smallest idle time asked.
    wanted: Option<u64>,
    joins: VecDeque<(usize, Option<bool>)>,
    /// Modifying requests waiting for their extents to be committed.
    waiting: VecDeque<(Tag, ClientOp)>,
    /// Modifying requests in the engine: their range.
    admitted: BTreeMap<Tag, (u64, u64)>,
    /// Flushes in the engine: their mark.
    flush_marks: BTreeMap<Tag, u64>,
    /// Per replica, membership and dirty bytes when the last commit started.
    out_sig: Vec<(Membership, u64)>,
    next_op: OpId,
    ticks: u64,
    saves: Vec<Option<Save>>,
    shrinks: Vec<Shrink>,
    /// Resynced replicas whose `MarkInSync` waits for the next commit: their final point.
    marks: BTreeMap<usize, ResyncPoint>,
    /// `finish` was called and waits for save flushes; then for the commit of this seq.
    finishing: bool,
    finish_commit: Option<u64>,
}

impl Keeper {
    /// The keeper of a new engine of `epoch` over replicas `ids`, whose first commit is
    /// `first_seq` (after crash recovery, `Plan::next_seq`).
    pub fn new(
        p: Params,
        epoch: u64,
        size: u64,
        chunk_bytes: u64,
        ids: Vec<String>,
        first_seq: u64,
    ) -> Keeper {
        assert!(first_seq >= 1, "journal sequence numbers start at 1");
        let n = ids.len();
        Keeper {
            al: ActivityLog::new(size, p.extent_bytes, p.max_extents),
            p,
            epoch,
            size,
            chunk_bytes,
            ids,
            seq: first_seq - 1,
            first_seq,
            out: BTreeMap::new(),
            lost: BTreeSet::new(),
            last: None,
            busy: None,
            wanted: None,
            joins: VecDeque::new(),
            waiting: VecDeque::new(),
            admitted: BTreeMap::new(),
            flush_marks: BTreeMap::new(),
            out_sig: Vec::new(),
            next_op: 1,
            ticks: 0,
            saves: (0..n).map(|_| None).collect(),
            shrinks: Vec::new(),
            marks: BTreeMap::new(),
            finishing: false,
            finish_commit: None,
        }
    }

    /// Grow the volume to `size` bytes online: the engine (`Engine::grow`, whose doc says
    /// what the caller must have done first) and then the keeper's own state. The one call a
    /// driver makes, under the lock that runs the engine; on an error nothing changed.
    ///
    /// What the keeper holds about sizes follows the engine's argument (the new range is
    /// zeroes on every replica, and no request ever reached it): the activity log admits
    /// requests there once their extents are committed, as anywhere; persisted dirty maps and
    /// resync points waiting for a flush or a commit cover the new chunks as clean; and the
    /// last committed journal (and one being committed) says the new size, so a joining
    /// replica is given a journal whose maps have the engine's geometry. A journal stored
    /// before the grow says less but nothing wrong: recovery reads its maps over the larger
    /// size with the new chunks clean (`recovery_plan`). Journals written from now on carry
    /// the new size; a write into the new range waits for a commit of its extent, so no
    /// replica holds such a write without a journal of the new size.
    pub fn grow(&mut self, e: &mut Engine, size: u64) -> Result<(), GrowError> {
        assert_eq!(self.size, e.size(), "keeper and engine sizes differ");
        e.grow(size)?;
        if size == self.size {
            return Ok(());
        }
        self.size = size;
        self.al.grow(size);
        for m in self.out.values_mut().flatten() {
            m.grow(size);
        }
        for s in &mut self.shrinks {
            s.point.lacks.grow(size);
        }
        for p in self.marks.values_mut() {
            p.lacks.grow(size);
        }
        for s in self.saves.iter_mut().flatten() {
            if let SaveStage::Flushing { point, .. } = &mut s.stage {
                point.lacks.grow(size);
            }
        }
        if let Some(j) = &mut self.last {
            j.size = size;
        }
        if let Some(Busy::Commit { journal, marks, .. }) = &mut self.busy {
            journal.size = size;
            for (_, p) in marks {
                p.lacks.grow(size);
            }
        }
        Ok(())
    }

    /// The volume's size as this keeper knows it (its journals say it).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Journal commits this keeper completed (every replica it was written to stored it
    /// or left).
    pub fn commits(&self) -> u64 {
        self.seq + 1 - self.first_seq
    }

    /// Extents in the committed activity log.
    pub fn active_extents(&self) -> usize {
        self.al.active().len()
    }

    /// Nothing of the journal under way or waiting.
    pub fn quiet(&self) -> bool {
        self.busy.is_none()
            && self.waiting.is_empty()
            && self.joins.is_empty()
            && self.shrinks.is_empty()
            && self.marks.is_empty()
            && self
                .saves
                .iter()
                .flatten()
                .all(|s| matches!(s.stage, SaveStage::Idle))
    }

    /// Nothing for the clock to do (with [`Engine::at_rest`]): the journal is quiet, its log
    /// is empty and says what the engine would, and no resync's progress is kept for saving.
    pub fn at_rest(&self, e: &Engine) -> bool {
        self.quiet()
            && self.wanted.is_none()
            && self.al.active().is_empty()
            && !self.al.wants_commit(self.p.idle_ticks)
            && !self.out_changed(e)
            && self.saves.iter().all(Option::is_none)
    }

    /// Requests waiting for a commit.
    pub fn waiting_tags(&self) -> Vec<Tag> {
        self.waiting.iter().map(|(t, _)| *t).collect()
    }

    /// A client request, under the activity log's rules.
    pub fn submit(&mut self, e: &mut Engine, tag: Tag, op: ClientOp, out: &mut Vec<Act>) {
        if matches!(op, ClientOp::Flush) {
            self.flush_marks.insert(tag, self.al.flush_mark());
        } else if let Some((offset, len)) = op.write_range() {
            if !e.is_fenced() {
                if !self.al.try_begin(offset, len) {
                    self.waiting.push_back((tag, op));
                    self.commit(e, self.p.idle_ticks, out);
                    return;
                }
                self.admitted.insert(tag, (offset, len));
            }
        }
        engine(out, |c| e.submit(tag, op, c));
    }

    /// A client request completed (every `Command::Complete` the engine emits).
    pub fn completed(&mut self, tag: Tag, ok: bool) {
        if let Some((offset, len)) = self.admitted.remove(&tag) {
            self.al.end(offset, len);
        }
        if let Some(mark) = self.flush_marks.remove(&tag) {
            if ok {
                self.al.flush_done(mark);
            }
        }
    }

    /// Fail the requests waiting for a commit (the engine is fenced or shut down).
    pub fn fail_waiting(&mut self, out: &mut Vec<Act>) {
        for (tag, _) in std::mem::take(&mut self.waiting) {
            out.push(Act::Engine(Command::Complete {
                tag,
                result: Err(IoError::ShutDown),
            }));
        }
    }

    /// The driver's clock: extents age, a commit starts when extents may leave or the
    /// journal's dirty maps are behind the engine, and resync saves fall due.
    pub fn tick(&mut self, e: &mut Engine, out: &mut Vec<Act>) {
        self.ticks += 1;
        self.al.advance();
        if e.is_fenced() {
            return;
        }
        for r in 0..self.ids.len() {
            self.maybe_save(e, r, false, out);
        }
        if self.al.wants_commit(self.p.idle_ticks) || self.out_changed(e) {
            self.commit(e, self.p.idle_ticks, out);
        }
    }

    /// Ask for a commit whose log keeps extents idle fewer than `min_idle` ticks. Returns the
    /// sequence number of the commit that will carry everything asked for so far.
    pub fn commit(&mut self, e: &mut Engine, min_idle: u64, out: &mut Vec<Act>) -> u64 {
        if let Some(busy) = &self.busy {
            self.wanted = Some(self.wanted.map_or(min_idle, |w| w.min(min_idle)));
            return match busy {
                Busy::Commit { journal, .. } => journal.seq + 1,
                Busy::Join { .. } => self.seq + 1,
            };
        }
        self.wanted = None;
        self.start_commit(e, min_idle, out)
    }

    fn start_commit(&mut self, e: &mut Engine, min_idle: u64, out: &mut Vec<Act>) -> u64 {
        let shrinks = std::mem::take(&mut self.shrinks);
        let mut marks = Vec::new();
        for (r, point) in std::mem::take(&mut self.marks) {
            if e.resync_point_holds(ri(r), &point) && point.lacks.is_empty() {
                marks.push((r, point));
            } else {
                engine(out, |c| e.on_mark_abandoned(ri(r), c));
            }
        }
        let mut targets = BTreeSet::new();
        for r in 0..self.ids.len() {
            let idx = ri(r);
            let marked = marks.iter().find(|m| m.0 == r).map(|m| &m.1.lacks);
            let restart = shrinks
                .iter()
                .find(|s| s.r == r && e.resync_point_holds(idx, &s.point))
                .map(|s| &s.point.lacks);
            match out_entry(e, idx, self.out.remove(&r), marked.or(restart)) {
                Some(entry) => {
                    self.out.insert(r, entry);
                    if marked.is_some() {
                        // Resynced and flushed: it lacks nothing, acknowledged or not.
                        self.lost.remove(&r);
                    } else if e.may_lack_acknowledged(idx) {
                        self.lost.insert(r);
                    } else if e.membership(idx) == Membership::InSync {
                        // Resynced since: it lacks no acknowledged write now.
                        self.lost.remove(&r);
                    }
                }
                None => {
                    self.lost.remove(&r);
                }
            }
            let v = e.replica_view(idx);
            let writes_go_there = matches!(
                v.membership,
                Membership::InSync | Membership::Syncing | Membership::Marking
            );
            if writes_go_there && v.connected {
                targets.insert(r);
            }
        }
        for s in &shrinks {
            let saved = e.resync_point_holds(ri(s.r), &s.point);
            if let Some(Some(save)) = self.saves.get_mut(s.r) {
                save.stage = SaveStage::Idle;
                if saved {
                    save.copied = s.copied;
                }
            }
        }
        self.out_sig = signature(e);
        let log = self.al.next(min_idle);
        self.al.commit_started(&log);
        let mut outs: Vec<OutReplica> = self
            .out
            .iter()
            .map(|(&r, m)| OutReplica {
                replica: self.ids[r].clone(),
                dirty: m.as_ref().map(ChunkMap::runs),
                lost: m.is_none() || self.lost.contains(&r),
            })
            .collect();
        outs.sort_by(|a, b| a.replica.cmp(&b.replica));
        let journal = bounded(Journal {
            epoch: self.epoch,
            seq: self.seq + 1,
            size: self.size,
            extent_bytes: self.p.extent_bytes,
            chunk_bytes: self.chunk_bytes,
            active: to_runs(log.iter().copied()),
            out: outs,
        });
        let op = self.op();
        let seq = journal.seq;
        for &r in &targets {
            out.push(Act::PutJournal {
                op,
                replica: ri(r),
                journal: journal.clone(),
            });
        }
        self.busy = Some(Busy::Commit {
            op,
            log,
            journal,
            pending: targets,
            stored: BTreeSet::new(),
            marks,
        });
        self.maybe_commit_done(e, out);
        seq
    }

    fn op(&mut self) -> OpId {
        self.next_op += 1;
        self.next_op - 1
    }

    fn maybe_commit_done(&mut self, e: &mut Engine, out: &mut Vec<Act>) {
        let Some(Busy::Commit { pending, .. }) = &self.busy else {
            return;
        };
        if !pending.is_empty() {
            return;
        }
        let Some(Busy::Commit {
            log,
            journal,
            stored,
            marks,
            ..
        }) = self.busy.take()
        else {
            unreachable!("checked above")
        };
        self.seq = journal.seq;
        self.last = Some(journal);
        self.al.committed(log);
        out.push(Act::Committed { seq: self.seq });
        for (r, point) in marks {
            if e.is_fenced() {
                break;
            }
            if stored.contains(&r) && e.resync_point_holds(ri(r), &point) {
                out.push(Act::MarkInSync { replica: ri(r) });
            } else {
                engine(out, |c| e.on_mark_abandoned(ri(r), c));
            }
        }
        if self.finish_commit.is_some_and(|s| s <= self.seq) {
            self.finish_commit = None;
            out.push(Act::Finished);
        }
        self.next(e, out);
    }

    /// The journal was released: admit what waits, then the next join or commit.
    fn next(&mut self, e: &mut Engine, out: &mut Vec<Act>) {
        for (tag, op) in std::mem::take(&mut self.waiting) {
            let (offset, len) = op.write_range().expect("only modifying requests wait");
            if e.is_fenced() {
                out.push(Act::Engine(Command::Complete {
                    tag,
                    result: Err(IoError::ShutDown),
                }));
            } else if self.al.try_begin(offset, len) {
                self.admitted.insert(tag, (offset, len));
                engine(out, |c| e.submit(tag, op, c));
            } else {
                self.waiting.push_back((tag, op));
            }
        }
        if self.busy.is_some() {
            return;
        }
        if let Some((r, rebooted)) = self.joins.pop_front() {
            let op = self.op();
            self.busy = Some(Busy::Join {
                op,
                r,
                rebooted,
                putting: false,
            });
            out.push(Act::GetJournal { op, replica: ri(r) });
            return;
        }
        if let Some(min_idle) = self.wanted.take() {
            self.start_commit(e, min_idle, out);
        } else if !self.waiting.is_empty() {
            self.start_commit(e, self.p.idle_ticks, out);
        }
    }

    /// Replica `r` is connected again: bring it into the set of replicas requests go to.
    /// `rebooted`: whether its node restarted since this engine's last session with it, or
    /// `None` when this engine had none; then the journal read tells whether the node
    /// rebooted since that journal was stored (as at crash recovery), and no journal counts
    /// as rebooted.
    pub fn join(
        &mut self,
        e: &mut Engine,
        r: ReplicaIdx,
        rebooted: Option<bool>,
        out: &mut Vec<Act>,
    ) {
        self.joins.push_back((usize::from(r.0), rebooted));
        if self.busy.is_none() {
            self.next(e, out);
        }
    }

    /// Replica `r`'s session ended: a commit stops waiting for it; its join, if any, is
    /// dropped (the executor retries with a new session).
    pub fn replica_gone(&mut self, e: &mut Engine, r: ReplicaIdx, out: &mut Vec<Act>) {
        let r = usize::from(r.0);
        self.joins.retain(|&(j, _)| j != r);
        match &mut self.busy {
            Some(Busy::Commit { pending, .. }) => {
                pending.remove(&r);
                self.maybe_commit_done(e, out);
            }
            Some(Busy::Join { r: jr, .. }) if *jr == r => {
                self.busy = None;
                self.next(e, out);
            }
            _ => {}
        }
        if let Some(Some(save)) = self.saves.get_mut(r) {
            if matches!(save.stage, SaveStage::Flushing { .. }) {
                save.stage = SaveStage::Idle;
                self.save_ended(e, out);
            }
        }
    }

    /// The answer to a `PutJournal`.
    pub fn stored(
        &mut self,
        e: &mut Engine,
        op: OpId,
        r: ReplicaIdx,
        result: Result<(), ReplicaFailure>,
        out: &mut Vec<Act>,
    ) {
        let i = usize::from(r.0);
        match &mut self.busy {
            Some(Busy::Commit {
                op: cop,
                pending,
                stored,
                ..
            }) if *cop == op && pending.contains(&i) => {
                pending.remove(&i);
                match result {
                    Ok(()) => {
                        stored.insert(i);
                    }
                    Err(ReplicaFailure::StaleEpoch) => engine(out, |c| e.on_fenced(c)),
                    Err(_) => out.push(Act::Disconnect { replica: r }),
                }
                self.maybe_commit_done(e, out);
            }
            Some(Busy::Join {
                op: jop,
                r: jr,
                putting: true,
                ..
            }) if *jop == op && *jr == i => match result {
                Ok(()) => self.joined(e, out),
                Err(f) => self.join_failed(e, f, out),
            },
            _ => {} // a duplicate, or of an operation that ended
        }
    }

    /// The answer to a `GetJournal`: the journal and whether the replica's node rebooted
    /// since it was stored; `Ok(None)` when the replica has no readable journal.
    pub fn read(
        &mut self,
        e: &mut Engine,
        op: OpId,
        r: ReplicaIdx,
        result: Result<Option<(Journal, bool)>, ReplicaFailure>,
        out: &mut Vec<Act>,
    ) {
        let i = usize::from(r.0);
        let Some(&Busy::Join {
            op: jop,
            r: jr,
            putting: false,
            ..
        }) = self.busy.as_ref()
        else {
            return;
        };
        if jop != op || jr != i {
            return;
        }
        let found = match result {
            Ok(found) => found,
            Err(f) => return self.join_failed(e, f, out),
        };
        let mut rebooted = false;
        if let Some(Busy::Join {
            rebooted: known, ..
        }) = &mut self.busy
        {
            rebooted = *known.get_or_insert(found.as_ref().is_none_or(|(_, since)| *since));
        }
        let j = found.map(|(j, _)| j);
        // What an earlier engine's journal says; this engine's own journals say what it
        // knew then, and it knows better now (the replica may have been resynced since).
        let earlier = |j: &Journal| j.epoch != self.epoch || j.seq < self.first_seq;
        let said = j
            .as_ref()
            .is_some_and(|j| earlier(j) && said_lost(j, &self.ids[i]));
        let own = self.own_lacks(e, i, j);
        if rebooted {
            // Known now, kept even if the join fails: the next try may not see it (its
            // journal is about to be overwritten under the new boot).
            e.note_rebooted(r);
        }
        if said {
            // A journal said it lost acknowledged writes: so must this engine.
            e.note_lost(r);
        }
        if e.may_lack_acknowledged(r) {
            self.lost.insert(i);
        }
        let Some(mut last) = self.last.clone() else {
            return self.joined(e, out);
        };
        let lost = self.lost.contains(&i);
        if own.is_some() || lost {
            // What it lacks as the engine knows it now (with what its own journal said, and
            // what a reboot just learnt took: `note_rebooted` made those chunks dirty), not
            // only what its own journal said: the journal it is given is the one the next
            // recovery reads of it (found by the simulator: an empty map with `lost` made a
            // rebooted replica whole, and recovery copied its stale chunks everywhere).
            let lacks = match own {
                Some(None) => None,
                own => {
                    let mut m = e.dirty(r).clone();
                    m.union(&e.unflushed_at_loss(r));
                    if let Some(Some(o)) = &own {
                        m.union(o);
                    }
                    Some(m)
                }
            };
            add_out(&mut last, &self.ids[i], lacks.as_ref(), lost);
            // Kept for the next joins too: if this one ends before a commit carried it, the
            // replica's next join finds a journal of this engine's (which says nothing new)
            // and is given this one again, not the commit's, which knew less (found by the
            // simulator: seed 40815 overwrote a journal naming an unacknowledged write).
            self.last = Some(last.clone());
        }
        if let Some(Busy::Join { putting, .. }) = &mut self.busy {
            *putting = true;
        }
        out.push(Act::PutJournal {
            op,
            replica: r,
            journal: bounded(last),
        });
    }

    /// What a joining replica's own journal `j` adds to what it lacks (added to the engine
    /// and to the keeper's maps, since that journal is about to be overwritten); `None`:
    /// nothing, it is this engine's own.
    fn own_lacks(
        &mut self,
        e: &mut Engine,
        r: usize,
        j: Option<Journal>,
    ) -> Option<Option<ChunkMap>> {
        let (size, chunk) = (self.size, self.chunk_bytes);
        let (m, own) = match j {
            Some(j) if j.epoch == self.epoch && j.seq >= self.first_seq => return None,
            Some(j) => {
                let ids: Vec<&str> = e
                    .may_be_reference()
                    .iter()
                    .map(|x| self.ids[usize::from(x.0)].as_str())
                    .collect();
                match returning_lacks(&j, &self.ids[r], &ids, size, chunk) {
                    Some(m) => (m.clone(), Some(m)),
                    None => (ChunkMap::full(size, chunk), None),
                }
            }
            None => (ChunkMap::full(size, chunk), None),
        };
        e.add_dirty(ri(r), &m);
        match (self.out.get_mut(&r), &own) {
            (Some(Some(x)), Some(own)) => x.union(own),
            (Some(entry @ Some(_)), None) => *entry = None,
            (Some(None), _) => {}
            (None, own) => {
                self.out.insert(r, own.clone());
            }
        }
        Some(own)
    }

    fn joined(&mut self, e: &mut Engine, out: &mut Vec<Act>) {
        let Some(Busy::Join { r, rebooted, .. }) = self.busy.take() else {
            unreachable!("only a join joins")
        };
        out.push(Act::Joined {
            replica: ri(r),
            ok: true,
        });
        let rebooted = rebooted.unwrap_or(true);
        engine(out, |c| e.on_replica_connected(ri(r), rebooted, c));
        self.next(e, out);
    }

    /// A join's journal operation failed: a disk error fails the replica for good (never
    /// retried); anything else is retried by the executor's next reconnect.
    fn join_failed(&mut self, e: &mut Engine, f: ReplicaFailure, out: &mut Vec<Act>) {
        let Some(Busy::Join { r, .. }) = self.busy.take() else {
            unreachable!("only a join fails to join")
        };
        match f {
            ReplicaFailure::Io => engine(out, |c| e.on_replica_disk_error(ri(r), c)),
            ReplicaFailure::StaleEpoch => engine(out, |c| e.on_fenced(c)),
            // Only data reads answer `Corrupt`; were a journal read to, it is retried like a
            // lost one, never taken for a disk error.
            ReplicaFailure::Lost | ReplicaFailure::NoSpace | ReplicaFailure::Corrupt { .. } => {}
        }
        out.push(Act::Joined {
            replica: ri(r),
            ok: false,
        });
        self.next(e, out);
    }

    /// The engine asked for `MarkInSync` of `r` (it copied everything to it and flushed it):
    /// held until a commit records that `r` lacks nothing (see the module's rules).
    pub fn resynced(&mut self, e: &mut Engine, r: ReplicaIdx, out: &mut Vec<Act>) {
        if !self.p.in_sync_commit {
            out.push(Act::MarkInSync { replica: r });
            return;
        }
        match e.resync_point(r) {
            Some(point) => {
                self.marks.insert(usize::from(r.0), point);
                self.commit(e, self.p.idle_ticks, out);
            }
            None => engine(out, |c| e.on_mark_abandoned(r, c)),
        }
    }

    /// Start a save of replica `r`'s resync when one is due (`now`: whenever it copied
    /// anything since the last). Its point is taken here, before the flush is asked for.
    fn maybe_save(&mut self, e: &Engine, r: usize, now: bool, out: &mut Vec<Act>) {
        let v = e.replica_view(ri(r));
        let resyncing = matches!(v.membership, Membership::Syncing | Membership::Marking);
        let ticks = self.ticks;
        let due = match &self.saves[r] {
            None if resyncing => {
                self.saves[r] = Some(Save {
                    at: ticks,
                    copied: v.copied_bytes,
                    stage: SaveStage::Idle,
                });
                now
            }
            Some(_) if !resyncing => {
                self.saves[r] = None;
                false
            }
            Some(s) => {
                matches!(s.stage, SaveStage::Idle)
                    && v.connected
                    && v.copied_bytes > s.copied
                    && (now || ticks >= s.at + self.p.save_ticks)
            }
            None => false,
        };
        let Some(point) = due.then(|| e.resync_point(ri(r))).flatten() else {
            return;
        };
        let op = self.op();
        if let Some(Some(s)) = self.saves.get_mut(r) {
            s.at = ticks;
            s.stage = SaveStage::Flushing {
                op,
                point,
                copied: v.copied_bytes,
            };
        }
        out.push(Act::SaveFlush { op, replica: ri(r) });
    }

    /// The answer to a `SaveFlush`: on success its point is committed as the replica's map
    /// by the next commit, if it still holds then.
    pub fn save_flushed(
        &mut self,
        e: &mut Engine,
        op: OpId,
        r: ReplicaIdx,
        result: Result<(), ReplicaFailure>,
        out: &mut Vec<Act>,
    ) {
        let i = usize::from(r.0);
        let Some(Some(save)) = self.saves.get_mut(i) else {
            return;
        };
        if !matches!(save.stage, SaveStage::Flushing { op: sop, .. } if sop == op) {
            return;
        }
        let SaveStage::Flushing { point, copied, .. } =
            std::mem::replace(&mut save.stage, SaveStage::Idle)
        else {
            unreachable!("matched above")
        };
        match result {
            Ok(()) => {
                save.stage = SaveStage::Committing;
                self.shrinks.push(Shrink {
                    r: i,
                    point,
                    copied,
                });
                self.commit(e, self.p.idle_ticks, out);
            }
            Err(ReplicaFailure::StaleEpoch) => engine(out, |c| e.on_fenced(c)),
            Err(_) => {}
        }
        self.save_ended(e, out);
    }

    /// Finish the engine's journal before a clean stop (after a successful flush): save every
    /// resync under way, then commit with a log of only what is still in flight (none after
    /// that flush, so the next engine skips recovery). `Finished` follows.
    pub fn finish(&mut self, e: &mut Engine, out: &mut Vec<Act>) {
        for r in 0..self.ids.len() {
            self.maybe_save(e, r, true, out);
        }
        self.finishing = true;
        self.save_ended(e, out);
    }

    fn save_ended(&mut self, e: &mut Engine, out: &mut Vec<Act>) {
        let flushing = self
            .saves
            .iter()
            .flatten()
            .any(|s| matches!(s.stage, SaveStage::Flushing { .. }));
        if !self.finishing || flushing {
            return;
        }
        self.finishing = false;
        let seq = self.commit(e, 0, out);
        if self.seq >= seq {
            out.push(Act::Finished);
        } else {
            self.finish_commit = Some(seq);
        }
    }

    fn out_changed(&self, e: &Engine) -> bool {
        let now = signature(e);
        self.out_sig.len() != now.len()
            || self
                .out_sig
                .iter()
                .zip(&now)
                .any(|(a, b)| a.0 != b.0 || b.1 > a.1)
    }
}

/// Per replica, membership and dirty bytes now.
fn signature(e: &Engine) -> Vec<(Membership, u64)> {
    (0..e.replicas())
        .map(|r| {
            let v = e.replica_view(ri(r));
            (v.membership, v.dirty_bytes)
        })
        .collect()
}

fn ri(r: usize) -> ReplicaIdx {
    ReplicaIdx(u8::try_from(r).expect("at most MAX_REPLICAS"))
}

/// Run an engine step and pass its commands on.
fn engine(out: &mut Vec<Act>, f: impl FnOnce(&mut Vec<Command>)) {
    let mut c = Vec::new();
    f(&mut c);
    out.extend(c.into_iter().map(Act::Engine));
}

/// The journal as it will be encoded: coarser when too large for one record (dirty maps
/// become unknown, full copies; then the log covers the whole volume). Both only cost
/// copying, and the keeper remembers what was actually stored.
pub fn bounded(mut j: Journal) -> Journal {
    if !matches!(j.encode(), Err(JournalError::TooLarge { .. })) {
        return j;
    }
    for o in &mut j.out {
        o.dirty = None;
    }
    if !matches!(j.encode(), Err(JournalError::TooLarge { .. })) {
        return j;
    }
    let extents = j.size.div_ceil(j.extent_bytes);
    j.active = if extents == 0 {
        vec![]
    } else {
        vec![(0, extents)]
    };
    j
}
