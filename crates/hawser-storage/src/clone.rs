//! Copies of whole files for snapshots, clones and restores: shared extents where the
//! filesystem has reflinks (XFS with `reflink=1`, btrfs: the `FICLONE` ioctl, which takes
//! milliseconds and no space until either copy is written), else a copy of the allocated
//! ranges only (ext4: holes stay holes, data is read and written once, and the copy takes its
//! full space).
//!
//! The copy is made under a temporary name, made durable, then linked into place, so after
//! a crash the target either does not exist or is complete.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// How a copy was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloneKind {
    /// Extents shared with the source (`FICLONE`).
    Reflink,
    /// The source's allocated ranges copied (`copy_file_range`, or read and write).
    Copy,
}

impl CloneKind {
    pub fn name(self) -> &'static str {
        match self {
            CloneKind::Reflink => "reflink",
            CloneKind::Copy => "copy",
        }
    }
}

/// Largest piece copied at once by the read-and-write fallback.
const COPY_CHUNK: usize = 1 << 20;

/// Make `dst` (which must not exist: an existing one is an error) a durable copy of `src`, `len` bytes long (at least the
/// source's length: a longer copy reads as zeros past the source's end). Shares extents when
/// it can. On error nothing is left at `dst`.
pub fn clone_file(src: &Path, dst: &Path, len: u64) -> io::Result<CloneKind> {
    let tmp = dst.with_extension("clonetmp");
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let from = File::open(src)?;
        let src_len = from.metadata()?.len();
        if len < src_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a copy of {src_len} bytes cannot be {len} bytes long"),
            ));
        }
        let to = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let kind = clone_into(&from, &to, src_len)?;
        if len > src_len {
            to.set_len(len)?;
        }
        to.sync_all()?;
        Ok(kind)
    })();
    match result {
        Ok(kind) => {
            // A link, not a rename: it fails if `dst` exists rather than replacing it.
            let linked = std::fs::hard_link(&tmp, dst);
            let _ = std::fs::remove_file(&tmp);
            linked?;
            crate::file_ops::sync_dir(dst)?;
            Ok(kind)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Make the empty `to` a copy of `from` (`len` bytes).
pub(crate) fn clone_into(from: &File, to: &File, len: u64) -> io::Result<CloneKind> {
    // SAFETY: FICLONE takes the source descriptor as its argument; both descriptors are open
    // for the duration of the call, and the kernel reads nothing else from our memory.
    let r = unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) };
    if r == 0 {
        return Ok(CloneKind::Reflink);
    }
    let e = io::Error::last_os_error();
    if !no_reflink(&e) {
        return Err(e);
    }
    to.set_len(len)?;
    let mut at = 0;
    while let Some((start, end)) = next_data(from, at, len)? {
        copy_range(from, to, start, end - start)?;
        at = end;
    }
    Ok(CloneKind::Copy)
}

/// Errors that mean "this filesystem (or this pair of files) cannot share extents".
fn no_reflink(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EXDEV | libc::EINVAL | libc::ENOSYS)
    )
}

/// The next range of `file` at or after `at` that holds data (`SEEK_DATA` / `SEEK_HOLE`), up
/// to `len`; None past the last. A filesystem without them reports everything as data.
fn next_data(file: &File, at: u64, len: u64) -> io::Result<Option<(u64, u64)>> {
    if at >= len {
        return Ok(None);
    }
    let seek = |whence| -> io::Result<Option<u64>> {
        let off = libc::off64_t::try_from(at).map_err(|_| einval())?;
        // SAFETY: lseek64 on an open descriptor; it touches no memory of ours.
        let r = unsafe { libc::lseek64(file.as_raw_fd(), off, whence) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENXIO) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(u64::try_from(r).map_err(|_| einval())?))
    };
    let Some(start) = seek(libc::SEEK_DATA)? else {
        return Ok(None);
    };
    if start >= len {
        return Ok(None);
    }
    let end = seek(libc::SEEK_HOLE)?.unwrap_or(len).min(len);
    Ok(Some((start, end.max(start))))
}

/// Copy `[offset, offset + len)` of `from` to the same offsets of `to`.
fn copy_range(from: &File, to: &File, offset: u64, len: u64) -> io::Result<()> {
    let mut done = 0u64;
    while done < len {
        let mut off_in = libc::loff_t::try_from(offset + done).map_err(|_| einval())?;
        let mut off_out = off_in;
        let want = usize::try_from(len - done)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        // SAFETY: both descriptors are open; the offsets are valid pointers to locals the
        // kernel updates.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut off_in,
                to.as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        if n > 0 {
            done += u64::try_from(n).map_err(|_| einval())?;
            continue;
        }
        if n == 0 {
            // The source ended early (it shrank under us): what is left reads as zeros.
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL) => {
                return read_write(from, to, offset + done, len - done);
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// The plain copy, for when `copy_file_range` cannot.
fn read_write(from: &File, to: &File, offset: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from(len - done)
            .unwrap_or(COPY_CHUNK)
            .min(COPY_CHUNK);
        let got = from.read_at(&mut buf[..n], offset + done)?;
        if got == 0 {
            return Ok(());
        }
        to.write_all_at(&buf[..got], offset + done)?;
        done += got as u64;
    }
    Ok(())
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn a_copy_has_the_same_bytes_and_keeps_holes_as_holes() {
        let d = dir();
        let (src, dst) = (d.path().join("a"), d.path().join("b"));
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[7u8; 8192], 1 << 20).unwrap();
        f.write_all_at(&[9u8; 4096], (40 << 20) + 4096).unwrap();
        f.sync_all().unwrap();
        let kind = clone_file(&src, &dst, 64 << 20).unwrap();
        let (a, b) = (std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        assert_eq!(a.len(), b.len());
        assert!(a == b, "contents differ ({kind:?})");
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(
            blocks < 8 << 20,
            "{blocks} bytes allocated for 12 KiB of data ({kind:?})"
        );
        // The temporary name is gone; a second copy to the same name is refused.
        assert!(!dst.with_extension("clonetmp").exists());
        assert!(clone_file(&src, &dst, 64 << 20).is_err());
        assert_eq!(
            std::fs::read(&dst).unwrap(),
            a,
            "the refused copy left it alone"
        );
    }

    #[test]
    fn a_longer_copy_reads_zeros_past_the_source_and_a_shorter_one_is_refused() {
        let d = dir();
        let (src, dst) = (d.path().join("a"), d.path().join("b"));
        std::fs::write(&src, [5u8; 4096]).unwrap();
        clone_file(&src, &dst, 16384).unwrap();
        let b = std::fs::read(&dst).unwrap();
        assert_eq!(b.len(), 16384);
        assert!(b[..4096].iter().all(|&x| x == 5) && b[4096..].iter().all(|&x| x == 0));
        let e = clone_file(&src, &d.path().join("c"), 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(!d.path().join("c").exists() && !d.path().join("c.clonetmp").exists());
    }

    #[test]
    fn a_missing_source_fails_and_leaves_nothing() {
        let d = dir();
        let dst = d.path().join("b");
        assert!(clone_file(&d.path().join("none"), &dst, 4096).is_err());
        assert!(!dst.exists() && !dst.with_extension("clonetmp").exists());
    }
}
