//! Reading a backup back: every block is fetched, decompressed and checked against its hash
//! before it is written, and a missing or corrupt block stops the restore, named.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use crate::constants::{MAX_IN_FLIGHT_BLOCKS, MAX_MANIFEST_BYTES};
use crate::error::BackupError;
use crate::manifest::Manifest;
use crate::progress::{Pacer, Progress};
use crate::readers::ReadHold;
use crate::target::Target;
use crate::upload::join;
use crate::{block, names};

/// The manifest of `backup` on `target`.
pub async fn read_manifest(target: &Target, backup: &str) -> Result<Manifest, BackupError> {
    names::validate_backup(backup)?;
    match target
        .get(&names::manifest(backup), MAX_MANIFEST_BYTES)
        .await?
    {
        Some(bytes) => Manifest::decode(backup, &bytes),
        None => Err(BackupError::NotFound {
            target: target.name().to_owned(),
            backup: backup.to_owned(),
        }),
    }
}

/// The backups on `target`, by name (complete ones only: a manifest is written last).
pub async fn list_backups(target: &Target) -> Result<Vec<String>, BackupError> {
    let objects = target.list(names::BACKUPS).await?;
    Ok(objects
        .iter()
        .filter_map(|o| names::backup_of(o))
        .map(str::to_owned)
        .collect())
}

/// What a sink is given to write at an offset.
pub enum Chunk<'a> {
    /// A block's data.
    Data(&'a [u8]),
    /// This many bytes of zeros: a block that held data in the base and is all zeros now.
    Zeros(u64),
}

