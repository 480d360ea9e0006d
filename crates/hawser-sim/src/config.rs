//! Bounds of the simulator and the per-seed parameters drawn from the seed.
//!
//! Times are simulated microseconds. They are scaled down from the real system's (a 5 s request
//! timeout becomes 20 ms) so a run covers many failures in few events; only their ratios matter
//! to the engine, which has no clock.

use hawser_core::constants::DEFAULT_CORRUPT_LIMIT_BLOCKS;
use hawser_core::{ChunkMap, EngineConfig, NoQuorum, Quorum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::client::WorkloadParams;
use crate::net::NetParams;
use crate::pattern::SECTOR;

/// Most replicas a simulated volume has.
pub const MAX_SIM_REPLICAS: usize = 5;
/// Most client requests in flight.
pub const MAX_QD: usize = 16;
/// A session whose message was lost is closed after this long (the agent's 5 s).
pub const SESSION_TIMEOUT_US: u64 = 20_000;
/// A connection attempt (Hello) that got no answer is abandoned after this long.
pub const CONNECT_TIMEOUT_US: u64 = 10_000;
/// Reconnect backoff, doubling from the minimum.
pub const RECONNECT_BACKOFF_MIN_US: u64 = 1_000;
pub const RECONNECT_BACKOFF_MAX_US: u64 = 16_000;
/// The driver's maintenance round (reconnects, background flush).
pub const DRIVER_TICK_US: u64 = 2_000;
/// Least time between two background flushes.
pub const BACKGROUND_FLUSH_US: u64 = 10_000;
/// The agent retries a control-plane call this often while it gets no useful answer.
pub const CONTROL_RETRY_US: u64 = 5_000;
/// After healing, the volume must be quiet (every replica in sync, nothing in flight) within
/// this long, or the run fails for liveness.
pub const HEAL_DEADLINE_US: u64 = 20_000_000;
/// Hard bound on events per run (a livelock guard).
pub const MAX_EVENTS: u64 = 5_000_000;
/// Largest read the final read-back issues.
pub const FINAL_READ_BYTES: u64 = 64 * 1024;
/// Most online growths of the volume per run (`FaultMix::grow`), and the most chunks one adds:
/// enough to cross the old end with requests in flight and crashes after, bounded so the
/// volume stays a few MiB.
pub const MAX_GROWS: u64 = 2;
pub const MAX_GROW_CHUNKS: u64 = 16;

/// Which faults a run injects, as relative weights (0: never).
#[derive(Clone, Copy, Debug)]
pub struct FaultMix {
    pub process_crash: u32,
    pub node_crash: u32,
    pub partition: u32,
    pub control_outage: u32,
    pub io_error: u32,
    pub disk_full: u32,
    /// A crash of the engine's process (kill -9 of its agent); a new engine then starts and
    /// runs crash recovery. Above 0, the run also models the journal (`world/journal.rs`).
    pub engine_crash: u32,
    /// Percent of engine starts after a crash that happen on another node, one without a
    /// replica (the volume attached elsewhere): the replica that was local becomes remote.
    pub engine_moves_pct: u32,
    /// The first engine also crashes within its first 2 ms, while its first journal commit
    /// is under way: the journals then do not name a blank replica yet (needs
    /// `engine_crash`).
    pub early_engine_crash: bool,
    /// Rot: a few random blocks of one in-sync replica stop matching their checksums
    /// (`Replica::corrupt`). Only while another replica holds a clean good copy.
    pub corrupt: u32,
    /// Online growth of the volume (`world/grow.rs`), at most `MAX_GROWS` times a run: every
    /// replica's disk grows with zeroes, then the engine and its keeper, then the client's
    /// workload takes in the new range.
    pub grow: u32,
}

impl FaultMix {
    pub const ALL: FaultMix = FaultMix {
        process_crash: 3,
        node_crash: 3,
        partition: 3,
        control_outage: 2,
        io_error: 1,
        disk_full: 1,
        engine_crash: 0,
        engine_moves_pct: 0,
        early_engine_crash: false,
        corrupt: 0,
        grow: 0,
    };
    /// Every fault, and rot at a low rate (1 in about 14 faults). Kept out of `ALL` so that
    /// the pinned seeds keep the traces they were found with.
    pub const ALL_WITH_CORRUPTION: FaultMix = FaultMix {
        corrupt: 1,
        ..FaultMix::ALL
    };
    /// Every fault, engine crashes too.
    pub const ALL_WITH_ENGINE_CRASHES: FaultMix = FaultMix {
        engine_crash: 2,
        ..FaultMix::ALL
    };
    /// Engine crashes, a third of whose restarts happen on a node without a replica.
    pub const ALL_WITH_ENGINE_MOVES: FaultMix = FaultMix {
        engine_crash: 2,
        engine_moves_pct: 33,
        ..FaultMix::ALL
    };
    /// Engine crashes, the first of them during the first engine's first commit.
    pub const ALL_WITH_EARLY_ENGINE_CRASH: FaultMix = FaultMix {
        early_engine_crash: true,
        ..FaultMix::ALL_WITH_ENGINE_CRASHES
    };
    /// Every fault, rot and scrubs too, and the volume grows online (1 in about 8 faults,
    /// `MAX_GROWS` at most, so most faults of a run are still others; a scrub pass may be
    /// under way across a growth). Kept out of `ALL` so that the pinned seeds keep the traces
    /// they were found with.
    pub const ALL_WITH_GROWTH: FaultMix = FaultMix {
        grow: 2,
        ..FaultMix::ALL_WITH_CORRUPTION
    };
    /// Growth with engine crashes (and the journal): restarts after a grow start with the
    /// grown size and recover from journals of either size.
    pub const ALL_WITH_GROWTH_AND_ENGINE_CRASHES: FaultMix = FaultMix {
        grow: 2,
        ..FaultMix::ALL_WITH_ENGINE_CRASHES
    };
    pub const NONE: FaultMix = FaultMix {
        process_crash: 0,
        node_crash: 0,
        partition: 0,
        control_outage: 0,
        io_error: 0,
        disk_full: 0,
        engine_crash: 0,
        engine_moves_pct: 0,
        early_engine_crash: false,
        corrupt: 0,
        grow: 0,
    };
}

/// The activity log's shape in a run that models the journal. Drawn from its own stream of
/// the seed, so runs without engine crashes draw exactly what they drew before it existed.
#[derive(Clone, Copy, Debug)]
pub struct JournalParams {
    pub extent_bytes: u64,
    /// The log's soft cap, in extents.
    pub max_extents: usize,
    /// Driver ticks an extent stays idle before it may leave.
    pub idle_ticks: u64,
    /// Most time between a crash and the next engine's start.
    pub restart_us: u64,
    /// Driver ticks between two resync saves of a replica.
    pub save_ticks: u64,
    /// The keeper's in-sync commit (off only for `Mutation::MarkWithoutCommit`).
    pub in_sync_commit: bool,
}

impl JournalParams {
    pub fn draw(seed: u64, chunk_bytes: u64) -> JournalParams {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6a6f_7572_6e61_6c21);
        JournalParams {
            extent_bytes: chunk_bytes * [1u64, 2, 4, 8][rng.random_range(0..4)],
            max_extents: [1usize, 2, 4, 1024][rng.random_range(0..4)],
            idle_ticks: [1u64, 3, 10][rng.random_range(0..3)],
            restart_us: rng.random_range(1_000..=50_000),
            save_ticks: [1u64, 5, 25][rng.random_range(0..3)],
            in_sync_commit: true,
        }
    }

    /// The journal keeper's share.
    pub fn keeper(&self) -> hawser_core::driver::journal::Params {
        hawser_core::driver::journal::Params {
            extent_bytes: self.extent_bytes,
            max_extents: self.max_extents,
            idle_ticks: self.idle_ticks,
            save_ticks: self.save_ticks,
            in_sync_commit: self.in_sync_commit,
        }
    }
}

