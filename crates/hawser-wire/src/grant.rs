//! Epoch grants: the controller's signed word that an engine on `node` may run `volume` at
//! `epoch`. An engine presents its grant in every Hello; a replica server of a node that has
//! joined a cluster opens a session (and raises the replica's epoch) only for a grant signed
//! by the cluster's key, for the replica's volume, at the Hello's epoch. So a process that
//! merely reaches the replica port cannot read or write a replica, nor lock a volume out with
//! `Hello(epoch = u64::MAX)`: the controller never signs an epoch it has not recorded.
//!
//! This crate only encodes and decodes; signing and verifying (Ed25519) happen in the
//! controller and the agent.
//!
//! Signed grant: magic u64 | version u32 | epoch u64 | cluster, volume, node (each u16
//! length + bytes) | in version 2, the volume's key check (16 bytes) | Ed25519 signature (64
//! bytes) of everything before it. Version 2 is written only for an encrypted volume, so
//! nodes that know only version 1 still open plain volumes.
//!
//! The key check is a digest of the volume's data key (docs/security.md). The engine's node
//! compares it with the key it was given, and each replica with the key check it was
//! created with: an engine holding another key than the one a replica's data was written
//! with is refused before it reads or writes, and a plain engine never opens an encrypted
//! replica, nor the reverse.
//!
//! Hello payload: either the replica id alone (a node that has not joined a cluster), or
//! id_len u16 (so the second byte is 0, which no id's second byte is) | id | signed grant.

/// The purpose a TLS cluster derives its grant key for from the CA's key (HKDF, with the
/// cluster id as context): the key every controller holding the CA signs with, which no
/// store holds.
pub const GRANT_KEY_PURPOSE: &str = "hawser epoch grant key v1";

use crate::constants::MAX_ID_BYTES;

pub const GRANT_MAGIC: u64 = u64::from_le_bytes(*b"HWSRGRNT");
pub const GRANT_VERSION: u32 = 1;
/// The version of a grant that carries a key check.
pub const GRANT_VERSION_KEYED: u32 = 2;
pub const SIGNATURE_BYTES: usize = 64;
/// Length of a data key's check value.
pub const KEY_CHECK_BYTES: usize = 16;
/// Longest encoded grant (three ids, the fixed fields and a key check).
pub const MAX_GRANT_BYTES: usize = 20 + 3 * (2 + MAX_ID_BYTES) + KEY_CHECK_BYTES + SIGNATURE_BYTES;
/// Longest Hello payload: an id with its length and a grant.
pub const MAX_HELLO_BYTES: usize = 2 + MAX_ID_BYTES + MAX_GRANT_BYTES;
/// Longest HelloSnapshot payload: two ids with their lengths and a grant.
pub const MAX_HELLO_SNAPSHOT_BYTES: usize = 2 * (2 + MAX_ID_BYTES) + MAX_GRANT_BYTES;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub cluster: String,
    pub volume: String,
    /// The node whose engine it is for.
    pub node: String,
    pub epoch: u64,
    /// The volume's data key check; `None` for a volume that is not encrypted.
    pub key_check: Option<[u8; KEY_CHECK_BYTES]>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrantError {
    #[error("grant truncated")]
    Truncated,
    #[error("not a grant (magic {found:#018x})")]
    BadMagic { found: u64 },
    #[error("unsupported grant version {found}")]
    BadVersion { found: u32 },
    #[error("grant field {field} is invalid")]
    BadField { field: &'static str },
}

impl Grant {
    /// The bytes the controller signs.
    pub fn body(&self) -> Result<Vec<u8>, GrantError> {
        let version = match self.key_check {
            None => GRANT_VERSION,
            Some(_) => GRANT_VERSION_KEYED,
        };
        let mut b = header(GRANT_MAGIC, version);
        b.extend_from_slice(&self.epoch.to_le_bytes());
        put_ids(&mut b, &self.cluster, &self.volume, &self.node)?;
        if let Some(check) = &self.key_check {
            b.extend_from_slice(check);
        }
        Ok(b)
    }

    /// Splits a signed grant into the grant, its signed body and the signature. Never panics.
    pub fn decode(signed: &[u8]) -> Result<(Grant, &[u8], &[u8]), GrantError> {
        let (mut r, version, body, sig) = open(signed, GRANT_MAGIC, GRANT_VERSION_KEYED)?;
        let epoch = r.u64()?;
        let cluster = r.id("cluster")?;
        let volume = r.id("volume")?;
        let node = r.id("node")?;
        let key_check = match version {
            GRANT_VERSION => None,
            _ => {
                let mut check = [0u8; KEY_CHECK_BYTES];
                check.copy_from_slice(r.take(KEY_CHECK_BYTES)?);
                Some(check)
            }
        };
        if r.at != body.len() {
            return Err(GrantError::BadField { field: "length" });
        }
        let grant = Grant {
            cluster,
            volume,
            node,
            epoch,
            key_check,
        };
        Ok((grant, body, sig))
    }
}

/// A grant body's start: its magic and version.
fn header(magic: u64, version: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&magic.to_le_bytes());
    b.extend_from_slice(&version.to_le_bytes());
    b
}

