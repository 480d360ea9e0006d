//! The engine driver's sessions policy, without I/O: when to (re)connect a replica the engine
//! wants back (after a backoff that doubles while attempts fail), whether a returning
//! replica's node rebooted since this engine's last session with it (from the boot id its
//! Hello answer carries), and when to flush in the background. The agent and the simulator
//! both run it; they only open the sessions and report what happened.
//!
//! Rules:
//! - A replica is due when the engine wants it (`Engine::wants_connection`), no attempt for it
//!   is under way, and its backoff has passed. An attempt ends with `ended`: joined (the
//!   backoff is reset), or failed (the next try waits the backoff, which then doubles up to
//!   its maximum). A session that opened resets the backoff too: a replica that answers but
//!   cannot join (its journal put failed) is retried soon, not after a long wait.
//! - A boot id counts as seen only once the replica joined: a join that fails must not hide
//!   its reboot from the next attempt, or what it lost with its power is never recopied
//!   (found by the simulator). A replica this engine never had a session with reports
//!   `None`: its journal tells (the keeper's join).
//! - A background flush is due at most once per interval while the engine has writes no
//!   flush has covered (`Engine::wants_flush`), so a replica whose node loses power has
//!   little to recopy and extents can leave the activity log.
//!
//! Time is the caller's clock in any unit, the same for `now` and the params.

use crate::{Engine, ReplicaIdx};

/// The policy's tunables, in the caller's time unit.
#[derive(Clone, Copy, Debug)]
pub struct LinkParams {
    pub backoff_min: u64,
    pub backoff_max: u64,
    pub flush_interval: u64,
}

#[derive(Clone, Debug)]
struct Link {
    /// An attempt is under way (between `due` and `ended`).
    busy: bool,
    next_try: u64,
    backoff: u64,
    /// The boot id of its node at this engine's last session with it that joined.
    boot: Option<u64>,
    /// The boot id of the session under way, taken by `ended` if it joins.
    opening: Option<u64>,
}

/// The sessions policy of one engine.
pub struct Links {
    p: LinkParams,
    links: Vec<Link>,
    last_flush: u64,
}

impl Links {
    /// The policy of an engine started at `now`; `boots`: the boot id of each replica's node
    /// as the engine found it at its start (`None`: not reached, or no boot id).
    pub fn new(p: LinkParams, boots: Vec<Option<u64>>, now: u64) -> Links {
        Links {
            links: boots
                .into_iter()
                .map(|boot| Link {
                    busy: false,
                    next_try: 0,
                    backoff: p.backoff_min,
                    boot,
                    opening: None,
                })
                .collect(),
            p,
            last_flush: now,
        }
    }

    /// The replicas to (re)connect now, each marked as under way until `ended`.
    pub fn due(&mut self, e: &Engine, now: u64) -> Vec<ReplicaIdx> {
        let mut due = Vec::new();
        for (i, l) in self.links.iter_mut().enumerate() {
            let r = ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS"));
            if !l.busy && now >= l.next_try && e.wants_connection(r) {
                l.busy = true;
                due.push(r);
            }
        }
        due
    }

    /// No (re)connect attempt under way.
    pub fn at_rest(&self) -> bool {
        self.links.iter().all(|l| !l.busy)
    }

    /// Whether an attempt for `r` is under way.
    pub fn busy(&self, r: ReplicaIdx) -> bool {
        self.links[usize::from(r.0)].busy
    }

    /// An attempt for `r` was started by the caller, not by `due` (at an engine's start).
    pub fn begin(&mut self, r: ReplicaIdx) {
        self.links[usize::from(r.0)].busy = true;
    }

    /// A session with `r` opened; its node's boot id is `boot` (`None`: it has none, as the
    /// local replica in the engine's process). Returns whether the node rebooted since this
    /// engine's last session with it, or `None` when this engine had none (or no boot id).
    pub fn opened(&mut self, r: ReplicaIdx, boot: Option<u64>) -> Option<bool> {
        let l = &mut self.links[usize::from(r.0)];
        l.backoff = self.p.backoff_min;
        l.opening = boot;
        match (l.boot, boot) {
            (Some(before), Some(now)) => Some(before != now),
            _ => None,
        }
    }

