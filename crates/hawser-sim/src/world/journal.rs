//! Carries out the journal keeper's acts (`hawser_core::driver::journal::Keeper`, the code
//! the agent runs) over the simulated network and disks, and feeds it their answers. No
//! journal rule lives here: only which session an operation went out on, so that an answer
//! from a session that has ended is dropped, as the agent's closed connection drops it.

use std::collections::{BTreeMap, VecDeque};

use hawser_core::driver::journal::{Act, Keeper, OpId};
use hawser_core::{ClientOp, ReplicaFailure, Tag};
use hawser_wire::journal::Journal;

use super::{replica_id, ri, Conn, EngineState, World};
use crate::replica::Op;
use crate::Mutation;

/// What kind of operation a journal op id names (for routing its answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JOp {
    Put,
    Get,
    SaveFlush,
}

/// The simulator's side of the keeper.
pub(crate) struct JournalDriver {
    pub params: crate::config::JournalParams,
    pub keeper: Keeper,
    /// Requests sent and not answered: (request id, replica) -> (keeper op, session, kind).
    /// Each request has its own id: a join's read and put share the keeper's op, and a
    /// duplicated reply to the read must not pass for the put's (seed 12818 of the
    /// 208,000-seed run: it did, the late put then overwrote a newer journal).
    ops: BTreeMap<(u64, usize), (OpId, u64, JOp)>,
    next_request: u64,
}

impl JournalDriver {
    /// The journal side of a new engine of `epoch` whose first commit is `first_seq`.
    pub fn new(
        p: &crate::config::Params,
        params: crate::config::JournalParams,
        epoch: u64,
        first_seq: u64,
    ) -> JournalDriver {
        let ids = (0..p.replicas).map(replica_id).collect();
        JournalDriver {
            keeper: Keeper::new(
                params.keeper(),
                epoch,
                p.size,
                p.engine.chunk_bytes,
                ids,
                first_seq,
            ),
            params,
            ops: BTreeMap::new(),
            next_request: 1,
        }
    }

    /// Requests waiting for a commit (failed by an engine crash).
    pub fn waiting_tags(&self) -> Vec<Tag> {
        self.keeper.waiting_tags()
    }
}

impl World {
    /// Run the keeper on the engine and carry out what it asks.
    pub(super) fn keep(
        &mut self,
        f: impl FnOnce(&mut Keeper, &mut hawser_core::Engine, &mut Vec<Act>),
    ) {
        let Some(jd) = self.jd.as_mut() else { return };
        let mut acts = Vec::new();
        f(&mut jd.keeper, &mut self.engine, &mut acts);
        self.observe();
        let mut queue: VecDeque<Act> = acts.into();
        while let Some(act) = queue.pop_front() {
            let mut more = Vec::new();
            self.act(act, &mut more);
            queue.extend(more);
        }
    }

    fn act(&mut self, act: Act, more: &mut Vec<Act>) {
        match act {
            Act::Engine(c) => {
                self.command(c);
                self.observe();
            }
            Act::PutJournal {
                op,
                replica,
                journal,
            } => {
                let r = usize::from(replica.0);
                trace!(
                    self,
                    "  journal: put {} of {:?} to r{r}",
                    journal.seq,
                    journal.active
                );
                self.journal_send(r, op, JOp::Put, |id| Op::PutJournal(id, journal), more);
            }
            Act::GetJournal { op, replica } => {
                let r = usize::from(replica.0);
                self.journal_send(r, op, JOp::Get, Op::GetJournal, more);
            }
            Act::SaveFlush { op, replica } => {
                let r = usize::from(replica.0);
                trace!(self, "  journal: resync save of r{r}: flush");
                self.stats.resync_saves += 1;
                self.journal_send(r, op, JOp::SaveFlush, Op::SaveFlush, more);
            }
            Act::Disconnect { replica } => {
                trace!(self, "  journal: put on r{} failed; dropping it", replica.0);
                self.disconnect(usize::from(replica.0));
            }
            Act::Joined { replica, ok } => {
                let r = usize::from(replica.0);
                match (ok, self.drivers[r].conn) {
                    (true, Conn::Joining(s)) => {
                        self.drivers[r].conn = Conn::Open(s);
                        self.links.ended(replica, true, self.now);
                    }
                    (true, other) => self.fail(format!(
                        "the keeper joined replica {r}, whose session is {other:?}"
                    )),
                    (false, _) => {
                        trace!(self, "  journal: join of r{r} failed");
                        self.connect_failed(r);
                    }
                }
            }
            Act::MarkInSync { replica } => {
                trace!(
                    self,
                    "  journal: r{} lacks nothing; mark it in sync",
                    replica.0
                );
                self.call(crate::control::Call::Mark {
                    r: usize::from(replica.0),
                });
            }
            Act::Committed { seq } => trace!(self, "  journal: {seq} committed"),
            Act::Finished => {}
        }
    }

