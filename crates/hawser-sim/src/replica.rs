//! One replica as its server runs it: a disk, a process that can die, and sessions.
//!
//! Modelled after `hawser-agent::replica_server`: a connection starts with a Hello that opens a
//! new session of the replica. The Hello waits until the requests of older sessions that are
//! executing have finished; from then on, requests of older sessions are refused (here:
//! discarded, their connection is dead anyway). So a request of an old session still in the
//! network lands before the new Hello is answered or never. Requests carry the engine's epoch
//! and a replica refuses older epochs (there is one engine per run today, so this is only the
//! hook an engine restart will need).
//!
//! Requests execute concurrently on the disk, each for a random latency; the effect happens
//! when it completes. A process crash ends every session; a request executing at that moment
//! may have reached a prefix of its sectors. A node crash does the same and also loses part
//! of the volatile layer (see `disk.rs`), and the node comes back with a new boot id.

use std::collections::BTreeMap;

use hawser_core::{ClientOp, ReplicaFailure, ReplicaResult, SubId};
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

struct Exec {
    session: u64,
    sub: SubId,
    op: ClientOp,
}

/// What became of a request that reached the replica.
pub enum Arrival {
    /// Refused or dropped: a newer session exists, or the process is down.
    Discarded,
    /// Executing: `DiskDone(op)` is due after the disk latency.
    Started(u64),
}

/// A finished request's reply, for session `session`.
pub struct Done {
    pub session: u64,
    pub sub: SubId,
    pub result: ReplicaResult,
    /// The request changed the disk (a write that succeeded), over these bytes.
    pub wrote: Option<(u64, u64)>,
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
    session: Option<u64>,
    /// Hellos waiting for older sessions' executing requests, in arrival order.
    hellos: Vec<u64>,
    executing: BTreeMap<u64, Exec>,
    next_op: u64,
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
            session: None,
            hellos: Vec::new(),
            executing: BTreeMap::new(),
            next_op: 1,
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

    /// A request of `session` arrived.
    pub fn arrive(&mut self, session: u64, sub: SubId, op: ClientOp) -> Arrival {
        if !self.up || self.session != Some(session) || !self.hellos.is_empty() {
            return Arrival::Discarded;
        }
        let id = self.next_op;
        self.next_op += 1;
        self.executing.insert(id, Exec { session, sub, op });
        Arrival::Started(id)
    }

    /// Request `id` finished on the disk: apply it and build the reply.
    pub fn finish(&mut self, id: u64, rng: &mut StdRng) -> Option<Done> {
        let e = self.executing.remove(&id)?;
        let fail = match (self.fault, &e.op) {
            (DiskFault::Io(p), _) if rng.random_bool(p) => Some(ReplicaFailure::Io),
            (DiskFault::Full, ClientOp::Write { .. } | ClientOp::WriteZeroes { .. }) => {
                Some(ReplicaFailure::NoSpace)
            }
            _ => None,
        };
        if let Some(f) = fail {
            return Some(Done {
                session: e.session,
                sub: e.sub,
                result: Err(f),
                wrote: None,
            });
        }
        let (result, wrote) = match &e.op {
            ClientOp::Read { offset, len } => {
                (Ok(Some(self.disk.read(*offset, u64::from(*len)))), None)
            }
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
        Some(Done {
            session: e.session,
            sub: e.sub,
            result,
            wrote,
        })
    }

    /// The process (or its node) dies. Writes executing now reach a random prefix of their
    /// sectors. A node crash then loses part of the volatile layer (each volatile sector kept
    /// with probability `keep`) and returns the sectors that were volatile.
    pub fn crash(&mut self, node: bool, keep: f64, rng: &mut StdRng) -> Vec<u64> {
        for (_, e) in std::mem::take(&mut self.executing) {
            let (offset, len, data) = match &e.op {
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
