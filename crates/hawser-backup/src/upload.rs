//! Making a backup: a snapshot file is cut into blocks; each block that is not all zeros and
//! not on the target yet is compressed and stored under its hash; the manifest goes last.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use crate::constants::MAX_IN_FLIGHT_BLOCKS;
use crate::error::BackupError;
use crate::locks::{Lock, LockBody, LockKind};
use crate::manifest::{BackupKey, BackupStats, Manifest, FORMAT};
use crate::progress::{Pacer, Progress};
use crate::target::Target;
use crate::{block, names};

/// What to back up, and how.
#[derive(Clone, Debug)]
pub struct BackupPlan {
    pub backup: String,
    pub volume: String,
    pub cluster: Option<String>,
    pub snapshot: Option<String>,
    pub taken_ms: u64,
    pub size_bytes: u64,
    pub block_bytes: u64,
    pub encryption: Option<BackupKey>,
    /// The volume's last backup on this target: its blocks are known to be there.
    pub previous: Option<Manifest>,
    /// The most the job reads per second (0: no limit).
    pub bytes_per_sec: u64,
}

/// What became of one block.
enum Stored {
    /// A hole in the file: nothing read.
    Hole,
    Zero,
    /// Named by the previous backup.
    Known(String),
    /// Not named by it, but found on the target (an interrupted run's, another volume's).
    Found(String),
    New(String, u64),
}

/// Backs up the first `plan.size_bytes` of `source` (a snapshot file) to `target`, and
/// returns the manifest it wrote. Killed midway, it leaves blocks and no manifest; the next
/// run finds those blocks and does not send them again.
pub async fn back_up(
    target: &Target,
    source: &Path,
    plan: BackupPlan,
    progress: Arc<Progress>,
) -> Result<Manifest, BackupError> {
    names::validate_backup(&plan.backup)?;
    let started = std::time::Instant::now();
    target.report_to(&progress);
    if target.size(&names::manifest(&plan.backup)).await?.is_some() {
        return Err(BackupError::Exists {
            target: target.name().to_owned(),
            backup: plan.backup.clone(),
        });
    }
    let file = open_source(source, plan.size_bytes)?;
    // Before anything on the target is relied on: no prune runs while this is held.
    let lock = Lock::take(
        target,
        LockBody {
            kind: LockKind::Backup,
            holder: plan.backup.clone(),
            cluster: plan.cluster.clone(),
            host: hostname(),
            started_ms: now_ms(),
            reads: Vec::new(),
        },
    )
    .await?;
    let made = async {
        lock.wait_out_prunes().await?;
        locked(target, source, file, plan, progress, &lock, started).await
    }
    .await;
    lock.release().await;
    made
}

/// The backup proper, under the target's lock.
async fn locked(
    target: &Target,
    source: &Path,
    file: Arc<std::fs::File>,
    mut plan: BackupPlan,
    progress: Arc<Progress>,
    lock: &Lock,
    started: std::time::Instant,
) -> Result<Manifest, BackupError> {
    // The previous backup was read before the lock: if it was deleted since, a prune may
    // have taken its blocks, so none of them is assumed to be there.
    if let Some(p) = &plan.previous {
        if target.size(&names::manifest(&p.backup)).await?.is_none() {
            tracing::info!(backup = %plan.backup, previous = %p.backup,
                "the previous backup was deleted; every block is looked up");
            plan.previous = None;
        }
    }
    let mut manifest = Manifest {
        format: FORMAT,
        backup: plan.backup.clone(),
        volume: plan.volume.clone(),
        cluster: plan.cluster.clone(),
        snapshot: plan.snapshot.clone(),
        taken_ms: plan.taken_ms,
        size_bytes: plan.size_bytes,
        block_bytes: plan.block_bytes,
        hash: "sha256".into(),
        compression: "zstd".into(),
        blocks: Default::default(),
        encryption: plan.encryption.clone(),
        previous: plan.previous.as_ref().map(|p| p.backup.clone()),
        stats: BackupStats::default(),
    };
    // Checked before any block is read, so a bad size fails at once.
    manifest.validate()?;
    let known: Arc<HashSet<String>> = Arc::new(
        plan.previous
            .iter()
            .flat_map(|p| p.blocks.values().cloned())
            .collect(),
    );
    let pacer = Arc::new(Pacer::new(plan.bytes_per_sec));
    let ctx = Arc::new((target.clone(), file, source.to_owned(), manifest.clone()));
    let results: Vec<(u64, Stored)> = futures::stream::iter(0..manifest.block_count())
        .map(|index| {
            let (ctx, known, pacer, progress) =
                (ctx.clone(), known.clone(), pacer.clone(), progress.clone());
            async move {
                let (target, file, path, m) = &*ctx;
                let (at, len) = m.block_range(index);
                let stored = one_block(target, file, path, at, len, &known, &pacer).await?;
                let sent = if let Stored::New(_, n) = &stored {
                    *n
                } else {
                    0
                };
                progress.advance(len, sent);
                Ok::<_, BackupError>((index, stored))
            }
        })
        .buffer_unordered(MAX_IN_FLIGHT_BLOCKS)
        .try_collect()
        .await?;
    let holes: u64 = results
        .iter()
        .filter(|(_, s)| matches!(s, Stored::Hole))
        .map(|(i, _)| manifest.block_range(*i).1)
        .sum();
    let stats = &mut manifest.stats;
    stats.read_bytes = plan.size_bytes.saturating_sub(holes);
    for (index, stored) in results {
        match stored {
            Stored::Hole | Stored::Zero => stats.zero_blocks += 1,
            Stored::Known(h) => {
                stats.reused_blocks += 1;
                manifest.blocks.insert(index, h);
            }
            Stored::Found(h) => {
                stats.reused_blocks += 1;
                stats.found_blocks += 1;
                manifest.blocks.insert(index, h);
            }
            Stored::New(h, n) => {
                stats.new_blocks += 1;
                stats.stored_bytes += n;
                manifest.blocks.insert(index, h);
            }
        }
    }
    manifest.stats.retries = target.retries();
    manifest.stats.micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    // Every block durable before the manifest that names them, and the manifest durable
    // before the backup is reported done.
    target.barrier().await?;
    // The blocks it reuses are still there only if no prune could have run meanwhile.
    lock.check()?;
    target
        .put(
            &names::manifest(&plan.backup),
            Bytes::from(manifest.encode()?),
        )
        .await?;
    target.barrier().await?;
    Ok(manifest)
}

