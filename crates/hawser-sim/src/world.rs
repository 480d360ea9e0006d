//! The event loop: one engine, its driver, N replicas, the network, the control plane and the
//! client, advanced one event at a time in simulated time. Every random choice comes from one
//! `StdRng` seeded by the run's seed, and nothing depends on iteration order of hash maps, so a
//! seed replays exactly.
//!
//! The driver's rules are `hawser_core::driver`'s, the code the agent runs: the journal keeper
//! (`world/journal.rs` carries out its acts), crash recovery's decision (`world/restart.rs`),
//! and the sessions policy (`driver::links`: when to reconnect a replica, whether its node
//! rebooted, when to flush in the background). This file carries them out: it turns the
//! engine's commands into messages and control-plane calls, answers every `Send` exactly once
//! (a reply, or `on_replica_lost` for the whole session), and opens the sessions `Links` says
//! are due.
//!
//! A run has two phases. In the random phase the client runs its workload and faults arrive at
//! random times (`Fault`). Then everything heals: crashed replicas restart, partitions and the
//! control plane come back, no new fault or request starts; the run continues until the volume
//! is quiet, reads the whole volume back through the engine, and runs the final checks.
//!
//! Fault rules that keep the checks honest:
//! - A node crash (power loss) may drop writes a replica acknowledged but had not flushed; on
//!   the only in-sync copy that would legitimately lose acknowledged data (the client did not
//!   flush; only other copies protect it). So a node is crashed only while another replica is
//!   in sync in the engine's view with no crash of its own since it last reconnected and no
//!   disk fault.
//! - A disk error (`DiskFault::Io`) fails every request of that replica from then on, so it
//!   never holds a write the others lack; it is injected only while another good in-sync copy
//!   exists. The replica stays failed and is left out of "ends in sync".
//! - The good copy a node crash or disk error relies on must also survive: it is not already
//!   on its way out when the fault is injected, and no fault takes away the last healthy
//!   replica the store calls in-sync while an unhealthy one could outdate it
//!   (`World::may_take_away`).
//! - The local replica (when there is one) lives in the engine's process: it has no network
//!   faults and crashes only with the engine.
//!
//! Runs with engine crashes (`FaultMix::engine_crash`) also run the driver's journal keeper
//! (`hawser_core::driver::journal`, carried out by `world/journal.rs`): writes wait for their
//! extents to be committed to the activity log on every replica they go to, returning
//! replicas join one at a time, and resyncs are saved as the agent saves them. An engine
//! crash (`world/restart.rs`) kills the engine and its local replica's process; a new engine
//! then starts in a new epoch and runs crash recovery before it serves I/O.

use std::collections::BTreeMap;

use bytes::Bytes;
use hawser_core::driver::links::{LinkParams, Links};
use hawser_core::{
    ChunkMap, ClientOp, Command, Engine, Initial, IoError, Membership, Quorum, ReplicaFailure,
    ReplicaIdx, ReplicaResult, ReplicaSpec, SubId, Tag,
};
use hawser_wire::journal::{Journal, OutReplica};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::check;
use crate::client::{Client, Kind};
use crate::config::*;
use crate::control::{Call, Control, Outcome, StoreState};
use crate::net::{Fate, Net};
use crate::replica::{Arrival, DiskFault, Finished, Op, Replica};
use crate::{Mutation, RunOptions};

/// The sessions policy's tunables in simulated microseconds (`config.rs`).
pub(crate) const LINK_PARAMS: LinkParams = LinkParams {
    backoff_min: RECONNECT_BACKOFF_MIN_US,
    backoff_max: RECONNECT_BACKOFF_MAX_US,
    flush_interval: BACKGROUND_FLUSH_US,
};

