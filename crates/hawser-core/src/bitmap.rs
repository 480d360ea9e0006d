//! Dirty-region bitmaps: one bit per chunk of the volume (`CHUNK_BYTES`), set where a replica
//! may lack data the in-sync replicas have. Resync copies exactly the set chunks.

/// A dense bit set over the chunks of a volume. 64 KiB chunks cost 2 KiB per GiB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkMap {
    chunk: u64,
    chunks: u64,
    words: Vec<u64>,
    set: u64,
}

impl ChunkMap {
    /// An empty map over a volume of `size` bytes with chunks of `chunk` bytes (a power of two).
    pub fn new(size: u64, chunk: u64) -> ChunkMap {
        assert!(chunk.is_power_of_two(), "chunk size must be a power of two");
        let chunks = size.div_ceil(chunk);
        let words = usize::try_from(chunks.div_ceil(64)).expect("bitmap fits in memory");
        ChunkMap {
            chunk,
            chunks,
            words: vec![0; words],
            set: 0,
        }
    }

    /// Every chunk set (a replica whose differences are unknown).
    pub fn full(size: u64, chunk: u64) -> ChunkMap {
        let mut m = ChunkMap::new(size, chunk);
        m.set_chunks(0, m.chunks);
        m
    }

    /// Cover a volume grown to `size` bytes: chunks past the old end join clean, every
    /// existing chunk keeps its state, the old partial last one too (its bit already covers
    /// its whole chunk). Whether clean is right for the new chunks is the caller's argument
    /// (`Engine::grow`). Panics if `size` would drop a chunk.
    pub fn grow(&mut self, size: u64) {
        let chunks = size.div_ceil(self.chunk);
        assert!(chunks >= self.chunks, "a chunk map never shrinks");
        let words = usize::try_from(chunks.div_ceil(64)).expect("bitmap fits in memory");
        // Bits past the old `chunks` in its last word are zero: nothing ever sets them
        // (`set_chunks` clamps to the map).
        self.words.resize(words, 0);
        self.chunks = chunks;
        debug_assert_eq!(
            self.set,
            self.words
                .iter()
                .map(|w| u64::from(w.count_ones()))
                .sum::<u64>()
        );
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk
    }

    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Chunks set.
    pub fn count(&self) -> u64 {
        self.set
    }

    pub fn is_empty(&self) -> bool {
        self.set == 0
    }

    /// Bytes covered by set chunks (the last chunk may extend past the volume's end).
    pub fn bytes(&self) -> u64 {
        self.set * self.chunk
    }

    /// The chunk range `[first, end)` covering bytes `[offset, offset + len)`.
    pub fn chunk_span(&self, offset: u64, len: u64) -> (u64, u64) {
        if len == 0 {
            return (0, 0);
        }
        let first = offset / self.chunk;
        let end = offset
            .saturating_add(len)
            .div_ceil(self.chunk)
            .min(self.chunks);
        (first.min(end), end)
    }

    /// Set every chunk touching bytes `[offset, offset + len)`.
    pub fn set_bytes(&mut self, offset: u64, len: u64) {
        let (first, end) = self.chunk_span(offset, len);
        self.set_chunks(first, end);
    }

    /// Set chunks `[first, end)` (clamped to the map).
    pub fn set_chunks(&mut self, first: u64, end: u64) {
        for c in first..end.min(self.chunks) {
            let (w, b) = pos(c);
            if self.words[w] & b == 0 {
                self.words[w] |= b;
                self.set += 1;
            }
        }
    }

    /// Clear chunks `[first, end)` (clamped to the map).
    pub fn clear_chunks(&mut self, first: u64, end: u64) {
        for c in first..end.min(self.chunks) {
            let (w, b) = pos(c);
            if self.words[w] & b != 0 {
                self.words[w] &= !b;
                self.set -= 1;
            }
        }
    }

    pub fn is_set(&self, c: u64) -> bool {
        if c >= self.chunks {
            return false;
        }
        let (w, b) = pos(c);
        self.words[w] & b != 0
    }

    /// Whether any chunk touching bytes `[offset, offset + len)` is set.
    pub fn any_in_bytes(&self, offset: u64, len: u64) -> bool {
        let (first, end) = self.chunk_span(offset, len);
        (first..end).any(|c| self.is_set(c))
    }

    /// The first run of set chunks at or after chunk `from`, at most `max` chunks long, as
    /// `(first, end)`; wraps around to the start when nothing is set after `from`.
    pub fn next_run(&self, from: u64, max: u64) -> Option<(u64, u64)> {
        if self.set == 0 || max == 0 {
            return None;
        }
        let start = self
            .first_set_from(from.min(self.chunks))
            .or_else(|| self.first_set_from(0))?;
        let mut end = start + 1;
        while end < self.chunks && end - start < max && self.is_set(end) {
            end += 1;
        }
        Some((start, end))
    }

