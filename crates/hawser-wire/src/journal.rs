//! The volume journal: what an engine persists on every replica it writes to, so that the next
//! engine (after a crash of this one, or of every process) knows where replicas may differ.
//!
//! - `active`: the activity log. Extents (4 MiB) that may have writes in flight or not yet
//!   flushed on every replica. An engine records an extent here, on every replica it writes
//!   to, before it sends the first write into it, and drops it only after a flush covered every
//!   write into it. After a crash, only these extents can differ between in-sync replicas.
//! - `out`: the dirty map of every replica that was not receiving writes (or was being
//!   resynced): the chunks it lacks, or `None` when unknown (it is copied in full); and
//!   whether it may lack *acknowledged* writes there (`lost`: its node lost power before they
//!   were durable on it, and no resync has copied them back since). Without `lost` it lacks
//!   only writes that were never acknowledged while it was missing them (it held them up),
//!   so crash recovery may still take those chunks from it.
//!
//! Encoding (little endian): magic u64 | version u32 | flags u32 (0) | epoch u64 | seq u64 |
//! size u64 | extent_bytes u64 | chunk_bytes u64 | active runs | out count u32 | per out:
//! id_len u16, id, kind u8 (0: unknown; 1: runs, lost; 2: runs, not lost), runs | crc32c u32
//! of everything before it. Kind 2 came later: a journal without it reads the same in older
//! agents, and kind 1 is the conservative meaning for journals written before.
//! Runs: count u32, then (first u64, end u64) pairs, sorted, disjoint, non-empty, in bounds.

use crate::constants::MAX_ID_BYTES;

pub const JOURNAL_MAGIC: u64 = u64::from_le_bytes(*b"HWSRJRNL");
pub const JOURNAL_VERSION: u32 = 1;
/// Largest encoded journal: it travels in one frame and fills one of two slots on disk.
pub const MAX_JOURNAL_BYTES: usize = 1 << 20;
/// Activity log granularity.
pub const ACTIVITY_EXTENT_BYTES: u64 = 4 << 20;