/// Appends the cluster, volume and node ids (u16 length + bytes each), each non-empty and at
/// most [`MAX_ID_BYTES`].
fn put_ids(b: &mut Vec<u8>, cluster: &str, volume: &str, node: &str) -> Result<(), GrantError> {
    for (field, s) in [("cluster", cluster), ("volume", volume), ("node", node)] {
        if s.is_empty() || s.len() > MAX_ID_BYTES {
            return Err(GrantError::BadField { field });
        }
        let len = u16::try_from(s.len()).map_err(|_| GrantError::BadField { field })?;
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    }
    Ok(())
}

/// An opened grant: a reader after its magic and version, the version, its signed body and
/// the signature.
type Opened<'a> = (Reader<'a>, u32, &'a [u8], &'a [u8]);

/// Opens a signed grant of kind `magic`, of a version from 1 to `newest`. Never panics.
fn open(signed: &[u8], magic: u64, newest: u32) -> Result<Opened<'_>, GrantError> {
    if signed.len() > MAX_GRANT_BYTES || signed.len() < SIGNATURE_BYTES {
        return Err(GrantError::Truncated);
    }
    let (body, sig) = signed.split_at(signed.len() - SIGNATURE_BYTES);
    let mut r = Reader { b: body, at: 0 };
    let found = r.u64()?;
    if found != magic {
        return Err(GrantError::BadMagic { found });
    }
    let version = r.u32()?;
    if !(GRANT_VERSION..=newest).contains(&version) {
        return Err(GrantError::BadVersion { found: version });
    }
    Ok((r, version, body, sig))
}

/// Magic of a snapshot-read grant: another magic than an engine grant's, so neither decodes
/// as the other.
pub const SNAPSHOT_READ_MAGIC: u64 = u64::from_le_bytes(*b"HWSRSNPR");

/// The controller's signed word that `node` may read the snapshot copies of `volume`'s
/// replicas (a replica that lacks a snapshot fetching it from one that holds it). It opens a
/// read-only snapshot session (`Op::HelloSnapshot`): no epoch is raised, no engine session
/// replaced, nothing written. Encoded like an engine grant without the epoch: magic u64 |
/// version u32 | cluster, volume, node (u16 length + bytes each) | signature (64 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotReadGrant {
    pub cluster: String,
    pub volume: String,
    /// The node allowed to read.
    pub node: String,
}

impl SnapshotReadGrant {
    /// The bytes the controller signs.
    pub fn body(&self) -> Result<Vec<u8>, GrantError> {
        let mut b = header(SNAPSHOT_READ_MAGIC, GRANT_VERSION);
        put_ids(&mut b, &self.cluster, &self.volume, &self.node)?;
        Ok(b)
    }

    /// Splits a signed snapshot-read grant into the grant, its signed body and the
    /// signature. Never panics.
    pub fn decode(signed: &[u8]) -> Result<(SnapshotReadGrant, &[u8], &[u8]), GrantError> {
        let (mut r, _, body, sig) = open(signed, SNAPSHOT_READ_MAGIC, GRANT_VERSION)?;
        let cluster = r.id("cluster")?;
        let volume = r.id("volume")?;
        let node = r.id("node")?;
        if r.at != body.len() {
            return Err(GrantError::BadField { field: "length" });
        }
        Ok((
            SnapshotReadGrant {
                cluster,
                volume,
                node,
            },
            body,
            sig,
        ))
    }
}