#[derive(Clone, Debug)]
enum Event {
    /// The client may submit a request.
    ClientArrival,
    /// The driver's maintenance round.
    DriverTick,
    /// A request (of the engine, or of the driver's journal) arrives at replica `r`.
    Request {
        r: usize,
        inc: u64,
        session: u64,
        op: Op,
    },
    /// Replica `r` finished executing request `id`.
    DiskDone {
        r: usize,
        inc: u64,
        id: u64,
    },
    /// A reply arrives at the engine's driver.
    Reply {
        r: usize,
        session: u64,
        sub: SubId,
        result: ReplicaResult,
    },
    /// The driver had no session for a send: it fails at once (if engine `gen` still runs).
    NoSession {
        sub: SubId,
        gen: u64,
    },
    /// The answer to a journal operation arrives at the driver.
    JournalReply {
        r: usize,
        session: u64,
        jid: u64,
        result: Result<Option<Journal>, ReplicaFailure>,
    },
    Hello {
        r: usize,
        inc: u64,
        session: u64,
    },
    HelloOk {
        r: usize,
        inc: u64,
        session: u64,
        boot: u64,
    },
    ConnectTimeout {
        r: usize,
        session: u64,
    },
    SessionTimeout {
        r: usize,
        session: u64,
    },
    /// The driver finished closing a session the engine asked to close.
    ReportLost {
        r: usize,
        session: u64,
    },
    /// A control-plane call of the engine of an epoch reaches the controller (or finds it
    /// down).
    Call(Call, u64),
    /// Its answer reaches the engine's driver.
    Answer(Call, Outcome, u64),
    /// A new engine starts (an attach after the last one crashed).
    EngineStart,
    Fault,
    Restart {
        r: usize,
        node: bool,
    },
    HealPartition {
        r: usize,
    },
    ControlUp,
    DiskFree {
        r: usize,
    },
    EndRandomPhase,
    /// `FaultMix::early_engine_crash`: the first engine crashes now.
    EarlyEngineCrash,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conn {
    Idle,
    Connecting(u64),
    Open(u64),
    /// Hello answered; the driver is bringing the replica into the journal's set
    /// (`world/journal.rs`) before it tells the engine.
    Joining(u64),
    /// The engine asked to disconnect; `ReportLost` is due.
    Closing(u64),
}

struct Driver {
    conn: Conn,
    /// Incarnation of the replica process the session talks to.
    inc: u64,
    /// The boot id its node reported to a starting engine's Hello (`Links::new`).
    start_boot: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Random,
    Heal,
    ReadBack,
    Done,
}

/// Counters printed with a run's summary.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub events: u64,
    pub faults: u64,
    pub sim_us: u64,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub reads_checked: u64,
    /// Per replica: bytes resync copied to it, bytes of chunks the engine marked dirty, and
    /// bytes of the distinct chunks acknowledged writes touched while it was not receiving
    /// writes, summed over its outages (what a resync should copy, reboots aside).
    pub copied: Vec<u64>,
    pub dirtied: Vec<u64>,
    pub missed: Vec<u64>,
    /// `Disconnect` commands for a session already closing.
    pub repeated_disconnects: u64,
    /// Engine crashes, and what the recoveries after them compared and copied.
    pub engine_crashes: u64,
    /// Engine starts on a node without a replica.
    pub engine_moves: u64,
    pub recovery_compared: u64,
    pub recovery_copied: u64,
    /// Resync saves the journal keeper started (a flush, then a commit of the point).
    pub resync_saves: u64,
    /// Blocks rotted by faults (marks set, some on blocks already marked), and the blocks
    /// the engine reported repaired and unrecoverable (`Command::Corruption`).
    pub corrupted: u64,
    pub corrupt_repaired: u64,
    pub corrupt_unrecoverable: u64,
    /// Scrub passes started and completed (`Command::ScrubDone`).
    pub scrubs_started: u64,
    pub scrubs_done: u64,
    /// Online growths of the volume (`world/grow.rs`).
    pub grows: u64,
}

/// Whether the engine runs.
#[derive(Clone, Debug, PartialEq, Eq)]
enum EngineState {
    Up,
    /// Crashed; an `EngineStart` is due.
    Down,
    /// Starting: waiting for the Hellos to these replicas to be answered or to time out.
    Starting(std::collections::BTreeSet<usize>),
}

