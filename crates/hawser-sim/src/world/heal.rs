//! The end of a run: everything heals, the volume goes quiet, is read back through the engine,
//! and the final checks run.

use super::*;

impl World {
    pub(super) fn begin_heal(&mut self) {
        trace!(self, "HEAL");
        self.phase = Phase::Heal;
        self.heal_started = self.now;
        for r in 0..self.p.replicas {
            self.net.partitioned[r] = false;
            self.net.reliable[r] = true;
            if self.replicas[r].fault == DiskFault::Full {
                self.replicas[r].fault = DiskFault::None;
            }
        }
        self.control.down = false;
        // Crashed replicas restart by their pending `Restart` events.
    }

    /// Nothing in flight anywhere and nothing left to do.
    pub(super) fn quiet(&self) -> bool {
        if self.engine_state != EngineState::Up || !self.journal_quiet() {
            return false;
        }
        let drivers_quiet = (0..self.p.replicas).all(|r| match self.drivers[r].conn {
            Conn::Open(_) => true,
            Conn::Idle => !self.engine.wants_connection(ri(r)),
            Conn::Connecting(_) | Conn::Joining(_) | Conn::Closing(_) => false,
        });
        let queue_quiet = self.queue.values().all(|ev| match ev {
            Event::DriverTick | Event::Fault | Event::ClientArrival => true,
            Event::SessionTimeout { r, session } => self.drivers[*r].conn != Conn::Open(*session),
            Event::ConnectTimeout { r, session } => {
                self.drivers[*r].conn != Conn::Connecting(*session)
            }
            _ => false,
        });
        drivers_quiet
            && queue_quiet
            && self.client.outstanding() == 0
            && self.engine.in_flight() == 0
            && self.control.in_flight == 0
            && !self.engine.wants_flush()
    }

    pub(super) fn quiet_reached(&mut self) {
        match self.phase {
            Phase::Heal => {
                if !self.heal_scrubbed() {
                    return;
                }
                trace!(self, "QUIET: reading the volume back");
                self.phase = Phase::ReadBack;
                self.read_back_next = 0;
                self.read_back();
            }
            Phase::ReadBack if self.read_back_next < self.p.size => self.read_back(),
            Phase::ReadBack => {
                self.phase = Phase::Done;
                self.final_checks();
            }
            Phase::Random | Phase::Done => {}
        }
    }

    /// Read the next pieces of the volume through the engine (checked by the client model).
    pub(super) fn read_back(&mut self) {
        for _ in 0..4 {
            if self.read_back_next >= self.p.size {
                break;
            }
            let len = FINAL_READ_BYTES.min(self.p.size - self.read_back_next);
            let off = self.read_back_next;
            self.read_back_next += len;
            self.submit(Kind::Read, off, len, false, false);
        }
    }

    /// A read of the healed volume failed: only allowed when every in-sync replica has a
    /// rotted block in its range (no other fault is left to blame).
    pub(super) fn read_back_failed(&mut self, offset: u64, len: u64) {
        let clean = (0..self.p.replicas).find(|&r| {
            self.engine.membership(ri(r)) == Membership::InSync
                && self.replicas[r].rotted(offset, len).is_none()
        });
        if let Some(r) = clean {
            self.fail(format!(
                "the read of bytes {offset}..{} failed after healing, though in-sync replica                  {r} holds them with no rotted block",
                offset + len
            ));
        }
    }

    pub(super) fn final_checks(&mut self) {
        let v = check::FinalView {
            engine: &self.engine,
            control: &self.control,
            replicas: &self.replicas,
            disk_failed: &self.disk_failed,
            outstanding: self.client.outstanding(),
            dirtied: &self.stats.dirtied,
        };
        if let Err(e) = check::final_state(&self.client.model, &v) {
            self.fail(e);
        }
        if self.client.stats.reads_failed > 0 && self.failure.is_none() {
            // Read-back reads must not fail once everything healed; earlier reads may.
            trace!(
                self,
                "{} reads failed during the run",
                self.client.stats.reads_failed
            );
        }
    }
}
