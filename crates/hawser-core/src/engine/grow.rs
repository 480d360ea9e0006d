//! Online growth: the volume's size grows while the engine serves I/O.
//!
//! The controller grows a volume in this order (docs/protocol.md, "Growing a volume"):
//! 1. every replica of the volume grows on disk, durably: the new range reads as zeroes on
//!    every replica, in sync or not, and each accepts requests there on its open sessions;
//! 2. the volume's record takes the new size (a restarted engine starts with it);
//! 3. the engine's driver calls `Keeper::grow` (which calls `Engine::grow`) under the lock
//!    that runs the state machine;
//! 4. the kernel device is told.
//!
//! So when the engine grows, the new range is identical (zeroes) on every replica, and no
//! request of this or any earlier engine ever reached it. Everything the engine keeps about
//! where replicas differ stays true when extended with "no difference" over the new range:
//! - dirty maps: new chunks are clean for every replica whatever its membership. An outdated
//!   replica with a full map ("unknown: copy all") lacks nothing there either: its unknown
//!   differences are in data written before the grow, all inside the old range. A replica
//!   being resynced lacks nothing there. The old partial last chunk keeps its bit: set, it
//!   is copied whole (its new part is zeroes on the source too); clear, the replica matches
//!   in its old part and everywhere holds zeroes in its new part.
//! - resync: cursors are chunk indices and stay valid; a copy in flight holds the range lock
//!   of its whole chunks (`resync.rs`), past the old end too, so no client write lands in the
//!   new part of a partial chunk while the copy reads or writes it, and clearing that chunk's
//!   bit when the copy lands is right even if the copy read only the old part.
//! - scrub: a pass compares its cursor with the size as it goes, so a pass under way reads the
//!   new range too, and the next pass covers it anyway; `ScrubView::size_bytes` follows.
//! - requests in flight keep their ranges (inside the old size); parked ones, unflushed sets
//!   and repairs are chunk or byte ranges inside the old size.
//!
//! From the moment it returns, `submit` accepts requests into the new range; they are
//! ordered, sent and marked dirty like any other.

use crate::constants::SECTOR_BYTES;
// One part of `Engine`'s impl, a child module of engine.rs (which holds the engine's state
// and calls this part), split by concern as the engine grew.
use crate::engine::Engine;

/// Why `Engine::grow` refused a size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrowError {
    /// A volume never shrinks online: replicas' data past the new end would be dropped
    /// under requests in flight.
    #[error("the volume is {size} bytes; it cannot shrink to {requested}")]
    Shrink { size: u64, requested: u64 },
    /// The size must be whole sectors, as every request is.
    #[error("{requested} bytes is not a multiple of the {align}-byte sector")]
    Misaligned { requested: u64, align: u64 },
}

impl Engine {
    /// Grow the volume to `size` bytes (see the module doc for the order the caller must
    /// follow: every replica already holds zeroes over the new range). The same size does
    /// nothing; a smaller or misaligned size is refused and nothing changes. Outputs no
    /// command: nothing waits for the size.
    pub fn grow(&mut self, size: u64) -> Result<(), GrowError> {
        if size < self.size {
            return Err(GrowError::Shrink {
                size: self.size,
                requested: size,
            });
        }
        if !size.is_multiple_of(SECTOR_BYTES) {
            return Err(GrowError::Misaligned {
                requested: size,
                align: SECTOR_BYTES,
            });
        }
        if size == self.size {
            return Ok(());
        }
        let chunks = size.div_ceil(self.cfg.chunk_bytes);
        for s in &mut self.slots {
            let before = s.dirty.count();
            // Clean, for every membership (module doc): not through `mark_dirty`, and a
            // resync point taken before still holds (it lacks nothing more now).
            s.dirty.grow(size);
            assert_eq!(
                s.dirty.count(),
                before,
                "growing marked or lost dirty chunks"
            );
            assert_eq!(s.dirty.chunks(), chunks);
        }
        self.size = size;
        Ok(())
    }
}
