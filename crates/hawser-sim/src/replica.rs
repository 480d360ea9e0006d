//! One replica as its server runs it: a disk, a process that can die, and sessions.
//!
//! Modelled after `hawser-agent::replica_server`: a connection starts with a Hello that opens a
//! new session of the replica. The Hello waits until the requests of older sessions that are
//! executing have finished; from then on, requests of older sessions are refused (here:
//! discarded, their connection is dead anyway). So a request of an old session still in the
//! network lands before the new Hello is answered or never. Requests carry the engine's epoch
//! and a replica refuses older epochs: an engine that restarts (`world/restart.rs`) says Hello
//! with a newer one. Besides the engine's requests a session carries its driver's journal
//! operations (`world/journal.rs`): a journal put is durable and atomic when it completes.
//!
//! Requests execute concurrently on the disk, each for a random latency; the effect happens
//! when it completes. A process crash ends every session; a request executing at that moment
//! may have reached a prefix of its sectors. A node crash does the same and also loses part
//! of the volatile layer (see `disk.rs`), and the node comes back with a new boot id.
//!
//! Rot (`corrupt`): `ORDER_BLOCK_BYTES` blocks whose bytes no longer match the checksum the
//! replica keeps. The bytes themselves are left as they were: a replica never returns a block
//! that fails its sum (it answers `Corrupt` instead), so only the mark is observable. A write
//! that touches a marked block clears the mark, a partial one too: the replica re-sums a
//! partial block from a read-back of the rest. A torn write (crash) leaves marks as they are
//! and makes none (not modelled: a real torn block fails its sum).

use std::collections::{BTreeMap, BTreeSet};

use hawser_core::constants::ORDER_BLOCK_BYTES;
use hawser_core::{ClientOp, ReplicaFailure, ReplicaResult, SubId};
use hawser_wire::journal::Journal;
use rand::rngs::StdRng;
use rand::Rng;

use crate::disk::Disk;
use crate::pattern::SECTOR;

/// A disk fault injected into a replica.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DiskFault {
    None,
    /// Each request fails with an I/O error with this probability (and changes nothing).
    Io(f64),
    /// Writes and write-zeroes fail with "no space" (and change nothing).
    Full,
}

/// What a session asks of a replica: a request of the engine, or a journal operation of its
/// driver (`jid` names it in the reply).
#[derive(Clone, Debug)]
pub enum Op {
    Client(SubId, ClientOp),
    PutJournal(u64, Journal),
    GetJournal(u64),
    /// A flush the journal keeper asks for (a resync save); answered like a journal put.
    SaveFlush(u64),
}

struct Exec {
    session: u64,
    op: Op,
}

/// The outcome of a finished operation.
pub enum Finished {
    Client {
        sub: SubId,
        result: ReplicaResult,
        /// The request changed the disk (a write that succeeded), over these bytes.
        wrote: Option<(u64, u64)>,
    },
    /// A journal operation: `Ok(Some(_))` for a get that found one.
    Journal {
        jid: u64,
        result: Result<Option<Journal>, ReplicaFailure>,
    },
}

/// What became of a request that reached the replica.
pub enum Arrival {
    /// Refused or dropped: a newer session exists, or the process is down.
    Discarded,
    /// Executing: `DiskDone(op)` is due after the disk latency.
    Started(u64),
}

/// A finished operation's reply, for session `session`.
pub struct Done {
    pub session: u64,
    pub outcome: Finished,
}

pub struct Replica {
    pub disk: Disk,
    pub up: bool,
    /// Bumped at every crash; requests and Hellos of an older incarnation never arrive.
    pub incarnation: u64,
    pub boot: u64,
    pub epoch: u64,
    pub fault: DiskFault,
    /// Deliberately wrong: flushes make nothing durable.
    pub forget_flushes: bool,
    /// The durable journal (two slots written alternately: a put is atomic). `None`: the
    /// replica never had one.
    pub journal: Option<Journal>,
    /// The boot id the node had when it stored `journal` (compared with `boot` at crash
    /// recovery, as the agent's journal file does).
    pub journal_boot: u64,
    session: Option<u64>,
    /// Hellos waiting for older sessions' executing requests, in arrival order.
    hellos: Vec<u64>,
    executing: BTreeMap<u64, Exec>,
    next_op: u64,
    /// Rotted blocks (indices of `ORDER_BLOCK_BYTES` blocks).
    pub corrupt: BTreeSet<u64>,
}

