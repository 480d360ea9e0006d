//! Thin, checked wrappers over the Linux file calls replicas need: O_DIRECT open, positional
//! I/O with RWF_DSYNC, fallocate modes, fdatasync, statvfs, and atomic small-file replacement.

use std::fs::{File, OpenOptions};
use std::io;

use hawser_wire::constants::MAX_ID_BYTES;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Open a data file for read/write, with O_DIRECT when the filesystem supports it (tmpfs does
/// not). Returns the file and whether O_DIRECT is on.
pub fn open_data(path: &Path, create_new: bool) -> io::Result<(File, bool)> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true);
    if create_new {
        opts.create_new(true);
    }
    match opts.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(path = %path.display(), "filesystem refuses O_DIRECT; using buffered I/O");
            Ok((opts.open(path)?, false))
        }
        Err(e) => Err(e),
    }
}

/// Write all of `data` at `offset`; with `dsync` the data is durable on return (RWF_DSYNC, or
/// write + fdatasync where the kernel lacks pwritev2).
pub fn write_at(file: &File, data: &[u8], offset: u64, dsync: bool) -> io::Result<()> {
    if !dsync {
        return file.write_all_at(data, offset);
    }
    let mut done = 0usize;
    while done < data.len() {
        let rest = &data[done..];
        let iov = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        let off = i64::try_from(offset + done as u64).map_err(|_| einval())?;
        // SAFETY: iov points into `data`, valid for `rest.len()` bytes for the whole call; the
        // fd is owned by `file`, which outlives the call.
        let n = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, off, libc::RWF_DSYNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => {
                    file.write_all_at(rest, offset + done as u64)?;
                    return file.sync_data();
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev2 wrote nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}

/// fallocate with the given mode over [offset, offset+len).
pub fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    let off = i64::try_from(offset).map_err(|_| einval())?;
    let len = i64::try_from(len).map_err(|_| einval())?;
    loop {
        // SAFETY: plain syscall on an fd owned by `file`; no memory is passed.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Deallocate a range (reads back as zeroes), keeping the file size.
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate(
        file,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        offset,
        len,
    )
}

/// Zero a range, keeping it allocated.
pub fn zero_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate(
        file,
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        offset,
        len,
    )
}

pub fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
    )
}

/// Filesystem size and free bytes (for unprivileged users) of the filesystem holding `path`.
pub fn fs_space(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| einval())?;
    // SAFETY: statvfs is plain old data; zeroed is a valid initial value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated string and `st` a valid out pointer.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let frsize = st.f_frsize;
    Ok((
        st.f_blocks.saturating_mul(frsize),
        st.f_bavail.saturating_mul(frsize),
    ))
}

/// Bytes a file occupies on disk.
pub fn allocated_bytes(file: &File) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(file.metadata()?.blocks().saturating_mul(512))
}

/// Replace `path` with `contents` atomically and durably: write a temporary file, fsync it,
/// rename it over `path`, fsync the directory. After a crash `path` holds the old or the new
/// contents, never a mix.
pub fn replace_file(path: &Path, contents: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all_at(contents, 0)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(path)
}

/// fsync the directory containing `path`, making a create/rename/unlink in it durable.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// Ids become file names: keep them to a safe alphabet.
pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
        && !id.starts_with('.')
}
