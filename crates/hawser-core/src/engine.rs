//! The volume engine: fans client requests out to replicas and decides when each may be
//! acknowledged. See docs/protocol.md for the argument this code implements; in short:
//!
//! - Modifying requests and flushes go to every in-sync replica. One completes when *every*
//!   replica has answered, and is acknowledged as a success when at least one succeeded and
//!   every replica that did not succeed has been removed from the in-sync set by the control
//!   plane (`Command::Outdate`, answered by `on_outdate_done`). Until then it waits: an
//!   acknowledged write is on every replica the store calls in-sync.
//! - When every replica fails a request, it fails with their error and no replica is outdated
//!   (no replica has anything the others lack).
//! - Reads go to the local replica when it is in sync, else to another in-sync one; a failed
//!   read is retried on the next in-sync replica.
//! - A replica answering "stale epoch" means a newer engine exists: this engine fences itself
//!   and fails everything with `IoError::ShutDown`.

use std::collections::{BTreeMap, HashMap};

use crate::constants::MAX_REPLICAS;
use crate::io_error::IoError;
use crate::range_lock::RangeLock;
use crate::types::{ClientOp, Command, ReplicaFailure, ReplicaIdx, ReplicaResult, SubId, Tag};

/// A replica's membership as this engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    InSync,
    /// `Command::Outdate` sent, not yet confirmed. Gets no new requests; writes it missed wait.
    Outdating,
    /// Confirmed out of the in-sync set by the control plane.
    Outdated,
}

#[derive(Clone, Copy, Debug)]
pub struct ReplicaSpec {
    /// On this node: reads prefer it.
    pub local: bool,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    spec: ReplicaSpec,
    membership: Membership,
}

/// Bit set of replicas (MAX_REPLICAS <= 32).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Set(u32);

impl Set {
    fn add(&mut self, r: ReplicaIdx) {
        self.0 |= 1 << r.0;
    }
    fn has(self, r: ReplicaIdx) -> bool {
        self.0 & (1 << r.0) != 0
    }
    fn is_empty(self) -> bool {
        self.0 == 0
    }
}

struct Pending {
    op: ClientOp,
    /// Sub-requests not yet answered.
    outstanding: u32,
    succeeded: Set,
    failed: Set,
    /// Worst failure seen, for the error when every replica failed.
    failure: Option<ReplicaFailure>,
    /// Reads: replicas already tried.
    tried: Set,
    /// Read data from the successful replica.
    data: Option<bytes::Bytes>,
}

pub struct Engine {
    size: u64,
    slots: Vec<Slot>,
    pending: HashMap<Tag, Pending>,
    subs: HashMap<SubId, (Tag, ReplicaIdx)>,
    next_sub: SubId,
    locks: RangeLock,
    /// Modifying requests and flushes whose sub-requests are all answered, waiting for an
    /// outdate to be confirmed before they can be acknowledged. Ordered for determinism.
    parked: BTreeMap<Tag, ()>,
    fenced: bool,
}