impl Replica {
    pub fn new(size: u64, boot: u64) -> Replica {
        Replica {
            disk: Disk::new(size),
            up: true,
            incarnation: 1,
            boot,
            epoch: 1,
            fault: DiskFault::None,
            forget_flushes: false,
            journal: None,
            journal_boot: boot,
            session: None,
            hellos: Vec::new(),
            executing: BTreeMap::new(),
            next_op: 1,
            corrupt: BTreeSet::new(),
        }
    }

    pub fn session(&self) -> Option<u64> {
        self.session
    }

    pub fn executing(&self) -> usize {
        self.executing.len()
    }

    /// A Hello for `session` arrived; it is answered once `ready_hellos` returns it.
    /// Returns false if it is refused (stale epoch; not reachable with one engine per run).
    pub fn hello(&mut self, session: u64, epoch: u64) -> bool {
        assert!(self.up, "hello delivered to a dead process");
        if epoch < self.epoch {
            return false;
        }
        self.epoch = epoch;
        self.hellos.push(session);
        true
    }

    /// Hellos that may be answered now: no request of another session is executing. The
    /// newest one answered becomes the current session.
    pub fn ready_hellos(&mut self) -> Vec<u64> {
        if self.hellos.is_empty() {
            return Vec::new();
        }
        let last = *self.hellos.last().expect("not empty");
        if self.executing.values().any(|e| e.session != last) {
            return Vec::new();
        }
        self.session = Some(last);
        std::mem::take(&mut self.hellos)
    }

    /// An operation of `session` arrived.
    pub fn arrive(&mut self, session: u64, op: Op) -> Arrival {
        if !self.up || self.session != Some(session) || !self.hellos.is_empty() {
            return Arrival::Discarded;
        }
        let id = self.next_op;
        self.next_op += 1;
        self.executing.insert(id, Exec { session, op });
        Arrival::Started(id)
    }

    /// Operation `id` finished on the disk: apply it and build the reply.
    pub fn finish(&mut self, id: u64, rng: &mut StdRng) -> Option<Done> {
        let e = self.executing.remove(&id)?;
        let session = e.session;
        let (sub, op) = match e.op {
            Op::Client(sub, op) => (sub, op),
            Op::PutJournal(jid, j) => {
                let result = match self.fault {
                    DiskFault::Io(p) if rng.random_bool(p) => Err(ReplicaFailure::Io),
                    // The journal file grows on first use; a full disk refuses it.
                    DiskFault::Full if self.journal.is_none() => Err(ReplicaFailure::NoSpace),
                    _ => {
                        self.journal = Some(j);
                        self.journal_boot = self.boot;
                        Ok(None)
                    }
                };
                let outcome = Finished::Journal { jid, result };
                return Some(Done { session, outcome });
            }
            Op::GetJournal(jid) => {
                let result = match self.fault {
                    DiskFault::Io(p) if rng.random_bool(p) => Err(ReplicaFailure::Io),
                    _ => Ok(self.journal.clone()),
                };
                let outcome = Finished::Journal { jid, result };
                return Some(Done { session, outcome });
            }
            Op::SaveFlush(jid) => {
                let result = match self.fault {
                    DiskFault::Io(p) if rng.random_bool(p) => Err(ReplicaFailure::Io),
                    _ => {
                        if !self.forget_flushes {
                            self.disk.flush();
                        }
                        Ok(None)
                    }
                };
                let outcome = Finished::Journal { jid, result };
                return Some(Done { session, outcome });
            }
        };
        let fail = match (self.fault, &op) {
            (DiskFault::Io(p), _) if rng.random_bool(p) => Some(ReplicaFailure::Io),
            (DiskFault::Full, ClientOp::Write { .. } | ClientOp::WriteZeroes { .. }) => {
                Some(ReplicaFailure::NoSpace)
            }
            _ => None,
        };
        if let Some(f) = fail {
            let outcome = Finished::Client {
                sub,
                result: Err(f),
                wrote: None,
            };
            return Some(Done { session, outcome });
        }
        let (result, wrote) = match &op {
            ClientOp::Read { offset, len } => match self.rotted(*offset, u64::from(*len)) {
                Some((first, blocks)) => (Err(ReplicaFailure::Corrupt { first, blocks }), None),
                None => (Ok(Some(self.disk.read(*offset, u64::from(*len)))), None),
            },
            ClientOp::Write { offset, data, fua } => {
                let len = data.len() as u64;
                self.disk.write(*offset, len, Some(data), *fua);
                (Ok(None), Some((*offset, len)))
            }
            ClientOp::Trim { offset, len } => {
                self.disk.write(*offset, u64::from(*len), None, false);
                (Ok(None), Some((*offset, u64::from(*len))))
            }
            ClientOp::WriteZeroes {
                offset, len, fua, ..
            } => {
                self.disk.write(*offset, u64::from(*len), None, *fua);
                (Ok(None), Some((*offset, u64::from(*len))))
            }
            ClientOp::Flush => {
                if !self.forget_flushes {
                    self.disk.flush();
                }
                (Ok(None), None)
            }
        };
        if let Some((offset, len)) = wrote {
            let b = ORDER_BLOCK_BYTES;
            let blocks: Vec<u64> = self
                .corrupt
                .range(offset / b..(offset + len).div_ceil(b))
                .copied()
                .collect();
            for k in blocks {
                self.corrupt.remove(&k);
            }
        }
        let outcome = Finished::Client { sub, result, wrote };
        Some(Done { session, outcome })
    }