pub struct World {
    rng: StdRng,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    p: Params,
    engine: Engine,
    out: Vec<Command>,
    drivers: Vec<Driver>,
    replicas: Vec<Replica>,
    net: Net,
    control: Control,
    client: Client,
    phase: Phase,
    next_session: u64,
    next_boot: u64,
    /// The engine's sessions policy (`hawser_core::driver::links`), new with every engine.
    links: Links,
    heal_started: u64,
    /// The scrub pass that corruption runs drive to completion while healing (`scrub.rs`).
    heal_scrub: HealScrub,
    /// Node crashed while in sync (or about to be) in the store, not repaired since: may lack
    /// unflushed acknowledged writes, so exempt from the checks.
    volatile_lost: Vec<bool>,
    /// Since its node crash, the engine has had no session with replica r that began before
    /// the crash (it noticed the loss), so its next session reports the new boot id.
    lost_seen_out: Vec<bool>,
    /// Chunks written (and acknowledged) while each replica was not receiving writes, since
    /// it was last in sync.
    owed: Vec<std::collections::BTreeSet<u64>>,
    /// Memberships last seen.
    seen_membership: Vec<Option<Membership>>,
    /// In sync because this engine resynced it (not taken as in sync at its start).
    resynced: Vec<bool>,
    /// The session of each replica that is known to be broken (its timeout is pending).
    doomed: Vec<Option<u64>>,
    /// Given a disk error: failed for good, left out of "ends in sync".
    disk_failed: Vec<bool>,
    /// The engine's dirty bytes per replica after the last step, and their increases.
    dirty_seen: Vec<u64>,
    stats: Stats,
    trace: Option<Vec<String>>,
    failure: Option<String>,
    read_back_next: u64,
    /// The driver's journal, when the run models it (`FaultMix::engine_crash` > 0).
    jd: Option<journal::JournalDriver>,
    engine_state: EngineState,
    /// Engines started so far (commands of older ones are dropped) and the current one's epoch.
    engine_gen: u64,
    engine_epoch: u64,
    /// Bytes resync copied per replica under engines that crashed since.
    copied_before: Vec<u64>,
    mutation: Mutation,
}

macro_rules! trace {
    ($w:expr, $($arg:tt)*) => {
        if $w.trace.is_some() {
            let line = format!("{:>9}us {}", $w.now, format!($($arg)*));
            if let Some(t) = &mut $w.trace {
                t.push(line);
            }
        }
    };
}

mod describe;
mod faults;
mod grow;
mod heal;
mod journal;
mod restart;
mod scrub;
mod sessions;

use describe::{describe, describe_command, describe_op};
use scrub::HealScrub;

/// The id a replica has in journals.
fn replica_id(r: usize) -> String {
    format!("r{r}")
}

fn ri(r: usize) -> ReplicaIdx {
    ReplicaIdx(u8::try_from(r).expect("few replicas"))
}

