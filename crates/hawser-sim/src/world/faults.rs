//! Which fault may strike next, and striking it. The rules keep the checks honest (the module
//! doc of `world.rs` lists them): no fault takes away the last good copy of an acknowledged
//! write while an unhealthy replica could outdate it.

use hawser_core::constants::ORDER_BLOCK_BYTES;

use super::*;

impl World {
    /// Whether a fault may take replica `r` out of the in-sync set. Not when `r` is the last
    /// healthy replica the store calls in-sync (no disk fault, no unrepaired node crash, not
    /// being outdated, not already on its way out) while an unhealthy one is in sync in the engine's view: the engine
    /// could outdate `r` on the strength of the unhealthy one (it does not know yet), leaving
    /// acknowledged writes only on a broken disk or on a replica the store no longer calls
    /// in-sync. The engine then rightly suspends I/O until someone intervenes, which the final
    /// checks (healed without manual action) cannot tell from a hang. Losing every in-sync
    /// replica at once is allowed: the engine recovers from that (`Engine::promote`).
    pub(super) fn may_take_away(&self, r: usize) -> bool {
        let in_store = |o: usize| self.control.store[o] == StoreState::InSync;
        let doomed = |o: usize| match self.drivers[o].conn {
            Conn::Open(s) => self.doomed[o] == Some(s),
            _ => false,
        };
        let healthy = |o: usize| {
            in_store(o)
                && self.engine.membership(ri(o)) != Membership::Outdating
                && !self.disk_failed[o]
                && !self.volatile_lost[o]
                && self.replicas[o].up
                && self.replicas[o].fault == DiskFault::None
                && self.replicas[o].corrupt.is_empty()
                && !self.net.partitioned[o]
                && !doomed(o)
        };
        let n = self.p.replicas;
        let last_healthy = healthy(r) && !(0..n).any(|o| o != r && healthy(o));
        // A `Marking` replica counts too: the store may confirm it any moment, and the engine
        // then outdates `r` on its strength (seed 42546 of the 208,000-seed run: a node crash
        // of the marking replica, then a process crash of the last healthy one, left
        // acknowledged writes only in a lost page cache).
        let marking = |o: usize| self.engine.membership(ri(o)) == Membership::Marking;
        let unhealthy_quorum = |o: usize| {
            o != r
                && !healthy(o)
                && ((in_store(o) && self.engine.membership(ri(o)) == Membership::InSync)
                    || marking(o))
        };
        !(last_healthy && (0..n).any(unhealthy_quorum))
    }

    /// A replica that holds every acknowledged write for sure: in sync in the engine's view,
    /// no node crash since it last reconnected, no disk fault, no rotted block.
    pub(super) fn good_copy(&self, r: usize) -> bool {
        self.engine.membership(ri(r)) == Membership::InSync
            && !self.volatile_lost[r]
            && self.replicas[r].fault == DiskFault::None
            && self.replicas[r].corrupt.is_empty()
            && !self.disk_failed[r]
    }

    /// Another good copy that is not already on its way out (its session is open and not
    /// known broken, its process up, its network whole).
    pub(super) fn another_good_copy(&self, r: usize) -> bool {
        (0..self.p.replicas).any(|o| {
            let open = match self.drivers[o].conn {
                Conn::Open(s) => self.doomed[o] != Some(s),
                _ => false,
            };
            o != r && self.good_copy(o) && open && self.replicas[o].up && !self.net.partitioned[o]
        })
    }

    /// A disk error fails a replica for good: allow one more only if the quorum can still
    /// outdate it (a majority of healthy replicas remains), else I/O would rightly suspend
    /// forever.
    pub(super) fn may_fail_one_more(&self) -> bool {
        let n = self.p.replicas;
        let healthy = n - self.disk_failed.iter().filter(|&&f| f).count() - 1;
        match self.p.engine.quorum {
            Quorum::Majority => 2 * healthy >= n && healthy >= 1,
            Quorum::Any => healthy >= 1,
        }
    }

