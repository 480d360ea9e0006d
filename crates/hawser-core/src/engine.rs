//! The volume engine: fans client requests out to replicas and decides when each may be
//! acknowledged. See docs/protocol.md for the argument this code implements; in short:
//!
//! - Modifying requests and flushes go to every replica that receives writes (in-sync, and
//!   syncing ones so they do not fall further behind). One completes when every such replica
//!   has answered. It is acknowledged when at least one succeeded and every replica that the
//!   store may still call in-sync and that did not succeed has been resolved: removed from the
//!   in-sync set by the control plane (`Command::Outdate`, answered by `on_outdate_done`), or
//!   brought back in sync by a resync that copied the write. Until then it waits ("parked",
//!   holding no range lock): an acknowledged write is on every replica the store calls in-sync.
//! - A replica may leave the in-sync set only if enough remain (`Quorum`); otherwise it is
//!   `Down` and writes it misses wait for it to return (or fail, per `NoQuorum`). Nothing is
//!   acknowledged that a quorum does not have, and replicas never diverge.
//! - Every replica not receiving writes has a dirty bitmap of the chunks it lacks. When it
//!   reconnects it becomes `Syncing`: it receives new writes, and the engine copies its dirty
//!   chunks from an in-sync replica (`resync.rs`), then makes it in-sync again through the
//!   control plane. If none is in sync, a returning replica that the store never stopped
//!   calling in-sync becomes the source instead (`Engine::promote` in `resync.rs`).
//! - When every replica fails a request, it fails with their error and no replica is outdated
//!   (no replica has anything the others lack).
//! - Reads go to the local in-sync replica when there is one, else to another in-sync one; a
//!   failed read is retried on the next in-sync replica. A read answered `Corrupt` (a block's
//!   bytes rotted) does not make the replica leave: the read is served by another, and the
//!   rotted range is repaired under the range lock (`repair.rs`).
//! - A replica answering "stale epoch" means a newer engine exists: this engine fences itself
//!   and fails everything with `IoError::ShutDown`.

pub(crate) mod grow;
pub(crate) mod repair;
pub(crate) mod resync;
pub(crate) mod scrub;
pub(crate) mod unflushed;

use std::collections::BTreeSet;

use crate::id_map::IdMap;

use self::repair::{Integrity, Repair};
use self::resync::Copy;
use self::scrub::Scrub;
use self::unflushed::{compact, Unflushed};
use crate::bitmap::ChunkMap;
use crate::constants::{
    DEFAULT_CHUNK_BYTES, DEFAULT_CORRUPT_LIMIT_BLOCKS, DEFAULT_RESYNC_PARALLEL,
    DEFAULT_RESYNC_UNIT_BYTES, DEFAULT_SCRUB_UNIT_BYTES, INTERNAL_TAG_BASE, MAX_REPLICAS,
    MAX_SCRUB_UNIT_BYTES, ORDER_BLOCK_BYTES, SECTOR_BYTES, UNFLUSHED_COMPACT_AT,
};
use crate::io_error::IoError;
use crate::range_lock::{span, RangeLock};
use crate::types::{ClientOp, Command, ReplicaFailure, ReplicaIdx, ReplicaResult, SubId, Tag};

/// A replica's membership as this engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Has every acknowledged write; receives writes; serves reads; a resync source.
    InSync,
    /// Lost, but leaving the in-sync set would break the quorum: it stays in-sync in the store
    /// and writes it misses wait (or fail) until it returns and is resynced.
    Down,
    /// `Command::Outdate` sent, not yet confirmed. Gets no new requests; writes it missed wait.
    Outdating,
    /// Confirmed out of the in-sync set by the control plane; its dirty bitmap grows.
    Outdated,
    /// Reconnected: receives writes while its dirty chunks are copied to it.
    Syncing,
    /// Resynced; `Command::MarkInSync` sent, not yet confirmed. Receives writes.
    Marking,
    /// Disk error: out of the in-sync set for good (as far as this engine goes).
    Failed,
}

/// What the engine does when a replica must leave but the quorum forbids it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NoQuorum {
    /// Writes the replica missed wait until it returns (or the quorum allows outdating it).
    #[default]
    Suspend,
    /// Writes the replica missed fail with an I/O error (their range is resynced later).
    Fail,
}

/// How many in-sync replicas must remain for one to be removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Quorum {
    /// A majority of the volume's replicas, or exactly half with the cluster store as the
    /// tie-breaker (the outdate is a compare-and-swap the store arbitrates). Two replicas
    /// survive the loss of one; three survive the loss of one, not two.
    #[default]
    Majority,
    /// Any one in-sync replica (the store still arbitrates every removal).
    Any,
}