/// This machine's name, for a lock's reader.
pub(crate) fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn open_source(source: &Path, size: u64) -> Result<Arc<std::fs::File>, BackupError> {
    let file = std::fs::File::open(source).map_err(|e| BackupError::io("open", source, e))?;
    let len = file
        .metadata()
        .map_err(|e| BackupError::io("stat", source, e))?
        .len();
    if len < size {
        return Err(BackupError::Invalid {
            what: format!(
                "{} is {len} bytes, less than the volume's {size}",
                source.display()
            ),
        });
    }
    Ok(Arc::new(file))
}

/// Whether `len` bytes at `at` of `file` are all a hole (a sparse file's unallocated range,
/// which reads as zeros): then the block is not read at all, so a thin volume's backup
/// reads only what was written. Any doubt (a filesystem without SEEK_DATA) says no.
fn is_hole(file: &std::fs::File, at: u64, len: u64) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(offset) = libc::off_t::try_from(at) else {
        return false;
    };
    // SAFETY: lseek(2) on a descriptor this function borrows; it moves the file offset,
    // which nothing here uses (every read is positioned: read_exact_at).
    let data = unsafe { libc::lseek(file.as_raw_fd(), offset, libc::SEEK_DATA) };
    if data < 0 {
        // ENXIO: no data at or after `at`, all hole to the end of the file.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
    }
    u64::try_from(data).is_ok_and(|d| d >= at.saturating_add(len))
}

async fn one_block(
    target: &Target,
    file: &Arc<std::fs::File>,
    path: &Path,
    at: u64,
    len: u64,
    known: &HashSet<String>,
    pacer: &Pacer,
) -> Result<Stored, BackupError> {
    let f = file.clone();
    if join(tokio::task::spawn_blocking(move || is_hole(&f, at, len))).await? {
        return Ok(Stored::Hole);
    }
    pacer.take(len).await;
    let (file, path2) = (file.clone(), path.to_owned());
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
        file.read_exact_at(&mut buf, at)
            .map_err(|e| BackupError::io("read", &path2, e))?;
        if block::is_zero(&buf) {
            return Ok(None);
        }
        let h = block::hash(&buf);
        Ok::<_, BackupError>(Some((buf, h)))
    });
    let Some((buf, hash)) = join(read).await?? else {
        return Ok(Stored::Zero);
    };
    let object = names::block(&hash);
    if known.contains(&hash) {
        return Ok(Stored::Known(hash));
    }
    if target.size(&object).await?.is_some_and(|n| n > 0) {
        return Ok(Stored::Found(hash));
    }
    let zipped = join(tokio::task::spawn_blocking(move || block::compress(&buf)))
        .await?
        .map_err(|e| BackupError::io("compress a block of", path, e))?;
    let n = zipped.len() as u64;
    target.put(&object, Bytes::from(zipped)).await?;
    Ok(Stored::New(hash, n))
}

pub(crate) async fn join<T>(h: tokio::task::JoinHandle<T>) -> Result<T, BackupError> {
    h.await.map_err(|e| BackupError::Invalid {
        what: format!("a block task failed: {e}"),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A thin volume's holes are not read; zeros that were written are read and found zero;
    /// both are stored nowhere.
    #[test]
    fn holes_are_skipped_without_reading() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("snap");
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(8 * MIB).unwrap();
        file.write_all_at(&[7u8; 4096], 2 * MIB + 8192).unwrap();
        file.write_all_at(&[9u8; 4096], 5 * MIB).unwrap();
        file.write_all_at(&vec![0u8; 1 << 20], 6 * MIB).unwrap();
        file.sync_all().unwrap();
        assert!(is_hole(&file, 0, MIB) && is_hole(&file, 7 * MIB, MIB));
        assert!(!is_hole(&file, 2 * MIB, MIB) && !is_hole(&file, 6 * MIB, MIB));
        let store = dir.path().join("target");
        std::fs::create_dir(&store).unwrap();
        let spec = crate::TargetSpec::Dir {
            path: store.display().to_string(),
        };
        let target = Target::open("t", &spec, None).unwrap();
        let plan = BackupPlan {
            backup: "v-1".into(),
            volume: "v".into(),
            cluster: None,
            snapshot: None,
            taken_ms: 1,
            size_bytes: 8 * MIB,
            block_bytes: MIB,
            encryption: None,
            previous: None,
            bytes_per_sec: 0,
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        let m = rt
            .block_on(back_up(&target, &image, plan, Arc::new(Progress::new(0))))
            .unwrap();
        let st = &m.stats;
        assert_eq!(
            (st.new_blocks, st.zero_blocks, st.read_bytes),
            (2, 6, 3 * MIB),
            "{st:?}"
        );
        assert_eq!(m.blocks.keys().copied().collect::<Vec<_>>(), [2, 5]);
    }
}