    pub(super) fn fault(&mut self) {
        if self.phase != Phase::Random {
            return;
        }
        if self.engine_state != EngineState::Up {
            // No new fault while an engine starts (recovery's own I/O is not faulted).
            let gap = self.fault_gap();
            self.schedule(gap.max(1), Event::Fault);
            return;
        }
        let m = self.p.faults;
        let n = self.p.replicas;
        let remote = |w: &World, r: usize| !(w.p.local && r == 0);
        // (weight, kind, replica)
        let mut options: Vec<(u32, u8, usize)> = Vec::new();
        for r in 0..n {
            if !self.may_take_away(r) {
                continue;
            }
            let up = self.replicas[r].up;
            if remote(self, r) && up {
                options.push((m.process_crash, 0, r));
                if self.another_good_copy(r) {
                    options.push((m.node_crash, 1, r));
                }
            }
            if remote(self, r) && !self.net.partitioned[r] {
                options.push((m.partition, 2, r));
            }
            if !self.disk_failed[r] && self.replicas[r].fault == DiskFault::None {
                if self.another_good_copy(r) && self.may_fail_one_more() {
                    options.push((m.io_error, 4, r));
                }
                options.push((m.disk_full, 5, r));
            }
            // Rot only while another replica holds a clean good copy, so a block is never
            // rotted everywhere by injection alone.
            let in_sync = self.engine.membership(ri(r)) == Membership::InSync;
            if m.corrupt > 0 && in_sync && self.another_good_copy(r) {
                options.push((m.corrupt, 7, r));
            }
        }
        if !self.control.down {
            options.push((m.control_outage, 3, 0));
        }
        // Scrub passes start (and now and then stop) in runs with rot only: other mixes draw
        // what they drew before the scrub existed.
        if m.corrupt > 0 {
            options.push((m.corrupt, 8, 0));
            if self.engine.scrub_view().is_some_and(|v| v.running) {
                options.push((m.corrupt, 9, 0));
            }
        }
        if m.engine_crash > 0 && self.may_crash_engine() {
            options.push((m.engine_crash, 6, 0));
        }
        // Only in runs with growth: other mixes draw what they drew before it existed.
        if self.may_grow() {
            options.push((m.grow, 10, 0));
        }
        let total: u32 = options.iter().map(|o| o.0).sum();
        if total > 0 {
            let mut pick = self.rng.random_range(0..total);
            let (_, kind, r) = *options
                .iter()
                .find(|o| {
                    if pick < o.0 {
                        true
                    } else {
                        pick -= o.0;
                        false
                    }
                })
                .expect("pick below the total");
            if kind == 10 {
                self.grow_volume();
            } else if kind >= 8 {
                self.scrub_action(kind == 8);
            } else {
                self.inject(kind, r);
            }
        }
        let gap = self.fault_gap();
        self.schedule(gap.max(1), Event::Fault);
    }

    pub(super) fn inject(&mut self, kind: u8, r: usize) {
        self.stats.faults += 1;
        match kind {
            0 | 1 => {
                let node = kind == 1;
                let keep = [0.0, 0.0, 0.5, 1.0][self.rng.random_range(0..4)];
                trace!(
                    self,
                    "FAULT {} crash of replica {r} (keep {keep})",
                    if node { "node" } else { "process" }
                );
                self.replicas[r].crash(node, keep, &mut self.rng);
                // A replica that is or is about to be in-sync in the store may now lack
                // acknowledged writes it had not flushed: exempt from the checks until the
                // engine repairs it (in sync again) or the store outdates it.
                let m = self.engine.membership(ri(r));
                if node
                    && (self.control.store[r] == StoreState::InSync
                        || matches!(
                            m,
                            Membership::InSync | Membership::Syncing | Membership::Marking
                        ))
                {
                    self.volatile_lost[r] = true;
                    self.lost_seen_out[r] = false;
                }
                // A dead process closes its connections (the engine notices soon); a dead node
                // does not (the engine notices by timeout).
                let notice = if node {
                    SESSION_TIMEOUT_US
                } else {
                    self.rng.random_range(0..=1_000)
                };
                if let Conn::Open(s) | Conn::Joining(s) = self.drivers[r].conn {
                    self.session_breaks(r, s, notice);
                }
                let down = self.rng.random_range(1_000..=100_000);
                self.schedule(down, Event::Restart { r, node });
            }
            2 => {
                trace!(self, "FAULT partition of replica {r}");
                self.net.partitioned[r] = true;
                let d = self.rng.random_range(1_000..=200_000);
                self.schedule(d, Event::HealPartition { r });
            }
            3 => {
                trace!(self, "FAULT control plane outage");
                self.control.down = true;
                let d = self.rng.random_range(1_000..=300_000);
                self.schedule(d, Event::ControlUp);
            }
            4 => {
                trace!(self, "FAULT disk errors on replica {r}");
                self.replicas[r].fault = DiskFault::Io(1.0);
                self.disk_failed[r] = true;
            }
            6 => self.crash_engine(),
            7 => {
                let blocks = self.p.size.div_ceil(ORDER_BLOCK_BYTES);
                let k = self.rng.random_range(1..=4);
                for _ in 0..k {
                    let b = self.rng.random_range(0..blocks);
                    self.replicas[r].corrupt.insert(b);
                }
                self.stats.corrupted += k;
                trace!(
                    self,
                    "FAULT rot of {k} block(s) on replica {r}: {:?}",
                    self.replicas[r].corrupt
                );
            }
            _ => {
                trace!(self, "FAULT disk full on replica {r}");
                self.replicas[r].fault = DiskFault::Full;
                let d = self.rng.random_range(1_000..=200_000);
                self.schedule(d, Event::DiskFree { r });
            }
        }
    }
}
