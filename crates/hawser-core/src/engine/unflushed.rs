//! Chunks written since the last completed flush.
//!
//! A replica whose *node* crashed (power loss, kernel panic) may have lost writes it had
//! acknowledged but not yet made durable: exactly the chunks written since the last flush that
//! completed on it. When such a replica comes back (the driver sees a new boot id), those chunks
//! join its dirty set. A replica whose process died but whose node stayed up lost nothing it
//! acknowledged (O_DIRECT writes are in the device), so nothing extra is copied.
//!
//! The set is kept as chunk ranges, snapshotted at each flush's start and dropped when the flush
//! succeeds; the driver issues background flushes so it stays small. A write's chunks join it
//! when a replica *answers* the write (a flush that started while the write was in flight may
//! not cover it), and a resync copy's when it lands.

use crate::constants::UNFLUSHED_COMPACT_AT;
// One part of `Engine`'s impl, a child module of engine.rs (which holds the engine's state
// and calls this part), split by concern as the engine grew.
use crate::engine::Engine;
use crate::types::{ReplicaIdx, SubId, Tag};

#[derive(Default)]
pub struct Unflushed {
    /// Chunk ranges `[first, end)` written since the newest flush started.
    cur: Vec<(u64, u64)>,
    /// Flushes in flight, oldest first, with the ranges written before each started.
    flushing: Vec<(Tag, Vec<(u64, u64)>)>,
    /// `cur` is compacted when it reaches this length: twice what the last compaction left
    /// (at least `UNFLUSHED_COMPACT_AT`), so random writes over more chunks than that do not
    /// sort the whole set on every write (which cost 7% of the CPU at 4k QD128).
    compact_at: usize,
}

impl Unflushed {
    pub fn wrote(&mut self, first: u64, end: u64) {
        if first >= end {
            return;
        }
        self.cur.push((first, end));
        if self.cur.len() >= self.compact_at.max(UNFLUSHED_COMPACT_AT) {
            compact(&mut self.cur);
            self.compact_at = 2 * self.cur.len();
        }
    }

    pub fn flush_started(&mut self, tag: Tag) {
        self.compact_at = 0;
        let taken = std::mem::take(&mut self.cur);
        self.flushing.push((tag, taken));
    }

    /// Flush `tag` succeeded: everything written before it started is durable, including what
    /// older flushes still in flight cover.
    pub fn flush_succeeded(&mut self, tag: Tag) {
        if let Some(i) = self.flushing.iter().position(|(t, _)| *t == tag) {
            self.flushing.drain(..=i);
        }
    }

    /// Flush `tag` failed: its ranges are still unflushed.
    pub fn flush_failed(&mut self, tag: Tag) {
        if let Some(i) = self.flushing.iter().position(|(t, _)| *t == tag) {
            let (_, ranges) = self.flushing.remove(i);
            self.cur.extend(ranges);
            compact(&mut self.cur);
        }
    }

    /// Whether anything was written since the last flush started.
    pub fn pending(&self) -> bool {
        !self.cur.is_empty()
    }

    /// Every range that may not be durable yet.
    pub fn snapshot(&self) -> Vec<(u64, u64)> {
        let mut all: Vec<(u64, u64)> = self.cur.clone();
        for (_, r) in &self.flushing {
            all.extend_from_slice(r);
        }
        compact(&mut all);
        all
    }
}

impl Engine {
    /// A flush goes to `r` as `sub`: if it succeeds, it covers what `r` had not made durable
    /// when it last left (`Slot::unflushed_at_loss`; the flush is sent on its current session,
    /// after every request of the old one finished).
    pub(crate) fn flush_sent(&mut self, r: ReplicaIdx, sub: SubId) {
        let s = self.slot_mut(r);
        if !s.unflushed_at_loss.is_empty() {
            let ranges = std::mem::take(&mut s.unflushed_at_loss);
            s.unflushed_flushing.push((sub, ranges));
        }
    }

    /// `r` answered sub-request `sub` (maybe a flush): drop what a successful flush covered,
    /// put back what a failed one did not.
    pub(crate) fn flush_answered(&mut self, r: ReplicaIdx, sub: SubId, ok: bool) {
        let s = self.slot_mut(r);
        let Some(i) = s.unflushed_flushing.iter().position(|(x, _)| *x == sub) else {
            return;
        };
        let (_, ranges) = s.unflushed_flushing.swap_remove(i);
        if !ok {
            s.unflushed_at_loss.extend(ranges);
            compact(&mut s.unflushed_at_loss);
        }
    }
}

/// Sort and merge overlapping or adjacent ranges.
pub(crate) fn compact(v: &mut Vec<(u64, u64)>) {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for &(a, b) in v.iter() {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    *v = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_retire_what_was_written_before_them() {
        let mut u = Unflushed::default();
        u.wrote(1, 2);
        u.flush_started(10);
        u.wrote(5, 7);
        u.flush_started(11);
        u.wrote(9, 10);
        assert_eq!(u.snapshot(), vec![(1, 2), (5, 7), (9, 10)]);
        // The newer flush covers the older one too.
        u.flush_succeeded(11);
        assert_eq!(u.snapshot(), vec![(9, 10)]);
        u.flush_started(12);
        u.flush_failed(12);
        assert_eq!(u.snapshot(), vec![(9, 10)]);
        assert!(u.pending());
    }

    #[test]
    fn compaction_is_amortised_over_many_distinct_chunks() {
        let mut u = Unflushed::default();
        // Every other chunk: nothing merges, so each compaction keeps every range.
        for i in 0..(3 * UNFLUSHED_COMPACT_AT as u64) {
            u.wrote(2 * i, 2 * i + 1);
        }
        // Compacted twice (at C and 2C ranges), not at every write past C.
        assert_eq!(u.compact_at, 4 * UNFLUSHED_COMPACT_AT);
        assert_eq!(u.cur.len(), 3 * UNFLUSHED_COMPACT_AT);
        assert_eq!(u.snapshot().len(), 3 * UNFLUSHED_COMPACT_AT);
        u.flush_started(1);
        assert_eq!(u.compact_at, 0);
    }

    #[test]
    fn compaction_merges_overlaps() {
        let mut v = vec![(5, 6), (1, 3), (2, 4), (4, 5), (8, 9)];
        compact(&mut v);
        assert_eq!(v, vec![(1, 6), (8, 9)]);
    }
}
