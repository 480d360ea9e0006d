//! A deterministic simulator of one Hawser volume: the real `hawser_core::Engine`, driven
//! through its public API only, with N simulated replicas (disks, processes, nodes), the network
//! between them, the control plane and a client, all in one thread from one `u64` seed.
//!
//! What is modelled lives with each part: `disk.rs` (durable and volatile layers, power loss,
//! torn writes), `replica.rs` (the replica server's sessions and epoch), `net.rs` (delay,
//! reordering, loss, duplication, partitions), `control.rs` (the store and the controller's
//! outdate / mark-in-sync rules, outages), `client.rs` (the workload and the model of what may
//! read back), `check.rs` (the checkers), `world.rs` (the event loop, the engine's driver, the
//! faults and their rules, healing). Each module's doc also says what it does not model.
//! Runs with `FaultMix::engine_crash` also model the driver's journal (`world/journal.rs`) and
//! crash the engine itself, then start a new one that runs crash recovery (`world/restart.rs`).
//! Runs with `FaultMix::grow` grow the volume online at random points (`world/grow.rs`).
//!
//! A failing run prints its seed, a one-line replay command and the end of its event trace:
//! `HAWSER_SEED=<seed> cargo test --release -p hawser-sim replay -- --nocapture` prints the whole
//! trace of that seed.

pub mod check;
pub mod client;
pub mod config;
pub mod control;
pub mod disk;
pub mod net;
pub mod pattern;
pub mod replica;
pub mod world;

use std::panic::{catch_unwind, AssertUnwindSafe};

pub use config::FaultMix;
pub use world::{Stats, World};

/// Deliberate bugs, to prove the checkers catch what they claim to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mutation {
    #[default]
    None,
    /// The control plane confirms outdates without recording them.
    StoreForgetsOutdates,
    /// The client's model forgets trims and write-zeroes (a wrong expectation).
    ModelIgnoresZeroes,
    /// Replica disks treat flushes as no-ops.
    FlushForgets,
    /// The driver sends writes without waiting for their extents to be in the journal's log.
    WritesSkipTheLog,
    /// Crash recovery compares but copies nothing.
    RecoveryCopiesNothing,
    /// Crash recovery takes every chunk from the first reachable replica, local first,
    /// whatever the journals say it may lack (`Rules::source_choice` off).
    RecoveryIgnoresSuspects,
    /// Crash recovery forgets that a journal said a replica lost power
    /// (`Rules::power_loss_suspect` off).
    RecoveryForgetsPowerLoss,
    /// Crash recovery starts instead of waiting for an unreachable in-sync replica
    /// (`Rules::refusal` off).
    RecoveryNeverWaits,
    /// A blank replica is taken for an ordinary outdated one at crash recovery
    /// (`Rules::blank_needs_naming_journal` off).
    BlankTrustsAnyJournal,
    /// The keeper asks the store to mark a resynced replica in sync at once, before a
    /// journal says it lacks nothing (`Params::in_sync_commit` off).
    MarkWithoutCommit,
    /// A growth of the volume gives one replica junk, not zeroes, over the new range (the
    /// controller told the engine before every replica was grown and zeroed): the engine
    /// takes the new chunks as clean everywhere, so that replica must be caught holding data
    /// no client wrote.
    GrowWithoutZeroes,
}

impl Mutation {
    /// The crash recovery rules a run decides with.
    pub fn rules(self) -> hawser_core::driver::recovery::Rules {
        let mut r = hawser_core::driver::recovery::Rules::ALL;
        match self {
            Mutation::RecoveryIgnoresSuspects => r.source_choice = false,
            Mutation::RecoveryForgetsPowerLoss => r.power_loss_suspect = false,
            Mutation::RecoveryNeverWaits => r.refusal = false,
            Mutation::BlankTrustsAnyJournal => r.blank_needs_naming_journal = false,
            _ => {}
        }
        r
    }
}

#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    pub faults: FaultMix,
    pub mutation: Mutation,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            faults: FaultMix::ALL,
            mutation: Mutation::None,
        }
    }
}

/// Lines of trace printed with a failure.
pub const TRACE_TAIL_LINES: usize = 120;

