//! What the target tests share: a directory target, an image to back up, and ways to age
//! and count what is on the target.
#![allow(clippy::unwrap_used, dead_code)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hawser_backup::locks::{LockBody, LockKind};
use hawser_backup::{BackupPlan, Target, TargetSpec};

pub const MIB: u64 = 1 << 20;
pub const STALE: u64 = hawser_backup::constants::LOCK_STALE_SECS;

pub struct Fixture {
    pub _dir: tempfile::TempDir,
    pub store: PathBuf,
    pub image: PathBuf,
    pub target: Target,
}

pub fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("target");
    std::fs::create_dir(&store).unwrap();
    let image = dir.path().join("image");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    let spec = TargetSpec::Dir {
        path: store.display().to_string(),
    };
    let target = Target::open("t", &spec, None).unwrap();
    Fixture {
        _dir: dir,
        store,
        image,
        target,
    }
}

pub fn write(image: &Path, at: u64, byte: u8) {
    let f = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    f.write_all_at(&vec![byte; 1 << 20], at).unwrap();
}

pub fn plan(backup: &str, previous: Option<hawser_backup::Manifest>) -> BackupPlan {
    BackupPlan {
        backup: backup.into(),
        volume: "v".into(),
        cluster: None,
        snapshot: None,
        taken_ms: 1,
        size_bytes: 4 * MIB,
        block_bytes: MIB,
        encryption: None,
        previous,
        bytes_per_sec: 0,
    }
}

/// Makes every object under `dir` look written an hour ago, as the target's clock tells.
pub fn age(dir: &Path) {
    let old = SystemTime::now() - Duration::from_secs(3600);
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            age(&p);
        } else {
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_modified(old).unwrap();
        }
    }
}

pub fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                let p = e.unwrap().path();
                if p.is_dir() {
                    files_under(&p)
                } else {
                    1
                }
            })
            .sum()
        })
        .unwrap_or(0)
}

/// A lock's body as a test's holder writes it.
pub fn lock_body(kind: LockKind, holder: &str) -> LockBody {
    LockBody {
        kind,
        holder: holder.into(),
        cluster: None,
        host: None,
        started_ms: 0,
        reads: Vec::new(),
    }
}
