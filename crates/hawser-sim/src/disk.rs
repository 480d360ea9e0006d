//! A replica's disk: a durable layer and a volatile layer (the page cache and the device's
//! write cache, as one).
//!
//! Modelled: writes land in the volatile layer (FUA writes go straight to the durable one); a
//! flush makes everything durable; a node crash (power loss) keeps a random subset of the
//! volatile sectors (the device may have written some back on its own) and drops the rest; a
//! write executing when the node or process dies may have reached only a prefix of its 512-byte
//! sectors (a torn write). A process crash keeps the volatile layer: it belongs to the kernel.
//! Sectors are atomic: a sector is never half old, half new.
//!
//! Rot (bytes that no longer match their checksum) is modelled one level up, as marks on a
//! replica's blocks (`Replica::corrupt`), since a replica never returns such bytes.
//! Not modelled: misdirected writes, reordering of
//! a flush before writes it covers, and a failing flush that loses data (all I/O errors here
//! mark the replica failed, which takes it out of the checks).

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::Rng;

use crate::pattern::SECTOR;

fn idx(x: u64) -> usize {
    usize::try_from(x).expect("disk offsets fit in memory")
}

pub struct Disk {
    /// What reads see: durable plus volatile.
    cur: Vec<u8>,
    durable: Vec<u8>,
    /// Sectors whose `cur` may differ from `durable`, without duplicates.
    volatile: Vec<u64>,
    is_volatile: Vec<bool>,
}

impl Disk {
    pub fn new(size: u64) -> Disk {
        Disk {
            cur: vec![0; idx(size)],
            durable: vec![0; idx(size)],
            volatile: Vec::new(),
            is_volatile: vec![false; idx(size / SECTOR)],
        }
    }

    pub fn size(&self) -> u64 {
        self.cur.len() as u64
    }

    /// Grow to `size` bytes, durably: the new range is zeroes in both layers (a replica
    /// reports its growth only once it would survive a power loss).
    pub fn grow(&mut self, size: u64) {
        assert!(size >= self.size() && size.is_multiple_of(SECTOR));
        self.cur.resize(idx(size), 0);
        self.durable.resize(idx(size), 0);
        self.is_volatile.resize(idx(size / SECTOR), false);
    }

    /// The whole disk as reads see it.
    pub fn view(&self) -> &[u8] {
        &self.cur
    }

    /// The durable layer (what survives a power loss for sure).
    pub fn durable(&self) -> &[u8] {
        &self.durable
    }

    pub fn read(&self, offset: u64, len: u64) -> Bytes {
        Bytes::copy_from_slice(&self.cur[idx(offset)..idx(offset + len)])
    }

    /// Write `data` at `offset`; `None` writes zeroes of `len` bytes.
    pub fn write(&mut self, offset: u64, len: u64, data: Option<&[u8]>, fua: bool) {
        let range = idx(offset)..idx(offset + len);
        match data {
            Some(d) => self.cur[range.clone()].copy_from_slice(d),
            None => self.cur[range.clone()].fill(0),
        }
        if fua {
            self.durable[range.clone()].copy_from_slice(&self.cur[range]);
            // Sectors still listed as volatile now equal their durable copy: harmless.
        } else {
            for s in offset / SECTOR..(offset + len) / SECTOR {
                if !self.is_volatile[idx(s)] {
                    self.is_volatile[idx(s)] = true;
                    self.volatile.push(s);
                }
            }
        }
    }

    /// Fill `[offset, offset + len)` with junk no client wrote, in both layers (a replica that
    /// starts out of date).
    pub fn scribble(&mut self, offset: u64, len: u64, version: u64) {
        let first = offset / SECTOR;
        for (i, s) in self.cur[idx(offset)..idx(offset + len)]
            .chunks_exact_mut(idx(SECTOR))
            .enumerate()
        {
            crate::pattern::fill_sector(s, version, first + i as u64);
        }
        let range = idx(offset)..idx(offset + len);
        self.durable[range.clone()].copy_from_slice(&self.cur[range]);
    }

    pub fn flush(&mut self) {
        for s in std::mem::take(&mut self.volatile) {
            let r = idx(s * SECTOR)..idx((s + 1) * SECTOR);
            self.durable[r.clone()].copy_from_slice(&self.cur[r]);
            self.is_volatile[idx(s)] = false;
        }
    }

    /// Power loss: each volatile sector survives with probability `keep`, else reverts to its
    /// durable contents. Returns the sectors that were volatile.
    pub fn power_loss(&mut self, rng: &mut StdRng, keep: f64) -> Vec<u64> {
        let lost = std::mem::take(&mut self.volatile);
        for &s in &lost {
            let r = idx(s * SECTOR)..idx((s + 1) * SECTOR);
            if rng.random_bool(keep) {
                self.durable[r.clone()].copy_from_slice(&self.cur[r]);
            } else {
                self.cur[r.clone()].copy_from_slice(&self.durable[r]);
            }
            self.is_volatile[idx(s)] = false;
        }
        lost
    }

    /// Sectors not yet durable.
    pub fn volatile_sectors(&self) -> &[u64] {
        &self.volatile
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn flush_and_power_loss() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut d = Disk::new(8 * SECTOR);
        d.write(0, SECTOR, Some(&[1; 512]), false);
        d.flush();
        d.write(0, 2 * SECTOR, Some(&[2; 1024]), false);
        d.write(4 * SECTOR, SECTOR, Some(&[3; 512]), true);
        assert_eq!(d.power_loss(&mut rng, 0.0), vec![0, 1]);
        assert_eq!(d.view()[0], 1, "unflushed write survived a power loss");
        assert_eq!(d.view()[512], 0);
        assert_eq!(d.view()[4 * 512], 3, "FUA write lost");
    }
}