/// What a `HelloSnapshot` carries: the replica, the snapshot, and the snapshot-read grant
/// (absent on a node that has not joined a cluster). Encoded as replica id and snapshot id
/// (u16 length + bytes each), then the grant's bytes to the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloSnapshotRequest {
    pub replica: String,
    pub snapshot: String,
    pub grant: Option<Vec<u8>>,
}

impl HelloSnapshotRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(4 + self.replica.len() + self.snapshot.len() + 160);
        for s in [&self.replica, &self.snapshot] {
            let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        }
        if let Some(g) = &self.grant {
            b.extend_from_slice(g);
        }
        b
    }

    /// Never panics; `None` for a malformed payload.
    pub fn decode(p: &[u8]) -> Option<HelloSnapshotRequest> {
        if p.len() > MAX_HELLO_SNAPSHOT_BYTES {
            return None;
        }
        let mut r = Reader { b: p, at: 0 };
        let replica = r.id("replica").ok()?;
        let snapshot = r.id("snapshot").ok()?;
        let rest = &p[r.at..];
        Some(HelloSnapshotRequest {
            replica,
            snapshot,
            grant: (!rest.is_empty()).then(|| rest.to_vec()),
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], GrantError> {
        let end = self.at.checked_add(n).ok_or(GrantError::Truncated)?;
        let s = self.b.get(self.at..end).ok_or(GrantError::Truncated)?;
        self.at = end;
        Ok(s)
    }
    fn u64(&mut self) -> Result<u64, GrantError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn u32(&mut self) -> Result<u32, GrantError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn id(&mut self, field: &'static str) -> Result<String, GrantError> {
        let mut l = [0u8; 2];
        l.copy_from_slice(self.take(2)?);
        let len = usize::from(u16::from_le_bytes(l));
        if len == 0 || len > MAX_ID_BYTES {
            return Err(GrantError::BadField { field });
        }
        std::str::from_utf8(self.take(len)?)
            .map(str::to_owned)
            .map_err(|_| GrantError::BadField { field })
    }
}

/// What a Hello carries: the replica id and, from an engine of a cluster, its signed grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloRequest {
    pub replica: String,
    pub grant: Option<Vec<u8>>,
}

impl HelloRequest {
    pub fn encode(&self) -> Vec<u8> {
        match &self.grant {
            None => self.replica.as_bytes().to_vec(),
            Some(g) => {
                let id = self.replica.as_bytes();
                let len = u16::try_from(id.len()).unwrap_or(u16::MAX);
                let mut b = Vec::with_capacity(2 + id.len() + g.len());
                b.extend_from_slice(&len.to_le_bytes());
                b.extend_from_slice(id);
                b.extend_from_slice(g);
                b
            }
        }
    }

