//! A backup's manifest: what the volume was, and which block holds each part of it. It is
//! plain JSON so that an administrator can read it, and restore by hand, with `jq`, `zstd`
//! and `dd` alone (docs/backup.md). It is written last, after every block it names is stored,
//! so a manifest on a target means a complete backup.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::constants::{MAX_BLOCK_BYTES, MIN_BLOCK_BYTES};
use crate::error::BackupError;
use crate::names;

/// The manifest format this code writes, and the only one it reads.
pub const FORMAT: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    pub backup: String,
    pub volume: String,
    /// The cluster the volume was backed up from (None outside a cluster, as in tests).
    #[serde(default)]
    pub cluster: Option<String>,
    /// The snapshot it was read from.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// When the snapshot was taken, in milliseconds since the Unix epoch: the recovery point.
    pub taken_ms: u64,
    pub size_bytes: u64,
    pub block_bytes: u64,
    /// "sha256": the hash that names blocks, of their uncompressed content.
    pub hash: String,
    /// "zstd": how each block object is compressed (one frame).
    pub compression: String,
    /// Block index to the hash of its content. A missing index is all zeros, stored nowhere.
    pub blocks: BTreeMap<u64, String>,
    /// An encrypted volume's data key, wrapped as the volume record keeps it. The blocks
    /// hold ciphertext: a restore needs this and the KEK that wrapped it.
    #[serde(default)]
    pub encryption: Option<BackupKey>,
    /// The backup of the same volume that this one was made incrementally against.
    #[serde(default)]
    pub previous: Option<String>,
    pub stats: BackupStats,
}

pub use hawser_api::backup::{BackupKey, BackupStats};

impl Manifest {
    /// How many blocks the volume is cut into (the last may be short).
    pub fn block_count(&self) -> u64 {
        self.size_bytes.div_ceil(self.block_bytes.max(1))
    }

    /// The byte range of block `index`.
    pub fn block_range(&self, index: u64) -> (u64, u64) {
        let start = index.saturating_mul(self.block_bytes);
        (
            start,
            self.block_bytes.min(self.size_bytes.saturating_sub(start)),
        )
    }

    pub fn encode(&self) -> Result<Vec<u8>, BackupError> {
        self.validate()?;
        serde_json::to_vec_pretty(self).map_err(|e| BackupError::BadManifest {
            backup: self.backup.clone(),
            why: e.to_string(),
        })
    }

    /// Parses and checks a manifest read from a target; `backup` is the name it was read
    /// under, which it must carry.
    pub fn decode(backup: &str, bytes: &[u8]) -> Result<Manifest, BackupError> {
        let bad = |why: String| BackupError::BadManifest {
            backup: backup.to_owned(),
            why,
        };
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        if m.backup != backup {
            return Err(bad(format!("it names backup {:?}", m.backup)));
        }
        m.validate()?;
        Ok(m)
    }

    /// Everything a restore relies on: a known format, a sane block size, and every block
    /// index and hash in range.
    pub fn validate(&self) -> Result<(), BackupError> {
        let bad = |why: String| BackupError::BadManifest {
            backup: self.backup.clone(),
            why,
        };
        if self.format != FORMAT {
            return Err(bad(format!(
                "format {} (this Hawser reads {FORMAT})",
                self.format
            )));
        }
        names::validate_backup(&self.backup).map_err(|e| bad(e.to_string()))?;
        if self.volume.is_empty() || self.volume.len() > 63 {
            return Err(bad(format!("volume name {:?}", self.volume)));
        }
        if self.hash != "sha256" || self.compression != "zstd" {
            return Err(bad(format!(
                "hash {:?}, compression {:?}",
                self.hash, self.compression
            )));
        }
        let bs = self.block_bytes;
        if !bs.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&bs) {
            return Err(bad(format!("block size {bs}")));
        }
        if self.size_bytes == 0 || !self.size_bytes.is_multiple_of(512) {
            return Err(bad(format!("volume size {}", self.size_bytes)));
        }
        let count = self.block_count();
        if let Some((&last, _)) = self.blocks.last_key_value() {
            if last >= count {
                return Err(bad(format!(
                    "block {last} is past the volume's {count} blocks"
                )));
            }
        }
        if let Some((i, h)) = self.blocks.iter().find(|(_, h)| !names::is_hash(h)) {
            return Err(bad(format!("block {i} has hash {h:?}")));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    pub(crate) fn sample() -> Manifest {
        Manifest {
            format: FORMAT,
            backup: "db-1".into(),
            volume: "db".into(),
            cluster: Some("c1".into()),
            snapshot: Some("s".into()),
            taken_ms: 1,
            size_bytes: 3 << 20,
            block_bytes: 1 << 20,
            hash: "sha256".into(),
            compression: "zstd".into(),
            blocks: BTreeMap::from([(0, "ab".repeat(32)), (2, "cd".repeat(32))]),
            encryption: None,
            previous: None,
            stats: BackupStats::default(),
        }
    }

    #[test]
    fn a_manifest_roundtrips() {
        let m = sample();
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode("db-1", &bytes).unwrap(), m);
        assert_eq!(m.block_count(), 3);
        assert_eq!(m.block_range(2), (2 << 20, 1 << 20));
    }

    #[test]
    fn bad_manifests_are_refused_with_the_reason() {
        type Change = Box<dyn Fn(&mut Manifest)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|m| m.format = 2), "format 2"),
            (Box::new(|m| m.block_bytes = 3 << 20), "block size"),
            (Box::new(|m| m.block_bytes = 4096), "block size"),
            (Box::new(|m| m.size_bytes = 0), "volume size"),
            (Box::new(|m| m.hash = "md5".into()), "hash"),
            (
                Box::new(|m| {
                    m.blocks.insert(3, "ab".repeat(32));
                }),
                "past the volume",
            ),
            (
                Box::new(|m| {
                    m.blocks.insert(1, "zz".into());
                }),
                "has hash",
            ),
        ];
        for (change, why) in cases {
            let mut m = sample();
            change(&mut m);
            let err = m.validate().unwrap_err().to_string();
            assert!(err.contains(why), "{err} should say {why}");
        }
        let bytes = sample().encode().unwrap();
        let err = Manifest::decode("db-2", &bytes).unwrap_err().to_string();
        assert!(err.contains("names backup"), "{err}");
    }

    #[test]
    fn garbage_never_panics() {
        let good = sample().encode().unwrap();
        for cut in 0..good.len() {
            let _ = Manifest::decode("db-1", &good[..cut]);
        }
        for bytes in [&b""[..], b"{}", b"null", b"\xff\xfe", b"[1,2]"] {
            assert!(Manifest::decode("db-1", bytes).is_err());
        }
    }
}
