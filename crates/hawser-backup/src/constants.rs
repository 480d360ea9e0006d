//! Every bound of a backup or restore in one place.

/// The default unit of a backup: a volume is cut into blocks of this size, each hashed,
/// compressed and stored once. Larger blocks mean fewer objects (requests cost money and
/// time on S3) and a smaller manifest; smaller ones upload less after scattered writes.
/// 1 MiB sits between Longhorn's 2 MiB and Hawser's 64 KiB catch-up digests; the manifest
/// records the size, so it can change without breaking older backups.
pub const DEFAULT_BLOCK_BYTES: u64 = 1 << 20;
/// The smallest and largest block sizes a manifest may name.
pub const MIN_BLOCK_BYTES: u64 = 64 << 10;
pub const MAX_BLOCK_BYTES: u64 = 64 << 20;
/// Blocks read, hashed, compressed or sent at once by one backup or restore: enough to keep
/// a remote store's round trips overlapped, few enough to bound memory
/// (`MAX_IN_FLIGHT_BLOCKS` x the block size, twice: raw and compressed).
pub const MAX_IN_FLIGHT_BLOCKS: usize = 4;
/// zstd's level: 3 is its default, fast enough to keep up with a disk on one core.
pub const ZSTD_LEVEL: i32 = 3;
/// The longest backup name: a volume name (63) and a UTC time stamp fit.
pub const MAX_BACKUP_NAME_BYTES: usize = 100;
/// The largest manifest a restore will read (a 64 TiB volume of 1 MiB blocks, all written,
/// is about 5 GiB of JSON; so this bounds volumes with manifests of up to ~6 TiB of data).
pub const MAX_MANIFEST_BYTES: u64 = 512 << 20;
/// Retries of one request to the target (5xx, 429, SlowDown, dropped connections), with
/// exponential backoff from `RETRY_FIRST_MS` up to `RETRY_MAX_BACKOFF_MS`, all within
/// `RETRY_TIMEOUT_SECS`: then the backup fails with the target's last answer.
pub const MAX_RETRIES: usize = 8;
pub const RETRY_FIRST_MS: u64 = 100;
pub const RETRY_MAX_BACKOFF_MS: u64 = 10_000;
pub const RETRY_TIMEOUT_SECS: u64 = 120;
/// A request to the target that takes longer than this is abandoned (and retried).
pub const REQUEST_TIMEOUT_SECS: u64 = 60;
