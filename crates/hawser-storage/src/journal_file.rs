//! A replica's copy of its volume's journal (`<id>.journal`, format in
//! `hawser_wire::journal`). Two fixed slots, written alternately: a new journal goes to the
//! slot that does not hold the newest valid one, then `fdatasync`. A crash mid-write tears at
//! most that slot, whose checksum then fails, and the other slot still holds the previous
//! journal. Each slot is a u32 length, the encoded journal, then a trailer: the boot id of the
//! node that stored it (u64) and a CRC32C of those 8 bytes.
//!
//! The boot id answers one question at crash recovery: did this node reboot since it stored
//! its newest journal? If so it may have lost writes it acknowledged but had not flushed (its
//! disk's volatile cache), and recovery prefers another replica as the source of the extents
//! that journal's log names (docs/protocol.md, "Crash recovery").

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hawser_wire::journal::{Journal, MAX_JOURNAL_BYTES};

/// Bytes of the trailer after the journal: boot id and its checksum.
const TRAILER_BYTES: usize = 12;
/// Bytes of one slot: the length prefix, the largest journal and the trailer, rounded to a
/// block.
const SLOT_BYTES: u64 = (MAX_JOURNAL_BYTES as u64 + 4 + TRAILER_BYTES as u64).div_ceil(4096) * 4096;

/// What a read of the journal file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Stored {
    /// No journal file: a replica created before journals existed.
    Missing,
    /// The file exists but neither slot holds a valid journal.
    Unreadable,
    /// `rebooted`: the node booted since the journal was stored (or the slot does not say
    /// which boot stored it), so writes not flushed then may be gone.
    Found { journal: Journal, rebooted: bool },
}

pub struct JournalFile {
    path: PathBuf,
    /// This node's current boot id, stamped on every journal stored.
    boot: u64,
    /// The open file and the slot holding the newest valid journal (if any), learned at the
    /// first access.
    state: Mutex<Option<(File, Option<usize>)>>,
}

impl JournalFile {
    pub fn new(path: PathBuf, boot: u64) -> JournalFile {
        JournalFile {
            path,
            boot,
            state: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Store `encoded` (a valid encoded journal) durably.
    pub fn put(&self, encoded: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(encoded.len())
            .ok()
            .filter(|&l| l as usize <= MAX_JOURNAL_BYTES)
            .ok_or_else(|| std::io::Error::other("journal larger than its slot"))?;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_none() {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)?;
            let newest = newest_slot(&file).map(|(slot, _, _)| slot);
            *state = Some((file, newest));
        }
        let Some((file, newest)) = state.as_mut() else {
            unreachable!("opened above")
        };
        let slot = match *newest {
            Some(s) => 1 - s,
            None => 0,
        };
        let mut buf = Vec::with_capacity(encoded.len() + 4 + TRAILER_BYTES);
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(encoded);
        let boot = self.boot.to_le_bytes();
        buf.extend_from_slice(&boot);
        buf.extend_from_slice(&crc32c::crc32c(&boot).to_le_bytes());
        file.write_all_at(&buf, slot as u64 * SLOT_BYTES)?;
        file.sync_data()?;
        *newest = Some(slot);
        Ok(())
    }

    /// The newest valid journal.
    pub fn get(&self) -> std::io::Result<Stored> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let file = match state.as_ref() {
            Some((f, _)) => f.try_clone()?,
            None => match File::open(&self.path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Stored::Missing),
                Err(e) => return Err(e),
            },
        };
        drop(state);
        Ok(match newest_slot(&file) {
            Some((_, journal, boot)) => Stored::Found {
                journal,
                rebooted: boot != Some(self.boot),
            },
            None => Stored::Unreadable,
        })
    }
}

/// The slot holding the newest valid journal, that journal, and the boot id that stored it
/// (`None`: the trailer is unreadable).
fn newest_slot(file: &File) -> Option<(usize, Journal, Option<u64>)> {
    (0..2)
        .filter_map(|slot| read_slot(file, slot).map(|(j, boot)| (slot, j, boot)))
        .max_by_key(|(_, j, _)| (j.epoch, j.seq))
}