/// Writes one block at an offset (blocking: it runs on the blocking pool).
pub type BlockSink = Arc<dyn Fn(u64, Chunk<'_>) -> std::io::Result<()> + Send + Sync>;

/// Where a restore writes, and what it does with the blocks that are all zeros.
#[derive(Clone)]
pub enum Dest<'a> {
    /// Check every block and write nothing (`hawser backup verify`).
    Verify,
    /// A file that reads as zeros where nothing is written: a new replica's.
    Blank(&'a Path),
    /// A file with other data in it: zero blocks are written as zeros.
    Overwrite(&'a Path),
    /// Something that reads as zeros where nothing is written (a new replica, written through
    /// its own checks and checksums); `name` is what errors call it.
    Sink { name: &'a str, write: BlockSink },
}

/// The newest complete backup of `volume` on `target` (by the time in its name; its manifest
/// must name the volume too), if any.
pub async fn latest_backup(target: &Target, volume: &str) -> Result<Option<Manifest>, BackupError> {
    let mut mine: Vec<((u64, u32), String)> = list_backups(target)
        .await?
        .into_iter()
        .filter_map(|b| names::order_of(&b, volume).map(|o| (o, b)))
        .collect();
    mine.sort();
    for (_, b) in mine.iter().rev() {
        match read_manifest(target, b).await {
            Ok(m) if m.volume == volume => return Ok(Some(m)),
            // Another volume's backup under a name that looks like one of this volume's,
            // or a manifest deleted since it was listed: not this volume's newest.
            Ok(_) | Err(BackupError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// What one block of a restore needs.
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    /// The destination holds it already.
    Skip,
    /// Write zeros: the destination may hold other data there.
    Zeros,
    /// Fetch this block and write it.
    Fetch(&'a str),
}

/// What the destination holds before a restore.
#[derive(Clone, Copy)]
pub enum Before<'a> {
    /// Zeros everywhere.
    Blank,
    /// Anything.
    Unknown,
    /// Exactly this backup, and zeros past its end.
    Backup(&'a Manifest),
}

fn step<'a>(m: &'a Manifest, before: Before<'_>, index: u64) -> Step<'a> {
    let new = m.blocks.get(&index).map(String::as_str);
    let old = match before {
        Before::Blank => None,
        Before::Unknown => return new.map_or(Step::Zeros, Step::Fetch),
        Before::Backup(b) => b.blocks.get(&index).map(String::as_str),
    };
    match (new, old) {
        (new, old) if new == old => Step::Skip,
        (Some(h), _) => Step::Fetch(h),
        (None, Some(_)) => Step::Zeros,
        (None, None) => Step::Skip,
    }
}

/// Restores `manifest`'s volume into `dest`. Fails before writing anything past the first bad
/// block, and says which block, at which offset, and what was wrong with it.
pub async fn restore(
    target: &Target,
    manifest: &Manifest,
    dest: Dest<'_>,
    progress: Arc<Progress>,
    bytes_per_sec: u64,
) -> Result<(), BackupError> {
    let before = match dest {
        Dest::Overwrite(_) => Before::Unknown,
        _ => Before::Blank,
    };
    restore_over(target, manifest, before, dest, progress, bytes_per_sec).await
}

/// Restores `manifest` over a destination that holds `before`: with a backup there (a
/// standby volume applying the next backup, docs/backup.md), only the blocks whose content
/// differs are written, and a block that became zeros is written as zeros. A base cut in
/// blocks of another size counts as unknown data: every block is written. Applying the same
/// manifest over a base again, after an apply that stopped half-way, ends in the same bytes.
/// The backup is held on the target while it is read (`readers.rs`): this needs write access
/// to the target's `locks/`.
pub async fn restore_over(
    target: &Target,
    manifest: &Manifest,
    before: Before<'_>,
    dest: Dest<'_>,
    progress: Arc<Progress>,
    bytes_per_sec: u64,
) -> Result<(), BackupError> {
    manifest.validate()?;
    // Before a block is relied on: no prune deletes what this backup names until released,
    // even if the backup is deleted meanwhile (readers.rs).
    let hold = ReadHold::take(target, &manifest.backup).await?;
    let done = held(target, manifest, before, dest, progress, bytes_per_sec).await;
    hold.release().await;
    done
}

/// [`restore_over`] under its hold on the backup.
async fn held(
    target: &Target,
    manifest: &Manifest,
    before: Before<'_>,
    dest: Dest<'_>,
    progress: Arc<Progress>,
    bytes_per_sec: u64,
) -> Result<(), BackupError> {
    let before = match before {
        Before::Backup(b) if b.block_bytes != manifest.block_bytes => Before::Unknown,
        b => b,
    };
    let (file, path) = match &dest {
        Dest::Verify | Dest::Sink { .. } => (None, None),
        Dest::Blank(p) | Dest::Overwrite(p) => (
            Some(open_dest(p, manifest.size_bytes)?),
            Some(p.to_path_buf()),
        ),
    };
    let sink = match &dest {
        Dest::Sink { name, write } => Some((name.to_string(), write.clone())),
        _ => None,
    };
    let pacer = Arc::new(Pacer::new(bytes_per_sec));
    let ctx = Arc::new((
        target.clone(),
        manifest.clone(),
        file.clone(),
        path.clone(),
        sink,
    ));
    futures::stream::iter(0..manifest.block_count())
        .map(|index| {
            let (ctx, pacer, progress) = (ctx.clone(), pacer.clone(), progress.clone());
            async move {
                let (target, m, file, path, sink) = &*ctx;
                let (at, len) = m.block_range(index);
                let hash = match step(m, before, index) {
                    Step::Skip => {
                        progress.advance(len, 0);
                        return Ok(());
                    }
                    Step::Zeros => {
                        put(file, path, sink, at, Put::Zeros(len)).await?;
                        progress.advance(len, 0);
                        return Ok(());
                    }
                    Step::Fetch(h) => h,
                };
                pacer.take(len).await;
                let (data, sent) = fetch(target, m, index, hash).await?;
                put(file, path, sink, at, Put::Data(data)).await?;
                progress.advance(len, sent);
                Ok::<_, BackupError>(())
            }
        })
        .buffer_unordered(MAX_IN_FLIGHT_BLOCKS)
        .try_collect::<Vec<()>>()
        .await?;
    if let (Some(f), Some(p)) = (file, path) {
        join(tokio::task::spawn_blocking(move || {
            f.sync_all().map_err(|e| BackupError::io("sync", &p, e))
        }))
        .await??;
    }
    Ok(())
}

/// A block to write, owned (it crosses to the blocking pool).
enum Put {
    Data(Vec<u8>),
    Zeros(u64),
}

/// Writes one block into a file or a sink; nothing for `Dest::Verify`.
async fn put(
    file: &Option<Arc<std::fs::File>>,
    path: &Option<std::path::PathBuf>,
    sink: &Option<(String, BlockSink)>,
    at: u64,
    block: Put,
) -> Result<(), BackupError> {
    if let (Some(f), Some(p)) = (file, path) {
        let data = match block {
            Put::Data(d) => d,
            Put::Zeros(len) => vec![0; usize::try_from(len).unwrap_or(0)],
        };
        return write_at(f.clone(), p, data, at).await;
    }
    let Some((name, write)) = sink else {
        return Ok(());
    };
    let (write, name) = (write.clone(), name.clone());
    join(tokio::task::spawn_blocking(move || {
        let chunk = match &block {
            Put::Data(d) => Chunk::Data(d),
            Put::Zeros(len) => Chunk::Zeros(*len),
        };
        write(at, chunk).map_err(|e| BackupError::Io {
            what: "write a block to",
            path: name,
            source: e,
        })
    }))
    .await?
}

/// One block, checked: its bytes and how many crossed the network.
async fn fetch(
    target: &Target,
    m: &Manifest,
    index: u64,
    hash: &str,
) -> Result<(Vec<u8>, u64), BackupError> {
    let object = names::block(hash);
    let (offset, len) = m.block_range(index);
    // zstd never needs more than this for a block of `len` (its compress bound, with room).
    let limit = len + len / 128 + 4096;
    let stored = match target.get(&object, limit).await {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(BackupError::MissingBlock {
                target: target.name().to_owned(),
                backup: m.backup.clone(),
                index,
                offset,
                object,
            })
        }
        Err(BackupError::BadTarget { why, .. }) => {
            return Err(corrupt(target, m, index, object, why));
        }
        Err(e) => return Err(e),
    };
    let sent = stored.len() as u64;
    let (h, obj) = (hash.to_owned(), object.clone());
    let opened = join(tokio::task::spawn_blocking(move || {
        block::open(&stored, len, &h)
    }))
    .await?;
    let data = opened.map_err(|why| corrupt(target, m, index, obj, why.to_string()))?;
    Ok((data, sent))
}

fn corrupt(target: &Target, m: &Manifest, index: u64, object: String, why: String) -> BackupError {
    let (offset, _) = m.block_range(index);
    BackupError::CorruptBlock {
        target: target.name().to_owned(),
        backup: m.backup.clone(),
        index,
        offset,
        object,
        why,
    }
}

fn open_dest(path: &Path, size: u64) -> Result<Arc<std::fs::File>, BackupError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| BackupError::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| BackupError::io("stat", path, e))?
        .len();
    if len < size {
        return Err(BackupError::Invalid {
            what: format!(
                "{} is {len} bytes, less than the backup's {size}",
                path.display()
            ),
        });
    }
    Ok(Arc::new(file))
}

async fn write_at(
    file: Arc<std::fs::File>,
    path: &Path,
    data: Vec<u8>,
    at: u64,
) -> Result<(), BackupError> {
    let path = path.to_owned();
    join(tokio::task::spawn_blocking(move || {
        file.write_all_at(&data, at)
            .map_err(|e| BackupError::io("write", &path, e))
    }))
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(blocks: &[(u64, &str)], block_bytes: u64) -> Manifest {
        let mut m = crate::manifest::tests::sample();
        m.block_bytes = block_bytes;
        m.size_bytes = 8 * block_bytes;
        m.blocks = blocks.iter().map(|(i, h)| (*i, h.repeat(64))).collect();
        m
    }

    #[test]
    fn applying_over_a_base_writes_only_what_changed() {
        let base = manifest(&[(0, "a"), (1, "b"), (2, "c")], 1024);
        let next = manifest(&[(0, "a"), (1, "d"), (3, "e")], 1024);
        let a = "a".repeat(64);
        let steps: Vec<Step> = (0..5)
            .map(|i| step(&next, Before::Backup(&base), i))
            .collect();
        let (d, e) = ("d".repeat(64), "e".repeat(64));
        assert_eq!(
            steps,
            [
                Step::Skip,
                Step::Fetch(&d),
                Step::Zeros,
                Step::Fetch(&e),
                Step::Skip
            ]
        );
        // Blank: zeros are skipped; unknown data: zeros are written.
        assert_eq!(step(&next, Before::Blank, 0), Step::Fetch(&a));
        assert_eq!(step(&next, Before::Blank, 2), Step::Skip);
        assert_eq!(step(&next, Before::Unknown, 2), Step::Zeros);
        assert_eq!(step(&next, Before::Unknown, 0), Step::Fetch(&a));
    }
}
