//! Join tokens: how a new node proves to the controller that an operator let it in, and
//! learns which CA is the cluster's before it trusts anything the network tells it.
//!
//! `hjt1.<id>.<secret>.<ca>`: the id (8 hex digits) names the token's record in the store,
//! which keeps only the secret's SHA-256, an expiry and the uses left; the secret is 32
//! random bytes (64 hex digits); `<ca>` is the SHA-256 of the CA certificate's DER (64 hex
//! digits), the same pinning kubeadm's discovery hash does.

use rand::RngCore;
use sha2::{Digest, Sha256};

const PREFIX: &str = "hjt1";

#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub secret: String,
    pub ca_sha256: [u8; 32],
}

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinToken")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The SHA-256 of a certificate's DER.
pub fn ca_fingerprint(cert_der: &[u8]) -> [u8; 32] {
    Sha256::digest(cert_der).into()
}

impl JoinToken {
    /// A new token for the CA whose DER is `ca_der`.
    pub fn generate(ca_der: &[u8]) -> JoinToken {
        let mut id = [0u8; 4];
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut id);
        rand::rng().fill_bytes(&mut secret);
        JoinToken {
            id: hex(&id),
            secret: hex(&secret),
            ca_sha256: ca_fingerprint(ca_der),
        }
    }

    /// Parses a token as the operator pasted it (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Option<JoinToken> {
        let mut parts = text.trim().split('.');
        let (prefix, id, secret, ca) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hexes = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        };
        if prefix != PREFIX
            || parts.next().is_some()
            || !hexes(id, 8)
            || !hexes(secret, 64)
            || !hexes(ca, 64)
        {
            return None;
        }
        let mut ca_sha256 = [0u8; 32];
        for (i, b) in ca_sha256.iter_mut().enumerate() {
            *b = u8::from_str_radix(ca.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(JoinToken {
            id: id.to_string(),
            secret: secret.to_string(),
            ca_sha256,
        })
    }

    /// SHA-256 of the secret, hex: what the store keeps.
    pub fn secret_sha256(&self) -> String {
        hex(&Sha256::digest(self.secret.as_bytes()))
    }
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{PREFIX}.{}.{}.{}",
            self.id,
            self.secret,
            hex(&self.ca_sha256)
        )
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_garbage_is_refused() {
        let t = JoinToken::generate(b"ca");
        let text = t.to_string();
        assert_eq!(JoinToken::parse(&format!(" {text}\n")), Some(t.clone()));
        assert_eq!(t.ca_sha256, ca_fingerprint(b"ca"));
        for bad in [
            "",
            "hjt1",
            "hjt1...",
            &text.replacen("hjt1", "hjt2", 1),
            &format!("{text}.00"),
            &text.to_uppercase(),
            &text[..text.len() - 1],
        ] {
            assert_eq!(JoinToken::parse(bad), None, "{bad:?}");
        }
    }
}