#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    pub chunk_bytes: u64,
    pub quorum: Quorum,
    pub no_quorum: NoQuorum,
    pub resync_unit_bytes: u64,
    pub resync_parallel: u32,
    /// Confirm every resync through `Command::MarkInSync`, also of a replica the store never
    /// stopped calling in-sync (it was `Down`): the driver's journal keeper commits a journal
    /// saying it lacks nothing before the mark is asked for, so no engine acts on its
    /// strength (acknowledging, outdating others) while the journals say it lacks chunks.
    /// Off only in simulator runs without the journal.
    pub mark_every_resync: bool,
    /// Corrupt blocks a replica may show (`Engine::integrity`'s `found`) before it leaves as
    /// failed, like after a disk error: a medium that keeps rotting is better rebuilt
    /// elsewhere than repaired block by block (`DEFAULT_CORRUPT_LIMIT_BLOCKS`).
    pub corrupt_limit: u64,
    /// Bytes a scrub pass reads at once on each in-sync replica (`scrub.rs`): a power of two,
    /// at least a checksum block (`DEFAULT_SCRUB_UNIT_BYTES`).
    pub scrub_unit_bytes: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            quorum: Quorum::default(),
            no_quorum: NoQuorum::default(),
            resync_unit_bytes: DEFAULT_RESYNC_UNIT_BYTES,
            resync_parallel: DEFAULT_RESYNC_PARALLEL,
            mark_every_resync: true,
            corrupt_limit: DEFAULT_CORRUPT_LIMIT_BLOCKS,
            scrub_unit_bytes: DEFAULT_SCRUB_UNIT_BYTES,
        }
    }
}

/// A replica's state when the engine starts, from the cluster store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Initial {
    InSync,
    /// Out of sync; `dirty` is what it lacks, `None` when unknown (everything is copied).
    Outdated {
        dirty: Option<ChunkMap>,
    },
    Failed,
}

#[derive(Clone, Debug)]
pub struct ReplicaSpec {
    /// On this node: reads prefer it.
    pub local: bool,
    pub initial: Initial,
}

impl ReplicaSpec {
    pub fn in_sync(local: bool) -> ReplicaSpec {
        ReplicaSpec {
            local,
            initial: Initial::InSync,
        }
    }
}

/// What `Engine::replica_view` reports about one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaView {
    pub membership: Membership,
    pub connected: bool,
    /// Bytes of dirty chunks still to copy.
    pub dirty_bytes: u64,
    /// Bytes copied by resync so far in this engine's life.
    pub copied_bytes: u64,
}

pub(crate) struct Slot {
    pub local: bool,
    pub membership: Membership,
    /// While `Syncing`: whether the store still lists it in-sync (it was `Down`, never
    /// outdated), so writes it misses cannot be acknowledged until it is resynced.
    pub store_in_sync: bool,
    /// The driver has a live session with it.
    pub connected: bool,
    /// Sessions opened with it so far (counts `on_replica_connected`): a request remembers
    /// the one it was sent on, so a failure from an older session is not held against a newer.
    pub session: u64,
    /// `Command::Disconnect` was sent for the current session (sent once per session).
    pub disconnecting: bool,
    /// It came back with its node rebooted and chunks it had not made durable (its own, or
    /// given by a previous engine's journals: `journal_lacks`), and has not been resynced
    /// since: it may lack acknowledged writes, so it is never promoted to resync source
    /// (`promote`).
    pub reboot_lost: bool,
    /// `add_dirty` gave it chunks from a previous engine's journals since it was last in sync.
    pub journal_lacks: bool,
    /// A disk error was seen: it leaves as failed and is never resynced.
    pub failed: bool,
    /// Lost while `Marking`: decided when the store answers.
    pub lost_while_marking: bool,
    /// Chunks it may lack. While `InSync`, only ranges of requests it failed: if another
    /// replica succeeded it leaves at once; if every replica failed, the bits stay (harmless:
    /// they are copied if it ever leaves and returns).
    pub dirty: ChunkMap,
    /// Times chunks were added to `dirty` (wherever bits are set: `mark_dirty`): a driver
    /// that saved what the replica lacks at some point sees from it whether the map grew
    /// since (`Engine::resync_point_holds`).
    pub dirty_marks: u64,
    /// Chunks written to it that it may not have made durable: what was unflushed when it
    /// left, plus writes it answered after it left. Kept across a rejoin (its node can still
    /// lose power before it flushes), dropped only when a flush sent to it after it rejoined
    /// succeeds, and copied if it comes back with its node rebooted.
    pub unflushed_at_loss: Vec<(u64, u64)>,
    /// Ranges taken from `unflushed_at_loss` by flushes in flight to it, by sub-request: a
    /// success drops them, a failure puts them back.
    pub unflushed_flushing: Vec<(SubId, Vec<(u64, u64)>)>,
    /// Resync copies in flight to it, and the final resync flush.
    pub copies: u32,
    pub sync_flushing: bool,
    /// Where the next resync copy starts (chunk index).
    pub cursor: u64,
    pub copied_bytes: u64,
    /// Corrupt blocks confirmed on it in this engine's life (`repair.rs`).
    pub integrity: Integrity,
}

