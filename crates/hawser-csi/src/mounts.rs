//! Filesystems and mounts on the node: what is mounted where (from /proc/self/mountinfo),
//! making a filesystem only on a blank device, bind mounts for pods, usage, growth.
//!
//! The commands are the standard ones (`mount`, `umount`, `blkid`, `mkfs.*`, `resize2fs`,
//! `xfs_growfs`, `losetup`): their behaviour is what administrators know and debug.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{cmd} {args} failed ({status}): {stderr}")]
    Command {
        cmd: String,
        args: String,
        status: String,
        stderr: String,
    },
    #[error("run {cmd}: {source}")]
    Spawn { cmd: String, source: io::Error },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "{device} holds a {found} filesystem, not the {wanted} asked; Hawser never formats \
         over existing data"
    )]
    WrongFs {
        device: PathBuf,
        found: String,
        wanted: String,
    },
    #[error("{device} holds data ({found}) that is not a filesystem; refusing to format over it")]
    NotBlank { device: PathBuf, found: String },
    #[error("filesystem type {0:?} is not supported: ext4 or xfs")]
    UnknownFs(String),
    #[error("{target} is already mounted, from another device than {device}")]
    MountedElsewhere { target: PathBuf, device: PathBuf },
}

type Result<T> = std::result::Result<T, MountError>;

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Runs a command; its stdout on success, an error with its stderr otherwise.
pub(crate) fn run(cmd: &str, args: &[&std::ffi::OsStr]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|source| MountError::Spawn {
            cmd: cmd.into(),
            source,
        })?;
    if !out.status.success() {
        return Err(MountError::Command {
            cmd: cmd.into(),
            args: args
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted filesystem's device.
    pub dev: String,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(MountEntry {
                dev: l.get(2)?.to_string(),
                mount_point: PathBuf::from(unescape(l.get(4)?)),
                fs_type: r.first()?.to_string(),
                source: unescape(r.get(1)?),
            })
        })
        .collect()
}

pub fn mount_entries() -> Result<Vec<MountEntry>> {
    let path = Path::new("/proc/self/mountinfo");
    let text = std::fs::read_to_string(path).map_err(io_err("read", path))?;
    Ok(parse_mountinfo(&text))
}

/// The path as mountinfo shows it (symlinks resolved when it exists).
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The topmost mount at `path`, if something is mounted there.
pub fn mount_at(path: &Path) -> Result<Option<MountEntry>> {
    let p = canonical(path);
    Ok(mount_entries()?
        .into_iter()
        .rev()
        .find(|e| e.mount_point == p))
}

pub fn is_mount_point(path: &Path) -> Result<bool> {
    Ok(mount_at(path)?.is_some())
}

