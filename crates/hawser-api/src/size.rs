//! Human-readable sizes: "10GiB", "512MiB", "4096", "1G" (binary units; "GB" means 10^9).
//! Volume sizes must be positive multiples of 4096 bytes.

use crate::error::{ApiError, ErrorCode};

const ALIGN: u64 = 4096;

/// The largest volume: 64 TiB. An engine keeps a dirty bitmap per replica (one bit per
/// 64 KiB: 128 MiB at this size) and an activity log sized by the volume, so the bound keeps
/// an engine's memory bounded whatever a request asks for.
pub const MAX_VOLUME_BYTES: u64 = 1 << 46;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("size {input:?} is not a number with an optional unit (e.g. 10GiB, 512MiB, 4096)")]
    Unparsable { input: String },
    #[error("size {input:?} is negative")]
    Negative { input: String },
    #[error("size must be greater than 0")]
    Zero,
    #[error("size {input:?} is too large")]
    Overflow { input: String },
    #[error("size {bytes} bytes is not a multiple of 4096 bytes")]
    Unaligned { bytes: u64 },
    #[error("size {bytes} bytes is larger than the largest volume (64 TiB)")]
    TooLarge { bytes: u64 },
}

impl From<SizeError> for ApiError {
    fn from(e: SizeError) -> Self {
        ApiError::new(ErrorCode::InvalidArgument, e.to_string())
    }
}

/// Parse a volume size. Accepts an integer with an optional unit: B, K/KiB, M/MiB, G/GiB,
/// T/TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000).
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let bytes = parse_bytes(input)?;
    check_volume_size(bytes)?;
    Ok(bytes)
}

/// Parse a byte count with the units of [`parse_size`], without a volume size's rules: zero
/// and unaligned counts are fine (rates, limits).
pub fn parse_bytes(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    if s.starts_with('-') {
        return Err(SizeError::Negative {
            input: input.into(),
        });
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(SizeError::Unparsable {
            input: input.into(),
        });
    }
    let n: u64 = num.parse().map_err(|_| SizeError::Overflow {
        input: input.into(),
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(SizeError::Unparsable {
                input: input.into(),
            })
        }
    };
    n.checked_mul(mult).ok_or(SizeError::Overflow {
        input: input.into(),
    })
}

/// A volume size must be positive, 4096-aligned and below 2^62 (so offsets never overflow).
pub fn check_volume_size(bytes: u64) -> Result<(), SizeError> {
    if bytes == 0 {
        return Err(SizeError::Zero);
    }
    if !bytes.is_multiple_of(ALIGN) {
        return Err(SizeError::Unaligned { bytes });
    }
    if bytes > MAX_VOLUME_BYTES {
        return Err(SizeError::TooLarge { bytes });
    }
    Ok(())
}

/// Format bytes for humans: "1.0 GiB", "512 MiB", "4.0 KiB", "100 B".
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size(" 8 KiB "), Ok(8192));
        assert_eq!(parse_size("4096000KB"), Ok(4_096_000_000));
    }

    #[test]
    fn byte_counts_may_be_zero_or_unaligned() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("100MB"), Ok(100_000_000));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(matches!(
            parse_bytes("fast"),
            Err(SizeError::Unparsable { .. })
        ));
    }

    #[test]
    fn rejects_bad_sizes() {
        assert_eq!(parse_size("0"), Err(SizeError::Zero));
        assert_eq!(parse_size("0GiB"), Err(SizeError::Zero));
        assert!(matches!(
            parse_size("-1GiB"),
            Err(SizeError::Negative { .. })
        ));
        assert!(matches!(
            parse_size("ten"),
            Err(SizeError::Unparsable { .. })
        ));
        assert!(matches!(
            parse_size("10XB"),
            Err(SizeError::Unparsable { .. })
        ));
        assert!(matches!(parse_size(""), Err(SizeError::Unparsable { .. })));
        assert_eq!(
            parse_size("1000"),
            Err(SizeError::Unaligned { bytes: 1000 })
        );
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("99999999999999999999999"),
            Err(SizeError::Overflow { .. })
        ));
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(1536 << 20), "1.5 GiB");
        assert_eq!(format_size(100), "100 B");
    }
}
