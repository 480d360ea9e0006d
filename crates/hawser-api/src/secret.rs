//! Secrets in API messages (a volume's data key on its way to the engine's node): carried as
//! base64 text, never shown by `Debug`, so a logged request does not log the key.

use serde::{Deserialize, Serialize};

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// `bytes` as base64.
    pub fn new(bytes: &[u8]) -> Secret {
        use base64::Engine as _;
        Secret(base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// The bytes; `None` if the text is not base64.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&self.0)
            .ok()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(hidden)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_roundtrips_as_base64_and_never_debug_prints() {
        let s = Secret::new(b"key bytes");
        assert_eq!(s.bytes().as_deref(), Some(&b"key bytes"[..]));
        assert_eq!(format!("{s:?}"), "Secret(hidden)");
        let json = serde_json::to_string(&s).unwrap_or_default();
        assert_eq!(json, "\"a2V5IGJ5dGVz\"");
        let bad: Secret =
            serde_json::from_str("\"not base64!\"").unwrap_or_else(|_| Secret::new(b""));
        assert_eq!(bad.bytes(), None);
    }
}
