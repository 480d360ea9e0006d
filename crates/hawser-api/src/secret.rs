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

/// Bytes in a key check.
pub const KEY_CHECK_BYTES: usize = 16;

/// A data key's check value: the first 16 bytes of SHA-256 over a fixed label and the key.
/// It is recorded in each replica of an encrypted volume and in the volume's record, and
/// carried in the engine's signed grant, so that an engine holding another key than the one
/// a replica's data was written with is refused before it reads or writes (as LUKS keeps a
/// digest of its master key). It reveals nothing usable about a random 512-bit key. Shown
/// and sent as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyCheck(pub [u8; KEY_CHECK_BYTES]);

impl KeyCheck {
    const LABEL: &'static [u8] = b"hawser volume key check v1\0";

    pub fn of(data_key: &[u8]) -> KeyCheck {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        h.update(Self::LABEL);
        h.update(data_key);
        let mut check = [0u8; KEY_CHECK_BYTES];
        check.copy_from_slice(&h.finalize()[..KEY_CHECK_BYTES]);
        KeyCheck(check)
    }

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 32 hex digits; `None` for anything else.
    pub fn parse_hex(s: &str) -> Option<KeyCheck> {
        let b = s.as_bytes();
        if b.len() != 2 * KEY_CHECK_BYTES {
            return None;
        }
        let mut check = [0u8; KEY_CHECK_BYTES];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            let digits = std::str::from_utf8(pair).ok()?;
            check[i] = u8::from_str_radix(digits, 16).ok()?;
        }
        Some(KeyCheck(check))
    }
}

impl std::fmt::Debug for KeyCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyCheck({})", self.hex())
    }
}

impl Serialize for KeyCheck {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for KeyCheck {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<KeyCheck, D::Error> {
        let s = String::deserialize(d)?;
        KeyCheck::parse_hex(&s)
            .ok_or_else(|| serde::de::Error::custom("a key check is 32 hexadecimal digits"))
    }
}

/// An encrypted volume's data key as its record keeps it, and as each of its replicas keeps a
/// copy: AES-256-GCM under key-encryption key `kek`, whose associated data names the volume
/// and the KEK, so only a controller holding that KEK opens it, and only for that volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WrappedKey {
    /// The KEK it is wrapped with.
    pub kek: u32,
    /// Nonce, ciphertext and tag, base64.
    pub wrapped: String,
    /// The data key's check value, which the volume's replicas record at create and its
    /// engines' grants carry. A rotation leaves it as it is.
    pub check: KeyCheck,
}

impl WrappedKey {
    /// A wrapping from its sealed bytes (nonce, ciphertext, tag).
    pub fn from_sealed(kek: u32, sealed: &[u8], check: KeyCheck) -> WrappedKey {
        use base64::Engine as _;
        WrappedKey {
            kek,
            wrapped: base64::engine::general_purpose::STANDARD.encode(sealed),
            check,
        }
    }

    /// The sealed bytes; `None` if `wrapped` is not base64.
    pub fn sealed(&self) -> Option<Vec<u8>> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&self.wrapped)
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_checks_tell_keys_apart_and_roundtrip_as_hex() {
        let a = KeyCheck::of(&[1u8; 64]);
        assert_eq!(a, KeyCheck::of(&[1u8; 64]));
        assert_ne!(a, KeyCheck::of(&[2u8; 64]));
        assert_eq!(KeyCheck::parse_hex(&a.hex()), Some(a));
        let json = serde_json::to_string(&a).unwrap_or_default();
        assert_eq!(json, format!("\"{}\"", a.hex()));
        assert_eq!(serde_json::from_str::<KeyCheck>(&json).ok(), Some(a));
        for bad in [
            "",
            "00",
            &"g".repeat(32),
            &"0".repeat(33),
            "é0000000000000000000000000000000",
        ] {
            assert_eq!(KeyCheck::parse_hex(bad), None, "{bad}");
        }
        // Fixed for good: replicas keep it, so every node must compute the same value.
        assert_eq!(
            KeyCheck::of(&[0u8; 64]).hex(),
            "a9154a235b4d6218de46959eb2e6389e"
        );
    }

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
