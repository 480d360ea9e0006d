//! A replica's block checksums (`sums.rs`) on its data path: summed with every write, checked
//! on every read, summed again at open where the journal says a crash may have left a block
//! and its sum apart, and made durable before a journal that covers less is stored.

use std::fs::File;
use std::path::Path;

use hawser_wire::journal::Journal;

use crate::aligned::AlignedBuf;
use crate::error::ReplicaIoError;
use crate::file_ops;
use crate::journal_file::Stored;
// The checksum part of `Replica`'s impl, a child module of replica.rs, which calls it.
use crate::replica::Replica;
use crate::sums::{is_whole, whole_blocks, Bad, Sums, SUM_BLOCK_BYTES};

/// What the stored journal covers: the blocks a crash may have left apart from their sums.
/// The activity log's extents (every write since the last flush is in one), and the chunks
/// the journal says this replica lacks (a resync copies into them outside the log).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cover {
    /// Byte ranges, sorted and disjoint.
    ranges: Vec<(u64, u64)>,
}

impl Cover {
    /// All of a replica of `size` bytes (no readable journal: assume the worst).
    pub(crate) fn all(size: u64) -> Cover {
        Cover {
            ranges: vec![(0, size)],
        }
    }

    pub(crate) fn of(journal: &Journal, replica: &str, size: u64) -> Cover {
        let mut ranges: Vec<(u64, u64)> = journal
            .active
            .iter()
            .map(|&(a, b)| (a * journal.extent_bytes, b * journal.extent_bytes))
            .collect();
        if let Some(own) = journal.out.iter().find(|o| o.replica == replica) {
            match &own.dirty {
                None => return Cover::all(size),
                Some(runs) => ranges.extend(
                    runs.iter()
                        .map(|&(a, b)| (a * journal.chunk_bytes, b * journal.chunk_bytes)),
                ),
            }
        }
        for r in &mut ranges {
            *r = (r.0.min(size), r.1.min(size));
        }
        ranges.retain(|r| r.0 < r.1);
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        Cover { ranges: merged }
    }

    pub(crate) fn of_stored(stored: &Stored, replica: &str, size: u64) -> Cover {
        match stored {
            Stored::Found { journal, .. } => Cover::of(journal, replica, size),
            Stored::Missing | Stored::Unreadable => Cover::all(size),
        }
    }

    pub(crate) fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Whether `[offset, offset+len)` lies inside.
    pub(crate) fn contains(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len);
        self.ranges.iter().any(|&(a, b)| a <= offset && end <= b)
    }

    /// Whether every range of `self` lies inside `other`.
    pub(crate) fn within(&self, other: &Cover) -> bool {
        self.ranges.iter().all(|&(a, b)| other.contains(a, b - a))
    }
}

impl Replica {
    /// Open (or build) the sums of a replica with checksums, and sum again what its stored
    /// journal covers.
    pub(crate) fn open_sums(
        data: &File,
        data_path: &Path,
        size: u64,
        cover: &Cover,
    ) -> std::io::Result<Sums> {
        match Sums::open(data_path, size)? {
            None => {
                tracing::info!(path = %data_path.display(), "summing replica data (no sums file)");
                Sums::build(data, data_path, size)
            }
            Some(sums) => {
                for &(a, b) in cover.ranges() {
                    sums.rehash(data, a, b - a, size)?;
                }
                sums.sync()?;
                Ok(sums)
            }
        }
    }

    /// Before a write of part of a block: the blocks `[offset, offset+len)` covers partly whose
    /// data already fails its check. Summing such a block again after the write would make its
    /// rotted bytes look right; `poison_rotten` keeps it failing instead, so the next read
    /// finds it and the engine rewrites it whole from a replica that got the same write.
    pub(crate) fn rotten_edges(&self, offset: u64, len: u64) -> Result<Vec<u64>, ReplicaIoError> {
        let Some(sums) = self.sums() else {
            return Ok(Vec::new());
        };
        if is_whole(offset, len) || len == 0 {
            return Ok(Vec::new());
        }
        let end = offset + len;
        let first = offset / SUM_BLOCK_BYTES * SUM_BLOCK_BYTES;
        let last = (end - 1) / SUM_BLOCK_BYTES * SUM_BLOCK_BYTES;
        let mut edges = vec![first];
        if last != first {
            edges.push(last);
        }
        edges.retain(|&b| b < offset || b + SUM_BLOCK_BYTES > end);
        let mut rotten = Vec::new();
        let mut buf = AlignedBuf::for_overwrite(crate::sums::SUM_BLOCK_USIZE);
        let io = |e: std::io::Error| ReplicaIoError::from_io(&e);
        for b in edges {
            file_ops::read_at(self.file(), buf.as_mut_slice(), b).map_err(io)?;
            if sums.check(b, buf.as_slice()).map_err(io)?.is_some() {
                tracing::warn!(
                    replica = self.id(),
                    offset = b,
                    "a write into part of a block that fails its checksum: it stays failing"
                );
                rotten.push(b);
            }
        }
        Ok(rotten)
    }