    /// The first rotted block in `[offset, offset + len)` (its byte offset) and how many are.
    pub fn rotted(&self, offset: u64, len: u64) -> Option<(u64, u32)> {
        let b = ORDER_BLOCK_BYTES;
        let mut bad = self.corrupt.range(offset / b..(offset + len).div_ceil(b));
        let first = *bad.next()?;
        let blocks = u32::try_from(1 + bad.count()).expect("few blocks per read");
        Some((first * b, blocks))
    }

    /// The process (or its node) dies. Writes executing now reach a random prefix of their
    /// sectors. A node crash then loses part of the volatile layer (each volatile sector kept
    /// with probability `keep`) and returns the sectors that were volatile.
    pub fn crash(&mut self, node: bool, keep: f64, rng: &mut StdRng) -> Vec<u64> {
        for (_, e) in std::mem::take(&mut self.executing) {
            let op = match e.op {
                Op::Client(_, op) => op,
                // A journal put is atomic (two slots): it landed or it did not.
                Op::PutJournal(_, j) => {
                    if rng.random_bool(0.5) {
                        self.journal = Some(j);
                        self.journal_boot = self.boot;
                    }
                    continue;
                }
                Op::GetJournal(_) | Op::SaveFlush(_) => continue,
            };
            let (offset, len, data) = match &op {
                ClientOp::Write { offset, data, .. } => (*offset, data.len() as u64, Some(data)),
                ClientOp::Trim { offset, len } | ClientOp::WriteZeroes { offset, len, .. } => {
                    (*offset, u64::from(*len), None)
                }
                ClientOp::Read { .. } | ClientOp::Flush => continue,
            };
            let sectors = len / SECTOR;
            let done = rng.random_range(0..=sectors) * SECTOR;
            if done > 0 {
                let prefix = data.map(|d| &d[..usize::try_from(done).expect("fits")]);
                self.disk.write(offset, done, prefix, false);
            }
        }
        self.up = false;
        self.incarnation += 1;
        self.session = None;
        self.hellos.clear();
        if node {
            self.disk.power_loss(rng, keep)
        } else {
            Vec::new()
        }
    }

    pub fn restart(&mut self, new_boot: Option<u64>) {
        assert!(!self.up);
        self.up = true;
        if let Some(b) = new_boot {
            self.boot = b;
        }
    }
}