/// A failed run: its seed, the violation, and the end of its trace.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    /// The replay's environment variable for this run's fault mix ("" for the default).
    pub mode: &'static str,
    pub message: String,
    pub trace_tail: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}: {}", self.seed, self.message)?;
        writeln!(f, "replay: {}", replay_command(self.seed, self.mode))?;
        writeln!(f, "last {} trace lines:", self.trace_tail.len())?;
        for l in &self.trace_tail {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

pub fn replay_command(seed: u64, mode: &str) -> String {
    format!("HAWSER_SEED={seed}{mode} cargo test --release -p hawser-sim replay -- --nocapture")
}

impl RunOptions {
    /// Every fault, engine crashes (and so the journal) too.
    pub fn with_engine_crashes() -> RunOptions {
        RunOptions {
            faults: FaultMix::ALL_WITH_ENGINE_CRASHES,
            mutation: Mutation::None,
        }
    }

    /// Engine crashes, the first during the first engine's first journal commit.
    pub fn with_early_engine_crash() -> RunOptions {
        RunOptions {
            faults: FaultMix::ALL_WITH_EARLY_ENGINE_CRASH,
            mutation: Mutation::None,
        }
    }

    /// Every fault of `default`, and rotted blocks (`FaultMix::corrupt`).
    pub fn with_corruption() -> RunOptions {
        RunOptions {
            faults: FaultMix::ALL_WITH_CORRUPTION,
            mutation: Mutation::None,
        }
    }

    /// Every fault, and online growth of the volume (`FaultMix::grow`).
    pub fn with_growth() -> RunOptions {
        RunOptions {
            faults: FaultMix::ALL_WITH_GROWTH,
            mutation: Mutation::None,
        }
    }

    /// Growth with engine crashes (and the journal).
    pub fn with_growth_and_engine_crashes() -> RunOptions {
        RunOptions {
            faults: FaultMix::ALL_WITH_GROWTH_AND_ENGINE_CRASHES,
            mutation: Mutation::None,
        }
    }

    /// Engine crashes, and restarts on another node.
    pub fn with_engine_moves() -> RunOptions {
        RunOptions {
            faults: FaultMix::ALL_WITH_ENGINE_MOVES,
            mutation: Mutation::None,
        }
    }

    pub fn engine_crashes(&self) -> bool {
        self.faults.engine_crash > 0
    }

    /// What `replay_command` adds for this fault mix.
    pub fn mode(&self) -> &'static str {
        if self.faults.grow > 0 && self.engine_crashes() {
            " HAWSER_GROWTH=1 HAWSER_ENGINE_CRASHES=1"
        } else if self.faults.grow > 0 {
            " HAWSER_GROWTH=1"
        } else if self.faults.early_engine_crash {
            " HAWSER_EARLY_ENGINE_CRASH=1"
        } else if self.faults.engine_moves_pct > 0 {
            " HAWSER_ENGINE_MOVES=1"
        } else if self.engine_crashes() {
            " HAWSER_ENGINE_CRASHES=1"
        } else if self.faults.corrupt > 0 {
            " HAWSER_CORRUPTION=1"
        } else {
            ""
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".into()
    }
}

/// Run one seed; a panic (an engine assertion) counts as a failure.
fn run_once(seed: u64, opts: RunOptions, trace: bool) -> (Result<Stats, String>, Vec<String>) {
    let built = catch_unwind(|| World::new(seed, opts, trace));
    let mut w = match built {
        Ok(w) => w,
        Err(p) => return (Err(format!("panicked: {}", panic_message(&*p))), Vec::new()),
    };
    let result = catch_unwind(AssertUnwindSafe(|| w.run()));
    let trace_out = w.trace_lines().to_vec();
    match result {
        Ok(r) => (r.map(|()| w.stats().clone()), trace_out),
        Err(p) => (Err(format!("panicked: {}", panic_message(&*p))), trace_out),
    }
}

/// Run one seed. On failure it is run again with tracing on, for the trace's tail.
pub fn run_seed(seed: u64, opts: RunOptions) -> Result<Stats, Failure> {
    match run_once(seed, opts, false).0 {
        Ok(s) => Ok(s),
        Err(message) => {
            let (_, trace) = run_once(seed, opts, true);
            let from = trace.len().saturating_sub(TRACE_TAIL_LINES);
            Err(Failure {
                seed,
                mode: opts.mode(),
                message,
                trace_tail: trace[from..].to_vec(),
            })
        }
    }
}

/// Run one seed with the whole trace (for replays).
pub fn run_traced(seed: u64, opts: RunOptions) -> (Result<Stats, String>, Vec<String>) {
    run_once(seed, opts, true)
}

/// `HAWSER_SEED_BASE`, or 0: the first seed of a seed range.
pub fn seed_base() -> u64 {
    std::env::var("HAWSER_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
