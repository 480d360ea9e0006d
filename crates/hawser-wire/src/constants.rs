//! Bounds shared by the wire formats. Every buffer a peer can make us allocate is bounded here.

/// Largest payload of one replica frame (and of one NBD request): 32 MiB, the NBD maximum
/// most clients use. A peer announcing more is a protocol error and loses its connection.
pub const MAX_PAYLOAD_BYTES: u32 = 32 * 1024 * 1024;

/// Sector size: the smallest unit of I/O Hawser accepts. Offsets and lengths of every
/// data request are multiples of it.
pub const SECTOR_BYTES: u64 = 512;

/// The block size Hawser advertises as preferred (and the granularity of replica files).
pub const BLOCK_BYTES: u64 = 4096;

/// Longest replica or volume id carried on the wire.
pub const MAX_ID_BYTES: usize = 128;
