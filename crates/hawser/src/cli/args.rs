//! Argument parsers shared by the CLI commands. They run inside clap, so a bad value is a
//! usage error (exit code 2) reported before any request is sent.

use hawser_api::{parse_size, validate_name};

/// A volume size such as `10GiB`; refuses 0, negatives, garbage and unaligned sizes.
pub fn parse_volume_size(s: &str) -> Result<u64, String> {
    // parse_size also applies the volume rules (positive, 4 KiB aligned, bounded).
    parse_size(s).map_err(|e| e.to_string())
}

/// A volume name (`[a-z0-9-]`, 1-63 characters).
pub fn parse_volume_name(s: &str) -> Result<String, String> {
    validate_name("volume", s).map_err(|e| e.message)?;
    Ok(s.to_string())
}

/// A snapshot name, same rules.
pub fn parse_snapshot_name(s: &str) -> Result<String, String> {
    validate_name("snapshot", s).map_err(|e| e.message)?;
    Ok(s.to_string())
}

/// A node name, same rules.
pub fn parse_node_name(s: &str) -> Result<String, String> {
    validate_name("node", s).map_err(|e| e.message)?;
    Ok(s.to_string())
}

/// A pool name, same rules.
pub fn parse_pool_name(s: &str) -> Result<String, String> {
    validate_name("pool", s).map_err(|e| e.message)?;
    Ok(s.to_string())
}

/// A duration such as `90s`, `30m`, `24h` or `7d` (a bare number is seconds), in seconds;
/// refuses 0 and garbage.
pub fn parse_duration_secs(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: use a number with s, m, h or d, e.g. 24h")),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: use a number with s, m, h or d, e.g. 24h"))?;
    match n.checked_mul(per) {
        Some(0) => Err(format!("{s:?}: must be more than 0")),
        Some(secs) => Ok(secs),
        None => Err(format!("{s:?} is too long")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_volume_size("10GiB"), Ok(10 << 30));
        for bad in ["0", "-1", "abc", "1000", "", "-4096"] {
            assert!(parse_volume_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_secs("24h"), Ok(86_400));
        assert_eq!(parse_duration_secs("90"), Ok(90));
        assert_eq!(parse_duration_secs("5s"), Ok(5));
        assert_eq!(parse_duration_secs("2d"), Ok(172_800));
        for bad in [
            "0",
            "0h",
            "",
            "h",
            "-1h",
            "1w",
            "1.5h",
            "99999999999999999999d",
        ] {
            assert!(parse_duration_secs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names() {
        assert!(parse_volume_name("demo-1").is_ok());
        assert!(parse_volume_name("Demo").is_err());
        assert!(parse_node_name("a/b").is_err());
        assert!(parse_pool_name("ssd").is_ok());
        assert!(parse_pool_name("SSD").is_err());
    }
}