    /// Send a journal operation on replica `r`'s session (a join's, or the open one). With
    /// no such session it fails at once, as the agent's send on a closed connection does.
    fn journal_send(
        &mut self,
        r: usize,
        op: OpId,
        kind: JOp,
        msg: impl FnOnce(u64) -> Op,
        more: &mut Vec<Act>,
    ) {
        let session = match (self.drivers[r].conn, kind) {
            (Conn::Open(s), JOp::Put | JOp::SaveFlush)
            | (Conn::Joining(s), JOp::Put | JOp::Get) => s,
            _ => {
                let jd = self.jd.as_mut().expect("the run models the journal");
                let (k, e) = (&mut jd.keeper, &mut self.engine);
                let lost = Err(ReplicaFailure::Lost);
                match kind {
                    JOp::Put => k.stored(e, op, ri(r), lost, more),
                    JOp::Get => k.read(e, op, ri(r), Err(ReplicaFailure::Lost), more),
                    JOp::SaveFlush => k.save_flushed(e, op, ri(r), lost, more),
                }
                return;
            }
        };
        let jd = self.jd.as_mut().expect("the run models the journal");
        let id = jd.next_request;
        jd.next_request += 1;
        jd.ops.insert((id, r), (op, session, kind));
        self.send(r, msg(id));
    }

    /// A client request, under the activity log's rules (the keeper's).
    pub(super) fn submit_journaled(&mut self, tag: Tag, op: ClientOp) {
        if self.mutation == Mutation::WritesSkipTheLog && op.write_range().is_some() {
            return self.step(|e, out| e.submit(tag, op, out));
        }
        self.keep(|k, e, acts| k.submit(e, tag, op, acts));
    }

    /// A client request completed (called for every completion).
    pub(super) fn journal_completed(&mut self, tag: Tag, ok: bool) {
        if let Some(jd) = self.jd.as_mut() {
            jd.keeper.completed(tag, ok);
        }
    }

    pub(super) fn journal_tick(&mut self) {
        self.keep(|k, e, acts| k.tick(e, acts));
    }

    /// Nothing of the journal under way.
    pub(super) fn journal_quiet(&self) -> bool {
        self.jd.as_ref().is_none_or(|jd| jd.keeper.quiet())
    }

    pub(super) fn start_commit(&mut self, min_idle: u64) {
        self.keep(|k, e, acts| {
            k.commit(e, min_idle, acts);
        });
    }

    /// Replica `r`'s Hello was answered (session `session`): bring it into the journal's set
    /// before the engine hears of it (`Links::ended` hears how that went).
    pub(super) fn join(&mut self, r: usize, session: u64, rebooted: Option<bool>) {
        self.drivers[r].conn = Conn::Joining(session);
        self.keep(|k, e, acts| k.join(e, ri(r), rebooted, acts));
    }

    /// A joining session broke.
    pub(super) fn join_failed(&mut self, r: usize) {
        trace!(self, "  journal: join of r{r} failed (session lost)");
        self.connect_failed(r);
        if let Some(jd) = self.jd.as_mut() {
            jd.ops.retain(|&(_, o), _| o != r);
        }
        self.keep(|k, e, acts| k.replica_gone(e, ri(r), acts));
    }

    /// Replica `r`'s session closed: a commit stops waiting for it.
    pub(super) fn journal_replica_gone(&mut self, r: usize) {
        if let Some(jd) = self.jd.as_mut() {
            jd.ops.retain(|&(_, o), _| o != r);
        }
        self.keep(|k, e, acts| k.replica_gone(e, ri(r), acts));
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
        if self.engine_state != EngineState::Up {
            return;
        }
        let Some(jd) = self.jd.as_mut() else { return };
        let Some(&(op, sent_on, kind)) = jd.ops.get(&(jid, r)) else {
            return; // a duplicate
        };
        let current = match self.drivers[r].conn {
            Conn::Open(s) | Conn::Joining(s) => Some(s),
            _ => None,
        };
        if sent_on != session || current != Some(session) {
            return; // of a session that ended (the keeper heard `replica_gone`)
        }
        jd.ops.remove(&(jid, r));
        let joining = matches!(self.drivers[r].conn, Conn::Joining(_));
        // As the agent's journal file reports it: stored before the node's last boot.
        let since_boot = self.replicas[r].journal_boot != self.replicas[r].boot;
        self.keep(|k, e, acts| match kind {
            JOp::Put => k.stored(e, op, ri(r), result.map(|_| ()), acts),
            JOp::Get => k.read(
                e,
                op,
                ri(r),
                result.map(|j| j.map(|j| (j, since_boot))),
                acts,
            ),
            JOp::SaveFlush => k.save_flushed(e, op, ri(r), result.map(|_| ()), acts),
        });
        // Told it is connected, the engine may still not take it (it failed meanwhile).
        if joining
            && matches!(self.drivers[r].conn, Conn::Open(_))
            && !self.engine.replica_view(ri(r)).connected
        {
            self.drivers[r].conn = Conn::Idle;
        }
    }

    /// The journal side of a new engine (after crash recovery).
    pub(super) fn reset_journal(&mut self, epoch: u64, first_seq: u64) {
        let params = self.jd.as_ref().expect("the run models the journal").params;
        self.jd = Some(JournalDriver::new(&self.p, params, epoch, first_seq));
    }
}