impl Engine {
    pub fn new(size: u64, replicas: &[ReplicaSpec]) -> Engine {
        assert!(
            !replicas.is_empty() && replicas.len() <= MAX_REPLICAS,
            "1..=8 replicas"
        );
        Engine {
            size,
            slots: replicas
                .iter()
                .map(|&spec| Slot {
                    spec,
                    membership: Membership::InSync,
                })
                .collect(),
            pending: HashMap::new(),
            subs: HashMap::new(),
            next_sub: 1,
            locks: RangeLock::default(),
            parked: BTreeMap::new(),
            fenced: false,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn membership(&self, r: ReplicaIdx) -> Membership {
        self.slots[usize::from(r.0)].membership
    }

    pub fn in_sync(&self) -> Vec<ReplicaIdx> {
        self.indices()
            .filter(|&r| self.membership(r) == Membership::InSync)
            .collect()
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Client requests in flight (including queued and parked ones).
    pub fn in_flight(&self) -> usize {
        self.pending.len() + self.locks.waiting()
    }

    fn indices(&self) -> impl Iterator<Item = ReplicaIdx> + '_ {
        // slots.len() <= MAX_REPLICAS, so the index fits in u8.
        (0..self.slots.len()).map(|i| ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS")))
    }

    /// Accept a client request. Its completion comes as a `Command::Complete` now or later.
    pub fn submit(&mut self, tag: Tag, op: ClientOp, out: &mut Vec<Command>) {
        assert!(
            !self.pending.contains_key(&tag),
            "tag {tag} already in flight"
        );
        if self.fenced {
            out.push(Command::Complete {
                tag,
                result: Err(IoError::ShutDown),
            });
            return;
        }
        if !self.valid(&op) {
            out.push(Command::Complete {
                tag,
                result: Err(IoError::Invalid),
            });
            return;
        }
        if let Some(op) = self.locks.acquire(tag, op) {
            self.start(tag, op, out);
        }
    }

    fn valid(&self, op: &ClientOp) -> bool {
        let (offset, len) = match op {
            ClientOp::Flush => return true,
            ClientOp::Read { offset, len } => (*offset, u64::from(*len)),
            other => other.write_range().unwrap_or((0, 0)),
        };
        let aligned = offset % 512 == 0 && len % 512 == 0 && len > 0;
        aligned && offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    fn start(&mut self, tag: Tag, op: ClientOp, out: &mut Vec<Command>) {
        let mut p = Pending {
            op,
            outstanding: 0,
            succeeded: Set::default(),
            failed: Set::default(),
            failure: None,
            tried: Set::default(),
            data: None,
        };
        if matches!(p.op, ClientOp::Read { .. }) {
            match self.pick_reader(p.tried) {
                Some(r) => self.send(tag, &mut p, r, out),
                None => {
                    out.push(Command::Complete {
                        tag,
                        result: Err(IoError::Io),
                    });
                    return;
                }
            }
        } else {
            for r in self.in_sync() {
                self.send(tag, &mut p, r, out);
            }
        }
        self.pending.insert(tag, p);
        // A request sent to no replica at all (none in sync) finishes at once.
        self.try_finish(tag, out);
    }

    fn send(&mut self, tag: Tag, p: &mut Pending, r: ReplicaIdx, out: &mut Vec<Command>) {
        let sub = self.next_sub;
        self.next_sub += 1;
        self.subs.insert(sub, (tag, r));
        p.outstanding += 1;
        if matches!(p.op, ClientOp::Read { .. }) {
            p.tried.add(r);
        }
        out.push(Command::Send {
            replica: r,
            sub,
            op: p.op.clone(),
        });
    }

    /// Local in-sync replica first, then the lowest-numbered in-sync one not yet tried.
    fn pick_reader(&self, tried: Set) -> Option<ReplicaIdx> {
        let candidates = || {
            self.indices()
                .filter(move |&r| self.membership(r) == Membership::InSync && !tried.has(r))
        };
        candidates()
            .find(|&r| self.slots[usize::from(r.0)].spec.local)
            .or_else(|| candidates().next())
    }

    /// A replica answered sub-request `sub`. Unknown or duplicate answers are ignored.
    pub fn on_reply(&mut self, sub: SubId, result: ReplicaResult, out: &mut Vec<Command>) {
        let Some((tag, r)) = self.subs.remove(&sub) else {
            return;
        };
        if result == Err(ReplicaFailure::StaleEpoch) {
            self.fence(out);
            return;
        }
        let Some(mut p) = self.pending.remove(&tag) else {
            return;
        };
        assert!(
            p.outstanding > 0,
            "reply for a request with nothing outstanding"
        );
        p.outstanding -= 1;
        match result {
            Ok(data) => {
                p.succeeded.add(r);
                if p.data.is_none() {
                    p.data = data;
                }
            }
            Err(f) => {
                p.failed.add(r);
                p.failure = Some(worse(p.failure, f));
                if matches!(p.op, ClientOp::Read { .. }) {
                    self.read_failed(tag, &mut p, r, out);
                }
            }
        }
        self.pending.insert(tag, p);
        self.try_finish(tag, out);
    }

    /// A failed read: outdate that replica if another can serve, and retry elsewhere.
    fn read_failed(&mut self, tag: Tag, p: &mut Pending, r: ReplicaIdx, out: &mut Vec<Command>) {
        self.begin_outdate(r, out);
        if let Some(next) = self.pick_reader(p.tried) {
            self.send(tag, p, next, out);
        }
    }

    /// The connection to replica `r` is gone: every request in flight on it fails, and it
    /// leaves the in-sync set if another replica remains.
    pub fn on_replica_lost(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let mut lost: Vec<SubId> = self
            .subs
            .iter()
            .filter(|(_, &(_, sr))| sr == r)
            .map(|(&s, _)| s)
            .collect();
        lost.sort_unstable();
        for sub in lost {
            self.on_reply(sub, Err(ReplicaFailure::Lost), out);
        }
        if !self.fenced {
            self.begin_outdate(r, out);
        }
    }

    /// Start removing `r` from the in-sync set, unless it is the last in-sync replica (the
    /// last copy is never given up; requests fail instead).
    fn begin_outdate(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let idx = usize::from(r.0);
        if self.slots[idx].membership != Membership::InSync || self.in_sync().len() <= 1 {
            return;
        }
        self.slots[idx].membership = Membership::Outdating;
        out.push(Command::Outdate { replica: r });
    }

    /// The control plane confirmed `r` is out of the in-sync set.
    pub fn on_outdate_done(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let idx = usize::from(r.0);
        assert_eq!(
            self.slots[idx].membership,
            Membership::Outdating,
            "unexpected outdate"
        );
        self.slots[idx].membership = Membership::Outdated;
        let parked: Vec<Tag> = self.parked.keys().copied().collect();
        for tag in parked {
            self.try_finish(tag, out);
        }
    }

    /// The control plane refused an outdate because a newer epoch exists.
    pub fn on_fenced(&mut self, out: &mut Vec<Command>) {
        self.fence(out);
    }

    fn fence(&mut self, out: &mut Vec<Command>) {
        if self.fenced {
            return;
        }
        self.fenced = true;
        out.push(Command::Fenced);
        self.fail_all(IoError::ShutDown, out);
    }

    /// Stop: every request in flight fails with `ShutDown`.
    pub fn shutdown(&mut self, out: &mut Vec<Command>) {
        self.fenced = true;
        self.fail_all(IoError::ShutDown, out);
    }

    fn fail_all(&mut self, e: IoError, out: &mut Vec<Command>) {
        let mut tags: Vec<Tag> = self.pending.keys().copied().collect();
        tags.extend(self.locks.drain_waiting().into_iter().map(|(t, _)| t));
        tags.sort_unstable();
        for tag in tags {
            out.push(Command::Complete {
                tag,
                result: Err(e),
            });
        }
        self.pending.clear();
        self.subs.clear();
        self.parked.clear();
    }

    /// Complete `tag` if every sub-request is answered and the rule in the module doc allows.
    fn try_finish(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let Some(p) = self.pending.get(&tag) else {
            return;
        };
        if p.outstanding > 0 {
            return;
        }
        let (succeeded, failure) = (p.succeeded, p.failure);
        let result = if matches!(p.op, ClientOp::Read { .. }) {
            if succeeded.is_empty() {
                Err(failure_to_io(failure))
            } else {
                Ok(Some(p.data.clone().unwrap_or_default()))
            }
        } else if succeeded.is_empty() {
            Err(failure_to_io(failure))
        } else {
            // Every replica that did not take this request must leave the in-sync set first.
            let missed: Vec<ReplicaIdx> = self.indices().filter(|&r| !succeeded.has(r)).collect();
            for &r in &missed {
                self.begin_outdate(r, out);
            }
            if missed
                .iter()
                .any(|&r| self.membership(r) == Membership::InSync)
            {
                // A replica that lacks this write must stay in sync (it is the last one): the
                // write cannot be acknowledged. Its range is undefined, as for any failed write.
                Err(failure_to_io(failure))
            } else if missed
                .iter()
                .any(|&r| self.membership(r) == Membership::Outdating)
            {
                self.parked.insert(tag, ());
                return;
            } else {
                Ok(None)
            }
        };
        self.parked.remove(&tag);
        self.pending.remove(&tag);
        out.push(Command::Complete { tag, result });
        for (t, op) in self.locks.release(tag) {
            self.start(t, op, out);
        }
    }
}

fn worse(a: Option<ReplicaFailure>, b: ReplicaFailure) -> ReplicaFailure {
    // NoSpace is the most useful error to report to a client; otherwise keep the first.
    match (a, b) {
        (_, ReplicaFailure::NoSpace) => ReplicaFailure::NoSpace,
        (Some(a), _) => a,
        (None, b) => b,
    }
}

fn failure_to_io(f: Option<ReplicaFailure>) -> IoError {
    match f {
        Some(ReplicaFailure::NoSpace) => IoError::NoSpace,
        Some(ReplicaFailure::StaleEpoch) => IoError::ShutDown,
        _ => IoError::Io,
    }
}
