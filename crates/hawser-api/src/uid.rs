//! A volume's uid: 16 random bytes, written as 32 lowercase hex digits, given at create and
//! never changed (kept through `cluster recover`, which reads it back from the replicas, and
//! through an in-place restore). Names are reused; a uid is not. Whatever must not open a
//! namesake (an NBD client certificate, a kernel device left by a restarted agent) names
//! the volume by its uid as well as its name.

use crate::{ApiError, ErrorCode};

/// Bytes in a uid.
pub const UID_BYTES: usize = 16;

/// The uid `text` writes, if it is 32 lowercase hex digits.
pub fn parse_uid(text: &str) -> Result<[u8; UID_BYTES], ApiError> {
    let bad = || {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("invalid volume uid {text:?}: expected 32 lowercase hex digits"),
        )
    };
    let b = text.as_bytes();
    if b.len() != 2 * UID_BYTES {
        return Err(bad());
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; UID_BYTES];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let (hi, lo) = (
            digit(pair[0]).ok_or_else(bad)?,
            digit(pair[1]).ok_or_else(bad)?,
        );
        out[i] = hi << 4 | lo;
    }
    Ok(out)
}

/// The text of `uid`.
pub fn uid_text(uid: &[u8; UID_BYTES]) -> String {
    uid.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_round_trip_and_nothing_else_parses() {
        let uid: [u8; UID_BYTES] = std::array::from_fn(|i| u8::try_from(i * 37 % 256).unwrap_or(0));
        let text = uid_text(&uid);
        assert_eq!(text.len(), 32);
        assert_eq!(parse_uid(&text).expect("parses"), uid);
        for bad in [
            "",
            "00",
            &"0".repeat(31),
            &"0".repeat(33),
            &"A".repeat(32),
            &"g".repeat(32),
            &"é".repeat(16),
        ] {
            assert!(parse_uid(bad).is_err(), "{bad:?}");
        }
    }
}