    fn first_set_from(&self, from: u64) -> Option<u64> {
        let mut c = from;
        while c < self.chunks {
            let (w, _) = pos(c);
            let bits = self.words[w] >> (c % 64);
            if bits != 0 {
                let found = c + u64::from(bits.trailing_zeros());
                return (found < self.chunks).then_some(found);
            }
            c = (c / 64 + 1) * 64;
        }
        None
    }

    /// Set every chunk set in `other` (same geometry).
    pub fn union(&mut self, other: &ChunkMap) {
        self.combine(other, |a, b| a | b);
    }

    /// Clear every chunk set in `other` (same geometry).
    pub fn subtract(&mut self, other: &ChunkMap) {
        self.combine(other, |a, b| a & !b);
    }

    fn combine(&mut self, other: &ChunkMap, op: impl Fn(u64, u64) -> u64) {
        assert_eq!(
            (self.chunk, self.chunks),
            (other.chunk, other.chunks),
            "bitmaps of different geometry"
        );
        let mut set = 0;
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a = op(*a, *b);
            set += u64::from(a.count_ones());
        }
        self.set = set;
    }

    /// Runs of set chunks as `(first, end)`, in order (for persisting and reporting).
    pub fn runs(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut c = 0;
        while let Some(start) = self.first_set_from(c) {
            let mut end = start + 1;
            while end < self.chunks && self.is_set(end) {
                end += 1;
            }
            out.push((start, end));
            c = end;
        }
        out
    }
}

fn pos(c: u64) -> (usize, u64) {
    // c < chunks, and words.len() == chunks / 64 rounded up fits in usize (checked in new).
    (
        usize::try_from(c / 64).expect("index fits"),
        1u64 << (c % 64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 64 * 1024;

    #[test]
    fn set_clear_count_and_spans() {
        let mut m = ChunkMap::new(10 * K + 512, K);
        assert_eq!(m.chunks(), 11);
        m.set_bytes(K - 512, 1024); // touches chunks 0 and 1
        assert_eq!(m.count(), 2);
        assert!(m.is_set(0) && m.is_set(1) && !m.is_set(2));
        m.set_bytes(10 * K, 512); // the last, partial chunk
        assert!(m.is_set(10));
        m.set_bytes(0, 0); // empty range sets nothing
        assert_eq!(m.count(), 3);
        m.clear_chunks(0, 2);
        assert_eq!(m.count(), 1);
        assert!(m.any_in_bytes(10 * K, 1));
        assert!(!m.any_in_bytes(0, 10 * K));
    }

    #[test]
    fn runs_are_bounded_and_wrap() {
        let mut m = ChunkMap::new(200 * K, K);
        m.set_chunks(3, 10);
        m.set_chunks(130, 131);
        assert_eq!(m.next_run(0, 4), Some((3, 7)));
        assert_eq!(m.next_run(7, 100), Some((7, 10)));
        assert_eq!(m.next_run(10, 100), Some((130, 131)));
        assert_eq!(m.next_run(131, 100), Some((3, 10)), "wraps to the start");
        assert_eq!(m.runs(), vec![(3, 10), (130, 131)]);
        m.clear_chunks(0, 200);
        assert_eq!(m.next_run(0, 100), None);
    }

    #[test]
    fn growing_keeps_every_bit_and_adds_clean_chunks() {
        // 10.5 chunks: the last one partial, and set, so growing must keep it set.
        let mut m = ChunkMap::new(10 * K + 512, K);
        m.set_chunks(2, 3);
        m.set_chunks(10, 11);
        m.grow(10 * K + 512);
        assert_eq!(m.chunks(), 11, "the same size changes nothing");
        m.grow(200 * K);
        assert_eq!(m.chunks(), 200);
        assert_eq!(m.runs(), vec![(2, 3), (10, 11)]);
        assert_eq!(m.count(), 2);
        assert_eq!(
            m.next_run(11, 100),
            Some((2, 3)),
            "nothing set past the old end"
        );
        // The new chunks are ordinary chunks: they can be set and unioned.
        m.set_chunks(150, 152);
        let mut f = ChunkMap::full(100 * K, K);
        f.grow(200 * K);
        assert_eq!(
            f.runs(),
            vec![(0, 100)],
            "a full map stays full only where it was"
        );
        f.union(&m);
        assert_eq!(f.runs(), vec![(0, 100), (150, 152)]);
    }

    #[test]
    #[should_panic(expected = "never shrinks")]
    fn a_chunk_map_never_shrinks() {
        ChunkMap::new(10 * K, K).grow(9 * K);
    }

    #[test]
    fn full_and_union() {
        let f = ChunkMap::full(129 * K, K);
        assert_eq!(f.count(), 129);
        let mut m = ChunkMap::new(129 * K, K);
        m.set_chunks(5, 6);
        m.union(&f);
        assert_eq!(m.count(), 129);
        assert_eq!(m.runs(), vec![(0, 129)]);
    }
}