/// A replica that starts out of date (the store has it `outdated`).
#[derive(Clone, Debug)]
pub struct InitialOutdated {
    pub replica: usize,
    /// What it lacks, if known (else it is copied in full).
    pub dirty: Option<ChunkMap>,
}

/// Everything drawn from the seed before the run starts.
#[derive(Clone, Debug)]
pub struct Params {
    pub replicas: usize,
    /// Replica 0 is on the engine's node (reads prefer it; it never crashes or partitions
    /// apart from the engine, since that would be an engine crash).
    pub local: bool,
    pub size: u64,
    pub engine: EngineConfig,
    pub net: NetParams,
    pub work: WorkloadParams,
    /// Most time between two client arrivals.
    pub client_gap_us: u64,
    pub random_phase_us: u64,
    /// Mean time between faults.
    pub fault_gap_us: u64,
    pub faults: FaultMix,
    pub disk_latency_us: (u64, u64),
    pub flush_latency_us: (u64, u64),
    pub control_delay_us: u64,
    /// Probability that the answer to a control-plane call is lost (the agent retries).
    pub control_answer_loss: f64,
    pub initial_outdated: Option<InitialOutdated>,
}

impl Params {
    pub fn draw(rng: &mut StdRng, faults: FaultMix) -> Params {
        let replicas = rng.random_range(1..=MAX_SIM_REPLICAS);
        let chunk = [4096u64, 16 * 1024, 64 * 1024][rng.random_range(0..3)];
        let chunks = rng.random_range(8..=40u64);
        // Sometimes the last chunk is partial.
        let tail = if rng.random_bool(0.3) {
            rng.random_range(1..chunk / SECTOR) * SECTOR
        } else {
            0
        };
        let size = (chunks * chunk).saturating_sub(tail).max(chunk);
        let engine = EngineConfig {
            chunk_bytes: chunk,
            quorum: if rng.random_bool(0.5) {
                Quorum::Majority
            } else {
                Quorum::Any
            },
            no_quorum: if rng.random_bool(0.7) {
                NoQuorum::Suspend
            } else {
                NoQuorum::Fail
            },
            resync_unit_bytes: chunk * [1u64, 2, 4, 16][rng.random_range(0..4)],
            resync_parallel: rng.random_range(1..=4),
            // With the journal, as the agent runs it; runs without keep the path their
            // pinned seeds were found with.
            mark_every_resync: faults.engine_crash > 0,
            corrupt_limit: DEFAULT_CORRUPT_LIMIT_BLOCKS,
            // A chunk: 8 to 40 units a pass. Not drawn, so every seed draws what it drew.
            scrub_unit_bytes: chunk,
        };
        let net = NetParams {
            delay_min: rng.random_range(5..=50),
            delay_max: rng.random_range(100..=1_000),
            tail_p: [0.0, 0.01, 0.05][rng.random_range(0..3)],
            tail_max: rng.random_range(2_000..=15_000),
            loss_p: [0.0, 0.0005, 0.002, 0.01][rng.random_range(0..4)],
            dup_p: [0.0, 0.01, 0.05][rng.random_range(0..3)],
        };
        let write_pct = rng.random_range(30..=70);
        let work = WorkloadParams {
            qd: rng.random_range(1..=MAX_QD),
            write_pct,
            zero_pct: rng.random_range(0..=8),
            flush_pct: rng.random_range(0..=8),
            fua_pct: rng.random_range(0..=10),
            hot_bytes: (size / 8).max(8 * SECTOR) / SECTOR * SECTOR,
            max_bytes: (chunk * 3).min(size).min(256 * 1024),
        };
        let initial_outdated = (replicas > 1 && rng.random_bool(0.1)).then(|| {
            let replica = rng.random_range(1..replicas);
            let dirty = rng.random_bool(0.5).then(|| {
                let mut m = ChunkMap::new(size, chunk);
                let first = rng.random_range(0..m.chunks());
                let end = rng.random_range(first + 1..=m.chunks());
                m.set_chunks(first, end);
                m
            });
            InitialOutdated { replica, dirty }
        });
        Params {
            replicas,
            local: rng.random_bool(0.5),
            size,
            engine,
            net,
            work,
            client_gap_us: rng.random_range(50..=1_500),
            random_phase_us: rng.random_range(100_000..=600_000),
            fault_gap_us: rng.random_range(5_000..=60_000),
            faults,
            disk_latency_us: (rng.random_range(5..=50), rng.random_range(100..=800)),
            flush_latency_us: (rng.random_range(50..=200), rng.random_range(500..=3_000)),
            control_delay_us: rng.random_range(100..=5_000),
            control_answer_loss: [0.0, 0.05, 0.2][rng.random_range(0..3)],
            initial_outdated,
        }
    }
}
