//! The driver's journal: the simulated counterpart of `hawser-agent::volume_engine::journal`,
//! over the same rules (`hawser_core::activity::ActivityLog`) and the same journal format.
//!
//! - A modifying client request goes to the engine only once every extent it touches is in
//!   the committed activity log (`submit_journaled`); otherwise it waits for a commit.
//! - A commit writes the next journal (the log, plus the dirty map of every replica not in
//!   sync) to every replica requests go to, and counts as done once each of them stored it or
//!   left (its session closed, or the put failed and the driver closed it).
//! - A replica whose Hello was answered joins under the same lock (`join`): its journal is
//!   read (a previous engine's log there is added to what it lacks; no journal means it lacks
//!   everything), it is given the last committed journal, and only then is the engine told it
//!   is connected.
//! - A successful flush lets extents leave the log; every driver tick may commit a smaller log.
//!
//! One operation (a commit or a join) runs at a time, like the agent's `journal` lock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use hawser_core::activity::to_runs;
use hawser_core::recovery_plan::{add_out, out_entry, returning_lacks};
use hawser_core::{ActivityLog, ChunkMap, ClientOp, Membership, ReplicaFailure, Tag};
use hawser_wire::journal::{Journal, OutReplica};

use super::{replica_id, ri, Conn, EngineState, World};
use crate::config::{JournalParams, Params};
use crate::replica::Op;
use crate::Mutation;

/// The operation holding the journal lock.
enum Busy {
    Commit {
        jid: u64,
        log: BTreeSet<u64>,
        journal: Journal,
        /// Replicas that have not stored it yet.
        pending: BTreeSet<usize>,
    },
    Join {
        jid: u64,
        r: usize,
        session: u64,
        rebooted: bool,
        boot: u64,
        /// Its journal was read; the put of the last committed one is under way.
        putting: bool,
    },
}

pub(crate) struct JournalDriver {
    pub params: JournalParams,
    al: ActivityLog,
    epoch: u64,
    /// Sequence number of the last commit, and the first of this engine's life.
    seq: u64,
    first_seq: u64,
    /// Persisted dirty maps of replicas not in sync (`None`: unknown); only grow while out.
    out: BTreeMap<usize, Option<ChunkMap>>,
    last: Option<Journal>,
    busy: Option<Busy>,
    /// A commit was asked for while the lock was held.
    commit_wanted: bool,
    joins: VecDeque<(usize, u64, bool, u64)>,
    /// Modifying requests waiting for their extents to be committed.
    waiting: VecDeque<(Tag, ClientOp)>,
    /// Modifying requests in the engine, by tag: their range.
    admitted: BTreeMap<Tag, (u64, u64)>,
    /// Flushes in the engine, by tag: their mark.
    flush_marks: BTreeMap<Tag, u64>,
    /// Per replica, membership and dirty bytes at the last commit.
    out_sig: Vec<(Membership, u64)>,
    next_jid: u64,
}

impl JournalDriver {
    /// The journal side of a new engine of `epoch` whose first commit is `first_seq`.
    pub fn new(p: &Params, params: JournalParams, epoch: u64, first_seq: u64) -> JournalDriver {
        JournalDriver {
            params,
            al: ActivityLog::new(p.size, params.extent_bytes, params.max_extents),
            epoch,
            seq: first_seq - 1,
            first_seq,
            out: BTreeMap::new(),
            last: None,
            busy: None,
            commit_wanted: false,
            joins: VecDeque::new(),
            waiting: VecDeque::new(),
            admitted: BTreeMap::new(),
            flush_marks: BTreeMap::new(),
            out_sig: Vec::new(),
            next_jid: 1,
        }
    }

    /// Requests waiting for a commit (failed by an engine crash).
    pub fn waiting_tags(&self) -> Vec<Tag> {
        self.waiting.iter().map(|(t, _)| *t).collect()
    }
}

impl World {
    fn jd(&mut self) -> &mut JournalDriver {
        self.jd.as_mut().expect("the run models the journal")
    }

