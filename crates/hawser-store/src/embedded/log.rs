//! The change log beside the snapshot (`FILE.log`): one record per mutation.
//!
//! Why: the snapshot is the whole state, so rewriting it on every write made a write's cost
//! grow with the store. At 10,000 volumes that was 5.5 MiB and two fsyncs per write, and a
//! create took 73 ms instead of 17 ms at 1,000 (docs/performance.md). A mutation now
//! appends its changes and fdatasyncs. When the log grows larger than the snapshot, the
//! store writes a new snapshot and empties the log (`fold` in `mod.rs`). So what an open
//! reads stays bounded, and each write's cost stays flat.
//!
//! Record: `hawser-log <crc32c of body, 8 hex> <body length>\n<body>\n`. The body is JSON
//! `{"revision": R, "ops": [...]}`. Each op is a key with its new value, at version R (as
//! in the snapshot: `text` or `hex`), or a key with `"deleted": true`. A put under a lease
//! is logged as a delete, because leased keys are never on disk.
//!
//! Replay, at open:
//! - Records at or below the snapshot's revision are skipped. A fold that crashed after its
//!   rename and before it emptied the log leaves them behind, and they are in the snapshot.
//! - Every other record must carry the next revision. Otherwise the two files do not
//!   belong together (the snapshot was deleted or replaced), and the open fails.
//! - A mutation is acknowledged only once its record is durable. So a record cut short at
//!   the end of the log is one nobody was told of (a crash in the middle of an append), and
//!   it is cut off.
//! - A bad record with a good one after it is corruption, and an error: acknowledged
//!   writes follow it.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::file::DiskEntry;
use crate::store::{Result, StoreError, Versioned};

const MAGIC: &str = "hawser-log";
/// A header longer than this is not one (the longest real one is about 40 bytes).
const MAX_HEADER: usize = 64;

/// One change of a logged mutation.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    Put { key: String, value: Vec<u8> },
    Delete { key: String },
}

