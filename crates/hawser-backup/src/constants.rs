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
/// A request to the target (5xx, 429, SlowDown, dropped connections) is retried with a
/// jittered exponential backoff from `RETRY_FIRST_MS` up to `RETRY_MAX_BACKOFF_MS` until
/// `RETRY_TIMEOUT_SECS` have passed since its first try (a controller may set another time:
/// `--backup-retry-secs`); then the backup fails with the target's last answer. The time is
/// the budget, not the count: object_store's backoff is random (each wait is drawn between
/// the first and twice the previous one), so 8 retries took anywhere from 1 s to 25 s, too
/// short for a store that throttles for a minute. `MAX_RETRIES` only bounds the count.
pub const MAX_RETRIES: usize = 200;
pub const RETRY_FIRST_MS: u64 = 100;
pub const RETRY_MAX_BACKOFF_MS: u64 = 10_000;
pub const RETRY_TIMEOUT_SECS: u64 = 120;
/// The retry time of a request someone waits on: the connection check of `hawser backup
/// target add`, the controller reading a manifest for `volume create --from-backup`. The
/// person learns of a target that is down or throttling in seconds, not after
/// `RETRY_TIMEOUT_SECS`, and an API call does not hold its caller for minutes.
pub const CHECK_RETRY_SECS: u64 = 10;
/// The longest retry time a controller may set (a day: a backup that waits longer for its
/// target is better failed and retried by a person).
pub const MAX_RETRY_TIMEOUT_SECS: u64 = 86_400;
/// An error answer's body is read (for its S3 code, such as SlowDown) only up to this size.
pub const MAX_ERROR_BODY_BYTES: u64 = 64 << 10;
/// A request to the target that takes longer than this is abandoned (and retried).
pub const REQUEST_TIMEOUT_SECS: u64 = 60;
/// A holder rewrites its lock on the target this often (`locks.rs`).
pub const LOCK_REFRESH_SECS: u64 = 30;
/// A lock the target stamped longer ago than this is a dead holder's: ignored. A killed
/// backup or prune blocks the other for at most this long.
pub const LOCK_STALE_SECS: u64 = 600;
/// A holder whose lock went unwritten this long (half the stale time, a margin for clock
/// rates and slow answers) may have looked dead: it stops before it does harm.
pub const LOCK_LAPSE_SECS: u64 = LOCK_STALE_SECS / 2;
/// How often a backup that found a prune running looks again.
pub const LOCK_WAIT_POLL_MS: u64 = 1000;
