//! On-disk replica metadata: a fixed 4096-byte record with magic, version and checksum, kept
//! next to the replica's data file and replaced atomically (write temp, fsync, rename, fsync
//! directory) so a crash leaves either the old or the new record, never a mix.

use crate::constants::MAX_ID_BYTES;

pub const META_MAGIC: u64 = u64::from_le_bytes(*b"HWSRMETA");
/// Version 2 added the cluster id; version 1 records (no cluster) still decode.
pub const META_VERSION: u32 = 2;
/// Version 3 adds an encrypted volume's key check; it is written only for such a replica,
/// so a plain replica's record stays readable by agents that know version 2.
pub const META_VERSION_KEYED: u32 = 3;
/// Version 4 adds a flags byte (`FLAG_CHECKSUMS`, `FLAG_KEY_CHECK`); it is written only for a
/// replica with block checksums, so other records stay readable by older agents.
pub const META_VERSION_FLAGS: u32 = 4;
/// Version 5 adds an encrypted volume's wrapped data key (`FLAG_WRAPPED_KEY`); it is written
/// only for a replica that holds one, so other records stay readable by older agents.
pub const META_VERSION_WRAPPED: u32 = 5;
/// Version 6 adds the volume's uid (`FLAG_VOLUME_UID`): the identity a volume keeps for life,
/// which a namesake created after it was deleted does not share. Written only for a replica
/// of a volume that has one, so other records stay readable by older agents.
pub const META_VERSION_UID: u32 = 6;
/// Version 4 flag: the replica keeps block checksums (`<id>.sums`).
pub const FLAG_CHECKSUMS: u8 = 1 << 0;
/// Version 4 flag: the key check at `KEY_CHECK_AT` is set (an encrypted volume).
pub const FLAG_KEY_CHECK: u8 = 1 << 1;
/// Version 5 flag: the wrapped data key at `WRAPPED_AT` is set (never without a key check).
pub const FLAG_WRAPPED_KEY: u8 = 1 << 2;
/// Version 6 flag: the volume uid at `UID_AT` is set.
pub const FLAG_VOLUME_UID: u8 = 1 << 3;
/// A volume uid's length in bytes (shown as 32 lowercase hex digits).
pub const VOLUME_UID_BYTES: usize = 16;
/// Longest sealed data key (nonce, ciphertext and tag): a 64-byte data key sealed with
/// AES-256-GCM takes 12 + 64 + 16 = 92.
pub const MAX_WRAPPED_KEY_BYTES: usize = 128;
pub use crate::grant::KEY_CHECK_BYTES;
/// Longest cluster id.
pub const MAX_CLUSTER_ID_BYTES: usize = 64;
/// One block, so the record is written by a single sector-aligned write.
pub const META_LEN: usize = 4096;

/// Replica states as stored on disk. Issue-level semantics live in docs/protocol.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplicaDiskState {
    /// Created, holds data of the volume as of its last in-sync write.
    Ok = 1,
    /// Marked failed after a disk error; never read from.
    Failed = 2,
}

