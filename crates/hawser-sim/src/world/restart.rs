//! Engine crashes and restarts, with crash recovery.
//!
//! A crash is a kill -9 of the engine's agent: the engine, its driver and its journal state
//! vanish; every client request in flight or waiting fails (the client may have written any
//! of them, sector by sector); the local replica, in the same process, dies too (writes
//! executing reach a prefix; its page cache survives). Messages the dead engine sent are still
//! in the network: a replica executes those that arrive before the next engine's Hello, whose
//! answer waits for them, and refuses the rest. Control-plane calls of the dead engine carry
//! its epoch and are refused once the next attach raised it.
//!
//! After a while a new engine starts, as `hawser-agent::volume_engine::start` does: the attach
//! raises the store's epoch; Hellos go to every replica the store calls in sync; then crash
//! recovery (`hawser_core::recovery_plan::Plan`, the agent's rules): the journals of the
//! reachable ones are read, the replicas are made equal over the union of their logs (and of
//! the dirty maps those journals give reachable ones) by copying from one source, local first;
//! what outdated and unreachable replicas lack is derived from the journals; then the engine
//! is built from the store's states and the first journal is committed.
//!
//! Checked at once: after recovery the reachable in-sync replicas are byte-identical. Any
//! difference left means a write reached some of them outside every log, which the activity
//! log's rule forbids.
//!
//! Simplifications: recovery's own reads, copies and flush happen at one instant (no fault
//! interleaves with them, and no new fault starts while an engine is down or starting); the
//! engine restarts on the same node (so the local replica, if any, is local again); the
//! engine's node does not lose power (a node crash of a replica it relies on is excluded, see
//! `may_crash_engine`).

use std::collections::BTreeSet;

use hawser_core::driver::links::Links;
use hawser_core::driver::recovery::{decide_with, Decision, Found, Member, Stored};
use hawser_core::{IoError, Plan};
use rand::Rng;

use super::{replica_id, ri, Conn, EngineState, Event, Phase, World};
use crate::check;
use crate::control::StoreState;
use crate::pattern::SECTOR;
use crate::replica::DiskFault;
use crate::Mutation;

/// A start that found no in-sync replica (or one with a full disk) is tried again after this.
const START_RETRY_US: u64 = 10_000;

impl World {
    /// An engine crash may come at any time, also while a replica has lost its power
    /// unnoticed: recovery's decision (`hawser_core::driver::recovery`, per-chunk sources,
    /// the refusal) must cope (docs/protocol.md, "Simulator runs").
    pub(super) fn may_crash_engine(&self) -> bool {
        self.jd.is_some() && self.engine_state == EngineState::Up
    }

    pub(super) fn crash_engine(&mut self) {
        trace!(self, "FAULT engine crash");
        if let Err(e) = check::journals_at_crash(self.resynced_now(), &self.replicas, &self.control)
        {
            return self.fail(e);
        }
        self.stats.engine_crashes += 1;
        let mut tags = self.client.outstanding_tags();
        if let Some(jd) = &self.jd {
            tags.extend(jd.waiting_tags());
        }
        tags.sort_unstable();
        tags.dedup();
        for tag in tags {
            if let Err(e) = self.client.complete(tag, &Err(IoError::ShutDown)) {
                return self.fail(e);
            }
        }
        for r in 0..self.p.replicas {
            self.copied_before[r] += self.engine.replica_view(ri(r)).copied_bytes;
            let d = &mut self.drivers[r];
            d.conn = Conn::Idle;
            // The next engine knows only the boot ids its start's Hellos report.
            d.start_boot = None;
            self.doomed[r] = None;
        }
        if self.p.local && self.replicas[0].up {
            self.replicas[0].crash(false, 1.0, &mut self.rng);
        }
        self.engine_state = EngineState::Down;
        self.engine_gen += 1;
        let jp = self.jd.as_ref().expect("checked").params;
        let d = self.rng.random_range(1_000..=jp.restart_us);
        self.schedule(d, Event::EngineStart);
    }