/// A record: the changes of the mutation that took `revision`.
#[derive(Debug, PartialEq, Eq)]
pub struct Record {
    pub revision: u64,
    pub changes: Vec<Change>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskRecord {
    revision: u64,
    ops: Vec<DiskOp>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskOp {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    deleted: bool,
}

/// The record of the mutation that took `revision`, as appended.
pub fn encode(revision: u64, changes: &[Change]) -> Result<Vec<u8>> {
    let ops = changes
        .iter()
        .map(|c| match c {
            Change::Put { key, value } => {
                let e = DiskEntry::of(&Versioned {
                    value: value.clone(),
                    version: revision,
                });
                DiskOp {
                    key: key.clone(),
                    text: e.text,
                    hex: e.hex,
                    deleted: false,
                }
            }
            Change::Delete { key } => DiskOp {
                key: key.clone(),
                text: None,
                hex: None,
                deleted: true,
            },
        })
        .collect();
    let body =
        serde_json::to_vec(&DiskRecord { revision, ops }).map_err(|source| StoreError::Encode {
            key: "<log record>".into(),
            source,
        })?;
    let mut out = format!("{MAGIC} {:08x} {}\n", crc32c::crc32c(&body), body.len()).into_bytes();
    out.extend_from_slice(&body);
    out.push(b'\n');
    Ok(out)
}

/// What a log holds after a snapshot at `after`.
#[derive(Debug)]
pub struct Replay {
    /// The records past the snapshot, in order, each at the next revision.
    pub records: Vec<Record>,
    /// Where the good records end; bytes past it are a record cut short.
    pub good_len: u64,
}

/// Reads the log at `path` (absent: empty) for a snapshot at revision `after`.
pub fn read(path: &Path, after: u64) -> Result<Replay> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => {
            return Err(StoreError::Io {
                op: "read",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    replay(path, &bytes, after)
}

/// [`read`] of `bytes`; `path` names the log in errors.
pub fn replay(path: &Path, bytes: &[u8], after: u64) -> Result<Replay> {
    let corrupt = |reason: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut records = Vec::new();
    let mut at = 0usize;
    let mut revision = after;
    while at < bytes.len() {
        let Some((record, len)) = parse(&bytes[at..]) else {
            // Cut short by a crash, unless an intact record follows.
            if let Some(later) = find_record(&bytes[at + 1..]) {
                return Err(corrupt(format!(
                    "a bad record at offset {at} with a good one at offset {}",
                    at + 1 + later
                )));
            }
            break;
        };
        if record.revision <= after {
            if !records.is_empty() {
                return Err(corrupt(format!(
                    "record at offset {at} has revision {} after revision {revision}",
                    record.revision
                )));
            }
        } else if Some(record.revision) != revision.checked_add(1) {
            return Err(corrupt(format!(
                "record at offset {at} has revision {}, expected {}: the snapshot (at \
                 revision {after}) and the log do not belong together",
                record.revision,
                revision.saturating_add(1)
            )));
        } else {
            revision = record.revision;
            records.push(record);
        }
        at += len;
    }
    Ok(Replay {
        records,
        good_len: at as u64,
    })
}

/// The record at the start of `bytes` and its length, or `None` if there is no intact one.
fn parse(bytes: &[u8]) -> Option<(Record, usize)> {
    let nl = bytes.iter().take(MAX_HEADER).position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..nl]).ok()?;
    let mut fields = header.split(' ');
    let (Some(MAGIC), Some(crc), Some(len), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return None;
    };
    let crc = u32::from_str_radix(crc, 16).ok()?;
    let len: usize = len.parse().ok()?;
    let body = bytes.get(nl + 1..nl.checked_add(1)?.checked_add(len)?)?;
    if crc32c::crc32c(body) != crc || bytes.get(nl + 1 + len) != Some(&b'\n') {
        return None;
    }
    let disk: DiskRecord = serde_json::from_slice(body).ok()?;
    let changes = disk
        .ops
        .into_iter()
        .map(|op| match op {
            DiskOp {
                key,
                text: None,
                hex: None,
                deleted: true,
            } => Some(Change::Delete { key }),
            DiskOp {
                key,
                text,
                hex,
                deleted: false,
            } => {
                let value = DiskEntry {
                    version: disk.revision,
                    text,
                    hex,
                }
                .value()
                .ok()?;
                Some(Change::Put { key, value })
            }
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    let record = Record {
        revision: disk.revision,
        changes,
    };
    Some((record, nl + 1 + len + 1))
}

/// The offset of the first intact record in `bytes`, if any.
fn find_record(bytes: &[u8]) -> Option<usize> {
    let magic = MAGIC.as_bytes();
    (0..bytes.len())
        .filter(|&i| bytes[i..].starts_with(magic))
        .find(|&i| parse(&bytes[i..]).is_some())
}

/// The log, open for appending.
pub struct Log {
    path: PathBuf,
    file: Arc<File>,
    /// Its length: where the next record goes.
    len: u64,
    /// A failed append could not be cut back: the log may end in part of a record, so
    /// nothing more is appended until it has been emptied.
    broken: bool,
}

impl Log {
    /// Opens (creating) the log at `path` and cuts off what follows its good records.
    pub fn open(path: PathBuf, good_len: u64) -> Result<Log> {
        let io = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| StoreError::Io { op, path, source }
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io("open", &path))?;
        let len = file.metadata().map_err(io("stat", &path))?.len();
        if len > good_len {
            tracing::warn!(path = %path.display(), offset = good_len, bytes = len - good_len,
                "cutting off a log record a crash left unfinished (never acknowledged)");
            file.set_len(good_len).map_err(io("truncate", &path))?;
            file.sync_all().map_err(io("fsync", &path))?;
        }
        Ok(Log {
            path,
            file: Arc::new(file),
            len: good_len,
            broken: false,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether records may be appended: not after an append that could not be cut back.
    pub fn usable(&self) -> bool {
        !self.broken
    }

    /// Appends `record` durably. On failure the log is cut back to where it was; if even
    /// that fails it is [`Log::usable`] no more until [`Log::clear`] succeeds.
    pub async fn append(&mut self, record: Vec<u8>) -> Result<()> {
        let (file, path, len) = (self.file.clone(), self.path.clone(), self.len);
        let written = tokio::task::spawn_blocking(move || {
            let io = |op: &'static str| {
                let path = path.clone();
                move |source| StoreError::Io { op, path, source }
            };
            let result = (|| {
                use std::os::unix::fs::FileExt;
                file.write_all_at(&record, len).map_err(io("append to"))?;
                file.sync_data().map_err(io("fsync"))
            })();
            match result {
                Ok(()) => Ok(len + record.len() as u64),
                Err(e) => {
                    let cut = file.set_len(len).and_then(|()| file.sync_data());
                    Err((e, cut.is_ok()))
                }
            }
        })
        .await
        .map_err(|e| (self.join_error(e), false))
        .and_then(|r| r);
        match written {
            Ok(new_len) => {
                self.len = new_len;
                Ok(())
            }
            Err((e, cut)) => {
                self.broken |= !cut;
                Err(e)
            }
        }
    }

    /// Empties the log (after a snapshot took in all of it).
    pub async fn clear(&mut self) -> Result<()> {
        let (file, path) = (self.file.clone(), self.path.clone());
        tokio::task::spawn_blocking(move || {
            file.set_len(0)
                .and_then(|()| file.sync_all())
                .map_err(|source| StoreError::Io {
                    op: "empty",
                    path,
                    source,
                })
        })
        .await
        .map_err(|e| self.join_error(e))??;
        self.len = 0;
        self.broken = false;
        Ok(())
    }

    fn join_error(&self, e: tokio::task::JoinError) -> StoreError {
        StoreError::Io {
            op: "join writer task for",
            path: self.path.clone(),
            source: std::io::Error::other(e.to_string()),
        }
    }
}
