//! The client: a random workload at a random queue depth, and the model of what each sector
//! may read back.
//!
//! The workload: writes of random self-describing patterns (`pattern.rs`), 512-aligned, from one
//! sector to several chunks, some FUA, concentrated on a hot region so that requests overlap;
//! trims and write-zeroes; flushes; reads. The driver adds background flushes.
//!
//! The model is linearizability per sector. Each sector keeps the candidate values it may hold:
//! every modifying request enters as a candidate when submitted; when one succeeds, candidates
//! that had completed before it was submitted are dropped (it is certainly later than them);
//! candidates that overlapped it in time stay (their order is undefined). A failed request stays
//! a candidate (it may have reached some disk) until a later success covers it. So after quiet
//! the set is the last acknowledged value plus failed attempts after it.
//!
//! Reads are checked against the model when no write to their range was in flight while they
//! ran (a read racing a write may see either, sector by sector, which the model allows, but a
//! read also races the engine's internal ordering, so those reads are not checked at all).

use std::collections::BTreeMap;

use bytes::Bytes;
use hawser_core::{ClientOp, IoError, Tag};
use rand::rngs::StdRng;
use rand::Rng;

use crate::pattern::{self, SECTOR};

/// Per-seed workload shape.
#[derive(Clone, Copy, Debug)]
pub struct WorkloadParams {
    pub qd: usize,
    /// Percent of requests by kind; the rest are reads.
    pub write_pct: u32,
    pub zero_pct: u32,
    pub flush_pct: u32,
    pub fua_pct: u32,
    /// Hot region (bytes from 0) that half of the requests fall into.
    pub hot_bytes: u64,
    /// Largest request, bytes.
    pub max_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
    Zero,
    Flush,
}

#[derive(Clone, Copy, Debug)]
struct Cand {
    /// Version the sector holds if this request wins (0: zeroes).
    val: u64,
    /// Logical times of submission and completion (`PENDING` while in flight).
    inv: u64,
    resp: u64,
}

const PENDING: u64 = u64::MAX;

/// What every sector may read back.
pub struct Model {
    sectors: Vec<Vec<Cand>>,
    /// Modifying requests in flight per sector.
    busy: Vec<u16>,
    clock: u64,
    /// Deliberately wrong: trims and write-zeroes are not recorded.
    pub ignores_zeroes: bool,
}

fn idx(x: u64) -> usize {
    usize::try_from(x).expect("sector index fits")
}

impl Model {
    pub fn new(size: u64) -> Model {
        let n = idx(size / SECTOR);
        let init = Cand {
            val: 0,
            inv: 0,
            resp: 0,
        };
        Model {
            sectors: vec![vec![init]; n],
            busy: vec![0; n],
            clock: 1,
            ignores_zeroes: false,
        }
    }

    pub fn sectors(&self) -> u64 {
        self.sectors.len() as u64
    }

