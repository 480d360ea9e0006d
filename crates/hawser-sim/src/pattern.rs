//! Self-describing sector contents, so any 512 bytes read from any disk tell which write put
//! them there.
//!
//! Every client write gets a version number (`> 0`); each of its sectors holds that version,
//! the sector's index and pseudo-random bytes derived from both. Zeroes are version 0 (the
//! initial contents, trims and write-zeroes). Anything else (for instance the junk an initially
//! outdated replica starts with, or a sector written to the wrong place) decodes to a version
//! the model never allows, or to `None`.

use bytes::Bytes;

pub const SECTOR: u64 = 512;
const SECTOR_USIZE: usize = 512;

/// Versions at or above this are junk that no client ever wrote.
pub const JUNK_BASE: u64 = 1 << 62;

fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser: cheap, and every input bit reaches every output bit.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn word(version: u64, sector: u64, i: usize) -> u64 {
    mix(version ^ mix(sector ^ mix(i as u64)))
}

/// Fill one sector's bytes for `version` at absolute sector index `sector`.
pub fn fill_sector(out: &mut [u8], version: u64, sector: u64) {
    debug_assert_eq!(out.len(), SECTOR_USIZE);
    if version == 0 {
        out.fill(0);
        return;
    }
    out[0..8].copy_from_slice(&version.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
    for (i, w) in out[16..].chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(version, sector, i).to_le_bytes());
    }
}

/// The payload of a write of `version` at byte `offset` (sector aligned), `len` bytes.
pub fn payload(version: u64, offset: u64, len: u64) -> Bytes {
    debug_assert!(offset.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR));
    let mut v = vec![0u8; usize::try_from(len).expect("write fits in memory")];
    for (i, s) in v.chunks_exact_mut(SECTOR_USIZE).enumerate() {
        fill_sector(s, version, offset / SECTOR + i as u64);
    }
    Bytes::from(v)
}

/// Which version a sector holds; `None` when the bytes are no version's (torn, misplaced,
/// corrupt). `full`: verify every byte, else only the header and two words (fast path).
pub fn decode(bytes: &[u8], sector: u64, full: bool) -> Option<u64> {
    debug_assert_eq!(bytes.len(), SECTOR_USIZE);
    let version = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
    if version == 0 {
        let zero = if full {
            bytes.iter().all(|&b| b == 0)
        } else {
            bytes[8..16].iter().all(|&b| b == 0) && bytes[504..].iter().all(|&b| b == 0)
        };
        return zero.then_some(0);
    }
    let at = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if at != sector {
        return None;
    }
    let words = bytes[16..].chunks_exact(8).enumerate();
    let ok = if full {
        words
            .into_iter()
            .all(|(i, w)| w == word(version, sector, i).to_le_bytes())
    } else {
        let last = (SECTOR_USIZE - 16) / 8 - 1;
        bytes[16..24] == word(version, sector, 0).to_le_bytes()
            && bytes[504..512] == word(version, sector, last).to_le_bytes()
    };
    ok.then_some(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_misplacement() {
        let p = payload(7, 3 * SECTOR, 2 * SECTOR);
        assert_eq!(decode(&p[..512], 3, true), Some(7));
        assert_eq!(decode(&p[512..], 4, true), Some(7));
        assert_eq!(decode(&p[512..], 4, false), Some(7));
        assert_eq!(
            decode(&p[..512], 4, true),
            None,
            "a sector in the wrong place"
        );
        assert_eq!(decode(&[0u8; 512], 9, true), Some(0));
        let mut torn = p[..512].to_vec();
        torn[300] ^= 1;
        assert_eq!(decode(&torn, 3, true), None);
    }
}