    /// A client request, under the activity log's rules.
    pub(super) fn submit_journaled(&mut self, tag: Tag, op: ClientOp) {
        if matches!(op, ClientOp::Flush) {
            let mark = self.jd().al.flush_mark();
            self.jd().flush_marks.insert(tag, mark);
        } else if let Some((offset, len)) = op.write_range() {
            if self.mutation == Mutation::WritesSkipTheLog {
                return self.step(|e, out| e.submit(tag, op, out));
            }
            if !self.jd().al.try_begin(offset, len) {
                trace!(self, "  journal: {tag} waits for a commit");
                self.jd().waiting.push_back((tag, op));
                let idle = self.jd().params.idle_ticks;
                self.start_commit(idle);
                return;
            }
            self.jd().admitted.insert(tag, (offset, len));
        }
        self.step(|e, out| e.submit(tag, op, out));
    }

    /// A client request completed (called for every completion).
    pub(super) fn journal_completed(&mut self, tag: Tag, ok: bool) {
        let Some(jd) = self.jd.as_mut() else { return };
        if let Some((offset, len)) = jd.admitted.remove(&tag) {
            jd.al.end(offset, len);
        }
        if let Some(mark) = jd.flush_marks.remove(&tag) {
            if ok {
                jd.al.flush_done(mark);
            }
        }
    }

    /// The driver's tick: the log's clock, and a commit when extents may leave or the dirty
    /// maps are behind.
    pub(super) fn journal_tick(&mut self) {
        let Some(jd) = self.jd.as_mut() else { return };
        jd.al.advance();
        let idle = jd.params.idle_ticks;
        if jd.al.wants_commit(idle) || self.out_changed() {
            self.start_commit(idle);
        }
    }

    fn out_signature(&self) -> Vec<(Membership, u64)> {
        (0..self.p.replicas)
            .map(|r| {
                let v = self.engine.replica_view(ri(r));
                (v.membership, v.dirty_bytes)
            })
            .collect()
    }

    fn out_changed(&self) -> bool {
        let Some(jd) = &self.jd else { return false };
        let now = self.out_signature();
        jd.out_sig.len() != now.len()
            || jd
                .out_sig
                .iter()
                .zip(&now)
                .any(|(a, b)| a.0 != b.0 || b.1 > a.1)
    }

    /// Nothing of the journal under way.
    pub(super) fn journal_quiet(&self) -> bool {
        self.jd
            .as_ref()
            .is_none_or(|jd| jd.busy.is_none() && jd.waiting.is_empty() && jd.joins.is_empty())
    }

    /// Commit the next journal to every replica requests go to (or note that one is wanted).
    pub(super) fn start_commit(&mut self, min_idle: u64) {
        if self.jd().busy.is_some() {
            self.jd().commit_wanted = true;
            return;
        }
        self.jd().commit_wanted = false;
        let (size, chunk) = (self.p.size, self.p.engine.chunk_bytes);
        let mut targets = BTreeSet::new();
        let mut out = std::mem::take(&mut self.jd().out);
        for r in 0..self.p.replicas {
            let v = self.engine.replica_view(ri(r));
            if let Some(entry) = out_entry(&self.engine, ri(r), out.remove(&r), None) {
                out.insert(r, entry);
            }
            let writes_go_there = matches!(
                v.membership,
                Membership::InSync | Membership::Syncing | Membership::Marking
            );
            if writes_go_there && v.connected && matches!(self.drivers[r].conn, Conn::Open(_)) {
                targets.insert(r);
            }
        }
        let jd = self.jd();
        jd.out = out;
        let log = jd.al.next(min_idle);
        jd.al.commit_started(&log);
        let journal = Journal {
            epoch: jd.epoch,
            seq: jd.seq + 1,
            size,
            extent_bytes: jd.params.extent_bytes,
            chunk_bytes: chunk,
            active: to_runs(log.iter().copied()),
            out: jd
                .out
                .iter()
                .map(|(&r, m)| OutReplica {
                    replica: replica_id(r),
                    dirty: m.as_ref().map(ChunkMap::runs),
                })
                .collect(),
        };
        let jid = jd.next_jid;
        jd.next_jid += 1;
        trace!(
            self,
            "  journal: commit {} of {:?} to {targets:?}",
            journal.seq,
            journal.active
        );
        self.jd().busy = Some(Busy::Commit {
            jid,
            log,
            journal: journal.clone(),
            pending: targets.clone(),
        });
        for r in targets {
            self.send(r, Op::PutJournal(jid, journal.clone()));
        }
        self.maybe_commit_done();
    }