/// `major:minor` of a block device node.
fn dev_numbers(device: &Path) -> Result<String> {
    let rdev = std::fs::metadata(device)
        .map_err(io_err("stat", device))?
        .rdev();
    Ok(format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
}

/// What a device holds, by blkid's low-level probe.
#[derive(Debug, PartialEq, Eq)]
enum Contents {
    Blank,
    Fs(String),
    /// A partition table or another signature that is no filesystem.
    Other(String),
}

fn probe(device: &Path) -> Result<Contents> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(device)
        .output()
        .map_err(|source| MountError::Spawn {
            cmd: "blkid".into(),
            source,
        })?;
    // blkid exits 2 when it finds no signature at all: the device is blank.
    match out.status.code() {
        Some(2) => return Ok(Contents::Blank),
        Some(0) => {}
        _ => {
            return Err(MountError::Command {
                cmd: "blkid".into(),
                args: format!("-p -o export {}", device.display()),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .map(str::to_string)
    };
    Ok(match (field("TYPE"), field("PTTYPE")) {
        (Some(t), _) => Contents::Fs(t),
        (None, Some(pt)) => Contents::Other(format!("a {pt} partition table")),
        (None, None) => Contents::Other("an unknown signature".into()),
    })
}

/// The filesystem on `device`, `None` when it is blank.
pub fn fs_type_of(device: &Path) -> Result<Option<String>> {
    match probe(device)? {
        Contents::Blank => Ok(None),
        Contents::Fs(t) => Ok(Some(t)),
        Contents::Other(found) => Err(MountError::NotBlank {
            device: device.to_path_buf(),
            found,
        }),
    }
}

fn mkfs(device: &Path, fs_type: &str) -> Result<()> {
    let d = device.as_os_str();
    // No discard: the volume is new, and a discard of every block through NBD is slow.
    match fs_type {
        "ext4" => run(
            "mkfs.ext4",
            &["-q".as_ref(), "-E".as_ref(), "nodiscard".as_ref(), d],
        ),
        "xfs" => run("mkfs.xfs", &["-q".as_ref(), "-K".as_ref(), d]),
        other => return Err(MountError::UnknownFs(other.into())),
    }
    .map(|_| ())
}

/// Makes an `fs_type` filesystem on `device` if (and only if) it is blank, and mounts it at
/// `target` with `flags`. Already mounted there from `device`: done.
pub fn format_and_mount(
    device: &Path,
    fs_type: &str,
    flags: &[String],
    target: &Path,
) -> Result<()> {
    if !matches!(fs_type, "ext4" | "xfs") {
        return Err(MountError::UnknownFs(fs_type.into()));
    }
    if let Some(m) = mount_at(target)? {
        if m.dev == dev_numbers(device)? {
            return Ok(());
        }
        return Err(MountError::MountedElsewhere {
            target: target.to_path_buf(),
            device: device.to_path_buf(),
        });
    }
    match probe(device)? {
        Contents::Blank => mkfs(device, fs_type)?,
        Contents::Fs(t) if t == "ext4" && fs_type == "ext4" => grow_ext4_unmounted(device)?,
        Contents::Fs(t) if t == fs_type => {}
        Contents::Fs(found) => {
            return Err(MountError::WrongFs {
                device: device.to_path_buf(),
                found,
                wanted: fs_type.into(),
            })
        }
        Contents::Other(found) => {
            return Err(MountError::NotBlank {
                device: device.to_path_buf(),
                found,
            })
        }
    }
    std::fs::create_dir_all(target).map_err(io_err("create", target))?;
    let mut args: Vec<&std::ffi::OsStr> = vec!["-t".as_ref(), fs_type.as_ref()];
    let opts = flags.join(",");
    if !opts.is_empty() {
        args.push("-o".as_ref());
        args.push(opts.as_ref());
    }
    args.extend([device.as_os_str(), target.as_os_str()]);
    run("mount", &args).map(|_| ())
}

fn remount_read_only(target: &Path) -> Result<()> {
    run(
        "mount",
        &[
            "-o".as_ref(),
            "remount,bind,ro".as_ref(),
            target.as_os_str(),
        ],
    )
    .map(|_| ())
}

/// Bind-mounts directory `source` at `target` (which must exist), read-only if asked.
pub fn bind_mount(source: &Path, target: &Path, read_only: bool) -> Result<()> {
    run(
        "mount",
        &["--bind".as_ref(), source.as_os_str(), target.as_os_str()],
    )?;
    if read_only {
        remount_read_only(target)?;
    }
    Ok(())
}

/// Bind-mounts the device node `device` on the file `target` (created if missing): how a raw
/// block volume is handed to the kubelet.
pub fn bind_device(device: &Path, target: &Path, read_only: bool) -> Result<()> {
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(target)
        .map_err(io_err("create", target))?;
    bind_mount(device, target, read_only)
}

/// Unmounts `path`; not mounted is fine.
pub fn unmount(path: &Path) -> Result<()> {
    if !is_mount_point(path)? {
        return Ok(());
    }
    run("umount", &[path.as_os_str()]).map(|_| ())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsStats {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub used_inodes: u64,
}

pub fn fs_stats(path: &Path) -> Result<FsStats> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| MountError::Io {
        what: "statvfs",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, e),
    })?;
    // SAFETY: an all-zero statvfs is a valid value of the plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a writable statvfs, both live for the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    if rc != 0 {
        return Err(io_err("statvfs", path)(io::Error::last_os_error()));
    }
    let frsize = s.f_frsize.max(1);
    let (blocks, bfree, bavail) = (s.f_blocks, s.f_bfree, s.f_bavail);
    Ok(FsStats {
        total_bytes: blocks.saturating_mul(frsize),
        available_bytes: bavail.saturating_mul(frsize),
        used_bytes: blocks.saturating_sub(bfree).saturating_mul(frsize),
        total_inodes: s.f_files,
        free_inodes: s.f_ffree,
        used_inodes: s.f_files.saturating_sub(s.f_ffree),
    })
}

