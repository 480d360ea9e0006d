//! Helpers shared by the fuzz targets: a reader that turns the fuzzer's bytes into choices
//! (zeroes once the input is exhausted, so every input is a complete program), and builders
//! of valid-looking values for the structured halves of the targets.

use hawser_wire::constants::MAX_ID_BYTES;
use hawser_wire::journal::{Journal, OutReplica, Runs};

/// Reads choices from fuzz input; past its end every read is zero.
pub struct Choices<'a> {
    data: &'a [u8],
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Choices { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Up to `max` raw bytes (fewer if the input ends).
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u8()).min(max).min(self.data.len());
        let (b, rest) = self.data.split_at(n);
        self.data = rest;
        b
    }
}

/// Runs within `[0, limit)`: sorted, disjoint, non-adjacent, non-empty (valid), unless
/// `sloppy`, when the gaps may be zero and runs may pass the limit (invalid ones).
pub fn runs(c: &mut Choices, limit: u64, sloppy: bool) -> Runs {
    let mut out = Vec::new();
    let mut at = 0u64;
    for i in 0..c.u8() % 6 {
        let gap = u64::from(c.u8() % 16) + u64::from(i > 0 && !sloppy);
        let len = u64::from(c.u8() % 32) + u64::from(!sloppy);
        let first = at.saturating_add(gap);
        let end = first.saturating_add(len);
        if end > limit && !sloppy {
            break;
        }
        out.push((first, end));
        at = end;
    }
    out
}

/// A journal from the choices: valid unless the choices ask for a flaw (then `encode`
/// must refuse it).
pub fn journal(c: &mut Choices) -> Journal {
    let flags = c.u8();
    let sloppy = flags & 0x80 != 0;
    let extent_bytes = if sloppy && flags & 1 != 0 {
        c.u64()
    } else {
        4096 << (c.u8() % 20)
    };
    let chunk_bytes = 4096 << (c.u8() % 12);
    let size = c.u64() % (1 << 44);
    let (extents, chunks) = (
        size.div_ceil(extent_bytes.max(1)),
        size.div_ceil(chunk_bytes),
    );
    let active = runs(c, extents, sloppy);
    let mut out = Vec::new();
    for _ in 0..c.u8() % 4 {
        let id_len = match c.u8() % 8 {
            0 if sloppy => 0,
            1 if sloppy => MAX_ID_BYTES + 1,
            n => 1 + usize::from(n) * 9,
        };
        let replica: String = (0..id_len)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let dirty = c.bool().then(|| runs(c, chunks, sloppy));
        // An unknown map always says lost (the decoder reads it so).
        let lost = dirty.is_none() || c.bool();
        out.push(OutReplica {
            replica,
            dirty,
            lost,
        });
    }
    Journal {
        epoch: c.u64(),
        seq: c.u64(),
        size,
        extent_bytes,
        chunk_bytes,
        active,
        out,
    }
}

/// Seeds for a target's corpus, written by the target's init when `HAWSER_FUZZ_SEEDS` names a
/// directory (scripts/fuzz.sh points it at the corpus). They come from the encoders of this
/// build, so they always speak the current formats.
pub fn write_seeds(seeds: impl FnOnce() -> Vec<(&'static str, Vec<u8>)>) {
    let Some(dir) = std::env::var_os("HAWSER_FUZZ_SEEDS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("create the corpus directory");
    for (name, bytes) in seeds() {
        std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write a seed");
    }
}

/// A small valid journal of a 1 GiB volume.
pub fn sample_journal() -> Journal {
    Journal {
        epoch: 7,
        seq: 42,
        size: 1 << 30,
        extent_bytes: hawser_wire::journal::ACTIVITY_EXTENT_BYTES,
        chunk_bytes: 64 << 10,
        active: vec![(0, 2), (10, 11)],
        out: vec![
            OutReplica {
                replica: "r-1".into(),
                dirty: Some(vec![(3, 9), (100, 120)]),
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

/// A fresh directory for a target's files: under `HAWSER_FUZZ_TMP` when set (scripts/fuzz.sh
/// removes it afterwards), else under tmpfs when there is one (stores and replicas fsync).
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    let base = std::env::var_os("HAWSER_FUZZ_TMP")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            ["/dev/shm", "/tmp"]
                .iter()
                .map(std::path::PathBuf::from)
                .find(|p| p.is_dir())
        })
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("hawser-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the fuzz directory");
    dir
}

/// The embedded store's round trip, for the targets that feed it files (`store_record`,
/// `store_log`): `store`, opened from `file`, takes one write at the next revision, and the
/// store opened again holds every entry it had plus that write. Returns the revision the
/// store opened at.
pub fn store_round_trip(
    rt: &tokio::runtime::Runtime,
    store: hawser_store::EmbeddedStore,
    file: &std::path::Path,
) -> u64 {
    use hawser_store::{EmbeddedStore, Expect, Store};
    rt.block_on(async {
        let revision = store.revision().await.expect("revision");
        let mut entries = store.list("").await.expect("list");
        const KEY: &str = "\u{10ffff}fuzz-roundtrip";
        let value = b"\xffwritten by the fuzzer".to_vec();
        let version = store
            .put(KEY, value.clone(), Expect::Any)
            .await
            .expect("a write to an opened store");
        assert_eq!(
            version,
            revision + 1,
            "a write did not take the next revision"
        );
        drop(store);

        let again = EmbeddedStore::open(file).expect("the store reopens after a write");
        assert_eq!(again.revision().await.expect("revision"), revision + 1);
        entries.retain(|(k, _)| k != KEY);
        entries.push((KEY.to_owned(), hawser_store::Versioned { value, version }));
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut found = again.list("").await.expect("list");
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(found, entries, "entries changed across a reopen");
        revision
    })
}
