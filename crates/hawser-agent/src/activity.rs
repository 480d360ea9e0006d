//! The activity log's bookkeeping (no I/O): which 4 MiB extents a volume's modifying requests
//! may touch without a journal commit, which ones wait for one, and which ones may leave.
//!
//! Rule (what crash recovery relies on): a modifying request is sent to a replica only after a
//! journal listing every extent it touches is durable on every replica it is sent to; an
//! extent leaves the log only once no request into it is in flight and a flush that started
//! after the last one completed has succeeded. So after any crash, every extent where replicas
//! may differ is in the log of a replica that got a request into it.

use std::collections::{BTreeSet, HashMap};

pub struct ActivityLog {
    extent_bytes: u64,
    size: u64,
    /// Extents in the last durable journal.
    committed: BTreeSet<u64>,
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
    pub fn new(size: u64, extent_bytes: u64) -> ActivityLog {
        ActivityLog {
            extent_bytes,
            size,
            committed: BTreeSet::new(),
            wanted: BTreeSet::new(),
            inflight: HashMap::new(),
            last_done: HashMap::new(),
            done: 0,
            flushed: 0,
            now: 0,
            last_use: HashMap::new(),
        }
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
            .filter(|e| !self.committed.contains(e))
            .collect();
        if !missing.is_empty() {
            for &e in &missing {
                // Wanted counts as used: it must not leave before its request runs.
                self.last_use.insert(e, self.now);
            }
            self.wanted.extend(missing);
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

    /// Whether a commit would change the log: extents are wanted, or some may leave.
    pub fn wants_commit(&self, min_idle: u64) -> bool {
        !self.wanted.is_empty() || self.committed.iter().any(|&e| self.may_leave(e, min_idle))
    }

    /// The log the next commit writes: what is committed and may not leave yet, plus
    /// everything wanted.
    pub fn next(&self, min_idle: u64) -> BTreeSet<u64> {
        let mut s: BTreeSet<u64> = self
            .committed
            .iter()
            .copied()
            .filter(|&e| !self.may_leave(e, min_idle))
            .collect();
        s.extend(self.wanted.iter().copied());
        s
    }

    /// A commit of `log` (from `next`) is durable on every replica requests go to.
    pub fn committed(&mut self, log: BTreeSet<u64>) {
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
        let mut al = ActivityLog::new(64 * MIB, 4 * MIB);
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
        let mut al = ActivityLog::new(64 * MIB, 4 * MIB);
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
        let mut al = ActivityLog::new(6 * MIB, 4 * MIB);
        assert!(!al.try_begin(5 * MIB, MIB));
        assert_eq!(al.next(u64::MAX), BTreeSet::from([1]));
        assert!(al.try_begin(0, 0), "an empty request needs nothing");
    }

    #[test]
    fn runs() {
        assert_eq!(to_runs([1, 2, 3, 7, 9, 10]), vec![(1, 4), (7, 8), (9, 11)]);
        assert_eq!(to_runs([]), vec![]);
    }
}
