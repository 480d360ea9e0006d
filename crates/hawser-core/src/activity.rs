//! The activity log's bookkeeping (no I/O): which 4 MiB extents a volume's modifying requests
//! may touch without a journal commit, which ones wait for one, and which ones may leave.
//!
//! Rule (what crash recovery relies on): a modifying request is sent to a replica only after a
//! journal listing every extent it touches is durable on every replica it is sent to; an
//! extent leaves the log only once no request into it is in flight and a flush that started
//! after the last one completed has succeeded. So after any crash, every extent where replicas
//! may differ is in the log of a replica that got a request into it.
//!
//! Size: an extent normally leaves once idle for a while, so random writes over a large volume
//! could keep most of it in the log, and recovery after a crash would compare all of it. Like
//! DRBD's al-extents, the log has a cap: past it, the least recently used extents that may
//! leave (nothing in flight, flushed) leave at the next commit without waiting to be idle.
//! The cap is soft: a request never waits for room (the engine's background flush, at most a
//! second after a write, makes extents able to leave), so the log can exceed it briefly.

use std::collections::{BTreeSet, HashMap};

pub struct ActivityLog {
    extent_bytes: u64,
    size: u64,
    /// The soft cap on the log's size, in extents.
    max_extents: usize,
    /// Extents in the last durable journal.
    committed: BTreeSet<u64>,
    /// Extents of `committed` that the commit under way drops: no new request may start in
    /// them, or it would run outside the log once that commit is durable.
    leaving: BTreeSet<u64>,
    /// Extents waiting requests need.
    wanted: BTreeSet<u64>,
    /// Requests in flight per extent (only extents with any).
    inflight: HashMap<u64, u32>,
    /// Per extent, the completion count at its last request's completion.
    last_done: HashMap<u64, u64>,
    /// Completions so far.
    done: u64,
    /// Every completion up to this count is covered by a successful flush.
    flushed: u64,
    /// The driver's clock, in ticks, and the tick of each extent's last request.
    now: u64,
    last_use: HashMap<u64, u64>,
}

impl ActivityLog {
    pub fn new(size: u64, extent_bytes: u64, max_extents: usize) -> ActivityLog {
        ActivityLog {
            extent_bytes,
            size,
            max_extents: max_extents.max(1),
            committed: BTreeSet::new(),
            leaving: BTreeSet::new(),
            wanted: BTreeSet::new(),
            inflight: HashMap::new(),
            last_done: HashMap::new(),
            done: 0,
            flushed: 0,
            now: 0,
            last_use: HashMap::new(),
        }
    }

