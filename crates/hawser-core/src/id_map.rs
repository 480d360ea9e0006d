//! Maps keyed by the engine's own sequence numbers (request tags, sub-request ids).
//!
//! The standard map hashes with SipHash, which resists keys an attacker picks; these keys are
//! counters the engine hands out, so that protection buys nothing, and callgrind counted
//! SipHash at about 1,000 instructions per 4k request across the engine's maps. One multiply
//! spreads a counter over the table instead (the hash rustc uses for its own maps). It is also
//! the same in every process, so the simulator's runs do not depend on a random hash seed.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from sequence numbers (or other keys no one outside chooses) to `V`.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Multiply-and-rotate hashing of integer keys.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn counters_spread_over_the_table() {
        let build = BuildHasherDefault::<IdHasher>::default();
        // The top 7 bits pick the control byte and the low bits the bucket: consecutive
        // counters must differ in both.
        let hashes: Vec<u64> = (0..128u64).map(|n| build.hash_one(n)).collect();
        let low: std::collections::BTreeSet<u64> = hashes.iter().map(|h| h & 127).collect();
        let top: std::collections::BTreeSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(low.len(), 128);
        // Random hashes would give about 81 distinct values of 128; a degenerate hash a few.
        assert!(top.len() >= 48, "only {} distinct top bits", top.len());
    }

    #[test]
    fn a_map_works_as_a_map() {
        let mut m: IdMap<u64, u64> = IdMap::default();
        for n in 0..10_000u64 {
            m.insert(n, n * 2);
        }
        for n in (0..10_000u64).step_by(2) {
            assert_eq!(m.remove(&n), Some(n * 2));
        }
        assert_eq!(m.len(), 5_000);
        assert!((1..10_000u64).step_by(2).all(|n| m[&n] == n * 2));
    }
}
