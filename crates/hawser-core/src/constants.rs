//! Bounds and defaults of the replication core.

/// Most replicas a volume can have (replica sets are bit sets in a u32; 8 is plenty).
pub const MAX_REPLICAS: usize = 8;

/// Client requests and the volume's size are whole sectors of this size (`Engine::submit`
/// refuses others, `Engine::grow` refuses a size that is not).
pub const SECTOR_BYTES: u64 = 512;

/// Dirty-tracking granularity: one bit per 64 KiB. Small enough that random 4 KiB writes
/// during an outage copy little (at most 16x, usually far less as writes cluster), large
/// enough that a 1 TiB volume's bitmap is 2 MiB.
pub const DEFAULT_CHUNK_BYTES: u64 = 64 * 1024;

/// Largest resync copy (adjacent dirty chunks are copied together, up to this).
pub const DEFAULT_RESYNC_UNIT_BYTES: u64 = 1024 * 1024;

/// Range a scrub pass reads at once on every in-sync replica (`scrub.rs`): its reads are the
/// pass's only load on the disks, one unit at a time.
pub const DEFAULT_SCRUB_UNIT_BYTES: u64 = 1024 * 1024;

/// Largest scrub unit: one read of it must fit a request's `u32` length.
pub const MAX_SCRUB_UNIT_BYTES: u64 = 1 << 31;

/// Resync copies in flight per syncing replica.
pub const DEFAULT_RESYNC_PARALLEL: u32 = 4;

/// Tags at or above this are the engine's own (resync copies); client tags stay below.
pub const INTERNAL_TAG_BASE: u64 = 1 << 63;

/// Unflushed-range entries kept before they are merged (bounds memory between flushes).
pub const UNFLUSHED_COMPACT_AT: usize = 4096;

/// Modifying requests are ordered by whole blocks of this size (`range_lock::span` widens
/// their ranges outward to it). A replica keeps a CRC-32C per block of this size: a write that
/// covers part of a block re-reads the block to sum it whole, so two writes into one block
/// must not interleave even when their bytes do not overlap, or one's read-back would carry
/// stale bytes of the other and a sum that matches neither.
pub const ORDER_BLOCK_BYTES: u64 = 4096;

/// Corrupt blocks (`ReplicaFailure::Corrupt`, confirmed under the range lock) a replica may
/// show in one engine's life before it leaves as failed, like a disk error. Rot of a few
/// blocks is repaired in place from another replica; a replica that keeps rotting has a
/// failing medium and is better rebuilt elsewhere. 4096 blocks is 16 MiB: far more than
/// stray bit rot, far less than a dying disk keeps producing.
pub const DEFAULT_CORRUPT_LIMIT_BLOCKS: u64 = 4096;

/// Repairs queued or running at once; a corrupt range found beyond that is not queued (the
/// next read of it finds it again).
pub const MAX_REPAIRS: usize = 1024;