    fn poison_rotten(&self, sums: &Sums, rotten: &[u64]) -> std::io::Result<()> {
        let mut buf = AlignedBuf::for_overwrite(crate::sums::SUM_BLOCK_USIZE);
        for &b in rotten {
            file_ops::read_at(self.file(), buf.as_mut_slice(), b)?;
            sums.poison(b, buf.as_slice())?;
        }
        Ok(())
    }

    /// After a write of `data` at `offset` landed: record its sums. A partial block is summed
    /// from what the file holds now (the engine orders writes by whole blocks, so no other
    /// write into that block is in flight), unless it had rotted (`rotten_edges`).
    pub(crate) fn sum_written(
        &self,
        offset: u64,
        data: &[u8],
        fua: bool,
        rotten: &[u64],
    ) -> Result<(), ReplicaIoError> {
        let Some(sums) = self.sums() else {
            return Ok(());
        };
        let len = data.len() as u64;
        let io = |e: std::io::Error| ReplicaIoError::from_io(&e);
        if is_whole(offset, len) {
            sums.record(offset, data).map_err(io)?;
        } else {
            self.resum(sums, offset, len).map_err(io)?;
            self.poison_rotten(sums, rotten).map_err(io)?;
        }
        self.sums_durable_for(fua, offset, len)
    }

    /// After `[offset, offset+len)` was zeroed (or trimmed): its whole blocks sum to 0, the
    /// partial ones at its edges are summed from the file.
    pub(crate) fn sum_zeroed(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        rotten: &[u64],
    ) -> Result<(), ReplicaIoError> {
        let Some(sums) = self.sums() else {
            return Ok(());
        };
        let io = |e: std::io::Error| ReplicaIoError::from_io(&e);
        let end = offset + len;
        let inner_first = offset.div_ceil(SUM_BLOCK_BYTES) * SUM_BLOCK_BYTES;
        let inner_end = end / SUM_BLOCK_BYTES * SUM_BLOCK_BYTES;
        if inner_first < inner_end {
            sums.zero(inner_first, inner_end - inner_first)
                .map_err(io)?;
            if offset < inner_first {
                self.resum(sums, offset, inner_first - offset).map_err(io)?;
            }
            if inner_end < end {
                self.resum(sums, inner_end, end - inner_end).map_err(io)?;
            }
        } else {
            self.resum(sums, offset, len).map_err(io)?;
        }
        self.poison_rotten(sums, rotten).map_err(io)?;
        self.sums_durable_for(fua, offset, len)
    }

    /// Sum the whole blocks around `[offset, offset+len)` again from the file.
    fn resum(&self, sums: &Sums, offset: u64, len: u64) -> std::io::Result<()> {
        sums.rehash(self.file(), offset, len, self.size())
    }

    /// A FUA write outside what the stored journal covers (a repair, say) is durable with
    /// its sums, or a crash could keep the data and lose the sum with nothing to sum it again.
    fn sums_durable_for(&self, fua: bool, offset: u64, len: u64) -> Result<(), ReplicaIoError> {
        let Some(sums) = self.sums() else {
            return Ok(());
        };
        if fua && !self.covered(offset, len) {
            sums.sync().map_err(|e| ReplicaIoError::from_io(&e))?;
        }
        Ok(())
    }

    /// Check whole blocks `data` read at `offset`.
    pub(crate) fn check_sums(&self, offset: u64, data: &[u8]) -> Result<(), ReplicaIoError> {
        let Some(sums) = self.sums() else {
            return Ok(());
        };
        match sums.check(offset, data) {
            Ok(None) => Ok(()),
            Ok(Some(Bad { offset, blocks })) => {
                tracing::warn!(
                    replica = self.id(),
                    offset,
                    blocks,
                    "checksum mismatch: the disk returned other data than was written"
                );
                Err(ReplicaIoError::Corrupt { offset, blocks })
            }
            Err(e) => Err(ReplicaIoError::from_io(&e)),
        }
    }

    /// A read through the sums: widened to whole blocks, checked, cut back.
    pub(crate) fn read_checked(
        &self,
        offset: u64,
        len: u32,
    ) -> Result<bytes::Bytes, ReplicaIoError> {
        let (first, end) = whole_blocks(offset, u64::from(len), self.size());
        let wide = usize::try_from(end - first).map_err(|_| ReplicaIoError::OutOfRange)?;
        let mut buf = AlignedBuf::for_overwrite(wide);
        file_ops::read_at(self.file(), buf.as_mut_slice(), first)
            .map_err(|e| ReplicaIoError::from_io(&e))?;
        self.check_sums(first, buf.as_slice())?;
        let bytes = buf.into_bytes();
        let skip = usize::try_from(offset - first).unwrap_or(0);
        Ok(bytes.slice(skip..skip + len as usize))
    }

    /// Before a journal covering `next` replaces the stored one: if it covers less, the sums
    /// of what leaves the cover must be durable first (see `sums.rs`).
    pub(crate) fn sums_before_journal(&self, next: &Cover) -> Result<(), ReplicaIoError> {
        let Some(sums) = self.sums() else {
            return Ok(());
        };
        let shrinks = !self.cover_lock().within(next);
        if shrinks {
            sums.sync().map_err(|e| ReplicaIoError::from_io(&e))?;
        }
        Ok(())
    }
}