impl World {
    pub fn new(seed: u64, opts: RunOptions, trace: bool) -> World {
        let (faults, mutation) = (opts.faults, opts.mutation);
        let mut rng = StdRng::seed_from_u64(seed);
        let p = Params::draw(&mut rng, faults);
        let n = p.replicas;
        let mut specs: Vec<ReplicaSpec> = (0..n)
            .map(|r| ReplicaSpec::in_sync(p.local && r == 0))
            .collect();
        let mut store = vec![StoreState::InSync; n];
        let mut replicas: Vec<Replica> =
            (0..n).map(|r| Replica::new(p.size, r as u64 + 1)).collect();
        if let Some(o) = &p.initial_outdated {
            specs[o.replica].initial = Initial::Outdated {
                dirty: o.dirty.clone(),
            };
            store[o.replica] = StoreState::Outdated;
            // It holds junk wherever it is out of date.
            let chunk = p.engine.chunk_bytes;
            let runs = match &o.dirty {
                Some(d) => d.runs(),
                None => vec![(0, p.size.div_ceil(chunk))],
            };
            for (i, (first, end)) in runs.into_iter().enumerate() {
                let (a, b) = (first * chunk, (end * chunk).min(p.size));
                replicas[o.replica]
                    .disk
                    .scribble(a, b - a, crate::pattern::JUNK_BASE + i as u64);
            }
        }
        let engine = Engine::with_config(p.size, &specs, p.engine);
        let local: Vec<bool> = (0..n).map(|r| p.local && r == 0).collect();
        let mut client = Client::new(p.size, p.work);
        client.model.ignores_zeroes = mutation == Mutation::ModelIgnoresZeroes;
        let broken = match mutation {
            Mutation::StoreForgetsOutdates => crate::control::Broken::ForgetsOutdates,
            _ => crate::control::Broken::No,
        };
        let dirty_seen: Vec<u64> = (0..n)
            .map(|r| engine.replica_view(ri(r)).dirty_bytes)
            .collect();
        // The first engine created the replicas: it knows every node's boot id.
        let boots = replicas.iter().map(|r| Some(r.boot)).collect();
        let mut w = World {
            rng,
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            engine,
            out: Vec::new(),
            drivers: Vec::new(),
            replicas,
            net: Net::new(p.net, local),
            control: Control::new(store, broken),
            client,
            phase: Phase::Random,
            next_session: 1,
            next_boot: 1000,
            links: Links::new(LINK_PARAMS, boots, 0),
            heal_started: 0,
            heal_scrub: HealScrub::NotStarted,
            volatile_lost: vec![false; n],
            doomed: vec![None; n],
            seen_membership: vec![None; n],
            resynced: vec![false; n],
            lost_seen_out: vec![false; n],
            owed: vec![Default::default(); n],
            disk_failed: vec![false; n],
            stats: Stats {
                copied: vec![0; n],
                dirtied: dirty_seen.clone(),
                missed: vec![0; n],
                ..Stats::default()
            },
            dirty_seen,
            trace: trace.then(Vec::new),
            failure: None,
            read_back_next: 0,
            jd: None,
            engine_state: EngineState::Up,
            engine_gen: 1,
            engine_epoch: 1,
            copied_before: vec![0; n],
            mutation,
            p,
        };
        if faults.engine_crash > 0 {
            let mut jp = JournalParams::draw(seed, w.p.engine.chunk_bytes);
            jp.in_sync_commit = mutation != Mutation::MarkWithoutCommit;
            trace!(w, "journal {jp:?}");
            w.jd = Some(journal::JournalDriver::new(&w.p, jp, 1, 1));
            // Every replica was created with an empty journal; the outdated one is said out.
            // One lacking everything is a blank replica (added to the volume by self-healing,
            // `EngineReplica::blank`): no journal names it, and it has none of its own.
            let blank = w.p.initial_outdated.as_ref().filter(|o| o.dirty.is_none());
            let out: Vec<OutReplica> =
                w.p.initial_outdated
                    .iter()
                    .filter(|o| o.dirty.is_some())
                    .map(|o| OutReplica {
                        replica: replica_id(o.replica),
                        dirty: o.dirty.as_ref().map(ChunkMap::runs),
                        lost: false,
                    })
                    .collect();
            let blank = blank.map(|o| o.replica);
            if let Some(b) = blank {
                w.control.blank[b] = true;
            }
            for (r, rep) in w.replicas.iter_mut().enumerate() {
                if Some(r) == blank {
                    rep.journal = None;
                    continue;
                }
                rep.journal = Some(Journal {
                    epoch: 0,
                    seq: 0,
                    size: w.p.size,
                    extent_bytes: jp.extent_bytes,
                    chunk_bytes: w.p.engine.chunk_bytes,
                    active: Vec::new(),
                    out: out.clone(),
                });
            }
        }
        if mutation == Mutation::FlushForgets {
            for rep in &mut w.replicas {
                rep.forget_flushes = true;
            }
        }
        // The engine takes in-sync replicas as connected: open their sessions.
        for r in 0..n {
            let mut d = Driver {
                conn: Conn::Idle,
                inc: w.replicas[r].incarnation,
                start_boot: None,
            };
            if w.engine.replica_view(ri(r)).connected {
                let s = w.new_session();
                assert!(w.replicas[r].hello(s, w.control.epoch));
                assert_eq!(w.replicas[r].ready_hellos(), vec![s]);
                d.conn = Conn::Open(s);
            }
            w.drivers.push(d);
        }
        trace!(w, "params {:?}", w.p);
        if w.jd.is_some() {
            w.start_commit(0);
        }
        w.schedule(0, Event::ClientArrival);
        w.schedule(0, Event::DriverTick);
        let gap = w.fault_gap();
        w.schedule(gap, Event::Fault);
        w.schedule(w.p.random_phase_us, Event::EndRandomPhase);
        if faults.early_engine_crash && w.jd.is_some() {
            let at = w.rng.random_range(0..=2_000);
            w.schedule(at, Event::EarlyEngineCrash);
        }
        w
    }

    pub fn params(&self) -> &Params {
        &self.p
    }

    pub fn trace_lines(&self) -> &[String] {
        self.trace.as_deref().unwrap_or(&[])
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    fn new_session(&mut self) -> u64 {
        self.next_session += 1;
        self.next_session
    }

    fn schedule(&mut self, delay: u64, ev: Event) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn fail(&mut self, msg: String) {
        trace!(self, "FAIL {msg}");
        if self.failure.is_none() {
            self.failure = Some(msg);
        }
    }

    // The value is clamped to [0, 1e9] first, so the cast cannot truncate.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn fault_gap(&mut self) -> u64 {
        // Exponential, mean `fault_gap_us`.
        let u: f64 = self.rng.random_range(1e-9..1.0);
        let mean = self.p.fault_gap_us as f64;
        (-u.ln() * mean).clamp(0.0, 1e9) as u64
    }

