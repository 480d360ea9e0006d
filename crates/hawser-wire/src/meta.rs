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
/// Version 4 flag: the replica keeps block checksums (`<id>.sums`).
pub const FLAG_CHECKSUMS: u8 = 1 << 0;
/// Version 4 flag: the key check at `KEY_CHECK_AT` is set (an encrypted volume).
pub const FLAG_KEY_CHECK: u8 = 1 << 1;
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
// (version 4) flags at FLAGS_AT | crc32c of bytes 0..META_LEN-4 in the last 4 bytes.
const IDS_AT: usize = 44;
/// Past the longest ids (44 + 2 * MAX_ID_BYTES + MAX_CLUSTER_ID_BYTES).
const KEY_CHECK_AT: usize = 4064;
const _: () = assert!(IDS_AT + 2 * MAX_ID_BYTES + MAX_CLUSTER_ID_BYTES <= KEY_CHECK_AT);
const _: () = assert!(KEY_CHECK_AT + KEY_CHECK_BYTES <= META_LEN - 4);
/// Just before the key check.
const FLAGS_AT: usize = KEY_CHECK_AT - 1;
const _: () = assert!(IDS_AT + 2 * MAX_ID_BYTES + MAX_CLUSTER_ID_BYTES <= FLAGS_AT);

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
        let version = match (self.checksums, self.key_check) {
            (false, None) => META_VERSION,
            (false, Some(_)) => META_VERSION_KEYED,
            (true, check) => {
                b[FLAGS_AT] = FLAG_CHECKSUMS | if check.is_some() { FLAG_KEY_CHECK } else { 0 };
                META_VERSION_FLAGS
            }
        };
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
        if !(1..=META_VERSION_FLAGS).contains(&version) {
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
        let flags = match version {
            META_VERSION_FLAGS => b[FLAGS_AT],
            META_VERSION_KEYED => FLAG_KEY_CHECK,
            _ => 0,
        };
        if flags & !(FLAG_CHECKSUMS | FLAG_KEY_CHECK) != 0 {
            return Err(MetaError::BadField { field: "flags" });
        }
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
        })
    }
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
        future[8..12].copy_from_slice(&5u32.to_le_bytes());
        let crc = crc32c::crc32c(&future[..META_LEN - 4]);
        future[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            ReplicaMeta::decode(&future),
            Err(MetaError::BadVersion { found: 5 })
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
