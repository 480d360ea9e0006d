//! Scrub passes in runs with rot: started (and stopped) now and then among the faults, and
//! one driven to completion while healing, after which no in-sync replica may keep a rotted
//! block that another in-sync replica holds good: the pass found and repaired all of them.

use super::*;

/// Where the healing phase's scrub pass stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HealScrub {
    NotStarted,
    Running,
    /// Completed (`Command::ScrubDone`) and checked.
    Done,
}

impl World {
    /// A scrub pass starts (`start`) or the running one stops, among the random faults.
    pub(super) fn scrub_action(&mut self, start: bool) {
        if start {
            let mut started = false;
            self.step(|e, out| started = e.start_scrub(out));
            if started {
                self.stats.scrubs_started += 1;
            }
            trace!(self, "SCRUB start (started: {started})");
        } else {
            trace!(self, "SCRUB stop");
            self.engine.stop_scrub();
        }
    }

    /// The engine reported a pass complete.
    pub(super) fn scrub_done(&mut self) {
        self.stats.scrubs_done += 1;
        if self.phase == Phase::Heal && self.heal_scrub == HealScrub::Running {
            self.heal_scrub = HealScrub::Done;
        }
    }

    /// Healed and quiet: in runs with rot, whether the healing phase's pass is over and
    /// checked (the volume then reads back); if not, start it (the run goes on until quiet
    /// again). Other runs read back at once.
    pub(super) fn heal_scrubbed(&mut self) -> bool {
        if self.p.faults.corrupt == 0 {
            return true;
        }
        match self.heal_scrub {
            HealScrub::NotStarted => {
                trace!(self, "QUIET: scrubbing");
                self.heal_scrub = HealScrub::Running;
                let mut started = false;
                self.step(|e, out| {
                    e.stop_scrub();
                    started = e.start_scrub(out);
                });
                if !started {
                    self.fail("the engine refused to start a scrub after healing".into());
                }
                self.stats.scrubs_started += 1;
                false
            }
            HealScrub::Running => {
                let v = self.engine.scrub_view();
                self.fail(format!(
                    "quiet, yet the healing scrub has not finished: {v:?}"
                ));
                false
            }
            HealScrub::Done => {
                self.check_scrubbed();
                true
            }
        }
    }

    /// No in-sync replica has a rotted block that another in-sync replica holds good.
    fn check_scrubbed(&mut self) {
        let n = self.p.replicas;
        let in_sync = |w: &World, r: usize| w.engine.membership(ri(r)) == Membership::InSync;
        let b = hawser_core::constants::ORDER_BLOCK_BYTES;
        for r in (0..n).filter(|&r| in_sync(self, r)) {
            for &k in &self.replicas[r].corrupt {
                let good = (0..n).find(|&o| {
                    o != r && in_sync(self, o) && self.replicas[o].rotted(k * b, b).is_none()
                });
                if let Some(o) = good {
                    let v = self.engine.scrub_view();
                    self.fail(format!(
                        "after a complete scrub, block {k} of in-sync replica {r} is still \
                         rotted though in-sync replica {o} holds it good ({v:?})"
                    ));
                    return;
                }
            }
        }
    }
}