    /// The attempt for `r` ended at `now`: `joined` (the engine was told it is connected),
    /// or failed (retried after the backoff).
    pub fn ended(&mut self, r: ReplicaIdx, joined: bool, now: u64) {
        let (min, max) = (self.p.backoff_min, self.p.backoff_max);
        let l = &mut self.links[usize::from(r.0)];
        l.busy = false;
        let opening = l.opening.take();
        if joined {
            if opening.is_some() {
                l.boot = opening;
            }
            l.backoff = min;
        } else {
            l.next_try = now + l.backoff;
            l.backoff = (l.backoff * 2).clamp(min, max);
        }
    }

    /// Whether to flush in the background now (counted as done if so).
    pub fn flush_due(&mut self, e: &Engine, now: u64) -> bool {
        if e.wants_flush() && now >= self.last_flush + self.p.flush_interval {
            self.last_flush = now;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: LinkParams = LinkParams {
        backoff_min: 10,
        backoff_max: 40,
        flush_interval: 100,
    };

    /// Two replicas, the second out of the engine's set and wanted back.
    fn setup() -> (Engine, Links) {
        let mut e = Engine::new(1 << 20, &[true, false]);
        let mut out = Vec::new();
        e.on_replica_lost(ReplicaIdx(1), &mut out);
        e.on_outdate_done(ReplicaIdx(1), &mut out);
        assert!(e.wants_connection(ReplicaIdx(1)));
        (e, Links::new(P, vec![None, Some(7)], 0))
    }

    #[test]
    fn failed_attempts_back_off_doubling_up_to_the_maximum() {
        let (e, mut l) = setup();
        let r = ReplicaIdx(1);
        assert_eq!(l.due(&e, 0), [r]);
        assert!(l.due(&e, 0).is_empty(), "two attempts at once");
        l.ended(r, false, 0);
        assert!(l.due(&e, 9).is_empty(), "retried before the backoff");
        assert_eq!(l.due(&e, 10), [r]);
        l.ended(r, false, 10);
        assert!(l.due(&e, 29).is_empty());
        assert_eq!(l.due(&e, 30), [r]);
        l.ended(r, false, 30);
        l.ended(r, false, 70);
        l.ended(r, false, 110);
        assert!(l.due(&e, 149).is_empty(), "the backoff passed its maximum");
        assert_eq!(l.due(&e, 150), [r]);
    }

    #[test]
    fn a_boot_id_counts_only_once_the_replica_joined() {
        let (e, mut l) = setup();
        let r = ReplicaIdx(1);
        l.due(&e, 0);
        assert_eq!(l.opened(r, Some(8)), Some(true));
        l.ended(r, false, 0);
        // The join failed: the next session must still see the reboot.
        l.due(&e, 100);
        assert_eq!(
            l.opened(r, Some(8)),
            Some(true),
            "a failed join hid the reboot"
        );
        l.ended(r, true, 100);
        assert_eq!(l.opened(r, Some(8)), Some(false));
        // A replica never reached: its journal tells.
        assert_eq!(l.opened(ReplicaIdx(0), Some(3)), None);
    }

    #[test]
    fn a_session_that_opened_resets_the_backoff() {
        let (e, mut l) = setup();
        let r = ReplicaIdx(1);
        for now in [0, 10, 30] {
            assert_eq!(l.due(&e, now), [r]);
            l.ended(r, false, now);
        }
        l.due(&e, 70);
        l.opened(r, Some(7));
        l.ended(r, false, 70);
        assert_eq!(
            l.due(&e, 80),
            [r],
            "a replica that answered waited the long backoff"
        );
    }

    #[test]
    fn background_flushes_wait_for_writes_and_the_interval() {
        let mut e = Engine::new(1 << 20, &[true]);
        let mut l = Links::new(P, vec![None], 0);
        assert!(!l.flush_due(&e, 500), "flushed with nothing written");
        let mut out = Vec::new();
        e.submit(
            1,
            crate::ClientOp::Write {
                offset: 0,
                data: bytes::Bytes::from(vec![1u8; 512]),
                fua: false,
            },
            &mut out,
        );
        let crate::Command::Send { sub, .. } = out[0].clone() else {
            panic!("{out:?}")
        };
        e.on_reply(sub, Ok(None), &mut out);
        assert!(l.flush_due(&e, 500));
        assert!(!l.flush_due(&e, 599), "twice in one interval");
        assert!(l.flush_due(&e, 600));
    }
}
