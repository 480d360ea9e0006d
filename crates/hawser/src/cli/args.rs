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
    fn names() {
        assert!(parse_volume_name("demo-1").is_ok());
        assert!(parse_volume_name("Demo").is_err());
        assert!(parse_node_name("a/b").is_err());
        assert!(parse_pool_name("ssd").is_ok());
        assert!(parse_pool_name("SSD").is_err());
    }
}