fn read_slot(file: &File, slot: usize) -> Option<(Journal, Option<u64>)> {
    let at = slot as u64 * SLOT_BYTES;
    let mut len = [0u8; 4];
    file.read_exact_at(&mut len, at).ok()?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_JOURNAL_BYTES {
        return None;
    }
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, at + 4).ok()?;
    let journal = Journal::decode(&buf).ok()?;
    let mut trailer = [0u8; TRAILER_BYTES];
    let boot = file
        .read_exact_at(&mut trailer, at + 4 + len as u64)
        .ok()
        .and_then(|()| {
            let (boot, crc) = trailer.split_at(8);
            (crc32c::crc32c(boot).to_le_bytes() == crc)
                .then(|| u64::from_le_bytes(boot.try_into().expect("8 bytes")))
        });
    Some((journal, boot))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_wire::journal::ACTIVITY_EXTENT_BYTES;

    fn journal(epoch: u64, seq: u64) -> Journal {
        Journal {
            epoch,
            seq,
            size: 64 << 20,
            extent_bytes: ACTIVITY_EXTENT_BYTES,
            chunk_bytes: 64 << 10,
            active: vec![(seq % 16, seq % 16 + 1)],
            out: vec![],
        }
    }

    fn found(journal: Journal, rebooted: bool) -> Stored {
        Stored::Found { journal, rebooted }
    }

    #[test]
    fn newest_wins_and_a_torn_slot_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.journal");
        let jf = JournalFile::new(path.clone(), 7);
        assert_eq!(jf.get().unwrap(), Stored::Missing);
        for seq in 1..=5 {
            jf.put(&journal(3, seq).encode().unwrap()).unwrap();
            assert_eq!(jf.get().unwrap(), found(journal(3, seq), false));
        }
        // A reopened file alternates correctly too.
        let jf = JournalFile::new(path.clone(), 7);
        jf.put(&journal(4, 1).encode().unwrap()).unwrap();
        assert_eq!(jf.get().unwrap(), found(journal(4, 1), false));
        // Tear the newest slot (seq 4/1 went to the slot not holding 3/5): the older returns.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let newest = newest_slot(&f).unwrap().0;
        f.write_all_at(b"garbage!", newest as u64 * SLOT_BYTES + 20)
            .unwrap();
        assert_eq!(
            JournalFile::new(path.clone(), 7).get().unwrap(),
            found(journal(3, 5), false)
        );
        // Both torn: unreadable, not missing.
        f.write_all_at(b"garbage!", (1 - newest) as u64 * SLOT_BYTES + 20)
            .unwrap();
        assert_eq!(JournalFile::new(path, 7).get().unwrap(), Stored::Unreadable);
    }

    #[test]
    fn a_journal_read_after_a_reboot_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.journal");
        JournalFile::new(path.clone(), 7)
            .put(&journal(3, 1).encode().unwrap())
            .unwrap();
        assert_eq!(
            JournalFile::new(path.clone(), 7).get().unwrap(),
            found(journal(3, 1), false)
        );
        assert_eq!(
            JournalFile::new(path.clone(), 8).get().unwrap(),
            found(journal(3, 1), true),
            "another boot id: the node rebooted since"
        );
        // Stored again under the new boot, it is current again.
        let jf = JournalFile::new(path.clone(), 8);
        jf.put(&journal(3, 2).encode().unwrap()).unwrap();
        assert_eq!(jf.get().unwrap(), found(journal(3, 2), false));
        // A damaged trailer does not hide the journal, but cannot vouch for the boot.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        let len = journal(3, 2).encode().unwrap().len() as u64;
        let slot = 1; // the second put went to the other slot
        f.write_all_at(&[0xff], slot * SLOT_BYTES + 4 + len)
            .unwrap();
        assert_eq!(
            JournalFile::new(path, 8).get().unwrap(),
            found(journal(3, 2), true)
        );
    }
}
