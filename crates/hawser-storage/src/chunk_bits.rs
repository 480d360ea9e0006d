//! A thin replica's allocation bitmap (one bit per `THIN_ALLOC_CHUNK_BYTES` chunk known to be
//! allocated) that grows while writers use it, without a lock.
//!
//! Why not a `Vec<AtomicU64>` behind an `RwLock`: every write would take the read lock, one
//! more atomic read-modify-write on a cache line shared by every thread writing to the replica
//! (the io_uring submitters, the I/O pool), for the sake of a grow that happens a few times in
//! a replica's life. Why not a fixed bitmap that calls chunks past its end "not known
//! allocated" (harmless for correctness: a spurious fallocate is harmless): every write into
//! the grown range would then fallocate, which takes the inode's lock exclusively and
//! serialises the writes (what `THIN_ALLOC_CHUNK_BYTES` exists to avoid), and would leave the
//! io_uring for the I/O pool (`Replica::start_write`), until the agent restarts.
//!
//! So the words live in segments that never move once made: segment 0 holds `BASE_WORDS`
//! words, segment k >= 1 holds `BASE_WORDS << (k - 1)`, so the first k + 1 segments hold
//! `BASE_WORDS << k` words. Growing makes the missing segments (`OnceLock`: each is made once,
//! and a reader sees either none or the whole zeroed segment); finding a word is a shift and
//! one load. A chunk past the made segments reads as not allocated and ignores sets, which is
//! the harmless direction.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Words of segment 0: 64 x 64 chunks of 1 MiB, a replica of 4 GiB.
const BASE_WORDS: u64 = 64;
/// Enough segments for any u64 size: 2^44 chunks of 1 MiB are 2^38 words, and the first
/// `SEGMENTS` segments hold `BASE_WORDS << (SEGMENTS - 1)` = 2^38 words.
const SEGMENTS: usize = 33;
const _: () = assert!(BASE_WORDS << (SEGMENTS - 1) >= (u64::MAX >> 20).div_ceil(64));

pub(crate) struct ChunkBits {
    segments: [OnceLock<Box<[AtomicU64]>>; SEGMENTS],
}

impl ChunkBits {
    /// A bitmap with a bit, clear, for each of `chunks` chunks.
    pub(crate) fn new(chunks: u64) -> ChunkBits {
        let bits = ChunkBits {
            segments: std::array::from_fn(|_| OnceLock::new()),
        };
        bits.cover(chunks);
        bits
    }

    /// Make room for `chunks` chunks (the new bits clear); never shrinks. Safe to call from
    /// several threads, but a replica's grows are serialised anyway.
    pub(crate) fn cover(&self, chunks: u64) {
        let words = chunks.div_ceil(64);
        for (k, segment) in self.segments.iter().enumerate() {
            let (start, len) = segment_range(k);
            if start >= words {
                break;
            }
            // A length past the address space cannot be a real replica's: left unmade, its
            // chunks read as not allocated.
            if let Ok(len) = usize::try_from(len) {
                segment.get_or_init(|| (0..len).map(|_| AtomicU64::new(0)).collect());
            }
        }
    }

    /// Whether `chunk` is known allocated.
    pub(crate) fn get(&self, chunk: u64) -> bool {
        self.word(chunk)
            .is_some_and(|(w, bit)| w.load(Ordering::Acquire) & bit != 0)
    }

    /// Record `chunk` as allocated.
    pub(crate) fn set(&self, chunk: u64) {
        if let Some((w, bit)) = self.word(chunk) {
            w.fetch_or(bit, Ordering::AcqRel);
        }
    }

    /// Forget that `chunk` is allocated.
    pub(crate) fn clear(&self, chunk: u64) {
        if let Some((w, bit)) = self.word(chunk) {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    fn word(&self, chunk: u64) -> Option<(&AtomicU64, u64)> {
        let (k, at) = locate(chunk / 64);
        let segment = self.segments.get(k)?.get()?;
        let word = segment.get(usize::try_from(at).ok()?)?;
        Some((word, 1 << (chunk % 64)))
    }
}

/// Where segment `k` starts (in words) and how many words it holds.
fn segment_range(k: usize) -> (u64, u64) {
    match k {
        0 => (0, BASE_WORDS),
        k => (BASE_WORDS << (k - 1), BASE_WORDS << (k - 1)),
    }
}

/// The segment holding word `w`, and the word's index in it.
fn locate(w: u64) -> (usize, u64) {
    let q = w / BASE_WORDS;
    if q == 0 {
        return (0, w);
    }
    // q in [2^(k-1), 2^k) for segment k.
    let k = (u64::BITS - q.leading_zeros()) as usize;
    (k, w - segment_range(k).0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_tile_the_words_without_gaps_or_overlaps() {
        let mut next = 0;
        for k in 0..SEGMENTS {
            let (start, len) = segment_range(k);
            assert_eq!(
                start,
                next,
                "segment {k} starts where {} ends",
                k.max(1) - 1
            );
            assert_eq!(locate(start), (k, 0));
            assert_eq!(locate(start + len - 1), (k, len - 1));
            next = start + len;
        }
        assert!(next >= (u64::MAX >> 20).div_ceil(64), "too few segments");
    }

    #[test]
    fn bits_past_the_covered_chunks_read_clear_until_a_grow_covers_them() {
        let chunks = BASE_WORDS * 64 + 10; // into segment 1
        let bits = ChunkBits::new(chunks);
        let far = BASE_WORDS * 64 * 5; // segment 3, not made yet
        bits.set(far);
        assert!(!bits.get(far), "a set past the end is ignored");
        for c in [0, 63, 64, chunks - 1] {
            assert!(!bits.get(c));
            bits.set(c);
            assert!(bits.get(c), "chunk {c}");
        }
        bits.cover(far + 1);
        assert!(!bits.get(far), "a new bit starts clear");
        bits.set(far);
        assert!(bits.get(far));
        assert!(bits.get(chunks - 1), "a grow keeps the bits set before it");
        bits.clear(chunks - 1);
        assert!(!bits.get(chunks - 1));
        assert!(bits.get(63) && bits.get(64), "a clear touches one bit");
    }
}
