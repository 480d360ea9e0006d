//! The snapshot file: the whole on-disk state in one file, replaced atomically.
//!
//! Crash safety: a snapshot is written to `FILE.tmp`, fsynced, renamed over `FILE`, and the
//! directory fsynced, so after a crash `FILE` is either the old or the new state, never a
//! mix.
//!
//! Format: one header line `hawser-store <format> <crc32c of body, 8 hex> <body length>\n`
//! followed by a JSON body. JSON parsing alone would catch truncation but not a flipped bit
//! inside a value, which would silently change cluster state; the checksum and length catch
//! both. Format 1 was the whole state; format 2 is the same body with a change log beside
//! it (`log.rs`) holding the changes made since. A binary that knows only format 1 refuses
//! format 2 rather than open the snapshot without the log's changes.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Entry;
use crate::store::{Result, StoreError, Versioned};

const MAGIC: &str = "hawser-store";
/// The format this version writes.
pub const FORMAT: u32 = 2;

/// A decoded snapshot.
pub struct Snapshot {
    pub format: u32,
    pub revision: u64,
    pub entries: BTreeMap<String, Entry>,
}

/// One entry on disk. Values that are UTF-8 (JSON, in practice) are stored as text so the
/// file stays readable by an operator; anything else is hex.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskEntry {
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskState {
    revision: u64,
    entries: BTreeMap<String, DiskEntry>,
}

/// `path` with `suffix` appended to its file name (`store.json` -> `store.json.tmp`).
pub fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = sibling(path, ".tmp");
    let io = |op: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| StoreError::Io {
            op,
            path: p,
            source,
        }
    };
    let mut f = File::create(&tmp).map_err(io("create", &tmp))?;
    f.write_all(bytes).map_err(io("write", &tmp))?;
    f.sync_all().map_err(io("fsync", &tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(io("rename over", path))?;
    // The rename is durable only once the directory entry is.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))?;
    Ok(())
}

/// The snapshot of `entries` at `revision`, leased keys left out (they live only as long as
/// the process).
pub fn encode(revision: u64, entries: &BTreeMap<String, Entry>) -> Result<Vec<u8>> {
    let entries = entries
        .iter()
        .filter(|(_, e)| e.lease.is_none())
        .map(|(k, e)| (k.clone(), DiskEntry::of(&e.value)))
        .collect();
    let state = DiskState { revision, entries };
    let body = serde_json::to_vec_pretty(&state).map_err(|source| StoreError::Encode {
        key: "<store>".into(),
        source,
    })?;
    let mut out = format!(
        "{MAGIC} {FORMAT} {:08x} {}\n",
        crc32c::crc32c(&body),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes and checks a snapshot; `path` names it in errors.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Snapshot> {
    let corrupt = |reason: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| corrupt("no header".into()))?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| corrupt("bad header".into()))?;
    let body = &bytes[nl + 1..];
    let fields: Vec<&str> = header.split(' ').collect();
    let [magic, format, crc, len] = fields[..] else {
        return Err(corrupt(format!("bad header {header:?}")));
    };
    if magic != MAGIC {
        return Err(corrupt(format!("not a hawser store (header {header:?})")));
    }
    let format = match format {
        "1" => 1,
        "2" => 2,
        _ => {
            return Err(corrupt(format!(
                "unsupported format {format:?}, expected 1 or {FORMAT}"
            )))
        }
    };
    let len: usize = len
        .parse()
        .map_err(|_| corrupt(format!("bad length {len:?}")))?;
    if body.len() != len {
        return Err(corrupt(format!(
            "body is {} bytes, header says {len} (truncated?)",
            body.len()
        )));
    }
    let crc = u32::from_str_radix(crc, 16).map_err(|_| corrupt(format!("bad checksum {crc:?}")))?;
    let actual = crc32c::crc32c(body);
    if actual != crc {
        return Err(corrupt(format!(
            "checksum {actual:08x} does not match header {crc:08x}"
        )));
    }
    let state: DiskState =
        serde_json::from_slice(body).map_err(|e| corrupt(format!("bad JSON body: {e}")))?;
    let mut entries = BTreeMap::new();
    for (key, e) in state.entries {
        let version = e.version;
        let value = e
            .value()
            .map_err(|reason| corrupt(format!("entry {key:?}: {reason}")))?;
        if version == 0 || version > state.revision {
            return Err(corrupt(format!(
                "entry {key:?} has version {version} but the store revision is {}",
                state.revision
            )));
        }
        let value = Versioned { value, version };
        entries.insert(key, Entry { value, lease: None });
    }
    // Every write takes the next revision; a file at the top of the range could take none
    // (found by the store_record fuzz target: the next write overflowed).
    if state.revision >= u64::MAX / 2 {
        return Err(corrupt(format!(
            "store revision {} is beyond any this store could reach",
            state.revision
        )));
    }
    Ok(Snapshot {
        format,
        revision: state.revision,
        entries,
    })
}

impl DiskEntry {
    /// `v` as stored: text if it is UTF-8, else hex.
    pub fn of(v: &Versioned) -> Self {
        match std::str::from_utf8(&v.value) {
            Ok(s) => DiskEntry {
                version: v.version,
                text: Some(s.into()),
                hex: None,
            },
            Err(_) => DiskEntry {
                version: v.version,
                text: None,
                hex: Some(to_hex(&v.value)),
            },
        }
    }

    /// The value's bytes, or why it has none.
    pub fn value(self) -> std::result::Result<Vec<u8>, BadEntry> {
        match (self.text, self.hex) {
            (Some(t), None) => Ok(t.into_bytes()),
            (None, Some(h)) => from_hex(&h).ok_or(BadEntry::Hex),
            _ => Err(BadEntry::TextOrHex),
        }
    }
}

/// Why a stored entry has no value: the file was written by something else, or damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadEntry {
    #[error("bad hex")]
    Hex,
    #[error("needs exactly one of text, hex")]
    TextOrHex,
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(text: Option<&str>, hex: Option<&str>) -> DiskEntry {
        DiskEntry {
            version: 1,
            text: text.map(str::to_owned),
            hex: hex.map(str::to_owned),
        }
    }

    #[test]
    fn an_entry_has_its_value_in_exactly_one_form() {
        let binary = Versioned {
            value: vec![0xff, 0x00, 0x7f],
            version: 3,
        };
        assert_eq!(DiskEntry::of(&binary).value().unwrap(), binary.value);
        assert_eq!(entry(Some("v"), None).value().unwrap(), b"v");
        assert_eq!(entry(None, Some("ff0")).value(), Err(BadEntry::Hex));
        assert_eq!(entry(None, Some("zz")).value(), Err(BadEntry::Hex));
        assert_eq!(entry(None, None).value(), Err(BadEntry::TextOrHex));
        assert_eq!(
            entry(Some("v"), Some("76")).value(),
            Err(BadEntry::TextOrHex)
        );
    }
}
