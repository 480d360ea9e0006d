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

/// Why a stored block is not the block its manifest names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// The manifest's length does not fit this machine's memory addresses.
    #[error("block length {0}")]
    Length(u64),
    /// The object is not zstd, or it decompresses to more than the block's length.
    #[error("not a zstd frame of at most {len} bytes: {why}")]
    NotAFrame { len: u64, why: String },
    /// The frame is whole but shorter than the block.
    #[error("{got} bytes once decompressed, not {len}")]
    Short { got: usize, len: u64 },
    /// The content is of the right length but another block's (or damaged).
    #[error("its content hashes to {0}")]
    Hash(String),
}

/// Decompresses a stored block and checks it is `len` bytes whose hash is `expect`; the
/// error says which of the two failed. Never more than `len` bytes are produced, whatever
/// the object holds.
pub fn open(stored: &[u8], len: u64, expect: &str) -> Result<Vec<u8>, BlockError> {
    let cap = usize::try_from(len).map_err(|_| BlockError::Length(len))?;
    let data = zstd::bulk::decompress(stored, cap).map_err(|e| BlockError::NotAFrame {
        len,
        why: e.to_string(),
    })?;
    if data.len() != cap {
        return Err(BlockError::Short {
            got: data.len(),
            len,
        });
    }
    let got = hash(&data);
    if got != expect {
        return Err(BlockError::Hash(got));
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
        let other = open(&z, 65536, &hash(b"x")).unwrap_err();
        assert_eq!(other, BlockError::Hash(h.clone()));
        assert!(other.to_string().contains("hashes to"), "{other}");
        let long = open(&z, 4096, &h).unwrap_err();
        assert!(
            matches!(long, BlockError::NotAFrame { len: 4096, .. }),
            "{long}"
        );
        assert!(long.to_string().contains("at most 4096"), "{long}");
        let short = open(&z, 70000, &h).unwrap_err();
        assert_eq!(
            short,
            BlockError::Short {
                got: 65536,
                len: 70000
            }
        );
        assert!(short.to_string().contains("not 70000"), "{short}");
        let mut flipped = z.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert!(open(&flipped, 65536, &h).is_err());
        assert!(matches!(
            open(b"garbage", 65536, &h),
            Err(BlockError::NotAFrame { .. })
        ));
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
