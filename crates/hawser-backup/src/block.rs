//! One block: its hash, whether it is all zeros, and its stored form (a zstd frame).

use sha2::{Digest, Sha256};

/// The hex SHA-256 of `data`: the block's name.
pub fn hash(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// All zeros: such a block is stored nowhere (a trimmed or never-written range).
pub fn is_zero(data: &[u8]) -> bool {
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to only splits at aligned bounds.
        unsafe { data.align_to::<u64>() }
    };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

pub fn compress(data: &[u8]) -> std::io::Result<Vec<u8>> {
    zstd::bulk::compress(data, crate::constants::ZSTD_LEVEL)
}

/// Decompresses a stored block and checks it is `len` bytes whose hash is `expect`; the
/// error says which of the two failed. Never more than `len` bytes are produced, whatever
/// the object holds.
pub fn open(stored: &[u8], len: u64, expect: &str) -> Result<Vec<u8>, String> {
    let cap = usize::try_from(len).map_err(|_| format!("block length {len}"))?;
    let data = zstd::bulk::decompress(stored, cap)
        .map_err(|e| format!("not a zstd frame of at most {len} bytes: {e}"))?;
    if data.len() != cap {
        return Err(format!("{} bytes once decompressed, not {len}", data.len()));
    }
    let got = hash(&data);
    if got != expect {
        return Err(format!("its content hashes to {got}"));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_block_opens_only_as_itself() {
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let h = hash(&data);
        let z = compress(&data).unwrap();
        assert!(z.len() < data.len() / 4);
        assert_eq!(open(&z, 65536, &h).unwrap(), data);
        assert!(open(&z, 65536, &hash(b"x"))
            .unwrap_err()
            .contains("hashes to"));
        assert!(open(&z, 4096, &h).unwrap_err().contains("at most 4096"));
        assert!(open(&z, 70000, &h).unwrap_err().contains("not 70000"));
        let mut flipped = z.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert!(open(&flipped, 65536, &h).is_err());
        assert!(open(b"garbage", 65536, &h).is_err());
        assert!(open(&[], 65536, &h).is_err());
    }

    #[test]
    fn zeros_are_seen_at_any_alignment() {
        let mut buf = vec![0u8; 4099];
        assert!(is_zero(&buf[1..]));
        for at in [0, 1, 7, 8, 2048, 4098] {
            buf[at] = 1;
            assert!(!is_zero(&buf), "{at}");
            buf[at] = 0;
        }
        assert!(is_zero(&[]));
    }
}