    fn maybe_commit_done(&mut self) {
        let Some(Busy::Commit { pending, .. }) = &self.jd().busy else {
            return;
        };
        if !pending.is_empty() {
            return;
        }
        let Some(Busy::Commit { log, journal, .. }) = self.jd().busy.take() else {
            unreachable!("checked above")
        };
        let sig = self.out_signature();
        let jd = self.jd();
        jd.seq = journal.seq;
        jd.last = Some(journal);
        jd.out_sig = sig;
        jd.al.committed(log);
        self.journal_next();
    }

    /// The lock was released: admit what waits, then the next join or commit.
    fn journal_next(&mut self) {
        if self.engine_state != EngineState::Up {
            return;
        }
        let waiting = std::mem::take(&mut self.jd().waiting);
        for (tag, op) in waiting {
            let (offset, len) = op.write_range().expect("only modifying requests wait");
            if self.jd().al.try_begin(offset, len) {
                self.jd().admitted.insert(tag, (offset, len));
                self.step(|e, out| e.submit(tag, op, out));
            } else {
                self.jd().waiting.push_back((tag, op));
            }
        }
        if self.jd().busy.is_some() {
            return;
        }
        if let Some((r, session, rebooted, boot)) = self.jd().joins.pop_front() {
            if self.drivers[r].conn == Conn::Joining(session) {
                self.begin_join(r, session, rebooted, boot);
            } else {
                self.journal_next();
            }
            return;
        }
        let idle = self.jd().params.idle_ticks;
        if self.jd().commit_wanted || !self.jd().waiting.is_empty() {
            self.start_commit(idle);
        }
    }

    /// Replica `r`'s Hello was answered (session `session`): bring it into the journal's set.
    pub(super) fn join(&mut self, r: usize, session: u64, rebooted: bool, boot: u64) {
        self.jd().joins.push_back((r, session, rebooted, boot));
        if self.jd().busy.is_none() {
            self.journal_next();
        }
    }

    fn begin_join(&mut self, r: usize, session: u64, rebooted: bool, boot: u64) {
        let jid = self.jd().next_jid;
        self.jd().next_jid += 1;
        self.jd().busy = Some(Busy::Join {
            jid,
            r,
            session,
            rebooted,
            boot,
            putting: false,
        });
        self.send(r, Op::GetJournal(jid));
    }

    /// A join's session closed or its journal operation failed.
    pub(super) fn join_failed(&mut self, r: usize, session: u64) {
        trace!(self, "  journal: join of r{r} failed");
        self.connect_failed(r);
        if let Some(Busy::Join {
            r: jr, session: js, ..
        }) = &self.jd().busy
        {
            if (*jr, *js) == (r, session) {
                self.jd().busy = None;
                self.journal_next();
            }
        }
    }

    /// Replica `r`'s session `session` closed: a commit stops waiting for it.
    pub(super) fn journal_replica_gone(&mut self, r: usize) {
        if self.jd.is_none() {
            return;
        }
        if let Some(Busy::Commit { pending, .. }) = &mut self.jd().busy {
            pending.remove(&r);
        }
        self.maybe_commit_done();
    }

