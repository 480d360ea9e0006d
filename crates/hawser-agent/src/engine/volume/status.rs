//! What the engine reports of itself (`EngineStatus`): each replica's membership and resync
//! progress, with copy rates measured from when the maintenance task saw each resync begin.

use std::sync::atomic::Ordering;
use std::time::Instant;

use hawser_api::agent::{EngineReplicaStatus, EngineStatus, ScrubStatus};
use hawser_core::{Engine, Membership, ReplicaIdx};

use super::VolumeEngine;

impl VolumeEngine {
    /// Remembers when each replica's resync began (and forgets it when it ends).
    pub(super) fn note_resyncs(&self, e: &Engine) {
        let mut began = self.sync_began.lock().unwrap_or_else(|p| p.into_inner());
        for (i, b) in began.iter_mut().enumerate() {
            let v = e.replica_view(Self::idx(i));
            let syncing = matches!(v.membership, Membership::Syncing | Membership::Marking);
            match (syncing, &b) {
                (true, None) => *b = Some((Instant::now(), v.copied_bytes)),
                (false, Some(_)) => *b = None,
                _ => {}
            }
        }
    }

    /// Bytes per second copied to replica `i` since its resync began.
    fn resync_speed(&self, i: usize, copied_now: u64) -> u64 {
        let began = self.sync_began.lock().unwrap_or_else(|p| p.into_inner());
        match began.get(i).copied().flatten() {
            Some((at, copied)) => {
                let ms = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
                if ms < 500 {
                    return 0;
                }
                copied_now.saturating_sub(copied).saturating_mul(1000) / ms
            }
            None => 0,
        }
    }

    /// Start a scrub pass (docs/checksums.md); false if one is under way or the engine is
    /// fenced.
    pub fn start_scrub(&self) -> bool {
        let mut started = false;
        self.run(|e, out| started = e.start_scrub(out));
        if started {
            tracing::info!(volume = %self.volume, "scrub pass started");
        }
        started
    }

    pub fn status(&self) -> EngineStatus {
        let finished_at = *self
            .scrub_finished_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        EngineStatus {
            volume: self.volume.clone(),
            epoch: self.epoch,
            size_bytes: inner.engine.size(),
            in_sync: inner
                .engine
                .in_sync()
                .into_iter()
                .map(|r| self.replica_ids[usize::from(r.0)].clone())
                .collect(),
            replicas: (0..self.handles.len())
                .map(|i| {
                    let idx = ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS"));
                    let v = inner.engine.replica_view(idx);
                    let found = inner.engine.integrity(idx);
                    EngineReplicaStatus {
                        replica_id: self.replica_ids[i].clone(),
                        state: membership_name(v.membership).into(),
                        connected: v.connected,
                        dirty_bytes: v.dirty_bytes,
                        copied_bytes: v.copied_bytes,
                        resync_bytes_per_sec: self.resync_speed(i, v.copied_bytes),
                        corrupt_found_blocks: found.found,
                        corrupt_repaired_blocks: found.repaired,
                        corrupt_unrecoverable_blocks: found.unrecoverable,
                    }
                })
                .collect(),
            recovery: *self.recovery.lock().unwrap_or_else(|p| p.into_inner()),
            active_extents: inner.keeper.active_extents() as u64,
            // The export's, filled in by `Engines`.
            qos: Default::default(),
            scrub: inner.engine.scrub_view().map(|v| ScrubStatus {
                running: v.running,
                scrubbed_bytes: v.scrubbed_bytes,
                size_bytes: v.size_bytes,
                found_blocks: v.found_blocks,
                repaired_blocks: v.repaired_blocks,
                unrecoverable_blocks: v.unrecoverable_blocks,
                finished_at,
            }),
        }
    }

    /// The volume's name, and the journal commits this engine completed.
    pub fn journal_commits(&self) -> (String, u64) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (self.volume.clone(), inner.keeper.commits())
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }
}

pub fn membership_name(m: Membership) -> &'static str {
    match m {
        Membership::InSync => "in_sync",
        Membership::Down => "down",
        Membership::Outdating => "outdating",
        Membership::Outdated => "outdated",
        Membership::Syncing => "syncing",
        Membership::Marking => "marking",
        Membership::Failed => "failed",
    }
}