    /// Never panics; `None` for anything that is neither form.
    pub fn decode(p: &[u8]) -> Option<HelloRequest> {
        if p.len() >= 2 && p[1] == 0 {
            let len = usize::from(u16::from_le_bytes([p[0], p[1]]));
            if len == 0 || len > MAX_ID_BYTES {
                return None;
            }
            let id = p.get(2..2 + len)?;
            let grant = p.get(2 + len..)?;
            return Some(HelloRequest {
                replica: std::str::from_utf8(id).ok()?.to_owned(),
                grant: Some(grant.to_vec()),
            });
        }
        if p.is_empty() || p.len() > MAX_ID_BYTES {
            return None;
        }
        Some(HelloRequest {
            replica: std::str::from_utf8(p).ok()?.to_owned(),
            grant: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            cluster: "0123456789abcdef0123456789abcdef".into(),
            volume: "vol".into(),
            node: "n1".into(),
            epoch: 7,
            key_check: None,
        }
    }

    #[test]
    fn signed_grants_roundtrip_and_garbage_is_refused() {
        let g = grant();
        let mut signed = g.body().expect("body");
        let body_len = signed.len();
        signed.extend_from_slice(&[9u8; SIGNATURE_BYTES]);
        let (back, body, sig) = Grant::decode(&signed).expect("decode");
        assert_eq!(back, g);
        assert_eq!((body.len(), sig), (body_len, &[9u8; SIGNATURE_BYTES][..]));
        for cut in 0..signed.len() {
            assert!(Grant::decode(&signed[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = signed.clone();
        bad[0] ^= 1;
        assert!(matches!(
            Grant::decode(&bad),
            Err(GrantError::BadMagic { .. })
        ));
        let empty = Grant {
            node: String::new(),
            ..grant()
        };
        assert!(empty.body().is_err());
    }

    #[test]
    fn a_key_check_makes_a_version_2_grant_and_version_1_stays_readable() {
        let plain = grant().body().expect("body");
        assert_eq!(plain[8..12], GRANT_VERSION.to_le_bytes());
        let keyed = Grant {
            key_check: Some([0xa5; KEY_CHECK_BYTES]),
            ..grant()
        };
        let mut signed = keyed.body().expect("body");
        assert_eq!(signed[8..12], GRANT_VERSION_KEYED.to_le_bytes());
        assert_eq!(signed.len(), plain.len() + KEY_CHECK_BYTES);
        signed.extend_from_slice(&[9u8; SIGNATURE_BYTES]);
        let (back, _, _) = Grant::decode(&signed).expect("decode");
        assert_eq!(back, keyed);
        // A version 1 grant with a key check's bytes appended, or a version 2 grant without
        // them, is malformed: the version says which.
        let mut long = plain.clone();
        long.extend_from_slice(&[0xa5; KEY_CHECK_BYTES + SIGNATURE_BYTES]);
        assert!(Grant::decode(&long).is_err());
        let mut short = plain;
        short[8..12].copy_from_slice(&GRANT_VERSION_KEYED.to_le_bytes());
        short.extend_from_slice(&[9u8; SIGNATURE_BYTES]);
        assert!(Grant::decode(&short).is_err());
        let mut future = signed.clone();
        future[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(
            Grant::decode(&future),
            Err(GrantError::BadVersion { found: 3 })
        );
        for cut in 0..signed.len() {
            assert!(Grant::decode(&signed[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn snapshot_read_grants_are_not_engine_grants_and_garbage_is_refused() {
        let g = SnapshotReadGrant {
            cluster: "0123456789abcdef0123456789abcdef".into(),
            volume: "vol".into(),
            node: "n2".into(),
        };
        let mut signed = g.body().expect("body");
        signed.extend_from_slice(&[7u8; SIGNATURE_BYTES]);
        let (back, _, sig) = SnapshotReadGrant::decode(&signed).expect("decode");
        assert_eq!((back, sig), (g, &[7u8; SIGNATURE_BYTES][..]));
        // Neither kind passes for the other, whatever the signature.
        assert!(matches!(
            Grant::decode(&signed),
            Err(GrantError::BadMagic { .. })
        ));
        let mut engine = grant().body().expect("body");
        engine.extend_from_slice(&[7u8; SIGNATURE_BYTES]);
        assert!(matches!(
            SnapshotReadGrant::decode(&engine),
            Err(GrantError::BadMagic { .. })
        ));
        for cut in 0..signed.len() {
            assert!(
                SnapshotReadGrant::decode(&signed[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn hello_snapshot_payloads_roundtrip_and_garbage_is_refused() {
        for grant in [None, Some(vec![1, 2, 3])] {
            let h = HelloSnapshotRequest {
                replica: "vol-r0-abc".into(),
                snapshot: "s1-0a0b0c".into(),
                grant,
            };
            assert_eq!(HelloSnapshotRequest::decode(&h.encode()), Some(h));
        }
        for bad in [
            &b""[..],
            &[5, 0, b'a'][..],
            &[0, 0][..],
            &[1, 0, b'r', 0, 0][..],
            &[1, 0, b'r', 9, 0, b's'][..],
        ] {
            assert_eq!(HelloSnapshotRequest::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hello_payloads_of_both_forms() {
        let old = HelloRequest {
            replica: "vol-r0-abc".into(),
            grant: None,
        };
        assert_eq!(HelloRequest::decode(&old.encode()), Some(old));
        let new = HelloRequest {
            replica: "vol-r0-abc".into(),
            grant: Some(vec![1, 2, 3]),
        };
        assert_eq!(HelloRequest::decode(&new.encode()), Some(new));
        for bad in [&b""[..], &[5, 0, b'a'][..], &[0, 0][..], &[0xff, 0xfe][..]] {
            assert_eq!(HelloRequest::decode(bad), None, "{bad:?}");
        }
    }
}
