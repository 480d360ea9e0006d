//! A volume's block device on this node: `nbdfuse` exposes the volume's NBD export as a file
//! in a FUSE mount, and a loop device on that file is the block device the filesystem sits
//! on.
//!
//! Why this path: the kernel `nbd` module would be the direct frontend (netlink interface,
//! with a dead-connection timeout that holds I/O across an agent restart), but the kernels
//! Hawser is built and tested on have no `nbd` module, so that path is not implemented. Its
//! cost, said plainly: nbdfuse does not reconnect, so when the agent serving the export
//! restarts, I/O on the device fails until the volume is staged again.
//!
//! Each staged volume has a record, `<state-dir>/<volume>.json`, written before the loop
//! device exists and removed last, so a node service that restarts (or crashed midway) finds
//! what it made. `nbdfuse` runs in a session of its own (`setsid -f`), reparented to init: it
//! outlives the node service, and the mount keeps working across a restart of that service.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::mounts::{self, MountError};

/// How long nbdfuse may take to connect and expose the export.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long nbdfuse may take to exit once its FUSE mount is gone.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);
/// The export's file name inside the FUSE mount.
const EXPORT_FILE: &str = "nbd";

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("nbdfuse did not expose {uri} within {waited:?}: {log}")]
    NotReady {
        uri: String,
        waited: Duration,
        log: String,
    },
    #[error("invalid volume id {0:?}")]
    BadId(String),
    #[error("losetup gave {0:?}, not a loop device")]
    BadLoop(String),
}

type Result<T> = std::result::Result<T, DeviceError>;

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DeviceError + 'a {
    move |source| DeviceError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// What is kept on disk per staged volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    volume_id: String,
    uri: String,
    read_only: bool,
    fuse_dir: PathBuf,
    /// nbdfuse's process id, once it is serving.
    pid: Option<u32>,
    /// The loop device, once attached.
    loop_device: Option<PathBuf>,
}

/// A volume's device, staged and alive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedDevice {
    pub volume_id: String,
    /// `/dev/loopN`.
    pub device: PathBuf,
    pub size_bytes: u64,
    pub uri: String,
}

pub struct DeviceManager {
    state_dir: PathBuf,
}

impl Record {
    fn export_file(&self) -> PathBuf {
        self.fuse_dir.join(EXPORT_FILE)
    }

    /// The process is our nbdfuse for this record (not a reused pid).
    fn nbdfuse_alive(&self) -> bool {
        let Some(pid) = self.pid else { return false };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline);
        text.contains("nbdfuse") && text.contains(&*self.fuse_dir.to_string_lossy())
    }

    fn fuse_mounted(&self) -> bool {
        mounts::mount_at(&self.fuse_dir)
            .ok()
            .flatten()
            .is_some_and(|m| m.fs_type.starts_with("fuse"))
    }

    /// The loop device is still backed by this record's export file.
    fn loop_alive(&self) -> bool {
        self.loop_device
            .as_deref()
            .is_some_and(|d| loop_backing(d).as_deref() == Some(self.export_file().as_path()))
    }
}

/// The backing file of a loop device, from sysfs.
fn loop_backing(device: &Path) -> Option<PathBuf> {
    let name = device.file_name()?.to_string_lossy().into_owned();
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(text.trim_end()))
}

impl DeviceManager {
    pub fn new(state_dir: PathBuf) -> DeviceManager {
        DeviceManager { state_dir }
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.state_dir.join(format!("{id}.json"))
    }

