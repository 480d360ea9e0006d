//! Checking the controller's epoch grants (`hawser_wire::grant`): at Hello on the replica
//! server, and at StartEngine on the admin API. A node that has joined a cluster knows the
//! cluster's public key (from its registration) and accepts a grant only if that key signed
//! it, for the cluster, volume and epoch at hand.

use hawser_api::KeyCheck;
use hawser_wire::grant::{Grant, GrantError, SnapshotReadGrant, KEY_CHECK_BYTES};

/// Why a grant is not good enough.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrantRefusal {
    #[error("no epoch grant; this node's cluster requires one from the controller")]
    Missing,
    #[error("the epoch grant is malformed: {0}")]
    Malformed(String),
    #[error("the epoch grant's signature is not the cluster's")]
    BadSignature,
    #[error(
        "the engine's data key check {granted} is not the replica's {recorded}: it is not the \
         key this replica's data is encrypted with"
    )]
    KeyCheck { granted: String, recorded: String },
    #[error("the epoch grant is for {what} {granted:?}, not {asked:?}")]
    Mismatch {
        what: &'static str,
        granted: String,
        asked: String,
    },
}

/// What a grant must name.
pub struct Expected<'a> {
    pub cluster: &'a str,
    pub volume: &'a str,
    pub epoch: u64,
    /// The engine's node, when the checker knows it (StartEngine: itself).
    pub node: Option<&'a str>,
}

/// A grant's decoder: the grant, its signed body and the signature.
type Decode<'a, G> = fn(&'a [u8]) -> Result<(G, &'a [u8], &'a [u8]), GrantError>;

/// The grant in `signed`, decoded by `decode`, once its signature is the cluster key's.
fn verified<'a, G>(
    key: &[u8],
    signed: Option<&'a [u8]>,
    decode: Decode<'a, G>,
) -> Result<G, GrantRefusal> {
    let signed = signed.ok_or(GrantRefusal::Missing)?;
    let (grant, body, sig) = decode(signed).map_err(|e| GrantRefusal::Malformed(e.to_string()))?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
        .verify(body, sig)
        .map_err(|_| GrantRefusal::BadSignature)?;
    Ok(grant)
}

/// A field of the grant that differs from the request's.
fn mismatch(what: &'static str, granted: &str, asked: &str) -> GrantRefusal {
    GrantRefusal::Mismatch {
        what,
        granted: granted.into(),
        asked: asked.into(),
    }
}

/// Checks `signed` (the grant's bytes) against the cluster's public key.
pub fn check(
    key: &[u8],
    signed: Option<&[u8]>,
    want: &Expected<'_>,
) -> Result<Grant, GrantRefusal> {
    let grant = verified(key, signed, Grant::decode)?;
    if grant.cluster != want.cluster {
        return Err(mismatch("cluster", &grant.cluster, want.cluster));
    }
    if grant.volume != want.volume {
        return Err(mismatch("volume", &grant.volume, want.volume));
    }
    if grant.epoch != want.epoch {
        return Err(mismatch(
            "epoch",
            &grant.epoch.to_string(),
            &want.epoch.to_string(),
        ));
    }
    if let Some(node) = want.node {
        if grant.node != node {
            return Err(mismatch("node", &grant.node, node));
        }
    }
    Ok(grant)
}

/// Checks that grant `g` carries the key check a replica recorded (`None`: a plain replica,
/// which only a plain engine may open).
pub fn check_key(g: &Grant, recorded: Option<[u8; KEY_CHECK_BYTES]>) -> Result<(), GrantRefusal> {
    same_key(g.key_check, recorded)
}

fn same_key(
    granted: Option<[u8; KEY_CHECK_BYTES]>,
    recorded: Option<[u8; KEY_CHECK_BYTES]>,
) -> Result<(), GrantRefusal> {
    if granted == recorded {
        return Ok(());
    }
    let shown = |k: Option<[u8; KEY_CHECK_BYTES]>| {
        k.map_or_else(|| "none (not encrypted)".to_string(), |k| KeyCheck(k).hex())
    };
    Err(GrantRefusal::KeyCheck {
        granted: shown(granted),
        recorded: shown(recorded),
    })
}

/// Checks that an engine whose data key has check `engine` (None: no key) may open a replica
/// that recorded `recorded`: the local replica's counterpart of [`check_key`].
pub fn check_key_of(
    replica: &str,
    recorded: Option<[u8; KEY_CHECK_BYTES]>,
    engine: Option<[u8; KEY_CHECK_BYTES]>,
) -> anyhow::Result<()> {
    same_key(engine, recorded).map_err(|e| anyhow::anyhow!("replica {replica}: {e}"))
}

/// Checks a snapshot-read grant (`signed`) for `cluster` and, when known, the reading
/// `node`; the caller checks its volume against the replica's.
pub fn check_snapshot_read(
    key: &[u8],
    signed: Option<&[u8]>,
    cluster: &str,
    node: Option<&str>,
) -> Result<SnapshotReadGrant, GrantRefusal> {
    let grant = verified(key, signed, SnapshotReadGrant::decode)?;
    if grant.cluster != cluster {
        return Err(mismatch("cluster", &grant.cluster, cluster));
    }
    if let Some(node) = node {
        if grant.node != node {
            return Err(mismatch("node", &grant.node, node));
        }
    }
    Ok(grant)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ring::signature::{Ed25519KeyPair, KeyPair};

    fn key() -> Ed25519KeyPair {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
        Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()
    }

    fn signed(k: &Ed25519KeyPair, epoch: u64) -> Vec<u8> {
        let g = Grant {
            cluster: "c".into(),
            volume: "v".into(),
            node: "n1".into(),
            epoch,
            key_check: None,
        };
        let mut b = g.body().unwrap();
        let sig = k.sign(&b);
        b.extend_from_slice(sig.as_ref());
        b
    }

    #[test]
    fn only_the_clusters_signature_for_the_same_volume_and_epoch_passes() {
        let (k, other) = (key(), key());
        let pk = k.public_key().as_ref().to_vec();
        let want = Expected {
            cluster: "c",
            volume: "v",
            epoch: 5,
            node: Some("n1"),
        };
        assert!(check(&pk, Some(&signed(&k, 5)), &want).is_ok());
        assert_eq!(check(&pk, None, &want), Err(GrantRefusal::Missing));
        assert_eq!(
            check(&pk, Some(&signed(&other, 5)), &want),
            Err(GrantRefusal::BadSignature)
        );
        assert!(matches!(
            check(
                &pk,
                Some(&signed(&k, u64::MAX)),
                &Expected {
                    epoch: u64::MAX - 1,
                    ..want
                }
            ),
            Err(GrantRefusal::Mismatch { what: "epoch", .. })
        ));
        let mut flipped = signed(&k, 5);
        flipped[12] ^= 1; // the epoch, under the signature
        assert_eq!(
            check(&pk, Some(&flipped), &want),
            Err(GrantRefusal::BadSignature)
        );
        assert!(matches!(
            check(
                &pk,
                Some(&signed(&k, 5)),
                &Expected {
                    volume: "w",
                    ..want
                }
            ),
            Err(GrantRefusal::Mismatch { what: "volume", .. })
        ));
        assert!(matches!(
            check(
                &pk,
                Some(&signed(&k, 5)),
                &Expected {
                    node: Some("n2"),
                    ..want
                }
            ),
            Err(GrantRefusal::Mismatch { what: "node", .. })
        ));
        assert!(matches!(
            check(&pk, Some(b"junk"), &want),
            Err(GrantRefusal::Malformed(_))
        ));
    }
}
