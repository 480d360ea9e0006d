//! Bearer tokens: the admin token (CLI, operators) and the agent token (agents to the
//! controller, the controller to agents' admin API), both created at cluster init.
//!
//! Servers keep only a token's SHA-256 and compare digests in constant time, so the cluster
//! store never holds a usable token and a timing side channel does not reveal a prefix.

use std::path::Path;

use sha2::{Digest, Sha256};

/// A token has at least this many characters (the generated ones have 64 hex digits, 256
/// bits); shorter ones are refused so a placeholder like "test" is never accepted.
pub const MIN_TOKEN_CHARS: usize = 32;
/// ... and at most this many, so a header cannot make the server hash megabytes.
pub const MAX_TOKEN_CHARS: usize = 256;

/// Default file names inside the controller's data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";
pub const AGENT_TOKEN_FILE: &str = "agent.token";
/// The metrics (scrape) token's file in the controller's data dir: read-only, `/metrics` only.
pub const METRICS_TOKEN_FILE: &str = "metrics.token";

/// The environment variable the CLI reads a token from.
pub const TOKEN_ENV: &str = "HAWSER_TOKEN";

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("read token file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("token{from} is invalid: {reason}")]
    Invalid { from: String, reason: String },
}

/// SHA-256 of a token, the only form of it a server stores.
pub type TokenDigest = [u8; 32];

pub fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// Lower-case hex of a digest (how the store keeps it).
pub fn digest_hex(d: &TokenDigest) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 64 hex digits back into a digest.
pub fn parse_digest_hex(s: &str) -> Option<TokenDigest> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Constant-time equality of two digests: every byte is looked at whatever the first
/// difference, so the time taken says nothing about how much of a guess was right.
pub fn digests_equal(a: &TokenDigest, b: &TokenDigest) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Checks a token's shape: MIN..=MAX printable ASCII characters, no whitespace. `from` names
/// where it came from, for the error.
pub fn validate_token(token: &str, from: &str) -> Result<(), TokenError> {
    let invalid = |reason: String| TokenError::Invalid {
        from: from.to_string(),
        reason,
    };
    let n = token.chars().count();
    if !(MIN_TOKEN_CHARS..=MAX_TOKEN_CHARS).contains(&n) {
        return Err(invalid(format!(
            "it has {n} characters, expected {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS}"
        )));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            "only printable ASCII without spaces is allowed".into(),
        ));
    }
    Ok(())
}

/// Reads a token file: the token is its content without surrounding whitespace.
pub fn read_token_file(path: &Path) -> Result<String, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let token = text.trim().to_string();
    validate_token(&token, &format!(" in {}", path.display()))?;
    Ok(token)
}

/// The token of an `Authorization: Bearer TOKEN` header value, if it has that shape.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_and_compare() {
        let t = "a".repeat(40);
        let d = digest(&t);
        assert_eq!(parse_digest_hex(&digest_hex(&d)), Some(d));
        assert!(digests_equal(&d, &digest(&t)));
        assert!(!digests_equal(&d, &digest(&"a".repeat(41))));
        assert_eq!(parse_digest_hex("zz"), None);
        assert_eq!(parse_digest_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn token_shape_and_bearer_header() {
        assert!(validate_token(&"x".repeat(32), "").is_ok());
        assert!(validate_token(&"x".repeat(31), "").is_err());
        assert!(validate_token(&"x".repeat(257), "").is_err());
        assert!(validate_token(&format!("{} y", "x".repeat(32)), "").is_err());
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }
}