    /// Run to the end. `Err` is a violation (or a hang), as one sentence.
    pub fn run(&mut self) -> Result<(), String> {
        while self.phase != Phase::Done {
            let Some(((t, _), ev)) = self.queue.pop_first() else {
                self.fail("the event queue ran dry".into());
                break;
            };
            self.now = t;
            self.stats.events += 1;
            if self.stats.events > MAX_EVENTS {
                self.fail(format!("more than {MAX_EVENTS} events: livelock?"));
            }
            self.event(ev);
            if self.failure.is_some() {
                break;
            }
        }
        self.stats.sim_us = self.now;
        let c = &self.client.stats;
        self.stats.writes_ok = c.writes_ok;
        self.stats.writes_failed = c.writes_failed;
        self.stats.reads_checked = c.reads_checked;
        for r in 0..self.p.replicas {
            self.stats.copied[r] =
                self.copied_before[r] + self.engine.replica_view(ri(r)).copied_bytes;
        }
        match self.failure.take() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    fn event(&mut self, ev: Event) {
        let noise = matches!(ev, Event::DriverTick | Event::ClientArrival | Event::Fault);
        if self.trace.is_some() && !noise {
            let s = describe(&ev);
            trace!(self, "{s}");
        }
        match ev {
            Event::ClientArrival => self.client_arrival(),
            Event::DriverTick => self.driver_tick(),
            Event::Request {
                r,
                inc,
                session,
                op,
            } => self.request_arrives(r, inc, session, op),
            Event::DiskDone { r, inc, id } => self.disk_done(r, inc, id),
            Event::Reply {
                r,
                session,
                sub,
                result,
            } => self.reply_arrives(r, session, sub, result),
            Event::NoSession { sub, gen } => {
                if gen == self.engine_gen && self.engine_state == EngineState::Up {
                    self.step(|e, out| e.on_reply(sub, Err(ReplicaFailure::Lost), out));
                }
            }
            Event::JournalReply {
                r,
                session,
                jid,
                result,
            } => self.journal_reply(r, session, jid, result),
            Event::Hello { r, inc, session } => self.hello_arrives(r, inc, session),
            Event::HelloOk {
                r,
                inc,
                session,
                boot,
            } => self.hello_ok(r, inc, session, boot),
            Event::ConnectTimeout { r, session } => {
                if self.drivers[r].conn == Conn::Connecting(session) {
                    self.connect_failed(r);
                    self.start_hello_settled(r);
                }
            }
            Event::SessionTimeout { r, session } => match self.drivers[r].conn {
                Conn::Open(s) if s == session => self.session_closed(r),
                Conn::Joining(s) if s == session => self.join_failed(r),
                _ => {}
            },
            Event::ReportLost { r, session } => {
                if self.drivers[r].conn == Conn::Closing(session) {
                    self.session_closed(r);
                }
            }
            Event::Call(call, epoch) => self.call_arrives(call, epoch),
            Event::Answer(call, outcome, epoch) => {
                self.control.in_flight -= 1;
                if epoch == self.engine_epoch && self.engine_state == EngineState::Up {
                    self.answer(call, outcome);
                }
            }
            Event::EngineStart => self.engine_start(),
            Event::Fault => self.fault(),
            Event::Restart { r, node } => {
                let boot = node.then(|| {
                    self.next_boot += 1;
                    self.next_boot
                });
                self.replicas[r].restart(boot);
            }
            Event::HealPartition { r } => self.net.partitioned[r] = false,
            Event::ControlUp => self.control.down = false,
            Event::DiskFree { r } => {
                if self.replicas[r].fault == DiskFault::Full {
                    self.replicas[r].fault = DiskFault::None;
                }
            }
            Event::EndRandomPhase => self.begin_heal(),
            Event::EarlyEngineCrash => {
                if self.engine_state == EngineState::Up && self.phase == Phase::Random {
                    self.stats.faults += 1;
                    self.crash_engine();
                }
            }
        }
    }

    /// The driver learnt that the open session of replica `r` is closed: the engine
    /// loses the replica, and a journal commit waiting for it stops waiting.
    fn session_closed(&mut self, r: usize) {
        self.drivers[r].conn = Conn::Idle;
        if self.engine_state == EngineState::Up {
            self.step(|e, out| e.on_replica_lost(ri(r), out));
            self.journal_replica_gone(r);
        }
    }

    // ---- the engine and its commands ----

    fn step(&mut self, f: impl FnOnce(&mut Engine, &mut Vec<Command>)) {
        let mut out = std::mem::take(&mut self.out);
        f(&mut self.engine, &mut out);
        for c in out.drain(..) {
            self.command(c);
        }
        self.out = out;
        self.observe();
    }

    /// After every engine step: account dirty bytes, trace membership changes.
    fn observe(&mut self) {
        for r in 0..self.p.replicas {
            let m = self.engine.membership(ri(r));
            // Made in sync by this engine (resynced or confirmed), not merely taken as in sync
            // from the store by a starting one.
            let mut repaired = false;
            if self.seen_membership[r] != Some(m) {
                let was = self.seen_membership[r];
                repaired = m == Membership::InSync && was.is_some();
                self.seen_membership[r] = Some(m);
                self.resynced[r] = repaired;
                trace!(self, "  r{r} is now {m:?}");
                if m == Membership::InSync && was.is_some() {
                    self.became_in_sync(r);
                    let owed = std::mem::take(&mut self.owed[r]);
                    self.stats.missed[r] += owed.len() as u64 * self.p.engine.chunk_bytes;
                }
            }
            if self.volatile_lost[r] {
                // Not "not in sync": a syncing or marking replica may have crashed unnoticed.
                if !self.engine.replica_view(ri(r)).connected {
                    self.lost_seen_out[r] = true;
                }
                let outdated = self.control.store[r] != StoreState::InSync
                    && !matches!(m, Membership::InSync | Membership::Marking);
                if self.lost_seen_out[r] && (outdated || repaired) {
                    self.volatile_lost[r] = false;
                }
            }
            let d = self.engine.replica_view(ri(r)).dirty_bytes;
            if self.trace.is_some() && d != self.dirty_seen[r] {
                let runs = self.engine.dirty(ri(r)).runs();
                trace!(self, "  r{r} dirty chunks {runs:?}");
            }
            if d > self.dirty_seen[r] {
                self.stats.dirtied[r] += d - self.dirty_seen[r];
            }
            self.dirty_seen[r] = d;
        }
    }

    /// The engine made `r` in sync (after a resync, or a confirmed mark): it must hold every
    /// acknowledged write.
    fn became_in_sync(&mut self, r: usize) {
        if self.volatile_lost[r] && !self.lost_seen_out[r] {
            return; // its crash is not known to the engine yet
        }
        if let Err(e) = check::holds_all(&self.client.model, &self.replicas[r]) {
            self.fail(format!(
                "the engine made replica {r} in sync while it lacks an acknowledged write: {e}"
            ));
        }
    }

    fn command(&mut self, c: Command) {
        if self.trace.is_some() {
            let s = describe_command(&c);
            trace!(self, "  engine: {s}");
        }
        match c {
            Command::Send {
                replica,
                sub,
                op,
                background: _,
            } => self.send(usize::from(replica.0), Op::Client(sub, op)),
            Command::Complete { tag, result } => self.completed(tag, result),
            Command::Outdate { replica, failed } => self.call(Call::Outdate {
                r: usize::from(replica.0),
                failed,
            }),
            // With the journal, the keeper holds it until a journal says the replica lacks
            // nothing (its `Act::MarkInSync`).
            Command::MarkInSync { replica } if self.jd.is_some() => {
                self.keep(|k, e, acts| k.resynced(e, replica, acts))
            }
            Command::MarkInSync { replica } => self.call(Call::Mark {
                r: usize::from(replica.0),
            }),
            Command::Disconnect { replica } => {
                let r = usize::from(replica.0);
                match self.drivers[r].conn {
                    Conn::Open(_) => self.disconnect(r),
                    // The engine repeats Disconnect on every leave while the session is
                    // still closing; like the agent's remote driver, ignore the repeats.
                    Conn::Closing(_) => self.stats.repeated_disconnects += 1,
                    other => self.fail(format!(
                        "engine asked to disconnect replica {r}, whose session is {other:?}"
                    )),
                }
            }
            Command::Fenced => {
                self.fail("the engine fenced itself, but no other engine exists".into())
            }
            Command::Corruption {
                blocks, repaired, ..
            } => {
                if repaired {
                    self.stats.corrupt_repaired += u64::from(blocks);
                } else {
                    self.stats.corrupt_unrecoverable += u64::from(blocks);
                }
            }
            Command::ScrubDone { .. } => self.scrub_done(),
        }
    }

    /// Close the open session of replica `r` (the engine, or a failed journal commit, asked).
    fn disconnect(&mut self, r: usize) {
        if let Conn::Open(s) = self.drivers[r].conn {
            self.drivers[r].conn = Conn::Closing(s);
            let d = self.rng.random_range(0..=100);
            self.schedule(d, Event::ReportLost { r, session: s });
        }
    }

    fn send(&mut self, r: usize, op: Op) {
        let s = match (self.drivers[r].conn, &op) {
            (Conn::Open(s), _) => s,
            (Conn::Joining(s), Op::PutJournal(..) | Op::GetJournal(_)) => s,
            (Conn::Closing(_), Op::Client(sub, _)) => {
                let (sub, gen) = (*sub, self.engine_gen);
                self.schedule(0, Event::NoSession { sub, gen });
                return;
            }
            (other, _) => {
                self.fail(format!(
                    "driver sent {op:?} to replica {r}, whose session is {other:?}"
                ));
                return;
            }
        };
        let inc = self.drivers[r].inc;
        let may_lose = self.may_take_away(r);
        match self
            .net
            .fate(&mut self.rng, r, true, may_lose, SESSION_TIMEOUT_US)
        {
            Fate::Deliver(d) => self.schedule(
                d,
                Event::Request {
                    r,
                    inc,
                    session: s,
                    op,
                },
            ),
            Fate::Lost => self.session_breaks(r, s, SESSION_TIMEOUT_US),
            Fate::Late(d) => {
                self.session_breaks(r, s, SESSION_TIMEOUT_US);
                self.schedule(
                    d,
                    Event::Request {
                        r,
                        inc,
                        session: s,
                        op,
                    },
                );
            }
        }
    }

    fn completed(&mut self, tag: Tag, result: Result<Option<Bytes>, IoError>) {
        self.journal_completed(tag, result.is_ok());
        let c = match self.client.complete(tag, &result) {
            Ok(c) => c,
            Err(e) => return self.fail(e),
        };
        let modifying = matches!(c.kind, Kind::Write | Kind::Zero);
        if modifying && c.ok {
            let chunk = self.p.engine.chunk_bytes;
            let (first, end) = (c.offset / chunk, (c.offset + c.len).div_ceil(chunk));
            for r in 0..self.p.replicas {
                let m = self.engine.membership(ri(r));
                if !matches!(
                    m,
                    Membership::InSync | Membership::Syncing | Membership::Marking
                ) {
                    for k in first..end {
                        self.owed[r].insert(k);
                    }
                }
            }
            if let Err(e) = check::acked(
                &self.client.model,
                &self.control,
                &self.replicas,
                &self.volatile_lost,
                c.offset,
                c.len,
            ) {
                self.fail(e);
            }
        }
        if c.kind == Kind::Read && !c.ok && self.phase == Phase::ReadBack {
            self.read_back_failed(c.offset, c.len);
        }
        if c.kind == Kind::Flush && c.ok {
            if let Err(e) = check::flushed(
                &self.client.model,
                &self.control,
                &self.replicas,
                &self.volatile_lost,
                c.inv,
            ) {
                self.fail(e);
            }
        }
    }

    // ---- client and driver ----

    fn client_arrival(&mut self) {
        if self.phase != Phase::Random {
            return;
        }
        if self.client.depth() < self.p.work.qd && self.engine_state == EngineState::Up {
            let (kind, offset, len, fua) = self.client.random_op(&mut self.rng);
            self.submit(kind, offset, len, fua, false);
        }
        let gap = self.rng.random_range(0..=self.p.client_gap_us);
        self.schedule(gap, Event::ClientArrival);
    }

    fn submit(&mut self, kind: Kind, offset: u64, len: u64, fua: bool, background: bool) {
        let (tag, op) = self.client.begin(kind, offset, len, fua, background);
        trace!(self, "  client submits {tag}: {}", describe_op(&op));
        if self.jd.is_some() {
            self.submit_journaled(tag, op);
        } else {
            self.step(|e, out| e.submit(tag, op, out));
        }
    }

    // ---- replicas ----

    fn request_arrives(&mut self, r: usize, inc: u64, session: u64, op: Op) {
        if self.net.partitioned[r] {
            self.session_breaks(r, session, SESSION_TIMEOUT_US);
            return;
        }
        let rep = &mut self.replicas[r];
        let latency = match &op {
            // A journal put is a write and an fdatasync.
            Op::Client(_, ClientOp::Flush) | Op::PutJournal(..) => self.p.flush_latency_us,
            _ => self.p.disk_latency_us,
        };
        let arrival = if rep.incarnation == inc && rep.up {
            rep.arrive(session, op)
        } else {
            Arrival::Discarded // the process that had this session is gone
        };
        match arrival {
            Arrival::Started(id) => {
                let d = self.rng.random_range(latency.0..=latency.1);
                self.schedule(d, Event::DiskDone { r, inc, id });
            }
            Arrival::Discarded => {
                // Reset by the new process, or refused by a newer session: either way the
                // connection closes and the driver hears of it.
                let d = self.net.delay(&mut self.rng, r);
                self.session_breaks(r, session, d);
            }
        }
    }

    fn disk_done(&mut self, r: usize, inc: u64, id: u64) {
        if self.replicas[r].incarnation != inc {
            return;
        }
        let Some(done) = self.replicas[r].finish(id, &mut self.rng) else {
            return;
        };
        self.answer_hellos(r);
        let may_lose = self.may_take_away(r);
        match self
            .net
            .fate(&mut self.rng, r, false, may_lose, SESSION_TIMEOUT_US)
        {
            Fate::Deliver(d) => {
                let ev = match done.outcome {
                    Finished::Client { sub, result, .. } => Event::Reply {
                        r,
                        session: done.session,
                        sub,
                        result,
                    },
                    Finished::Journal { jid, result } => Event::JournalReply {
                        r,
                        session: done.session,
                        jid,
                        result,
                    },
                };
                if self.net.duplicate(&mut self.rng, r) {
                    let d2 = d + self.net.delay(&mut self.rng, r);
                    self.schedule(d2, ev.clone());
                }
                self.schedule(d, ev);
            }
            Fate::Lost | Fate::Late(_) => self.session_breaks(r, done.session, SESSION_TIMEOUT_US),
        }
    }

    fn reply_arrives(&mut self, r: usize, session: u64, sub: SubId, result: ReplicaResult) {
        if self.net.partitioned[r] {
            self.session_breaks(r, session, SESSION_TIMEOUT_US);
            return;
        }
        if self.drivers[r].conn == Conn::Open(session) && self.engine_state == EngineState::Up {
            self.step(|e, out| e.on_reply(sub, result, out));
        }
    }

    // ---- control plane ----

    fn call(&mut self, call: Call) {
        self.control.in_flight += 1;
        let d = self.rng.random_range(1..=self.p.control_delay_us);
        self.schedule(d, Event::Call(call, self.engine_epoch));
    }

    fn call_arrives(&mut self, call: Call, epoch: u64) {
        if self.control.down {
            self.schedule(CONTROL_RETRY_US, Event::Call(call, epoch));
            return;
        }
        let before = self.control.store.clone();
        let outcome = self.control.apply_at(call, epoch);
        trace!(self, "  store: {:?} -> {:?}", before, self.control.store);
        if let Call::Mark { r } = call {
            if before[r] != StoreState::InSync
                && self.control.store[r] == StoreState::InSync
                && !self.volatile_lost[r]
            {
                if let Err(e) = check::marked(&self.client.model, &self.replicas[r], r) {
                    self.fail(e);
                }
            }
        }
        let lost = self.phase == Phase::Random && self.rng.random_bool(self.p.control_answer_loss);
        if outcome == Outcome::Retry || lost {
            self.schedule(CONTROL_RETRY_US, Event::Call(call, epoch));
            return;
        }
        let d = self.rng.random_range(1..=self.p.control_delay_us);
        self.schedule(d, Event::Answer(call, outcome, epoch));
    }

    fn answer(&mut self, call: Call, outcome: Outcome) {
        match (call, outcome) {
            (Call::Outdate { r, .. }, Outcome::Done) => {
                self.step(|e, out| e.on_outdate_done(ri(r), out));
            }
            (Call::Mark { r }, Outcome::Done | Outcome::Refused) => {
                let ok = outcome == Outcome::Done;
                self.step(|e, out| e.on_mark_in_sync_done(ri(r), ok, out));
            }
            (call, outcome) => self.fail(format!("unexpected answer {outcome:?} to {call:?}")),
        }
    }

    /// Session `session` of replica `r` is broken: the driver notices after `after`.
    fn session_breaks(&mut self, r: usize, session: u64, after: u64) {
        if self.drivers[r].conn == Conn::Open(session) {
            self.doomed[r] = Some(session);
        }
        self.schedule(after, Event::SessionTimeout { r, session });
    }
}