    /// Replicas in sync now because this engine resynced them, whose node has not lost power
    /// since: each holds every acknowledged write, and the journals must say so.
    fn resynced_now(&self) -> Vec<bool> {
        (0..self.p.replicas)
            .map(|r| {
                self.resynced[r]
                    && self.engine.membership(ri(r)) == hawser_core::Membership::InSync
                    && !self.volatile_lost[r]
            })
            .collect()
    }

    /// An attach: a new epoch, Hellos to the replicas the store calls in sync.
    pub(super) fn engine_start(&mut self) {
        self.control.epoch += 1;
        self.engine_epoch = self.control.epoch;
        trace!(self, "ENGINE START, epoch {}", self.engine_epoch);
        let pct = self.p.faults.engine_moves_pct;
        if self.p.local && pct > 0 && self.rng.random_range(0..100) < pct {
            // Attached on a node without a replica: the replica that was local is now one
            // like the others, on a node whose agent restarts in its own time.
            trace!(self, "  the engine moves to a node without a replica");
            self.stats.engine_moves += 1;
            self.p.local = false;
            self.net.local[0] = false;
            self.net.reliable[0] = self.phase != Phase::Random;
            if !self.replicas[0].up {
                let d = self.rng.random_range(1_000..=100_000);
                self.schedule(d, Event::Restart { r: 0, node: false });
            }
        }
        if self.p.local && !self.replicas[0].up {
            self.replicas[0].restart(None);
        }
        let mut pending = BTreeSet::new();
        for r in 0..self.p.replicas {
            if self.control.store[r] != StoreState::InSync {
                continue;
            }
            if self.p.local && r == 0 {
                let s = self.new_session();
                if self.replicas[0].hello(s, self.engine_epoch) {
                    let ready = self.replicas[0].ready_hellos();
                    assert_eq!(ready, vec![s], "the local replica just restarted");
                    self.drivers[0].conn = Conn::Open(s);
                    self.drivers[0].inc = self.replicas[0].incarnation;
                }
                continue;
            }
            pending.insert(r);
            self.connect(r);
        }
        self.engine_state = EngineState::Starting(pending);
        self.start_hello_settled(usize::MAX);
    }

    /// The Hello to replica `r` was answered or timed out (`usize::MAX`: none yet).
    pub(super) fn start_hello_settled(&mut self, r: usize) {
        let EngineState::Starting(pending) = &mut self.engine_state else {
            return;
        };
        pending.remove(&r);
        if pending.is_empty() {
            self.finish_start();
        }
    }

    fn start_failed(&mut self, why: &str) {
        trace!(self, "  engine start failed: {why}");
        for r in 0..self.p.replicas {
            self.drivers[r].conn = Conn::Idle;
            // The next attach is a new engine, as in the agent: it knows only the boot ids
            // its own Hellos report (a stale one here made a rebooted replica look not
            // rebooted, and promotable: seed 91112).
            self.drivers[r].start_boot = None;
        }
        self.engine_state = EngineState::Down;
        self.schedule(START_RETRY_US, Event::EngineStart);
    }