    /// The volume grew to `size` bytes: requests into the new range need their extents in the
    /// log like any other. Nothing else changes: every extent tracked is inside the old size,
    /// and the old partial last extent is one extent whatever the size.
    pub fn grow(&mut self, size: u64) {
        assert!(size >= self.size, "the activity log never shrinks");
        self.size = size;
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn extents(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        if len == 0 || offset >= self.size {
            return 0..0;
        }
        let end = (offset + len).min(self.size);
        offset / self.extent_bytes..end.div_ceil(self.extent_bytes)
    }

    /// Start a modifying request over `[offset, offset+len)` if every extent it touches is
    /// committed (true); else record them as wanted (false: wait for a commit, then retry).
    pub fn try_begin(&mut self, offset: u64, len: u64) -> bool {
        let range = self.extents(offset, len);
        let missing: Vec<u64> = range
            .clone()
            .filter(|e| !self.committed.contains(e) || self.leaving.contains(e))
            .collect();
        if !missing.is_empty() {
            // The whole range is wanted, not only what is missing: over the cap, the next
            // commit could otherwise evict a committed extent of this very request (as least
            // recently used) to make room for the missing ones, and the request would never
            // find all its extents in the log (found by the simulator with a cap of 1-4).
            for e in range.clone() {
                // Wanted counts as used: it must not leave before its request runs.
                self.last_use.insert(e, self.now);
            }
            self.wanted.extend(range);
            return false;
        }
        for e in range {
            *self.inflight.entry(e).or_insert(0) += 1;
            self.last_use.insert(e, self.now);
        }
        true
    }

    /// A request started by `try_begin` completed (successfully or not).
    pub fn end(&mut self, offset: u64, len: u64) {
        self.done += 1;
        for e in self.extents(offset, len) {
            let n = self
                .inflight
                .get_mut(&e)
                .expect("end without a matching try_begin");
            *n -= 1;
            if *n == 0 {
                self.inflight.remove(&e);
            }
            self.last_done.insert(e, self.done);
        }
    }

    /// A flush is about to be submitted: the mark to pass to `flush_done` if it succeeds.
    pub fn flush_mark(&self) -> u64 {
        self.done
    }

    pub fn flush_done(&mut self, mark: u64) {
        self.flushed = self.flushed.max(mark);
    }

    /// One tick of the driver's clock.
    pub fn advance(&mut self) {
        self.now += 1;
    }

    /// May leave the log: nothing in flight, every completion flushed, and unused for
    /// `min_idle` ticks (an extent in use now is likely used again soon, and re-entering the
    /// log costs a commit on the write path).
    fn may_leave(&self, e: u64, min_idle: u64) -> bool {
        !self.inflight.contains_key(&e)
            && self.last_done.get(&e).is_none_or(|&d| d <= self.flushed)
            && self
                .last_use
                .get(&e)
                .is_none_or(|&t| self.now.saturating_sub(t) >= min_idle)
    }

    /// Whether a commit would change the log: extents are wanted, some may leave, or the log
    /// is over its cap and some can leave early.
    pub fn wants_commit(&self, min_idle: u64) -> bool {
        !self.wanted.is_empty()
            || self.committed.iter().any(|&e| self.may_leave(e, min_idle))
            || (self.committed.len() > self.max_extents
                && self.committed.iter().any(|&e| self.may_leave(e, 0)))
    }

    /// The log the next commit writes: what is committed and may not leave yet, plus
    /// everything wanted; over the cap, minus the least recently used that may leave now.
    pub fn next(&self, min_idle: u64) -> BTreeSet<u64> {
        let mut s: BTreeSet<u64> = self
            .committed
            .iter()
            .copied()
            .filter(|&e| !self.may_leave(e, min_idle))
            .collect();
        s.extend(self.wanted.iter().copied());
        if s.len() > self.max_extents {
            let mut early: Vec<(u64, u64)> = s
                .iter()
                .copied()
                .filter(|e| !self.wanted.contains(e) && self.may_leave(*e, 0))
                .map(|e| (self.last_use.get(&e).copied().unwrap_or(0), e))
                .collect();
            early.sort_unstable();
            let over = s.len() - self.max_extents;
            for (_, e) in early.into_iter().take(over) {
                s.remove(&e);
            }
        }
        s
    }

    /// A commit of `log` (from `next`) starts: from now until it is durable, requests into
    /// the extents it drops wait (for the next commit, which takes them back).
    pub fn commit_started(&mut self, log: &BTreeSet<u64>) {
        self.leaving = self.committed.difference(log).copied().collect();
    }

    /// A commit of `log` (from `next`) is durable on every replica requests go to.
    pub fn committed(&mut self, log: BTreeSet<u64>) {
        self.leaving.clear();
        self.wanted.retain(|e| !log.contains(e));
        // Bookkeeping of extents that left and are cold is no longer needed.
        self.last_done
            .retain(|e, d| log.contains(e) || *d > self.flushed);
        self.last_use
            .retain(|e, _| log.contains(e) || self.wanted.contains(e));
        self.committed = log;
    }

    pub fn active(&self) -> &BTreeSet<u64> {
        &self.committed
    }
}

/// Sorted extents (or chunks) as half-open runs.
pub fn to_runs(items: impl IntoIterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for i in items {
        match runs.last_mut() {
            Some((_, end)) if *end == i => *end += 1,
            _ => runs.push((i, i + 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn requests_wait_for_their_extents_and_extents_leave_only_when_flushed() {
        let mut al = ActivityLog::new(64 * MIB, 4 * MIB, 1024);
        // A write across the 4 MiB boundary needs extents 0 and 1.
        assert!(!al.try_begin(4 * MIB - 4096, 8192));
        assert!(al.wants_commit(u64::MAX));
        let log = al.next(0);
        assert_eq!(log, BTreeSet::from([0, 1]));
        al.committed(log);
        assert!(!al.wants_commit(1), "just wanted: may not leave yet");
        assert!(al.try_begin(4 * MIB - 4096, 8192));
        assert!(!al.wants_commit(0), "in flight: nothing may leave");
        al.end(4 * MIB - 4096, 8192);
        assert!(!al.wants_commit(0), "done but not flushed");
        // A flush that started before the completion does not cover it.
        al.flush_done(0);
        assert!(!al.wants_commit(0));
        let mark = al.flush_mark();
        // A write into extent 1 starts after the flush was submitted: extent 1 stays.
        assert!(al.try_begin(5 * MIB, 4096));
        al.flush_done(mark);
        assert!(al.wants_commit(0));
        assert_eq!(al.next(0), BTreeSet::from([1]));
        al.committed(al.next(0));
        al.end(5 * MIB, 4096);
        assert!(!al.wants_commit(0), "its completion is not flushed yet");
        let mark = al.flush_mark();
        al.flush_done(mark);
        assert_eq!(al.next(0), BTreeSet::new());
    }

    #[test]
    fn recently_used_extents_stay() {
        let mut al = ActivityLog::new(64 * MIB, 4 * MIB, 1024);
        assert!(!al.try_begin(0, 4096));
        al.committed(al.next(2));
        assert!(al.try_begin(0, 4096));
        al.end(0, 4096);
        al.flush_done(al.flush_mark());
        assert!(!al.wants_commit(2), "used this tick");
        al.advance();
        assert!(!al.wants_commit(2), "used one tick ago");
        al.advance();
        assert!(al.wants_commit(2));
        assert_eq!(al.next(2), BTreeSet::new());
    }

    #[test]
    fn the_tail_extent_is_partial_and_nothing_beyond_exists() {
        let mut al = ActivityLog::new(6 * MIB, 4 * MIB, 1024);
        assert!(!al.try_begin(5 * MIB, MIB));
        assert_eq!(al.next(u64::MAX), BTreeSet::from([1]));
        assert!(al.try_begin(0, 0), "an empty request needs nothing");
    }

    #[test]
    fn a_request_past_the_old_end_needs_its_extent_once_the_log_grows() {
        let mut al = ActivityLog::new(6 * MIB, 4 * MIB, 1024);
        assert!(
            al.try_begin(7 * MIB, 4096),
            "past the end: no extent (the engine refuses it)"
        );
        al.end(7 * MIB, 4096);
        al.grow(12 * MIB);
        assert!(
            !al.try_begin(7 * MIB, 4096),
            "inside now: it waits for its extent"
        );
        assert_eq!(al.next(u64::MAX), BTreeSet::from([1]));
        assert!(!al.try_begin(9 * MIB, 4096));
        assert_eq!(al.next(u64::MAX), BTreeSet::from([1, 2]));
    }

    #[test]
    fn runs() {
        assert_eq!(to_runs([1, 2, 3, 7, 9, 10]), vec![(1, 4), (7, 8), (9, 11)]);
        assert_eq!(to_runs([]), vec![]);
    }

    /// Over the cap, flushed idle extents leave early, least recently used first; extents
    /// with requests in flight or unflushed completions never do, whatever the cap.
    #[test]
    fn no_request_starts_in_an_extent_the_commit_under_way_drops() {
        let mut al = ActivityLog::new(64 * MIB, 4 * MIB, 1024);
        assert!(!al.try_begin(0, 4096));
        let log = al.next(0);
        al.committed(log);
        assert!(al.try_begin(0, 4096));
        al.end(0, 4096);
        let mark = al.flush_mark();
        al.flush_done(mark);
        // Extent 0 is idle and flushed: the next commit drops it.
        let log = al.next(0);
        assert!(log.is_empty());
        al.commit_started(&log);
        assert!(
            !al.try_begin(0, 4096),
            "a request started in an extent the durable log is about to lose"
        );
        al.committed(log);
        // It waits for the next commit, which takes extent 0 back.
        let log = al.next(0);
        assert!(log.contains(&0));
        al.commit_started(&log);
        al.committed(log);
        assert!(al.try_begin(0, 4096));
    }

    #[test]
    fn a_request_over_the_cap_gets_all_its_extents_even_those_that_could_leave() {
        let mut al = ActivityLog::new(64 * MIB, 4 * MIB, 1);
        // Extent 0 is committed, idle, flushed: the least recently used, free to leave.
        assert!(!al.try_begin(0, 4096));
        let log = al.next(u64::MAX);
        al.committed(log);
        assert!(al.try_begin(0, 4096));
        al.end(0, 4096);
        let mark = al.flush_mark();
        al.flush_done(mark);
        al.advance();
        // A request over extents 0 and 1 with a cap of 1: the commit must keep both.
        assert!(!al.try_begin(4 * MIB - 4096, 8192));
        let log = al.next(u64::MAX);
        al.committed(log);
        assert!(
            al.try_begin(4 * MIB - 4096, 8192),
            "the commit evicted an extent the waiting request needs: {:?}",
            al.active()
        );
    }

    #[test]
    fn over_the_cap_the_least_recently_used_flushed_extents_leave_early() {
        let mut al = ActivityLog::new(64 * MIB, 4 * MIB, 4);
        let commit = |al: &mut ActivityLog| {
            let log = al.next(u64::MAX);
            al.committed(log);
        };
        // Six extents used in order 0..6, one tick apart, all completed and flushed.
        for e in 0..6u64 {
            assert!(!al.try_begin(e * 4 * MIB, 4096));
            commit(&mut al);
            assert!(al.try_begin(e * 4 * MIB, 4096));
            al.end(e * 4 * MIB, 4096);
            let mark = al.flush_mark();
            al.flush_done(mark);
            al.advance();
        }
        // Commits so far added extents one at a time and evicted the oldest past the cap.
        assert_eq!(
            al.active().iter().copied().collect::<Vec<_>>(),
            vec![2, 3, 4, 5]
        );
        assert!(
            !al.wants_commit(u64::MAX),
            "at the cap, nothing needs to leave"
        );
        // Extent 1 is busy (in flight), extent 2 has an unflushed completion.
        let (e1, e2) = (4 * MIB, 8 * MIB);
        for e in [e1, e2] {
            if !al.try_begin(e, 4096) {
                commit(&mut al);
                assert!(al.try_begin(e, 4096));
            }
        }
        al.end(e2, 4096);
        // Two new extents push the log over the cap.
        for e in [10 * 4 * MIB, 11 * 4 * MIB] {
            assert!(!al.try_begin(e, 4096));
        }
        commit(&mut al);
        let log = al.active().clone();
        assert!(
            log.contains(&1) && log.contains(&2),
            "busy or unflushed left: {log:?}"
        );
        assert!(
            log.contains(&10) && log.contains(&11),
            "wanted extents missing: {log:?}"
        );
        assert_eq!(
            log.len(),
            4,
            "the flushed idle extents 4 and 5 should have left: {log:?}"
        );
        // Once extent 2 is flushed and extent 1 done, the log can shrink to the cap again.
        al.end(e1, 4096);
        let mark = al.flush_mark();
        al.flush_done(mark);
        commit(&mut al);
        assert!(al.active().len() <= 4, "{:?}", al.active());
    }
}