    fn load(&self, id: &str) -> Result<Option<Record>> {
        let path = self.record_path(id);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    /// Writes the record durably: a temporary file, fsync, rename, fsync of the directory.
    fn save(&self, r: &Record) -> Result<()> {
        use std::io::Write;
        let path = self.record_path(&r.volume_id);
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(r).map_err(|e| DeviceError::Io {
            what: "encode",
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(&bytes).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
        std::fs::File::open(&self.state_dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync", &self.state_dir))
    }

    fn check_id(id: &str) -> Result<()> {
        hawser_api::validate_name("volume", id).map_err(|_| DeviceError::BadId(id.into()))
    }

    fn staged(r: &Record) -> Result<StagedDevice> {
        let device = r.loop_device.clone().unwrap_or_default();
        Ok(StagedDevice {
            volume_id: r.volume_id.clone(),
            size_bytes: mounts::block_device_size(&device)?,
            device,
            uri: r.uri.clone(),
        })
    }

    /// The volume's device: the one already staged when it is alive and the same, else a
    /// new one (leftovers of a dead one are cleaned first).
    pub fn connect(&self, id: &str, uri: &str, read_only: bool) -> Result<StagedDevice> {
        Self::check_id(id)?;
        std::fs::create_dir_all(&self.state_dir).map_err(io_err("create", &self.state_dir))?;
        if let Some(r) = self.load(id)? {
            let alive = r.nbdfuse_alive() && r.fuse_mounted() && r.loop_alive();
            if alive && r.uri == uri && r.read_only == read_only {
                return Self::staged(&r);
            }
            self.teardown(&r)?;
        }
        let mut r = Record {
            volume_id: id.into(),
            uri: uri.into(),
            read_only,
            fuse_dir: self.state_dir.join("fuse").join(id),
            pid: None,
            loop_device: None,
        };
        self.save(&r)?;
        match self.bring_up(&mut r) {
            Ok(d) => Ok(d),
            Err(e) => {
                if let Err(cleanup) = self.teardown(&r) {
                    tracing::warn!(volume = id, error = %cleanup, "cleaning up a failed connect");
                }
                Err(e)
            }
        }
    }

    fn bring_up(&self, r: &mut Record) -> Result<StagedDevice> {
        std::fs::create_dir_all(&r.fuse_dir).map_err(io_err("create", &r.fuse_dir))?;
        let pidfile = r.fuse_dir.with_extension("pid");
        let logfile = r.fuse_dir.with_extension("log");
        let _ = std::fs::remove_file(&pidfile);
        let log = std::fs::File::create(&logfile).map_err(io_err("create", &logfile))?;
        let err = log.try_clone().map_err(io_err("open", &logfile))?;
        // setsid -f: nbdfuse in a new session, not our child, so it outlives this process
        // and leaves no zombie; it writes its pid to the pidfile once it serves.
        let mut cmd = Command::new("setsid");
        cmd.args(["-f", "nbdfuse", "-P"]).arg(&pidfile);
        if r.read_only {
            cmd.arg("-r");
        }
        let status = cmd
            .arg(r.export_file())
            .arg(&r.uri)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .status()
            .map_err(io_err("run setsid nbdfuse for", &r.fuse_dir))?;
        if !status.success() {
            return Err(self.not_ready(r, &logfile, Duration::ZERO));
        }
        let start = Instant::now();
        let pid = loop {
            let pid = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok());
            if let Some(pid) = pid {
                if std::fs::metadata(r.export_file()).is_ok_and(|m| m.len() > 0) {
                    break pid;
                }
            }
            if start.elapsed() > CONNECT_TIMEOUT {
                return Err(self.not_ready(r, &logfile, start.elapsed()));
            }
            std::thread::sleep(POLL);
        };
        r.pid = Some(pid);
        self.save(r)?;
        let device = attach_loop(&r.export_file(), r.read_only)?;
        r.loop_device = Some(device);
        self.save(r)?;
        Self::staged(r)
    }

    fn not_ready(&self, r: &Record, logfile: &Path, waited: Duration) -> DeviceError {
        let log = std::fs::read_to_string(logfile).unwrap_or_default();
        DeviceError::NotReady {
            uri: r.uri.clone(),
            waited,
            log: log
                .trim()
                .chars()
                .rev()
                .take(500)
                .collect::<String>()
                .chars()
                .rev()
                .collect(),
        }
    }

    /// The volume's device if it is staged here and alive.
    pub fn find(&self, id: &str) -> Result<Option<StagedDevice>> {
        Self::check_id(id)?;
        match self.load(id)? {
            Some(r) if r.nbdfuse_alive() && r.fuse_mounted() && r.loop_alive() => {
                Self::staged(&r).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The volumes with a record here (alive or not).
    pub fn recorded(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(&self.state_dir) else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".json").map(str::to_string)
            })
            .collect()
    }

    /// Removes the volume's device: loop device, FUSE mount, nbdfuse, files. Idempotent.
    pub fn disconnect(&self, id: &str) -> Result<()> {
        Self::check_id(id)?;
        match self.load(id)? {
            Some(r) => self.teardown(&r),
            None => Ok(()),
        }
    }

    fn teardown(&self, r: &Record) -> Result<()> {
        // Every loop device on the export file (ours, or one a crash left unrecorded).
        let file = r.export_file();
        for dev in loops_on(&file)? {
            mounts::run("losetup", &["-d".as_ref(), dev.as_os_str()])?;
        }
        if r.fuse_mounted() {
            // nbdfuse exits cleanly when its mount goes (its documented way to stop it).
            let unmounted = mounts::run("fusermount3", &["-u".as_ref(), r.fuse_dir.as_os_str()]);
            if unmounted.is_err() {
                mounts::run("umount", &["-l".as_ref(), r.fuse_dir.as_os_str()])?;
            }
        }
        if r.nbdfuse_alive() {
            let start = Instant::now();
            while r.nbdfuse_alive() && start.elapsed() < EXIT_TIMEOUT {
                std::thread::sleep(POLL);
            }
            if let (true, Some(pid)) = (r.nbdfuse_alive(), r.pid) {
                tracing::warn!(volume = %r.volume_id, pid, "nbdfuse did not exit; killing it");
                // SAFETY: kill(2) on a pid checked just above to be this record's nbdfuse.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        for f in [
            r.fuse_dir.with_extension("pid"),
            r.fuse_dir.with_extension("log"),
        ] {
            remove_file(&f)?;
        }
        match std::fs::remove_dir(&r.fuse_dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_err("remove", &r.fuse_dir)(e))
            }
            _ => {}
        }
        remove_file(&self.record_path(&r.volume_id))
    }
}

fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", path)(e)),
        _ => Ok(()),
    }
}

/// Loop devices whose backing file is `file`.
fn loops_on(file: &Path) -> Result<Vec<PathBuf>> {
    let dir = Path::new("/sys/block");
    let entries = std::fs::read_dir(dir).map_err(io_err("list", dir))?;
    Ok(entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("loop"))
        .map(|n| PathBuf::from("/dev").join(n))
        .filter(|d| loop_backing(d).as_deref() == Some(file))
        .collect())
}

/// `losetup` on the export file; direct I/O when the file allows it (no second copy of
/// every block in the page cache), buffered otherwise.
fn attach_loop(file: &Path, read_only: bool) -> Result<PathBuf> {
    let mut args: Vec<&std::ffi::OsStr> = vec!["--find".as_ref(), "--show".as_ref()];
    if read_only {
        args.push("--read-only".as_ref());
    }
    args.push(file.as_os_str());
    let out = mounts::run("losetup", &args)?;
    let dev = PathBuf::from(out.trim());
    if !dev.to_string_lossy().starts_with("/dev/loop") {
        return Err(DeviceError::BadLoop(out));
    }
    if let Err(e) = mounts::run("losetup", &["--direct-io=on".as_ref(), dev.as_os_str()]) {
        tracing::debug!(device = %dev.display(), error = %e, "loop device stays buffered");
    }
    Ok(dev)
}