/// An encrypted volume's data key as its controller's record holds it: sealed (nonce,
/// ciphertext, tag) under key-encryption key `kek`, with associated data that names the
/// volume and the KEK. Only a controller holding that KEK can open it; a replica keeps a copy
/// so that a controller that lost its store can rebuild the volume's record
/// (`hawser cluster recover`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrappedKey {
    pub kek: u32,
    pub sealed: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaMeta {
    pub volume: String,
    pub replica: String,
    /// Volume size in bytes.
    pub size: u64,
    /// Highest volume epoch this replica has accepted. Requests with a lower epoch are refused.
    pub epoch: u64,
    /// Bumped on every metadata change (debugging, resync ordering later).
    pub generation: u64,
    pub state: ReplicaDiskState,
    /// Thin (sparse) or thick (fully allocated) data file.
    pub thin: bool,
    /// The cluster whose controller created it (None: created before clusters had ids). A
    /// controller never deletes a replica of another cluster (docs/security.md).
    pub cluster: Option<String>,
    /// The key check of the data key the replica's data is encrypted with (None: the volume is
    /// not encrypted). Set at create and never changed: an engine whose grant carries another
    /// key check is refused (`hawser_wire::grant`).
    pub key_check: Option<[u8; KEY_CHECK_BYTES]>,
    /// The replica keeps a checksum per 4 KiB block beside its data and checks every read
    /// against it (set at create, never changed).
    pub checksums: bool,
    /// An encrypted volume's wrapped data key (None: a plain volume, or a replica created
    /// before replicas kept it). Set at create; a key rotation replaces it with the same data
    /// key wrapped under a newer KEK.
    pub wrapped_key: Option<WrappedKey>,
    /// The uid of the volume it belongs to (None: a volume created before volumes had uids).
    /// Set at create, never changed; `hawser cluster recover` gives it back to the volume.
    pub volume_uid: Option<[u8; VOLUME_UID_BYTES]>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetaError {
    #[error("metadata record is {len} bytes, expected {META_LEN}")]
    BadLength { len: usize },
    #[error("not a Hawser replica metadata record (magic {found:#018x})")]
    BadMagic { found: u64 },
    #[error("unsupported metadata version {found}")]
    BadVersion { found: u32 },
    #[error("metadata checksum mismatch (computed {computed:#010x}, stored {found:#010x})")]
    Checksum { computed: u32, found: u32 },
    #[error("metadata field {field} is invalid")]
    BadField { field: &'static str },
}

// Layout: magic u64 | version u32 | state u8 | thin u8 | cluster_len u16 (0 in version 1) |
// size u64 | epoch u64 | generation u64 | vol_len u16 | rep_len u16 | volume bytes |
// replica bytes | cluster bytes | zeroes | (version 3) key check at KEY_CHECK_AT | zeroes |
// (version 5) at WRAPPED_AT: kek u32 | sealed_len u16 | sealed bytes | zeroes |
// (version 6) at UID_AT: volume uid (16 bytes) |
// (version 4) flags at FLAGS_AT | crc32c of bytes 0..META_LEN-4 in the last 4 bytes.
const IDS_AT: usize = 44;
/// Past the longest ids (44 + 2 * MAX_ID_BYTES + MAX_CLUSTER_ID_BYTES).
const KEY_CHECK_AT: usize = 4064;
const _: () = assert!(IDS_AT + 2 * MAX_ID_BYTES + MAX_CLUSTER_ID_BYTES <= KEY_CHECK_AT);
const _: () = assert!(KEY_CHECK_AT + KEY_CHECK_BYTES <= META_LEN - 4);
/// Just before the key check.
const FLAGS_AT: usize = KEY_CHECK_AT - 1;
const _: () = assert!(IDS_AT + 2 * MAX_ID_BYTES + MAX_CLUSTER_ID_BYTES <= FLAGS_AT);
/// Just before the flags, room for the longest sealed key with its KEK id and length.
const WRAPPED_AT: usize = FLAGS_AT - 6 - MAX_WRAPPED_KEY_BYTES;
const _: () = assert!(IDS_AT + 2 * MAX_ID_BYTES + MAX_CLUSTER_ID_BYTES <= WRAPPED_AT);
const _: () = assert!(WRAPPED_AT + 6 + MAX_WRAPPED_KEY_BYTES <= FLAGS_AT);
const _: () = assert!(MAX_WRAPPED_KEY_BYTES <= u16::MAX as usize);
/// Just before the wrapped key.
const UID_AT: usize = WRAPPED_AT - VOLUME_UID_BYTES;
const _: () = assert!(IDS_AT + 2 * MAX_ID_BYTES + MAX_CLUSTER_ID_BYTES <= UID_AT);

impl ReplicaMeta {
    pub fn encode(&self) -> Result<Vec<u8>, MetaError> {
        let vol = self.volume.as_bytes();
        let rep = self.replica.as_bytes();
        if vol.is_empty() || vol.len() > MAX_ID_BYTES {
            return Err(MetaError::BadField { field: "volume" });
        }
        if rep.is_empty() || rep.len() > MAX_ID_BYTES {
            return Err(MetaError::BadField { field: "replica" });
        }
        let mut b = vec![0u8; META_LEN];
        b[0..8].copy_from_slice(&META_MAGIC.to_le_bytes());
        if let Some(check) = self.key_check {
            b[KEY_CHECK_AT..KEY_CHECK_AT + KEY_CHECK_BYTES].copy_from_slice(&check);
        }
        let mut flags = 0;
        if self.checksums {
            flags |= FLAG_CHECKSUMS;
        }
        if self.key_check.is_some() {
            flags |= FLAG_KEY_CHECK;
        }
        if let Some(w) = &self.wrapped_key {
            self.put_wrapped_key(&mut b, w)?;
            flags |= FLAG_WRAPPED_KEY;
        }
        if let Some(uid) = &self.volume_uid {
            b[UID_AT..UID_AT + VOLUME_UID_BYTES].copy_from_slice(uid);
            flags |= FLAG_VOLUME_UID;
        }
        let version = match (
            self.volume_uid.is_some(),
            self.wrapped_key.is_some(),
            self.checksums,
            self.key_check,
        ) {
            (true, _, _, _) => META_VERSION_UID,
            (false, true, _, _) => META_VERSION_WRAPPED,
            (false, false, false, None) => META_VERSION,
            (false, false, false, Some(_)) => META_VERSION_KEYED,
            (false, false, true, _) => META_VERSION_FLAGS,
        };
        if version >= META_VERSION_FLAGS {
            b[FLAGS_AT] = flags;
        }
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[12] = self.state as u8;
        b[13] = u8::from(self.thin);
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..40].copy_from_slice(&self.generation.to_le_bytes());
        let bad = |field| move |_| MetaError::BadField { field };
        let vl = u16::try_from(vol.len()).map_err(bad("volume"))?;
        let rl = u16::try_from(rep.len()).map_err(bad("replica"))?;
        let cluster = self.cluster.as_deref().unwrap_or("").as_bytes();
        if self.cluster.is_some() && (cluster.is_empty() || cluster.len() > MAX_CLUSTER_ID_BYTES) {
            return Err(MetaError::BadField { field: "cluster" });
        }
        let cl = u16::try_from(cluster.len()).map_err(bad("cluster"))?;
        b[14..16].copy_from_slice(&cl.to_le_bytes());
        b[40..42].copy_from_slice(&vl.to_le_bytes());
        b[42..44].copy_from_slice(&rl.to_le_bytes());
        let mut at = IDS_AT;
        for part in [vol, rep, cluster] {
            b[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        let crc = crc32c::crc32c(&b[..META_LEN - 4]);
        b[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        Ok(b)
    }

    /// Lays out `w` at `WRAPPED_AT`; only beside a key check.
    fn put_wrapped_key(&self, b: &mut [u8], w: &WrappedKey) -> Result<(), MetaError> {
        let len = w.sealed.len();
        if self.key_check.is_none() || len == 0 || len > MAX_WRAPPED_KEY_BYTES {
            return Err(MetaError::BadField {
                field: "wrapped key",
            });
        }
        let len16 = u16::try_from(len).map_err(|_| MetaError::BadField {
            field: "wrapped key",
        })?;
        b[WRAPPED_AT..WRAPPED_AT + 4].copy_from_slice(&w.kek.to_le_bytes());
        b[WRAPPED_AT + 4..WRAPPED_AT + 6].copy_from_slice(&len16.to_le_bytes());
        b[WRAPPED_AT + 6..WRAPPED_AT + 6 + len].copy_from_slice(&w.sealed);
        Ok(())
    }

    /// Decode a record read from disk. Never panics.
    pub fn decode(b: &[u8]) -> Result<ReplicaMeta, MetaError> {
        if b.len() != META_LEN {
            return Err(MetaError::BadLength { len: b.len() });
        }
        let magic = u64::from_le_bytes(arr8(&b[0..8]));
        if magic != META_MAGIC {
            return Err(MetaError::BadMagic { found: magic });
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if !(1..=META_VERSION_UID).contains(&version) {
            return Err(MetaError::BadVersion { found: version });
        }
        let found = u32::from_le_bytes([b[4092], b[4093], b[4094], b[4095]]);
        let computed = crc32c::crc32c(&b[..META_LEN - 4]);
        if computed != found {
            return Err(MetaError::Checksum { computed, found });
        }
        let state = match b[12] {
            1 => ReplicaDiskState::Ok,
            2 => ReplicaDiskState::Failed,
            _ => return Err(MetaError::BadField { field: "state" }),
        };
        let thin = match b[13] {
            0 => false,
            1 => true,
            _ => return Err(MetaError::BadField { field: "thin" }),
        };
        let vol_len = usize::from(u16::from_le_bytes([b[40], b[41]]));
        let rep_len = usize::from(u16::from_le_bytes([b[42], b[43]]));
        if vol_len == 0 || vol_len > MAX_ID_BYTES || rep_len == 0 || rep_len > MAX_ID_BYTES {
            return Err(MetaError::BadField { field: "id length" });
        }
        let cluster_len = usize::from(u16::from_le_bytes([b[14], b[15]]));
        if cluster_len > MAX_CLUSTER_ID_BYTES || (version == 1 && cluster_len != 0) {
            return Err(MetaError::BadField {
                field: "cluster length",
            });
        }
        let (flags, known) = match version {
            META_VERSION_UID => (
                b[FLAGS_AT],
                FLAG_CHECKSUMS | FLAG_KEY_CHECK | FLAG_WRAPPED_KEY | FLAG_VOLUME_UID,
            ),
            META_VERSION_WRAPPED => (
                b[FLAGS_AT],
                FLAG_CHECKSUMS | FLAG_KEY_CHECK | FLAG_WRAPPED_KEY,
            ),
            META_VERSION_FLAGS => (b[FLAGS_AT], FLAG_CHECKSUMS | FLAG_KEY_CHECK),
            META_VERSION_KEYED => (FLAG_KEY_CHECK, FLAG_KEY_CHECK),
            _ => (0, 0),
        };
        let wrapped_alone = flags & FLAG_WRAPPED_KEY != 0 && flags & FLAG_KEY_CHECK == 0;
        if flags & !known != 0 || wrapped_alone {
            return Err(MetaError::BadField { field: "flags" });
        }
        let wrapped_key = if flags & FLAG_WRAPPED_KEY != 0 {
            Some(wrapped_key_at(b)?)
        } else {
            None
        };
        let id = |from: usize, len: usize, field| {
            std::str::from_utf8(&b[from..from + len])
                .map(str::to_owned)
                .map_err(|_| MetaError::BadField { field })
        };
        Ok(ReplicaMeta {
            volume: id(IDS_AT, vol_len, "volume")?,
            replica: id(IDS_AT + vol_len, rep_len, "replica")?,
            size: u64::from_le_bytes(arr8(&b[16..24])),
            epoch: u64::from_le_bytes(arr8(&b[24..32])),
            generation: u64::from_le_bytes(arr8(&b[32..40])),
            state,
            thin,
            cluster: match cluster_len {
                0 => None,
                n => Some(id(IDS_AT + vol_len + rep_len, n, "cluster")?),
            },
            key_check: (flags & FLAG_KEY_CHECK != 0).then(|| {
                let mut check = [0u8; KEY_CHECK_BYTES];
                check.copy_from_slice(&b[KEY_CHECK_AT..KEY_CHECK_AT + KEY_CHECK_BYTES]);
                check
            }),
            checksums: flags & FLAG_CHECKSUMS != 0,
            wrapped_key,
            volume_uid: (flags & FLAG_VOLUME_UID != 0).then(|| {
                let mut uid = [0u8; VOLUME_UID_BYTES];
                uid.copy_from_slice(&b[UID_AT..UID_AT + VOLUME_UID_BYTES]);
                uid
            }),
        })
    }
}

/// The wrapped key of a version 5 record (`b` is META_LEN long).
fn wrapped_key_at(b: &[u8]) -> Result<WrappedKey, MetaError> {
    let kek = u32::from_le_bytes([
        b[WRAPPED_AT],
        b[WRAPPED_AT + 1],
        b[WRAPPED_AT + 2],
        b[WRAPPED_AT + 3],
    ]);
    let len = usize::from(u16::from_le_bytes([b[WRAPPED_AT + 4], b[WRAPPED_AT + 5]]));
    if len == 0 || len > MAX_WRAPPED_KEY_BYTES {
        return Err(MetaError::BadField {
            field: "wrapped key length",
        });
    }
    let from = WRAPPED_AT + 6;
    Ok(WrappedKey {
        kek,
        sealed: b[from..from + len].to_vec(),
    })
}

fn arr8(s: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ReplicaMeta {
        ReplicaMeta {
            volume: "demo".into(),
            replica: "demo-r1".into(),
            size: 1 << 30,
            epoch: 4,
            generation: 11,
            state: ReplicaDiskState::Ok,
            thin: true,
            cluster: Some("0123456789abcdef0123456789abcdef".into()),
            key_check: None,
            checksums: false,
            wrapped_key: None,
            volume_uid: None,
        }
    }

    /// A volume's uid makes a version 6 record beside every other field, and comes back byte
    /// for byte; a record without one keeps the older version (older agents read it).
    #[test]
    fn volume_uids_roundtrip_in_version_6_only() {
        let uid = Some([0xc3; VOLUME_UID_BYTES]);
        for (key_check, checksums, wrapped_key) in [
            (None, false, None),
            (None, true, None),
            (
                Some([0x5a; KEY_CHECK_BYTES]),
                true,
                Some(wrapped(7, MAX_WRAPPED_KEY_BYTES)),
            ),
        ] {
            let m = ReplicaMeta {
                volume: "v".repeat(MAX_ID_BYTES),
                replica: "r".repeat(MAX_ID_BYTES),
                cluster: Some("c".repeat(MAX_CLUSTER_ID_BYTES)),
                key_check,
                checksums,
                wrapped_key,
                volume_uid: uid,
                ..sample()
            };
            let b = m.encode().expect("encode");
            assert_eq!(b[8..12], META_VERSION_UID.to_le_bytes());
            assert_eq!(ReplicaMeta::decode(&b), Ok(m.clone()));
            let without = ReplicaMeta {
                volume_uid: None,
                ..m
            };
            let b = without.encode().expect("encode");
            assert!(u32::from_le_bytes([b[8], b[9], b[10], b[11]]) < META_VERSION_UID);
            assert_eq!(ReplicaMeta::decode(&b), Ok(without));
        }
        // Version 5 cannot claim a uid: the flag is unknown there.
        let mut b = ReplicaMeta {
            volume_uid: uid,
            ..sample()
        }
        .encode()
        .expect("encode");
        b[8..12].copy_from_slice(&META_VERSION_WRAPPED.to_le_bytes());
        assert_eq!(
            ReplicaMeta::decode(&resealed(b)),
            Err(MetaError::BadField { field: "flags" })
        );
    }

    fn wrapped(kek: u32, len: usize) -> WrappedKey {
        WrappedKey {
            kek,
            sealed: (0..len).map(|i| i.to_le_bytes()[0] ^ 0x5c).collect(),
        }
    }

    /// Recomputes a hand-edited record's checksum.
    fn resealed(mut b: Vec<u8>) -> Vec<u8> {
        let crc = crc32c::crc32c(&b[..META_LEN - 4]);
        b[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// An encrypted volume's replica that holds its wrapped data key has a version 5 record,
    /// with or without checksums, and gets it back byte for byte, KEK id included.
    #[test]
    fn wrapped_keys_roundtrip_in_version_5_only() {
        for checksums in [false, true] {
            for len in [1, 92, MAX_WRAPPED_KEY_BYTES] {
                let m = ReplicaMeta {
                    key_check: Some([0x5a; KEY_CHECK_BYTES]),
                    checksums,
                    wrapped_key: Some(wrapped(u32::MAX - 3, len)),
                    ..sample()
                };
                let b = m.encode().expect("encode");
                assert_eq!(b[8..12], META_VERSION_WRAPPED.to_le_bytes());
                assert_eq!(ReplicaMeta::decode(&b), Ok(m.clone()));
                // The longest ids and cluster still fit beside it.
                let long = ReplicaMeta {
                    volume: "v".repeat(MAX_ID_BYTES),
                    replica: "r".repeat(MAX_ID_BYTES),
                    cluster: Some("c".repeat(MAX_CLUSTER_ID_BYTES)),
                    ..m
                };
                let b = long.encode().expect("encode");
                assert_eq!(ReplicaMeta::decode(&b), Ok(long));
            }
        }
        // Without it, an encrypted replica's record stays version 3 or 4, as agents that do
        // not know version 5 read it.
        let keyed = ReplicaMeta {
            key_check: Some([0x5a; KEY_CHECK_BYTES]),
            ..sample()
        };
        assert_eq!(keyed.encode().expect("encode")[8..12], 3u32.to_le_bytes());
    }

    /// A wrapped key with no key check, an empty one or one too long is refused on encode.
    #[test]
    fn wrapped_keys_that_cannot_be_right_are_refused_on_encode() {
        let keyed = ReplicaMeta {
            key_check: Some([0x5a; KEY_CHECK_BYTES]),
            ..sample()
        };
        for (key_check, len) in [
            (None, 92),
            (keyed.key_check, 0),
            (keyed.key_check, MAX_WRAPPED_KEY_BYTES + 1),
        ] {
            let m = ReplicaMeta {
                key_check,
                wrapped_key: Some(wrapped(1, len)),
                ..keyed.clone()
            };
            assert_eq!(
                m.encode(),
                Err(MetaError::BadField {
                    field: "wrapped key"
                })
            );
        }
    }

    /// Garbage behind a good checksum in a version 5 record is an error, never a panic or a
    /// key: a length of 0 or past the room, a wrapped key without a key check, an unknown
    /// flag; and a version 4 record cannot claim a wrapped key.
    #[test]
    fn garbage_in_a_version_5_record_is_refused() {
        let m = ReplicaMeta {
            key_check: Some([0x5a; KEY_CHECK_BYTES]),
            wrapped_key: Some(wrapped(2, 92)),
            ..sample()
        };
        let good = m.encode().expect("encode");
        let bad_len = |len: u16| {
            let mut b = good.clone();
            b[WRAPPED_AT + 4..WRAPPED_AT + 6].copy_from_slice(&len.to_le_bytes());
            resealed(b)
        };
        let past = u16::try_from(MAX_WRAPPED_KEY_BYTES + 1).expect("fits");
        for len in [0, past, u16::MAX] {
            assert_eq!(
                ReplicaMeta::decode(&bad_len(len)),
                Err(MetaError::BadField {
                    field: "wrapped key length"
                })
            );
        }
        let with_flags = |version: u32, flags: u8| {
            let mut b = good.clone();
            b[8..12].copy_from_slice(&version.to_le_bytes());
            b[FLAGS_AT] = flags;
            resealed(b)
        };
        let flags = Err(MetaError::BadField { field: "flags" });
        assert_eq!(ReplicaMeta::decode(&with_flags(5, FLAG_WRAPPED_KEY)), flags);
        assert_eq!(
            ReplicaMeta::decode(&with_flags(5, 0x80 | FLAG_KEY_CHECK)),
            flags
        );
        let claimed = FLAG_WRAPPED_KEY | FLAG_KEY_CHECK;
        assert_eq!(ReplicaMeta::decode(&with_flags(4, claimed)), flags);
        // A version 5 record without the flag has no wrapped key, whatever its room holds.
        let none = ReplicaMeta::decode(&with_flags(5, FLAG_KEY_CHECK)).expect("decodes");
        assert_eq!(none.wrapped_key, None);
        assert_eq!(none.key_check, m.key_check);
        // Every single bit flipped anywhere is caught.
        for bit in 0..META_LEN * 8 {
            let mut b = good.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(ReplicaMeta::decode(&b).is_err(), "bit {bit}");
        }
        // Random garbage with a good checksum and version 5: never a panic.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..2000 {
            let mut b = good.clone();
            for _ in 0..8 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = usize::try_from(seed % 4092).expect("small");
                b[at] = seed.to_le_bytes()[4];
            }
            b[8..12].copy_from_slice(&5u32.to_le_bytes());
            let _ = ReplicaMeta::decode(&resealed(b));
        }
    }

    /// Records of every older version, written as those versions' encoders wrote them, decode
    /// with no wrapped key.
    #[test]
    fn older_versions_decode_with_no_wrapped_key() {
        let keyed = ReplicaMeta {
            key_check: Some([0x11; KEY_CHECK_BYTES]),
            ..sample()
        };
        let summed = ReplicaMeta {
            checksums: true,
            ..keyed.clone()
        };
        for (m, version) in [(sample(), 2u32), (keyed, 3), (summed, 4)] {
            let b = m.encode().expect("encode");
            assert_eq!(b[8..12], version.to_le_bytes());
            let got = ReplicaMeta::decode(&b).expect("decode");
            assert_eq!(got.wrapped_key, None);
            assert_eq!(got, m);
        }
    }

    /// An encrypted volume's replica records its key check in a version 3 record; a plain
    /// one stays version 2.
    #[test]
    fn key_checks_roundtrip_in_version_3_only() {
        let plain = sample().encode().expect("encode");
        assert_eq!(plain[8..12], META_VERSION.to_le_bytes());
        let keyed = ReplicaMeta {
            key_check: Some([0x5a; KEY_CHECK_BYTES]),
            ..sample()
        };
        let b = keyed.encode().expect("encode");
        assert_eq!(b[8..12], META_VERSION_KEYED.to_le_bytes());
        assert_eq!(ReplicaMeta::decode(&b), Ok(keyed));
        let mut flipped = b.clone();
        flipped[KEY_CHECK_AT + 3] ^= 1;
        assert!(ReplicaMeta::decode(&flipped).is_err(), "checksum covers it");
        let mut future = b;
        let next = META_VERSION_UID + 1;
        future[8..12].copy_from_slice(&next.to_le_bytes());
        let crc = crc32c::crc32c(&future[..META_LEN - 4]);
        future[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            ReplicaMeta::decode(&future),
            Err(MetaError::BadVersion { found: next })
        );
    }

    /// A replica with block checksums has a version 4 record with flags, keyed or not; an
    /// unknown flag is refused.
    #[test]
    fn checksums_roundtrip_in_version_4_only() {
        for key_check in [None, Some([0x33; KEY_CHECK_BYTES])] {
            let m = ReplicaMeta {
                checksums: true,
                key_check,
                ..sample()
            };
            let b = m.encode().expect("encode");
            assert_eq!(b[8..12], META_VERSION_FLAGS.to_le_bytes());
            assert_eq!(ReplicaMeta::decode(&b), Ok(m));
            let mut unknown = b;
            unknown[FLAGS_AT] |= 0x80;
            let crc = crc32c::crc32c(&unknown[..META_LEN - 4]);
            unknown[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(
                ReplicaMeta::decode(&unknown),
                Err(MetaError::BadField { field: "flags" })
            );
        }
    }

    #[test]
    fn roundtrip() {
        let m = sample();
        assert_eq!(
            ReplicaMeta::decode(&m.encode().expect("encode")),
            Ok(m.clone())
        );
        let none = ReplicaMeta { cluster: None, ..m };
        assert_eq!(
            ReplicaMeta::decode(&none.encode().expect("encode")),
            Ok(none)
        );
    }

    /// A record written before cluster ids (version 1) still loads, with no cluster.
    #[test]
    fn version_1_records_load() {
        let m = ReplicaMeta {
            cluster: None,
            ..sample()
        };
        let mut b = m.encode().expect("encode");
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&b[..META_LEN - 4]);
        b[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(ReplicaMeta::decode(&b), Ok(m));
        // ...but a version 1 record cannot claim a cluster.
        b[14] = 4;
        let crc = crc32c::crc32c(&b[..META_LEN - 4]);
        b[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(ReplicaMeta::decode(&b).is_err());
    }

    #[test]
    fn corruption_anywhere_is_detected() {
        let bytes = sample().encode().expect("encode");
        for at in [0, 9, 12, 20, 30, 45, 2000, 4095] {
            let mut b = bytes.clone();
            b[at] ^= 0x40;
            assert!(ReplicaMeta::decode(&b).is_err(), "flip at {at} accepted");
        }
        assert_eq!(
            ReplicaMeta::decode(&bytes[..100]),
            Err(MetaError::BadLength { len: 100 })
        );
    }

    #[test]
    fn bad_ids_refused_on_encode() {
        let mut m = sample();
        m.volume = String::new();
        assert!(m.encode().is_err());
        m.volume = "x".repeat(MAX_ID_BYTES + 1);
        assert!(m.encode().is_err());
    }
}
