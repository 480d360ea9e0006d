//! Bounds and defaults of the replication core.

/// Most replicas a volume can have (replica sets are bit sets in a u32; 8 is plenty).
pub const MAX_REPLICAS: usize = 8;

/// Dirty-tracking granularity: one bit per 64 KiB. Small enough that random 4 KiB writes
/// during an outage copy little (at most 16x, usually far less as writes cluster), large
/// enough that a 1 TiB volume's bitmap is 2 MiB.
pub const DEFAULT_CHUNK_BYTES: u64 = 64 * 1024;

/// Largest resync copy (adjacent dirty chunks are copied together, up to this).
pub const DEFAULT_RESYNC_UNIT_BYTES: u64 = 1024 * 1024;

/// Resync copies in flight per syncing replica.
pub const DEFAULT_RESYNC_PARALLEL: u32 = 4;

/// Tags at or above this are the engine's own (resync copies); client tags stay below.
pub const INTERNAL_TAG_BASE: u64 = 1 << 63;

/// Unflushed-range entries kept before they are merged (bounds memory between flushes).
pub const UNFLUSHED_COMPACT_AT: usize = 4096;
