//! Online growth of the volume (`FaultMix::grow`), in the controller's order
//! (docs/protocol.md, "Growing a volume"): every replica's disk grows, durably, with zeroes
//! over the new range (down or out of date ones too: the controller waits for each); then
//! the record's size, which a later engine starts with (`Params::size`); then the running
//! engine and its journal keeper (`Keeper::grow`, the call the agent makes) in one step;
//! then the client, whose workload and model take in the new range. All at one instant: the
//! controller's waiting for every replica is not modelled, only its outcome.
//!
//! No growth rule lives here: what the engine and keeper do with the size is theirs. The
//! checks cover the new range because they go by the model's sectors and the size.

use rand::Rng;

use super::{EngineState, Phase, World};
use crate::config::{MAX_GROWS, MAX_GROW_CHUNKS};
use crate::pattern::{JUNK_BASE, SECTOR};
use crate::Mutation;

impl World {
    /// Whether the volume may grow now: the engine is up (the controller grows an attached
    /// volume through its engine) and the run has growths left.
    pub(super) fn may_grow(&self) -> bool {
        self.p.faults.grow > 0
            && self.phase == Phase::Random
            && self.engine_state == EngineState::Up
            && self.stats.grows < MAX_GROWS
    }

    pub(super) fn grow_volume(&mut self) {
        let chunk = self.p.engine.chunk_bytes;
        let old = self.p.size;
        // Whole chunks, and sometimes a partial last one, or growth inside the old partial
        // last chunk only.
        let add = self.rng.random_range(0..=MAX_GROW_CHUNKS) * chunk
            + self.rng.random_range(0..chunk / SECTOR) * SECTOR;
        let size = old + add.max(SECTOR);
        trace!(self, "GROW the volume from {old} to {size} bytes");
        self.stats.grows += 1;
        for (r, rep) in self.replicas.iter_mut().enumerate() {
            rep.disk.grow(size);
            if self.mutation == Mutation::GrowWithoutZeroes && r == self.p.replicas - 1 {
                rep.disk
                    .scribble(old, size - old, JUNK_BASE + 1_000 + self.stats.grows);
            }
        }
        self.p.size = size;
        if self.jd.is_some() {
            let mut grown = Ok(());
            self.keep(|k, e, _| grown = k.grow(e, size));
            grown.expect("the keeper grows to a larger, aligned size");
        } else {
            self.engine.grow(size).expect("a larger, aligned size");
        }
        assert_eq!(self.engine.size(), size);
        self.client.grow(size);
    }
}