    fn finish_start(&mut self) {
        let n = self.p.replicas;
        let (size, chunk) = (self.p.size, self.p.engine.chunk_bytes);
        // What the attach finds of each replica; the decision is `hawser_core::driver`'s,
        // the one the agent runs.
        let members: Vec<Member> = (0..n)
            .map(|r| {
                let rep = &self.replicas[r];
                let stored = match self.control.store[r] {
                    StoreState::InSync => Stored::InSync,
                    StoreState::Outdated => Stored::Outdated {
                        blank: self.control.blank[r],
                    },
                    StoreState::Failed => Stored::Failed,
                };
                let found = match stored {
                    Stored::InSync if !matches!(self.drivers[r].conn, Conn::Open(_)) => {
                        Found::Unreachable
                    }
                    Stored::InSync if matches!(rep.fault, DiskFault::Io(_)) => Found::DiskError,
                    Stored::InSync => Found::Journal {
                        journal: rep.journal.clone(),
                        rebooted: rep.journal_boot != rep.boot,
                    },
                    _ => Found::NotAsked,
                };
                Member {
                    id: replica_id(r),
                    local: self.p.local && r == 0,
                    stored,
                    found,
                }
            })
            .collect();
        let rules = self.mutation.rules();
        let start = match decide_with(rules, self.engine_epoch, size, chunk, &members) {
            Decision::Start(s) => s,
            Decision::Refuse(why) => return self.start_failed(&why.to_string()),
        };
        let reach = start.sources.clone();
        if reach
            .iter()
            .any(|&r| self.replicas[r].fault != DiskFault::None)
        {
            // A copy to a full disk fails the start (a retry comes when it has room).
            return self.start_failed("a full disk on an in-sync replica");
        }
        trace!(
            self,
            "  recovery: reach {reach:?}, unreachable {:?}, reconcile {:?}",
            start.unreachable,
            start.plan.reconcile.runs()
        );
        let source_of: Vec<usize> = (0..start.plan.reconcile.chunks())
            .map(|c| reach[start.source_of(c)])
            .collect();
        trace!(self, "  recovery: source per chunk {source_of:?}");
        self.reconcile(&reach, &start.plan, &source_of);
        if self.failure.is_some() {
            return;
        }
        self.engine = start.engine(size, self.p.engine);
        let lacks: Vec<_> = (0..n)
            .map(|r| {
                let outdated = self.control.store[r] == StoreState::Outdated
                    && self.replicas[r].fault == DiskFault::None;
                outdated.then(|| self.engine.dirty(ri(r)))
            })
            .collect();
        if let Err(e) = check::outdated_lacks(&self.client.model, &self.replicas, &lacks) {
            return self.fail(e);
        }
        self.engine_state = EngineState::Up;
        let boots = self.drivers.iter().map(|d| d.start_boot).collect();
        self.links = Links::new(super::LINK_PARAMS, boots, self.now);
        self.seen_membership = vec![None; n];
        self.dirty_seen = vec![0; n];
        self.reset_journal(self.engine_epoch, start.plan.next_seq);
        self.observe();
        for &r in &start.broken {
            trace!(self, "  recovery: r{} failed its journal read", r.0);
        }
        self.step(|e, out| start.begin(e, out));
        self.start_commit(0);
    }

    /// Make the reachable in-sync replicas equal over `plan.reconcile`, copying each chunk
    /// `c` from replica `source_of[c]` (the driver's choice), then flush them all; then check
    /// they are identical everywhere.
    fn reconcile(&mut self, reach: &[usize], plan: &Plan, source_of: &[usize]) {
        let chunk = self.p.engine.chunk_bytes;
        for c in 0..plan.reconcile.chunks() {
            if !plan.reconcile.is_set(c) {
                continue;
            }
            let src = source_of[usize::try_from(c).expect("few chunks")];
            let from = c * chunk;
            let to = (from + chunk).min(self.p.size);
            self.stats.recovery_compared += to - from;
            for &r in reach.iter().filter(|&&r| r != src) {
                for s in from / SECTOR..to / SECTOR {
                    let (a, b) = (s * SECTOR, (s + 1) * SECTOR);
                    let data = self.replicas[src].disk.read(a, SECTOR);
                    let copies = self.mutation != Mutation::RecoveryCopiesNothing;
                    if copies && self.replicas[r].disk.read(a, SECTOR) != data {
                        self.replicas[r].disk.write(a, b - a, Some(&data), false);
                        self.stats.recovery_copied += SECTOR;
                    }
                }
            }
        }
        // Every reachable replica is flushed, written to or not: the dead engine's
        // acknowledged writes may still be unflushed on any of them (inside its log), and the
        // new engine does not know it, so a later power loss would lose them unnoticed.
        for &r in reach {
            self.replicas[r].disk.flush();
        }
        let src = reach[0];
        for &r in &reach[1..] {
            let (x, y) = (&self.replicas[src].disk, &self.replicas[r].disk);
            let differs = (0..self.p.size / SECTOR)
                .find(|&s| x.read(s * SECTOR, SECTOR) != y.read(s * SECTOR, SECTOR));
            if let Some(s) = differs {
                let chunk_of = s * SECTOR / chunk;
                return self.fail(format!(
                    "after crash recovery, in-sync replicas {src} and {r} differ at sector {s} \
                     (chunk {chunk_of}), outside every journal's log"
                ));
            }
        }
    }
}