/// The size of a block device (ioctl BLKGETSIZE64).
pub fn block_device_size(device: &Path) -> Result<u64> {
    use std::os::fd::AsRawFd;
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let f = std::fs::File::open(device).map_err(io_err("open", device))?;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid for the call;
    // the descriptor is open for its duration.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(io_err("BLKGETSIZE64", device)(io::Error::last_os_error()));
    }
    Ok(size)
}

/// The size of the ext4 filesystem on `device` (block count times block size).
pub fn ext4_size(device: &Path) -> Result<u64> {
    let out = run("dumpe2fs", &["-h".as_ref(), device.as_os_str()])?;
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    match (field("Block count:"), field("Block size:")) {
        (Some(n), Some(b)) => Ok(n.saturating_mul(b)),
        _ => Err(MountError::Command {
            cmd: "dumpe2fs".into(),
            args: format!("-h {}", device.display()),
            status: "no block count or size in its output".into(),
            stderr: String::new(),
        }),
    }
}

/// Grows an unmounted ext4 filesystem to its device, if the device grew (an expanded
/// volume): offline, because online ext4 growth needs CAP_SYS_RESOURCE, which a node plugin
/// may lack. resize2fs wants a freshly checked filesystem, so e2fsck runs first.
fn grow_ext4_unmounted(device: &Path) -> Result<()> {
    if ext4_size(device)? >= block_device_size(device)? {
        return Ok(());
    }
    let out = Command::new("e2fsck")
        .args(["-f", "-p"])
        .arg(device)
        .output()
        .map_err(|source| MountError::Spawn {
            cmd: "e2fsck".into(),
            source,
        })?;
    // 0: clean; 1: errors corrected. Anything else needs a human.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(MountError::Command {
            cmd: "e2fsck".into(),
            args: format!("-f -p {}", device.display()),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        });
    }
    run("resize2fs", &[device.as_os_str()]).map(|_| ())
}

/// Grows the filesystem on `device`, mounted at `mount_path`, to the device's size; nothing
/// to do when it already fills the device (NodeStage grows ext4 before mounting it).
pub fn grow_fs(device: &Path, mount_path: &Path, fs_type: &str) -> Result<()> {
    match fs_type {
        "ext4" if ext4_size(device)? >= block_device_size(device)? => return Ok(()),
        "ext4" => run("resize2fs", &[device.as_os_str()]),
        "xfs" => run("xfs_growfs", &[mount_path.as_os_str()]),
        other => return Err(MountError::UnknownFs(other.into())),
    }
    .map(|_| ())
}

/// Makes a loop device see its backing file's current size.
pub fn refresh_loop_size(device: &Path) -> Result<()> {
    run("losetup", &["-c".as_ref(), device.as_os_str()]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes() {
        let text = "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 35 7:3 / /var/lib/kubelet/x rw shared:5 - xfs /dev/loop3 rw,attr2\n\
                    garbage line\n";
        let e = parse_mountinfo(text);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!((e[0].dev.as_str(), e[0].fs_type.as_str()), ("98:0", "ext3"));
        assert_eq!(e[1].source, "/dev/loop3");
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("tail\\04"), "tail\\04");
    }
}
