//! Sessions with the replicas: opening the ones the sessions policy (`hawser_core::driver::links`)
//! says are due, Hellos and their answers, and the background flush.

use super::*;

impl World {
    pub(super) fn driver_tick(&mut self) {
        if self.engine_state != EngineState::Up {
            if self.phase != Phase::Done {
                self.schedule(DRIVER_TICK_US, Event::DriverTick);
            }
            return;
        }
        self.journal_tick();
        for r in self.links.due(&self.engine, self.now) {
            let r = usize::from(r.0);
            if self.drivers[r].conn != Conn::Idle {
                let conn = self.drivers[r].conn;
                return self.fail(format!(
                    "the sessions policy reconnects replica {r}, whose session is {conn:?}"
                ));
            }
            self.connect(r);
        }
        if self.phase != Phase::Done && self.links.flush_due(&self.engine, self.now) {
            self.submit(Kind::Flush, 0, 0, false, true);
        }
        match self.phase {
            Phase::Heal | Phase::ReadBack if self.quiet() => self.quiet_reached(),
            Phase::Heal | Phase::ReadBack if self.now > self.heal_started + HEAL_DEADLINE_US => {
                let state = self.describe_state();
                self.fail(format!(
                    "not quiet {} s after healing: {state}",
                    HEAL_DEADLINE_US / 1_000_000
                ));
            }
            _ => {}
        }
        if self.phase != Phase::Done {
            self.schedule(DRIVER_TICK_US, Event::DriverTick);
        }
    }

    pub(super) fn connect(&mut self, r: usize) {
        let s = self.new_session();
        self.drivers[r].conn = Conn::Connecting(s);
        self.schedule(CONNECT_TIMEOUT_US, Event::ConnectTimeout { r, session: s });
        if !self.replicas[r].up {
            return; // refused; the timeout ends the attempt
        }
        let inc = self.replicas[r].incarnation;
        let fate = self
            .net
            .fate(&mut self.rng, r, true, true, SESSION_TIMEOUT_US);
        if let Fate::Deliver(d) | Fate::Late(d) = fate {
            self.schedule(d, Event::Hello { r, inc, session: s });
        }
    }

    /// An attempt to bring replica `r` back failed (its Hello timed out, or its join).
    pub(super) fn connect_failed(&mut self, r: usize) {
        self.drivers[r].conn = Conn::Idle;
        if self.engine_state == EngineState::Up {
            self.links.ended(ri(r), false, self.now);
        }
    }

    pub(super) fn hello_arrives(&mut self, r: usize, inc: u64, session: u64) {
        let rep = &mut self.replicas[r];
        if self.net.partitioned[r] || !rep.up || rep.incarnation != inc {
            return;
        }
        if !rep.hello(session, self.control.epoch) {
            return;
        }
        self.answer_hellos(r);
    }

    pub(super) fn answer_hellos(&mut self, r: usize) {
        let (boot, inc) = (self.replicas[r].boot, self.replicas[r].incarnation);
        for session in self.replicas[r].ready_hellos() {
            let fate = self
                .net
                .fate(&mut self.rng, r, false, true, SESSION_TIMEOUT_US);
            if let Fate::Deliver(d) = fate {
                self.schedule(
                    d,
                    Event::HelloOk {
                        r,
                        inc,
                        session,
                        boot,
                    },
                );
            }
        }
    }

    pub(super) fn hello_ok(&mut self, r: usize, inc: u64, session: u64, boot: u64) {
        if self.net.partitioned[r] || self.drivers[r].conn != Conn::Connecting(session) {
            return;
        }
        let d = &mut self.drivers[r];
        d.conn = Conn::Open(session);
        d.inc = inc;
        if self.engine_state != EngineState::Up {
            d.start_boot = Some(boot);
            self.start_hello_settled(r);
            return;
        }
        // `None`: this engine never had a session with it; the journal tells.
        let rebooted = self.links.opened(ri(r), Some(boot));
        if self.jd.is_some() {
            // Like the agent's driver: into the journal's set first, then the engine.
            self.join(r, session, rebooted);
            return;
        }
        self.links.ended(ri(r), true, self.now);
        let rebooted = rebooted.unwrap_or(true);
        self.step(|e, out| e.on_replica_connected(ri(r), rebooted, out));
        if !self.engine.replica_view(ri(r)).connected {
            self.drivers[r].conn = Conn::Idle;
        }
    }
}
