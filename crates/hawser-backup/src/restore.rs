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

/// Writes one block's data at an offset (blocking: it runs on the blocking pool).
pub type BlockSink = Arc<dyn Fn(u64, &[u8]) -> std::io::Result<()> + Send + Sync>;

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

/// Restores `manifest`'s volume into `dest`. Fails before writing anything past the first bad
/// block, and says which block, at which offset, and what was wrong with it.
pub async fn restore(
    target: &Target,
    manifest: &Manifest,
    dest: Dest<'_>,
    progress: Arc<Progress>,
    bytes_per_sec: u64,
) -> Result<(), BackupError> {
    manifest.validate()?;
    let (file, path, zeros) = match &dest {
        Dest::Verify | Dest::Sink { .. } => (None, None, false),
        Dest::Blank(p) => (
            Some(open_dest(p, manifest.size_bytes)?),
            Some(p.to_path_buf()),
            false,
        ),
        Dest::Overwrite(p) => (
            Some(open_dest(p, manifest.size_bytes)?),
            Some(p.to_path_buf()),
            true,
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
                let Some(hash) = m.blocks.get(&index) else {
                    if let (true, Some(f), Some(p)) = (zeros, file, path) {
                        write_at(f.clone(), p, vec![0; usize::try_from(len).unwrap_or(0)], at)
                            .await?;
                    }
                    progress.advance(len, 0);
                    return Ok(());
                };
                pacer.take(len).await;
                let (data, sent) = fetch(target, m, index, hash).await?;
                if let (Some(f), Some(p)) = (file, path) {
                    write_at(f.clone(), p, data, at).await?;
                } else if let Some((name, write)) = sink {
                    let (write, name) = (write.clone(), name.clone());
                    join(tokio::task::spawn_blocking(move || {
                        write(at, &data).map_err(|e| BackupError::Io {
                            what: "write a block to",
                            path: name,
                            source: e,
                        })
                    }))
                    .await??;
                }
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
    let data = opened.map_err(|why| corrupt(target, m, index, obj, why))?;
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