/// Half-open runs `[first, end)` of extent or chunk indices.
pub type Runs = Vec<(u64, u64)>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutReplica {
    pub replica: String,
    /// Chunks it lacks; `None`: unknown, copy everything.
    pub dirty: Option<Runs>,
    /// It may lack acknowledged writes in those chunks (always so when `dirty` is unknown).
    pub lost: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Journal {
    /// Epoch of the engine that wrote it, and its sequence number within that epoch: the
    /// newest journal is the greatest `(epoch, seq)`.
    pub epoch: u64,
    pub seq: u64,
    pub size: u64,
    pub extent_bytes: u64,
    pub chunk_bytes: u64,
    pub active: Runs,
    pub out: Vec<OutReplica>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JournalError {
    #[error("journal record truncated at byte {at}")]
    Truncated { at: usize },
    #[error("journal record is {len} bytes, more than {MAX_JOURNAL_BYTES}")]
    TooLarge { len: usize },
    #[error("not a Hawser journal (magic {found:#018x})")]
    BadMagic { found: u64 },
    #[error("unsupported journal version {found}")]
    BadVersion { found: u32 },
    #[error("journal checksum mismatch (computed {computed:#010x}, stored {found:#010x})")]
    Checksum { computed: u32, found: u32 },
    #[error("journal field {field} is invalid")]
    BadField { field: &'static str },
}

impl Journal {
    /// Extents of a volume of `size` bytes, and its chunks.
    fn bounds(&self) -> (u64, u64) {
        (
            self.size.div_ceil(self.extent_bytes.max(1)),
            self.size.div_ceil(self.chunk_bytes.max(1)),
        )
    }

    pub fn encode(&self) -> Result<Vec<u8>, JournalError> {
        self.validate()?;
        let mut b = Vec::with_capacity(128);
        put64(&mut b, JOURNAL_MAGIC);
        put32(&mut b, JOURNAL_VERSION);
        put32(&mut b, 0);
        for v in [
            self.epoch,
            self.seq,
            self.size,
            self.extent_bytes,
            self.chunk_bytes,
        ] {
            put64(&mut b, v);
        }
        put_runs(&mut b, &self.active)?;
        put32(&mut b, count(self.out.len())?);
        for o in &self.out {
            let id = o.replica.as_bytes();
            // validate() bounds ids to MAX_ID_BYTES.
            let id_len = u16::try_from(id.len()).map_err(|_| JournalError::BadField {
                field: "replica id",
            })?;
            b.extend_from_slice(&id_len.to_le_bytes());
            b.extend_from_slice(id);
            match &o.dirty {
                Some(runs) => {
                    b.push(if o.lost { 1 } else { 2 });
                    put_runs(&mut b, runs)?;
                }
                None => b.push(0),
            }
        }
        let crc = crc32c::crc32c(&b);
        put32(&mut b, crc);
        if b.len() > MAX_JOURNAL_BYTES {
            return Err(JournalError::TooLarge { len: b.len() });
        }
        Ok(b)
    }

    /// Decode untrusted bytes; never panics.
    pub fn decode(b: &[u8]) -> Result<Journal, JournalError> {
        if b.len() > MAX_JOURNAL_BYTES {
            return Err(JournalError::TooLarge { len: b.len() });
        }
        if b.len() < 4 {
            return Err(JournalError::Truncated { at: b.len() });
        }
        let (body, tail) = b.split_at(b.len() - 4);
        let found = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        let mut r = Reader { b: body, at: 0 };
        let magic = r.u64()?;
        if magic != JOURNAL_MAGIC {
            return Err(JournalError::BadMagic { found: magic });
        }
        let version = r.u32()?;
        if version != JOURNAL_VERSION {
            return Err(JournalError::BadVersion { found: version });
        }
        let computed = crc32c::crc32c(body);
        if computed != found {
            return Err(JournalError::Checksum { computed, found });
        }
        if r.u32()? != 0 {
            return Err(JournalError::BadField { field: "flags" });
        }
        let (epoch, seq, size) = (r.u64()?, r.u64()?, r.u64()?);
        let (extent_bytes, chunk_bytes) = (r.u64()?, r.u64()?);
        let active = r.runs()?;
        let n = r.u32()?;
        let mut out = Vec::new();
        for _ in 0..n {
            let len = usize::from(r.u16()?);
            let id = std::str::from_utf8(r.bytes(len)?).map_err(|_| JournalError::BadField {
                field: "replica id",
            })?;
            let (dirty, lost) = match r.u8()? {
                0 => (None, true),
                1 => (Some(r.runs()?), true),
                2 => (Some(r.runs()?), false),
                _ => {
                    return Err(JournalError::BadField {
                        field: "dirty kind",
                    })
                }
            };
            out.push(OutReplica {
                replica: id.to_owned(),
                dirty,
                lost,
            });
        }
        if r.at != body.len() {
            return Err(JournalError::BadField {
                field: "trailing bytes",
            });
        }
        let j = Journal {
            epoch,
            seq,
            size,
            extent_bytes,
            chunk_bytes,
            active,
            out,
        };
        j.validate()?;
        Ok(j)
    }

    fn validate(&self) -> Result<(), JournalError> {
        let pow2 = |v: u64| v.is_power_of_two() && v >= 4096;
        if !pow2(self.extent_bytes) {
            return Err(JournalError::BadField {
                field: "extent_bytes",
            });
        }
        if !pow2(self.chunk_bytes) {
            return Err(JournalError::BadField {
                field: "chunk_bytes",
            });
        }
        let (extents, chunks) = self.bounds();
        if !runs_ok(&self.active, extents) {
            return Err(JournalError::BadField { field: "active" });
        }
        for o in &self.out {
            if o.replica.is_empty() || o.replica.len() > MAX_ID_BYTES {
                return Err(JournalError::BadField {
                    field: "replica id",
                });
            }
            if let Some(runs) = &o.dirty {
                if !runs_ok(runs, chunks) {
                    return Err(JournalError::BadField { field: "dirty" });
                }
            } else if !o.lost {
                return Err(JournalError::BadField { field: "lost" });
            }
        }
        Ok(())
    }
}

/// Sorted, disjoint, non-empty runs within `[0, limit)`.
fn runs_ok(runs: &Runs, limit: u64) -> bool {
    let mut prev_end = 0u64;
    runs.iter().enumerate().all(|(i, &(first, end))| {
        let ok = first < end && end <= limit && (i == 0 || first > prev_end);
        prev_end = end;
        ok
    })
}

fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// A count as stored: one that does not fit in u32 could not fit in a journal either.
fn count(n: usize) -> Result<u32, JournalError> {
    u32::try_from(n).map_err(|_| JournalError::TooLarge { len: usize::MAX })
}

fn put_runs(b: &mut Vec<u8>, runs: &Runs) -> Result<(), JournalError> {
    put32(b, count(runs.len())?);
    for &(first, end) in runs {
        put64(b, first);
        put64(b, end);
    }
    Ok(())
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], JournalError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(JournalError::Truncated { at: self.at })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, JournalError> {
        Ok(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, JournalError> {
        let s = self.bytes(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, JournalError> {
        let s = self.bytes(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, JournalError> {
        let s = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn runs(&mut self) -> Result<Runs, JournalError> {
        let n = self.u32()? as usize;
        // Each run is 16 bytes: a count larger than what is left is a lie, not an allocation.
        if n > (self.b.len() - self.at) / 16 {
            return Err(JournalError::Truncated { at: self.at });
        }
        let mut runs = Vec::with_capacity(n);
        for _ in 0..n {
            runs.push((self.u64()?, self.u64()?));
        }
        Ok(runs)
    }
}

/// A stored journal as a replica reports it (`Op::GetJournal`'s reply payload): a byte saying
/// whether the replica's node rebooted since it stored the journal (1) or not (0), then the
/// encoded journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredReport {
    pub journal: Journal,
    /// The node may have lost writes it had acknowledged but not flushed when it stored this.
    pub rebooted: bool,
}

impl StoredReport {
    pub fn encode(&self) -> Result<Vec<u8>, JournalError> {
        let j = self.journal.encode()?;
        let mut b = Vec::with_capacity(j.len() + 1);
        b.push(u8::from(self.rebooted));
        b.extend_from_slice(&j);
        Ok(b)
    }

    /// Decode untrusted bytes; never panics.
    pub fn decode(b: &[u8]) -> Result<StoredReport, JournalError> {
        let (&flag, rest) = b.split_first().ok_or(JournalError::Truncated { at: 0 })?;
        let rebooted = match flag {
            0 => false,
            1 => true,
            _ => return Err(JournalError::BadField { field: "rebooted" }),
        };
        Ok(StoredReport {
            journal: Journal::decode(rest)?,
            rebooted,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> Journal {
        Journal {
            epoch: 7,
            seq: 42,
            size: 1 << 30,
            extent_bytes: ACTIVITY_EXTENT_BYTES,
            chunk_bytes: 64 << 10,
            active: vec![(0, 2), (10, 11), (255, 256)],
            out: vec![
                OutReplica {
                    replica: "r-1".into(),
                    dirty: Some(vec![(3, 9), (16383, 16384)]),
                    lost: false,
                },
                OutReplica {
                    replica: "r-2".into(),
                    dirty: None,
                    lost: true,
                },
                OutReplica {
                    replica: "r-3".into(),
                    dirty: Some(vec![(0, 1)]),
                    lost: true,
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let j = sample();
        let b = j.encode().unwrap();
        assert_eq!(Journal::decode(&b).unwrap(), j);
    }

    #[test]
    fn every_truncation_and_bit_flip_is_an_error() {
        let b = sample().encode().unwrap();
        for len in 0..b.len() {
            assert!(Journal::decode(&b[..len]).is_err(), "truncated to {len}");
        }
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut c = b.clone();
                c[i] ^= 1 << bit;
                assert!(Journal::decode(&c).is_err(), "flip byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn refuses_bad_runs() {
        let mut j = sample();
        j.active = vec![(2, 2)];
        assert!(j.encode().is_err(), "empty run");
        j.active = vec![(0, 3), (2, 5)];
        assert!(j.encode().is_err(), "overlap");
        j.active = vec![(0, 257)];
        assert!(j.encode().is_err(), "beyond the volume");
        j.active = vec![(0, 3), (3, 5)];
        assert!(j.encode().is_err(), "adjacent runs are one run");
    }

    #[test]
    fn huge_counts_do_not_allocate() {
        let mut j = sample();
        j.active = vec![];
        j.out = vec![];
        let mut b = j.encode().unwrap();
        // active run count sits right after the fixed fields (8+4+4+5*8 = 56).
        b[56..60].copy_from_slice(&u32::MAX.to_le_bytes());
        let body = b.len() - 4;
        let crc = crc32c::crc32c(&b[..body]);
        b[body..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Journal::decode(&b),
            Err(JournalError::Truncated { .. })
        ));
    }

    #[test]
    fn stored_reports_round_trip_and_reject_a_bad_flag() {
        let journal = Journal {
            epoch: 2,
            seq: 3,
            size: 64 << 20,
            extent_bytes: ACTIVITY_EXTENT_BYTES,
            chunk_bytes: 64 << 10,
            active: vec![(1, 2)],
            out: vec![],
        };
        for rebooted in [false, true] {
            let r = StoredReport {
                journal: journal.clone(),
                rebooted,
            };
            assert_eq!(StoredReport::decode(&r.encode().unwrap()), Ok(r));
        }
        let mut b = StoredReport {
            journal,
            rebooted: false,
        }
        .encode()
        .unwrap();
        b[0] = 2;
        assert_eq!(
            StoredReport::decode(&b),
            Err(JournalError::BadField { field: "rebooted" })
        );
        assert_eq!(
            StoredReport::decode(&[]),
            Err(JournalError::Truncated { at: 0 })
        );
        assert!(StoredReport::decode(&b[..b.len() - 1]).is_err());
    }
}