/// Bit set of replicas (MAX_REPLICAS <= 32).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Set(pub u32);

impl Set {
    pub fn add(&mut self, r: ReplicaIdx) {
        self.0 |= 1 << r.0;
    }
    pub fn remove(&mut self, r: ReplicaIdx) {
        self.0 &= !(1 << r.0);
    }
    pub fn has(self, r: ReplicaIdx) -> bool {
        self.0 & (1 << r.0) != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl Slot {
    /// Add chunks to what it may lack (every place that sets dirty bits goes through here).
    pub(crate) fn mark_dirty(&mut self, f: impl FnOnce(&mut ChunkMap)) {
        f(&mut self.dirty);
        self.dirty_marks += 1;
    }
}

pub(crate) struct Pending {
    pub op: ClientOp,
    /// Sub-requests not yet answered.
    pub outstanding: u32,
    pub succeeded: Set,
    /// Replicas it was sent to.
    pub sent: Set,
    /// Replicas that failed it, and those of them with a disk error.
    pub failed: Set,
    pub io_failed: Set,
    /// Replicas whose failure of it has been acted on (they left, or were skipped).
    pub handled: Set,
    /// The session of each replica it was sent to, when it was sent.
    pub sessions: [u64; MAX_REPLICAS],
    /// Worst failure seen, for the error when every replica failed.
    pub failure: Option<ReplicaFailure>,
    /// Reads: replicas already tried.
    pub tried: Set,
    /// Read data from the successful replica.
    pub data: Option<bytes::Bytes>,
    /// Parked: replicas that missed it and still have to be resolved (outdated or resynced).
    pub missed: Option<Set>,
    /// A replica that did not get it was promoted to resync source (`promote`): it fails.
    pub doomed: bool,
    /// Reads: replicas that answered `Corrupt`, with their first bad offset and bad blocks.
    pub corrupt: Set,
    pub corrupt_at: [(u64, u32); MAX_REPLICAS],
    /// Reads: run again under the range lock (every replica tried answered `Corrupt`).
    pub locked: bool,
}

/// What waits in the range lock: a client request or a resync copy.
pub(crate) enum Work {
    Client(ClientOp),
    /// A resync copy; its state is in `Engine::copies` under the same tag.
    Copy,
    /// A client read run again under the lock of its blocks (`repair.rs`), same tag.
    LockedRead {
        offset: u64,
        len: u32,
    },
    /// A repair of corrupt blocks; its state is in `Engine::repairs` under the same tag.
    Repair,
}

pub struct Engine {
    pub(crate) size: u64,
    pub(crate) cfg: EngineConfig,
    pub(crate) slots: Vec<Slot>,
    pub(crate) pending: IdMap<Tag, Pending>,
    pub(crate) subs: IdMap<SubId, (Tag, ReplicaIdx)>,
    pub(crate) next_sub: SubId,
    pub(crate) locks: RangeLock<Work>,
    /// Parked requests, ordered for determinism.
    pub(crate) parked: BTreeSet<Tag>,
    pub(crate) copies: IdMap<Tag, Copy>,
    pub(crate) repairs: IdMap<Tag, Repair>,
    /// The scrub pass running or last run (`scrub.rs`); `None` before the first.
    pub(crate) scrub: Option<Scrub>,
    pub(crate) next_internal: Tag,
    pub(crate) unflushed: Unflushed,
    pub(crate) fenced: bool,
    /// Replicas promoted to resync source so far (`promote`): a copy read before the latest
    /// promotion carries the old reference's data and clears no dirty bit.
    pub(crate) promotions: u64,
}

impl Engine {
    /// An engine whose replicas are all in sync, with the default configuration.
    pub fn new(size: u64, local: &[bool]) -> Engine {
        let specs: Vec<ReplicaSpec> = local.iter().map(|&l| ReplicaSpec::in_sync(l)).collect();
        Engine::with_config(size, &specs, EngineConfig::default())
    }

    /// Replicas that start `InSync` are taken as connected (the driver reports the ones it
    /// could not reach with `on_replica_lost`); the others wait for `on_replica_connected`.
    pub fn with_config(size: u64, replicas: &[ReplicaSpec], cfg: EngineConfig) -> Engine {
        assert!(
            !replicas.is_empty() && replicas.len() <= MAX_REPLICAS,
            "1..=8 replicas"
        );
        assert!(
            cfg.chunk_bytes.is_power_of_two() && cfg.chunk_bytes >= 4096,
            "chunk size"
        );
        assert!(cfg.resync_unit_bytes >= cfg.chunk_bytes && cfg.resync_parallel > 0);
        assert!(
            cfg.scrub_unit_bytes.is_power_of_two()
                && (ORDER_BLOCK_BYTES..=MAX_SCRUB_UNIT_BYTES).contains(&cfg.scrub_unit_bytes),
            "scrub unit size"
        );
        let slots = replicas
            .iter()
            .map(|spec| {
                let (membership, dirty) = match &spec.initial {
                    Initial::InSync => (Membership::InSync, ChunkMap::new(size, cfg.chunk_bytes)),
                    Initial::Outdated { dirty: Some(d) } => {
                        assert_eq!(d.chunk_bytes(), cfg.chunk_bytes, "bitmap geometry");
                        // A map from before the volume grew lacks nothing past its end: the
                        // grown range was zeroes on every replica (`grow.rs`).
                        let mut d = d.clone();
                        d.grow(size);
                        (Membership::Outdated, d)
                    }
                    Initial::Outdated { dirty: None } => {
                        (Membership::Outdated, ChunkMap::full(size, cfg.chunk_bytes))
                    }
                    Initial::Failed => (Membership::Failed, ChunkMap::new(size, cfg.chunk_bytes)),
                };
                Slot {
                    local: spec.local,
                    membership,
                    store_in_sync: membership == Membership::InSync,
                    connected: membership == Membership::InSync,
                    session: 0,
                    disconnecting: false,
                    reboot_lost: false,
                    journal_lacks: false,
                    failed: membership == Membership::Failed,
                    lost_while_marking: false,
                    dirty,
                    dirty_marks: 0,
                    unflushed_at_loss: Vec::new(),
                    unflushed_flushing: Vec::new(),
                    copies: 0,
                    sync_flushing: false,
                    cursor: 0,
                    copied_bytes: 0,
                    integrity: Integrity::default(),
                }
            })
            .collect();
        Engine {
            size,
            cfg,
            slots,
            pending: IdMap::default(),
            subs: IdMap::default(),
            next_sub: 1,
            locks: RangeLock::default(),
            parked: BTreeSet::new(),
            copies: IdMap::default(),
            repairs: IdMap::default(),
            scrub: None,
            next_internal: INTERNAL_TAG_BASE,
            unflushed: Unflushed::default(),
            fenced: false,
            promotions: 0,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn config(&self) -> EngineConfig {
        self.cfg
    }

    pub fn replicas(&self) -> usize {
        self.slots.len()
    }

    pub fn membership(&self, r: ReplicaIdx) -> Membership {
        self.slot(r).membership
    }

    pub fn replica_view(&self, r: ReplicaIdx) -> ReplicaView {
        let s = self.slot(r);
        ReplicaView {
            membership: s.membership,
            connected: s.connected,
            dirty_bytes: s.dirty.bytes(),
            copied_bytes: s.copied_bytes,
        }
    }

    /// The dirty chunks of `r` (what a resync would copy).
    pub fn dirty(&self, r: ReplicaIdx) -> &ChunkMap {
        &self.slot(r).dirty
    }

    /// Chunks written to `r` that it may not have made durable since it last left
    /// (`Slot::unflushed_at_loss`, and those a flush in flight to it covers). This engine
    /// copies them only if `r`'s node rebooted; a journal must record them too, or after a
    /// crash of this engine the next one would not know (found by the simulator).
    pub fn unflushed_at_loss(&self, r: ReplicaIdx) -> ChunkMap {
        let s = self.slot(r);
        let mut m = ChunkMap::new(self.size, self.cfg.chunk_bytes);
        let flushing = s.unflushed_flushing.iter().flat_map(|(_, v)| v.iter());
        for &(first, end) in s.unflushed_at_loss.iter().chain(flushing) {
            m.set_chunks(first, end);
        }
        m
    }

    /// Chunks `r` may lack for reasons this engine did not see (crash recovery: what the
    /// activity logs say a previous engine may have left different). They are copied when `r`
    /// is resynced, on top of what this engine marks itself. For an in-sync replica they only
    /// matter once it leaves (the driver calls this just before reporting it lost).
    pub fn add_dirty(&mut self, r: ReplicaIdx, chunks: &ChunkMap) {
        assert_eq!(
            chunks.chunk_bytes(),
            self.cfg.chunk_bytes,
            "bitmap geometry"
        );
        let s = self.slot_mut(r);
        s.mark_dirty(|d| d.union(chunks));
        // A resync under way goes round again to pick up chunks behind its cursor.
        s.cursor = 0;
        // What a previous engine knew may include acknowledged writes it had not made
        // durable (journals record those with the rest): if its node rebooted, it is never a
        // reference for a promotion until resynced (found by the simulator).
        if !chunks.is_empty() {
            s.journal_lacks = true;
        }
    }

    /// Replicas that are, or may become without a resync, the reference others are copied
    /// from: those the store calls in-sync (in sync, or `Down`, or resyncing after `Down`),
    /// not failed.
    /// `r` may lack acknowledged writes (its node lost power with writes not yet durable, or
    /// a journal said so, and no resync has copied them back): never promoted to reference,
    /// and journals say `lost` for it.
    pub fn may_lack_acknowledged(&self, r: ReplicaIdx) -> bool {
        self.slot(r).reboot_lost
    }

    /// A journal said `r` may lack acknowledged writes (`OutReplica::lost`): until a resync
    /// copied its dirty chunks it is treated like a replica whose node lost power.
    pub fn note_lost(&mut self, r: ReplicaIdx) {
        let s = self.slot_mut(r);
        if s.membership != Membership::InSync || !s.dirty.is_empty() {
            s.reboot_lost = true;
        }
    }

    pub fn may_be_reference(&self) -> Vec<ReplicaIdx> {
        self.indices()
            .filter(|&r| {
                let s = self.slot(r);
                s.store_in_sync && !s.failed
            })
            .collect()
    }

    pub fn in_sync(&self) -> Vec<ReplicaIdx> {
        self.indices()
            .filter(|&r| self.membership(r) == Membership::InSync)
            .collect()
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Requests in flight: client requests (including queued and parked ones), resync
    /// copies, repairs and a scrub's reads.
    pub fn in_flight(&self) -> usize {
        let scrub = self.scrub.as_ref().map_or(0, Scrub::reads_in_flight);
        self.pending.len() + self.locks.waiting() + self.copies.len() + self.repairs.len() + scrub
    }

    /// Something was written since the last flush started: the driver should flush in the
    /// background now and then, so a replica whose node crashes has little to recopy.
    pub fn wants_flush(&self) -> bool {
        self.unflushed.pending() && !self.fenced
    }

    /// Nothing for the driver's clock to do until something happens to the engine: no
    /// request, copy, repair or scrub read in flight, no scrub pass running, nothing written
    /// since the last flush began, and every replica in sync with a session (or failed: never
    /// reconnected). A driver may stop its clock then, until the next event (issue 44: an
    /// idle volume should cost its node nothing).
    pub fn at_rest(&self) -> bool {
        self.in_flight() == 0
            && self.scrub_view().is_none_or(|s| !s.running)
            && !self.wants_flush()
            && self.indices().all(|r| {
                let s = self.slot(r);
                s.failed
                    || (s.connected
                        && !s.disconnecting
                        && matches!(s.membership, Membership::InSync))
            })
    }

    /// Whether the driver should (re)connect to `r`: it is out of sync or down and not failed.
    pub fn wants_connection(&self, r: ReplicaIdx) -> bool {
        let s = self.slot(r);
        !self.fenced
            && !s.connected
            && !s.failed
            && matches!(
                s.membership,
                Membership::Down | Membership::Outdated | Membership::Outdating
            )
    }

    pub(crate) fn slot(&self, r: ReplicaIdx) -> &Slot {
        &self.slots[usize::from(r.0)]
    }

    pub(crate) fn slot_mut(&mut self, r: ReplicaIdx) -> &mut Slot {
        &mut self.slots[usize::from(r.0)]
    }

    pub(crate) fn indices(&self) -> impl Iterator<Item = ReplicaIdx> + '_ {
        // slots.len() <= MAX_REPLICAS, so the index fits in u8.
        (0..self.slots.len()).map(|i| ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS")))
    }

    /// Replicas that receive modifying requests and flushes.
    fn receivers(&self) -> Vec<ReplicaIdx> {
        self.indices()
            .filter(|&r| self.slot(r).connected && self.receives(r))
            .collect()
    }

    /// Whether `r`'s membership is one that receives writes and flushes (when connected).
    pub(crate) fn receives(&self, r: ReplicaIdx) -> bool {
        matches!(
            self.membership(r),
            Membership::InSync | Membership::Syncing | Membership::Marking
        )
    }

    /// Whether the store may list `r` as in-sync, so that a write it lacks cannot be
    /// acknowledged before `r` is resolved.
    pub(crate) fn blocks_ack(&self, r: ReplicaIdx) -> bool {
        let s = self.slot(r);
        match s.membership {
            Membership::InSync | Membership::Down | Membership::Outdating | Membership::Marking => {
                true
            }
            Membership::Syncing => s.store_in_sync,
            Membership::Outdated | Membership::Failed => false,
        }
    }

    /// Accept a client request. Its completion comes as a `Command::Complete` now or later.
    pub fn submit(&mut self, tag: Tag, op: ClientOp, out: &mut Vec<Command>) {
        assert!(tag < INTERNAL_TAG_BASE, "client tags stay below 2^63");
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
        let range = span(&op);
        if let Some(Work::Client(op)) = self.locks.acquire(tag, range, Work::Client(op)) {
            self.start(tag, op, false, out);
        }
    }

    fn valid(&self, op: &ClientOp) -> bool {
        let (offset, len) = match op {
            ClientOp::Flush => return true,
            ClientOp::Read { offset, len } => (*offset, u64::from(*len)),
            other => other.write_range().unwrap_or((0, 0)),
        };
        let aligned = offset % SECTOR_BYTES == 0 && len % SECTOR_BYTES == 0 && len > 0;
        aligned && offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    /// Start work that got its range: a client request, a resync copy, a read run again under
    /// the lock, or a repair.
    pub(crate) fn start_work(&mut self, tag: Tag, work: Work, out: &mut Vec<Command>) {
        match work {
            Work::Client(op) => self.start(tag, op, false, out),
            Work::Copy => self.copy_locked(tag, out),
            Work::LockedRead { offset, len } => {
                self.start(tag, ClientOp::Read { offset, len }, true, out)
            }
            Work::Repair => self.repair_locked(tag, out),
        }
    }

    /// `locked`: a read that holds the range lock of its blocks (`Work::LockedRead`).
    fn start(&mut self, tag: Tag, op: ClientOp, locked: bool, out: &mut Vec<Command>) {
        let mut p = Pending {
            op,
            outstanding: 0,
            succeeded: Set::default(),
            sent: Set::default(),
            failed: Set::default(),
            io_failed: Set::default(),
            handled: Set::default(),
            sessions: [0; MAX_REPLICAS],
            failure: None,
            tried: Set::default(),
            data: None,
            missed: None,
            doomed: false,
            corrupt: Set::default(),
            corrupt_at: [(0, 0); MAX_REPLICAS],
            locked,
        };
        match &p.op {
            ClientOp::Read { .. } => match self.pick_reader(p.tried) {
                Some(r) => self.send(tag, &mut p, r, out),
                None => {
                    out.push(Command::Complete {
                        tag,
                        result: Err(IoError::Io),
                    });
                    if locked {
                        self.release(tag, out);
                    }
                    return;
                }
            },
            ClientOp::Flush => {
                self.unflushed.flush_started(tag);
                for r in self.receivers() {
                    self.send(tag, &mut p, r, out);
                }
            }
            modifying => {
                let (offset, len) = modifying.write_range().unwrap_or((0, 0));
                let receivers = self.receivers();
                let chunk = self.cfg.chunk_bytes;
                let (first, end) = self.slots[0].dirty.chunk_span(offset, len);
                // Replicas that will not get this write lack it from now on.
                for r in self.indices().collect::<Vec<_>>() {
                    if !receivers.contains(&r) && self.slot(r).membership != Membership::Failed {
                        self.slot_mut(r).mark_dirty(|d| d.set_chunks(first, end));
                    }
                }
                debug_assert_eq!(chunk, self.slots[0].dirty.chunk_bytes());
                for r in receivers {
                    self.send(tag, &mut p, r, out);
                }
            }
        }
        self.pending.insert(tag, p);
        // A request sent to no replica at all finishes at once.
        self.try_finish(tag, out);
    }

    fn send(&mut self, tag: Tag, p: &mut Pending, r: ReplicaIdx, out: &mut Vec<Command>) {
        let sub = self.new_sub(tag, r);
        p.outstanding += 1;
        p.sent.add(r);
        p.sessions[usize::from(r.0)] = self.slot(r).session;
        match p.op {
            ClientOp::Read { .. } => p.tried.add(r),
            ClientOp::Flush => self.flush_sent(r, sub),
            _ => {}
        }
        out.push(Command::Send {
            replica: r,
            sub,
            op: p.op.clone(),
            background: false,
        });
    }

    pub(crate) fn new_sub(&mut self, tag: Tag, r: ReplicaIdx) -> SubId {
        let sub = self.next_sub;
        self.next_sub += 1;
        self.subs.insert(sub, (tag, r));
        sub
    }

    /// Local in-sync replica first, then the lowest-numbered in-sync one not yet tried. Not
    /// one whose session is gone (while its loss is being processed it is still `InSync`).
    pub(crate) fn pick_reader(&self, tried: Set) -> Option<ReplicaIdx> {
        let candidates = || {
            self.indices().filter(move |&r| {
                self.membership(r) == Membership::InSync && self.slot(r).connected && !tried.has(r)
            })
        };
        candidates()
            .find(|&r| self.slot(r).local)
            .or_else(|| candidates().next())
    }

    /// A replica answered sub-request `sub`. Unknown or duplicate answers are ignored.
    pub fn on_reply(&mut self, sub: SubId, result: ReplicaResult, out: &mut Vec<Command>) {
        let Some((tag, r)) = self.subs.remove(&sub) else {
            return;
        };
        self.flush_answered(r, sub, result.is_ok());
        if result == Err(ReplicaFailure::StaleEpoch) {
            self.fence(out);
            return;
        }
        if tag >= INTERNAL_TAG_BASE {
            if self.repairs.contains_key(&tag) {
                self.on_repair_reply(tag, r, result, out);
            } else if self.scrub_owns(tag) {
                self.on_scrub_reply(tag, r, result, out);
            } else {
                self.on_copy_reply(tag, r, result, out);
            }
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
                // Durable on `r` only after a flush *sent after this reply*: from now on a
                // flush that starts covers it (one started earlier may not).
                if let Some((offset, len)) = p.op.write_range() {
                    let (first, end) = self.slots[0].dirty.chunk_span(offset, len);
                    self.unflushed.wrote(first, end);
                    // Answered after `r` left: no flush that `unflushed` tracks reaches it.
                    if !self.receives(r) {
                        let lost = &mut self.slot_mut(r).unflushed_at_loss;
                        lost.push((first, end));
                        if lost.len() >= UNFLUSHED_COMPACT_AT {
                            compact(lost);
                        }
                    }
                }
                if p.data.is_none() {
                    p.data = data;
                }
                self.pending.insert(tag, p);
            }
            Err(f) => {
                let is_read = matches!(p.op, ClientOp::Read { .. });
                let f = match f {
                    ReplicaFailure::Corrupt { first, blocks } if is_read => {
                        p.corrupt.add(r);
                        p.corrupt_at[usize::from(r.0)] = (first, blocks);
                        f
                    }
                    // Only reads answer `Corrupt`; anything else saying so failed on the disk.
                    ReplicaFailure::Corrupt { .. } => ReplicaFailure::Io,
                    other => other,
                };
                p.failure = Some(worse(p.failure, f));
                p.failed.add(r);
                if f == ReplicaFailure::Io {
                    p.io_failed.add(r);
                }
                // It may lack this write (or hold part of it) from now on: marked now, before
                // it can be lost, come back and be resynced without this range. Also when
                // every replica fails it (the lost ones may hold it, the others not).
                if let Some((offset, len)) = p.op.write_range() {
                    self.slot_mut(r).mark_dirty(|d| d.set_bytes(offset, len));
                }
                self.pending.insert(tag, p);
                if is_read {
                    // Another replica can serve it: this one leaves (a disk error marks it
                    // failed) and the read is retried. Not for rotted blocks: the replica
                    // has every acknowledged write, and the range is repaired instead.
                    if !matches!(f, ReplicaFailure::Corrupt { .. }) {
                        self.leave(r, f == ReplicaFailure::Io, out);
                    }
                    self.retry_read(tag, out);
                }
            }
        }
        self.act_on_failures(tag, out);
        self.try_finish(tag, out);
    }

    /// Once some replica succeeded a modifying request or flush, every replica that failed it
    /// lacks something the others have: it leaves (outdated, failed on a disk error, or
    /// `Down`), at once rather than when the request completes. A replica whose session
    /// changed since the request was sent already left for that (it was lost) and is being
    /// resynced, with this request's range dirty: it is left alone.
    fn act_on_failures(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let Some(p) = self.pending.get_mut(&tag) else {
            return;
        };
        if matches!(p.op, ClientOp::Read { .. }) || p.succeeded.is_empty() {
            return;
        }
        let todo = Set(p.failed.0 & !p.handled.0);
        p.handled = Set(p.handled.0 | todo.0);
        let (io_failed, sessions) = (p.io_failed, p.sessions);
        for r in self.indices().collect::<Vec<_>>() {
            if todo.has(r) && self.slot(r).session == sessions[usize::from(r.0)] {
                self.leave(r, io_failed.has(r), out);
            }
        }
    }

    /// A failed read: try the next in-sync replica not yet tried, if any.
    fn retry_read(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let Some(mut p) = self.pending.remove(&tag) else {
            return;
        };
        if let Some(next) = self.pick_reader(p.tried) {
            self.send(tag, &mut p, next, out);
        }
        self.pending.insert(tag, p);
    }

    /// The control plane refused an outdate or mark because a newer epoch exists.
    pub fn on_fenced(&mut self, out: &mut Vec<Command>) {
        self.fence(out);
    }

    pub(crate) fn fence(&mut self, out: &mut Vec<Command>) {
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
        for (t, work) in self.locks.drain_waiting() {
            if matches!(work, Work::Client(_) | Work::LockedRead { .. }) {
                tags.push(t);
            }
        }
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
        self.copies.clear();
        self.repairs.clear();
        self.scrub_stopped();
        for s in &mut self.slots {
            s.copies = 0;
            s.sync_flushing = false;
        }
    }

    /// Complete `tag` if every sub-request is answered and the rule in the module doc allows.
    pub(crate) fn try_finish(&mut self, tag: Tag, out: &mut Vec<Command>) {
        let Some(p) = self.pending.get(&tag) else {
            return;
        };
        if p.outstanding > 0 {
            return;
        }
        let (succeeded, failure) = (p.succeeded, p.failure);
        let is_read = matches!(p.op, ClientOp::Read { .. });
        let is_flush = matches!(p.op, ClientOp::Flush);
        if is_read {
            // Reads are never doomed (`fail_missed_by` skips them).
            debug_assert!(!p.doomed);
            self.finish_read(tag, out);
            return;
        }
        let result = if p.doomed {
            Err(IoError::Io)
        } else if succeeded.is_empty() {
            // Failed everywhere: no replica has anything the others lack, so none leaves
            // (a full disk everywhere is the client's ENOSPC, not a reason to degrade).
            Err(failure_to_io(failure))
        } else {
            // Replicas that failed it have left (`act_on_failures`). Every replica the store
            // may call in-sync that lacks this request must be resolved first (outdated, or
            // resynced), unless policy says fail.
            let missed = match p.missed {
                Some(m) => m,
                None => {
                    // A replica in sync by now that it was not sent to, or sent to on an
                    // older session (which then failed), was resynced after it started. For a
                    // write that cannot be (the write's range lock keeps the copy out, and its
                    // range is dirty on a replica that failed it); for a flush it is fine: a
                    // resync ends with a flush of the replica.
                    let (sent, sessions) = (p.sent, p.sessions);
                    let mut m = Set::default();
                    for r in self.indices() {
                        let session = self.slot(r).session;
                        let resynced = self.membership(r) == Membership::InSync
                            && (!sent.has(r) || session != sessions[usize::from(r.0)]);
                        if !succeeded.has(r) && self.blocks_ack(r) && !resynced {
                            m.add(r);
                        }
                    }
                    m
                }
            };
            if missed.is_empty() {
                Ok(None)
            } else if self.cfg.no_quorum == NoQuorum::Fail
                && self
                    .indices()
                    .any(|r| missed.has(r) && self.membership(r) == Membership::Down)
            {
                Err(IoError::Io)
            } else {
                if let Some(p) = self.pending.get_mut(&tag) {
                    if p.missed.is_none() {
                        p.missed = Some(missed);
                        self.parked.insert(tag);
                        // Done on every replica it went to: it holds no lock while it waits,
                        // so resync can copy its range and later writes can proceed.
                        self.release(tag, out);
                    }
                }
                return;
            }
        };
        if is_flush {
            match result {
                Ok(_) => self.unflushed.flush_succeeded(tag),
                Err(_) => self.unflushed.flush_failed(tag),
            }
        }
        let was_parked = self.parked.remove(&tag);
        self.pending.remove(&tag);
        out.push(Command::Complete { tag, result });
        if !was_parked {
            self.release(tag, out);
        }
    }

    /// Release `tag`'s range and start what was waiting for it.
    pub(crate) fn release(&mut self, tag: Tag, out: &mut Vec<Command>) {
        for (t, work) in self.locks.release(tag) {
            self.start_work(t, work, out);
        }
    }

    /// `r` no longer holds up parked requests (outdated, failed, or resynced): finish those
    /// that were waiting only for it.
    pub(crate) fn resolve(&mut self, r: ReplicaIdx, out: &mut Vec<Command>) {
        let parked: Vec<Tag> = self.parked.iter().copied().collect();
        for tag in parked {
            if let Some(p) = self.pending.get_mut(&tag) {
                if let Some(m) = &mut p.missed {
                    m.remove(r);
                }
            }
            self.try_finish(tag, out);
        }
    }

    /// Re-check parked requests after a replica went `Down` under the fail policy.
    pub(crate) fn recheck_parked(&mut self, out: &mut Vec<Command>) {
        let parked: Vec<Tag> = self.parked.iter().copied().collect();
        for tag in parked {
            self.try_finish(tag, out);
        }
    }
}

pub(crate) fn worse(a: Option<ReplicaFailure>, b: ReplicaFailure) -> ReplicaFailure {
    // NoSpace is the most useful error to report to a client; otherwise keep the first.
    match (a, b) {
        (_, ReplicaFailure::NoSpace) => ReplicaFailure::NoSpace,
        (Some(a), _) => a,
        (None, b) => b,
    }
}

pub(crate) fn failure_to_io(f: Option<ReplicaFailure>) -> IoError {
    match f {
        Some(ReplicaFailure::NoSpace) => IoError::NoSpace,
        Some(ReplicaFailure::StaleEpoch) => IoError::ShutDown,
        // Rotted blocks are an I/O error to the client, like a disk error.
        Some(ReplicaFailure::Corrupt { .. } | ReplicaFailure::Io | ReplicaFailure::Lost) | None => {
            IoError::Io
        }
    }
}
