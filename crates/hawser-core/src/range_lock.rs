//! Ordering of overlapping modifying requests.
//!
//! Two overlapping writes in flight at once could be applied in different orders on different
//! replicas, leaving them with different bytes although every replica acknowledged both. So a
//! modifying request that overlaps one in flight waits until it completes, and waiting requests
//! start in arrival order (a request never overtakes an earlier overlapping one). Requests that
//! do not overlap anything in flight start at once, so this costs nothing for normal I/O.
//!
//! Ranges are whole `ORDER_BLOCK_BYTES` blocks: a replica sums each block, so a write into
//! part of a block re-reads the rest of it, and two writes into one block conflict even when
//! their bytes do not overlap.

use std::collections::VecDeque;

use crate::constants::ORDER_BLOCK_BYTES;
use crate::types::{ClientOp, Tag};

/// A byte range `[start, end)`; `None` for requests that hold nothing (reads, flushes).
type Span = Option<(u64, u64)>;

/// Held ranges and the requests waiting for them. `T` is what a waiting request carries (the
/// engine queues client requests and its own resync copies in one line, so neither overtakes
/// the other).
pub struct RangeLock<T> {
    /// (start, end, tag) of modifying requests in flight.
    held: Vec<(u64, u64, Tag)>,
    /// Requests waiting for an overlapping one to finish, oldest first.
    waiting: VecDeque<(Tag, Span, T)>,
}

impl<T> Default for RangeLock<T> {
    fn default() -> Self {
        RangeLock {
            held: Vec::new(),
            waiting: VecDeque::new(),
        }
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// The byte range `[start, end)` a client request must hold, widened to whole blocks; `None`
/// for reads and flushes.
pub fn span(op: &ClientOp) -> Option<(u64, u64)> {
    op.write_range().map(|(off, len)| block_span(off, len))
}

/// `[offset, offset + len)` widened outward to `ORDER_BLOCK_BYTES` boundaries (it may end past
/// the volume's end: a lock range, never an I/O range).
pub fn block_span(offset: u64, len: u64) -> (u64, u64) {
    let b = ORDER_BLOCK_BYTES;
    let start = offset / b * b;
    let end = offset.saturating_add(len).div_ceil(b).saturating_mul(b);
    assert!(start <= offset && end >= offset.saturating_add(len));
    (start, end)
}

impl<T> RangeLock<T> {
    /// Try to take `range` for `tag`. Returns the item back if it may start now, or `None` if
    /// it was queued behind an overlapping holder or waiter. `None` ranges never wait.
    pub fn acquire(&mut self, tag: Tag, range: Option<(u64, u64)>, item: T) -> Option<T> {
        let Some(range) = range else {
            return Some(item);
        };
        let blocked = self.held.iter().any(|h| overlaps((h.0, h.1), range))
            || self
                .waiting
                .iter()
                .any(|(_, w, _)| w.is_some_and(|r| overlaps(r, range)));
        if blocked {
            self.waiting.push_back((tag, Some(range), item));
            None
        } else {
            self.held.push((range.0, range.1, tag));
            Some(item)
        }
    }

    /// Release the range held by `tag` and return the waiting requests that may start now
    /// (their ranges are taken on their behalf), in arrival order.
    pub fn release(&mut self, tag: Tag) -> Vec<(Tag, T)> {
        let Some(pos) = self.held.iter().position(|h| h.2 == tag) else {
            return Vec::new();
        };
        self.held.swap_remove(pos);
        let mut ready = Vec::new();
        let mut still: VecDeque<(Tag, Span, T)> = VecDeque::new();
        while let Some((t, range, item)) = self.waiting.pop_front() {
            let Some(r) = range else {
                ready.push((t, item));
                continue;
            };
            let blocked = self.held.iter().any(|h| overlaps((h.0, h.1), r))
                || still
                    .iter()
                    .any(|(_, w, _)| w.is_some_and(|w| overlaps(w, r)));
            if blocked {
                still.push_back((t, range, item));
            } else {
                self.held.push((r.0, r.1, t));
                ready.push((t, item));
            }
        }
        self.waiting = still;
        ready
    }

    /// Drop everything (engine shutdown); returns the waiting requests.
    pub fn drain_waiting(&mut self) -> Vec<(Tag, T)> {
        self.held.clear();
        self.waiting.drain(..).map(|(t, _, i)| (t, i)).collect()
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn w(offset: u64, len: usize) -> ClientOp {
        ClientOp::Write {
            offset,
            data: Bytes::from(vec![0; len]),
            fua: false,
        }
    }

    #[test]
    fn disjoint_writes_do_not_wait() {
        let mut l: RangeLock<ClientOp> = RangeLock::default();
        assert!(l.acquire(1, span(&w(0, 4096)), w(0, 4096)).is_some());
        assert!(l.acquire(2, span(&w(4096, 4096)), w(4096, 4096)).is_some());
        assert_eq!(l.held(), 2);
    }

    #[test]
    fn overlapping_writes_start_in_order() {
        let mut l: RangeLock<ClientOp> = RangeLock::default();
        assert!(l.acquire(1, span(&w(0, 8192)), w(0, 8192)).is_some());
        assert!(l.acquire(2, span(&w(4096, 4096)), w(4096, 4096)).is_none());
        // 3 overlaps only the waiting 2: it must not overtake it.
        assert!(l
            .acquire(3, span(&w(8192 - 512, 1024)), w(8192 - 512, 1024))
            .is_none());
        // 4 overlaps nothing.
        assert!(l
            .acquire(4, span(&w(1 << 20, 512)), w(1 << 20, 512))
            .is_some());
        let ready: Vec<Tag> = l.release(1).into_iter().map(|(t, _)| t).collect();
        assert_eq!(ready, vec![2]);
        let ready: Vec<Tag> = l.release(2).into_iter().map(|(t, _)| t).collect();
        assert_eq!(ready, vec![3]);
        assert_eq!(l.waiting(), 0);
    }

    #[test]
    fn writes_into_one_block_wait_though_their_bytes_do_not_overlap() {
        let mut l: RangeLock<ClientOp> = RangeLock::default();
        assert!(l.acquire(1, span(&w(0, 512)), w(0, 512)).is_some());
        assert!(
            l.acquire(2, span(&w(3584, 512)), w(3584, 512)).is_none(),
            "a second write into block 0 interleaved with the first"
        );
        assert!(
            l.acquire(3, span(&w(4096, 512)), w(4096, 512)).is_some(),
            "a write into the next block waited"
        );
        assert_eq!(span(&w(4096 + 512, 512)), Some((4096, 8192)));
        assert_eq!(span(&w(4096 - 512, 1024)), Some((0, 8192)));
        assert_eq!(span(&w(8192, 4096)), Some((8192, 12288)));
        assert_eq!(
            block_span(u64::MAX - 511, 512),
            (u64::MAX / 4096 * 4096, u64::MAX)
        );
        let ready: Vec<Tag> = l.release(1).into_iter().map(|(t, _)| t).collect();
        assert_eq!(ready, vec![2]);
    }

    #[test]
    fn reads_and_flushes_never_wait() {
        let mut l: RangeLock<ClientOp> = RangeLock::default();
        assert!(l.acquire(1, span(&w(0, 4096)), w(0, 4096)).is_some());
        let read = ClientOp::Read {
            offset: 0,
            len: 4096,
        };
        assert!(l.acquire(2, span(&read), read.clone()).is_some());
        assert!(l.acquire(3, None, ClientOp::Flush).is_some());
        assert_eq!(l.held(), 1);
    }
}