    /// The volume grew to `size` bytes: its new sectors hold zeroes, as new ones do.
    pub fn grow(&mut self, size: u64) {
        let n = idx(size / SECTOR);
        assert!(n >= self.sectors.len(), "a volume never shrinks");
        let init = Cand {
            val: 0,
            inv: 0,
            resp: 0,
        };
        self.sectors.resize(n, vec![init]);
        self.busy.resize(n, 0);
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Logical time now (for a flush's submission).
    pub fn now(&mut self) -> u64 {
        self.tick()
    }

    fn begin(&mut self, first: u64, end: u64, val: u64) -> u64 {
        let inv = self.tick();
        for s in first..end {
            self.sectors[idx(s)].push(Cand {
                val,
                inv,
                resp: PENDING,
            });
            self.busy[idx(s)] += 1;
        }
        inv
    }

    fn end(&mut self, first: u64, end: u64, inv: u64, ok: bool) {
        let resp = self.tick();
        for s in first..end {
            let c = &mut self.sectors[idx(s)];
            let me = c
                .iter_mut()
                .find(|c| c.inv == inv)
                .expect("candidate of a request in flight");
            me.resp = resp;
            if ok {
                // Everything that completed before this request started is overwritten.
                c.retain(|c| c.inv == inv || c.resp == PENDING || c.resp > inv);
            }
            self.busy[idx(s)] -= 1;
        }
    }

    pub fn allows(&self, s: u64, v: u64) -> bool {
        self.sectors[idx(s)].iter().any(|c| c.val == v)
    }

    pub fn allowed(&self, s: u64) -> Vec<u64> {
        self.sectors[idx(s)].iter().map(|c| c.val).collect()
    }

    /// Whether a modifying request to sector `s` is in flight.
    pub fn busy(&self, s: u64) -> bool {
        self.busy[idx(s)] > 0
    }

    /// Whether every candidate of sector `s` completed before logical time `t`.
    pub fn settled_before(&self, s: u64, t: u64) -> bool {
        self.sectors[idx(s)].iter().all(|c| c.resp < t)
    }
}

struct Req {
    kind: Kind,
    offset: u64,
    len: u64,
    val: u64,
    inv: u64,
    background: bool,
    /// Reads: no write to the range was in flight while it ran.
    clean: bool,
}

/// A completed request, for the checks that need the world (replicas, store).
#[derive(Clone, Copy, Debug)]
pub struct Completed {
    pub kind: Kind,
    pub offset: u64,
    pub len: u64,
    pub inv: u64,
    pub ok: bool,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ClientStats {
    pub submitted: u64,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub reads_checked: u64,
    pub reads_failed: u64,
    pub flushes_ok: u64,
    pub flushes_failed: u64,
}

pub struct Client {
    pub model: Model,
    pub params: WorkloadParams,
    size: u64,
    reqs: BTreeMap<Tag, Req>,
    next_tag: Tag,
    next_version: u64,
    pub stats: ClientStats,
}

impl Client {
    pub fn new(size: u64, params: WorkloadParams) -> Client {
        Client {
            model: Model::new(size),
            params,
            size,
            reqs: BTreeMap::new(),
            next_tag: 1,
            next_version: 1,
            stats: ClientStats::default(),
        }
    }

    /// Requests submitted by the workload (not background flushes) and not yet completed.
    pub fn depth(&self) -> usize {
        self.reqs.values().filter(|r| !r.background).count()
    }

    pub fn outstanding(&self) -> usize {
        self.reqs.len()
    }

    /// The volume grew to `size` bytes: the model and the workload take in the new range.
    pub fn grow(&mut self, size: u64) {
        self.model.grow(size);
        self.size = size;
    }

    pub fn outstanding_tags(&self) -> Vec<Tag> {
        self.reqs.keys().copied().collect()
    }

    /// A random request of the workload.
    pub fn random_op(&self, rng: &mut StdRng) -> (Kind, u64, u64, bool) {
        let p = &self.params;
        let roll = rng.random_range(0..100);
        let kind = if roll < p.write_pct {
            Kind::Write
        } else if roll < p.write_pct + p.zero_pct {
            Kind::Zero
        } else if roll < p.write_pct + p.zero_pct + p.flush_pct {
            Kind::Flush
        } else {
            Kind::Read
        };
        let max_sectors = (p.max_bytes / SECTOR).max(1);
        let sectors = match rng.random_range(0..100) {
            0..70 => rng.random_range(1..=max_sectors.min(16)),
            70..95 => rng.random_range(1..=max_sectors.min(128)),
            _ => rng.random_range(1..=max_sectors),
        };
        let len = (sectors * SECTOR).min(self.size);
        let region = if rng.random_bool(0.5) {
            p.hot_bytes.max(len)
        } else {
            self.size
        };
        let offset = rng.random_range(0..=(region - len) / SECTOR) * SECTOR;
        (kind, offset, len, rng.random_range(0..100) < p.fua_pct)
    }

    /// Register a request and build it. `background`: the driver's flush.
    pub fn begin(
        &mut self,
        kind: Kind,
        offset: u64,
        len: u64,
        fua: bool,
        background: bool,
    ) -> (Tag, ClientOp) {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.stats.submitted += 1;
        let (first, end) = (offset / SECTOR, (offset + len) / SECTOR);
        let (op, val) = match kind {
            Kind::Read => (
                ClientOp::Read {
                    offset,
                    len: u32::try_from(len).expect("request fits in u32"),
                },
                0,
            ),
            Kind::Flush => (ClientOp::Flush, 0),
            Kind::Write => {
                let v = self.next_version;
                self.next_version += 1;
                let data = pattern::payload(v, offset, len);
                (ClientOp::Write { offset, data, fua }, v)
            }
            Kind::Zero => {
                let len32 = u32::try_from(len).expect("request fits in u32");
                let op = if fua || len.is_multiple_of(2048) {
                    ClientOp::WriteZeroes {
                        offset,
                        len: len32,
                        fua,
                        may_trim: len.is_multiple_of(4096),
                    }
                } else {
                    ClientOp::Trim { offset, len: len32 }
                };
                (op, 0)
            }
        };
        let modifies =
            matches!(kind, Kind::Write) || (kind == Kind::Zero && !self.model.ignores_zeroes);
        let inv = if modifies {
            // Reads in flight over this range now race it.
            for r in self.reqs.values_mut() {
                if r.kind == Kind::Read && r.offset < offset + len && offset < r.offset + r.len {
                    r.clean = false;
                }
            }
            self.model.begin(first, end, val)
        } else {
            self.model.now()
        };
        let clean = kind == Kind::Read && (first..end).all(|s| !self.model.busy(s));
        self.reqs.insert(
            tag,
            Req {
                kind,
                offset,
                len,
                val,
                inv,
                background,
                clean,
            },
        );
        (tag, op)
    }

    /// Request `tag` completed. Errors are violations (unknown tag, a read returning what the
    /// model forbids, an error a valid request can never get).
    pub fn complete(
        &mut self,
        tag: Tag,
        result: &Result<Option<Bytes>, IoError>,
    ) -> Result<Completed, String> {
        let Some(r) = self.reqs.remove(&tag) else {
            return Err(format!("completion for unknown or completed request {tag}"));
        };
        if result == &Err(IoError::Invalid) {
            return Err(format!(
                "valid request {tag} ({:?}) refused as invalid",
                r.kind
            ));
        }
        let ok = result.is_ok();
        let (first, end) = (r.offset / SECTOR, (r.offset + r.len) / SECTOR);
        match r.kind {
            Kind::Write | Kind::Zero => {
                if r.kind == Kind::Write || !self.model.ignores_zeroes {
                    self.model.end(first, end, r.inv, ok);
                }
                if ok {
                    self.stats.writes_ok += 1;
                } else {
                    self.stats.writes_failed += 1;
                }
                let _ = r.val;
            }
            Kind::Flush if ok => self.stats.flushes_ok += 1,
            Kind::Flush => self.stats.flushes_failed += 1,
            Kind::Read => match result {
                Ok(Some(data)) if r.clean => {
                    self.check_read(tag, r.offset, r.len, data)?;
                    self.stats.reads_checked += 1;
                }
                Ok(Some(data)) if data.len() as u64 != r.len => {
                    return Err(format!(
                        "read {tag} returned {} bytes, not {}",
                        data.len(),
                        r.len
                    ));
                }
                Ok(_) => {}
                Err(_) => self.stats.reads_failed += 1,
            },
        }
        Ok(Completed {
            kind: r.kind,
            offset: r.offset,
            len: r.len,
            inv: r.inv,
            ok,
        })
    }

    fn check_read(&self, tag: Tag, offset: u64, len: u64, data: &[u8]) -> Result<(), String> {
        if data.len() as u64 != len {
            return Err(format!(
                "read {tag} returned {} bytes, not {len}",
                data.len()
            ));
        }
        for (i, b) in data.chunks_exact(512).enumerate() {
            let s = offset / SECTOR + i as u64;
            let v = pattern::decode(b, s, false);
            if !v.is_some_and(|v| self.model.allows(s, v)) {
                return Err(format!(
                    "read {tag} of sector {s} returned version {v:?}; the model allows {:?}",
                    self.model.allowed(s)
                ));
            }
        }
        Ok(())
    }
}