    pub(super) fn journal_reply(
        &mut self,
        r: usize,
        session: u64,
        jid: u64,
        result: Result<Option<Journal>, ReplicaFailure>,
    ) {
        if self.net.partitioned[r] {
            self.session_breaks(r, session, crate::config::SESSION_TIMEOUT_US);
            return;
        }
        if self.engine_state != EngineState::Up || self.jd.is_none() {
            return;
        }
        match self.jd().busy.as_ref() {
            Some(Busy::Commit {
                jid: cj, pending, ..
            }) if *cj == jid && pending.contains(&r) => {
                if self.drivers[r].conn != Conn::Open(session) {
                    return;
                }
                if let Some(Busy::Commit { pending, .. }) = &mut self.jd().busy {
                    pending.remove(&r);
                }
                if let Err(e) = result {
                    trace!(self, "  journal: put on r{r} failed ({e:?}); dropping it");
                    self.disconnect(r);
                }
                self.maybe_commit_done();
            }
            Some(&Busy::Join {
                jid: cj,
                r: jr,
                session: js,
                rebooted,
                boot,
                putting,
            }) if cj == jid && jr == r && js == session => {
                if self.drivers[r].conn != Conn::Joining(session) {
                    return;
                }
                let j = match result {
                    Err(e) => {
                        if e == ReplicaFailure::Io {
                            // Failed for good, like the agent's `join_failed`.
                            self.step(|en, out| en.on_replica_disk_error(ri(r), out));
                        }
                        self.drivers[r].conn = Conn::Idle;
                        return self.join_failed(r, session);
                    }
                    Ok(j) => j,
                };
                if !putting {
                    let own = self.joined_journal(r, j);
                    if let Some(mut last) = self.jd().last.clone() {
                        if let Some(own) = &own {
                            add_out(&mut last, &replica_id(r), own.as_ref());
                        }
                        if let Some(Busy::Join { putting, .. }) = &mut self.jd().busy {
                            *putting = true;
                        }
                        self.send(r, Op::PutJournal(jid, last));
                        return;
                    }
                }
                self.jd().busy = None;
                self.drivers[r].conn = Conn::Open(session);
                self.drivers[r].last_boot = boot;
                self.step(|e, out| e.on_replica_connected(ri(r), rebooted, out));
                if !self.engine.replica_view(ri(r)).connected {
                    self.drivers[r].conn = Conn::Idle;
                }
                self.journal_next();
            }
            _ => {} // a duplicate, or of an operation that ended
        }
    }

    /// What a joining replica's own journal adds to what it lacks (added to the engine and
    /// to the journal state, since that journal is about to be overwritten); `None`: nothing.
    fn joined_journal(&mut self, r: usize, j: Option<Journal>) -> Option<Option<ChunkMap>> {
        let (size, chunk) = (self.p.size, self.p.engine.chunk_bytes);
        let (epoch, first_seq) = (self.jd().epoch, self.jd().first_seq);
        let (m, own) = match j {
            Some(j) if j.epoch == epoch && j.seq >= first_seq => return None,
            Some(j) => {
                let ids: Vec<String> = self
                    .engine
                    .may_be_reference()
                    .iter()
                    .map(|x| replica_id(usize::from(x.0)))
                    .collect();
                let in_sync: Vec<&str> = ids.iter().map(String::as_str).collect();
                match returning_lacks(&j, &replica_id(r), &in_sync, size, chunk) {
                    Some(m) => (m.clone(), Some(m)),
                    None => (ChunkMap::full(size, chunk), None),
                }
            }
            None => (ChunkMap::full(size, chunk), None),
        };
        if !m.is_empty() {
            trace!(self, "  journal: r{r} lacks its own log {:?}", m.runs());
        }
        self.engine.add_dirty(ri(r), &m);
        self.observe();
        let out = &mut self.jd().out;
        match (out.get_mut(&r), &own) {
            (Some(Some(x)), Some(own)) => x.union(own),
            (Some(entry @ Some(_)), None) => *entry = None,
            (Some(None), _) => {}
            (None, own) => {
                out.insert(r, own.clone());
            }
        }
        Some(own)
    }

    /// The journal side of a new engine (after crash recovery).
    pub(super) fn reset_journal(&mut self, epoch: u64, first_seq: u64) {
        let params = self.jd().params;
        self.jd = Some(JournalDriver::new(&self.p, params, epoch, first_seq));
    }
}
