//! Online growth of a running engine (`POST /v1/engines/{volume}/grow`). The controller has
//! grown every replica first, so the new range reads as zeroes on all of them and each takes
//! writes there on its open session; only then does the engine's size move (docs/protocol.md,
//! "Growing a volume online"). The engine and its journal keeper grow together under the one
//! lock that runs the state machine, and the size read on every request follows last, so no
//! request into the new range reaches an engine that would refuse it.

use std::sync::atomic::Ordering;

use super::VolumeEngine;

impl VolumeEngine {
    /// Grow the engine to `size` bytes (a no-op at its size or less).
    pub fn grow(&self, size: u64) -> anyhow::Result<()> {
        if size <= self.size.load(Ordering::Acquire) {
            return Ok(());
        }
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            inner
                .keeper
                .grow(&mut inner.engine, size)
                .map_err(|e| anyhow::anyhow!("engine of {}: {e}", self.volume))?;
        }
        self.size.fetch_max(size, Ordering::AcqRel);
        Ok(())
    }
}
