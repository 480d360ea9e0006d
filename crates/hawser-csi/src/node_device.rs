//! A volume's block device on this node, by one of two paths:
//! - **a kernel device served by the agent** (`/dev/ublkbN`, else `/dev/nbdN`), asked
//!   for through the agent's device API (`<agent data-dir>/device.sock`). It survives a
//!   restart or an upgrade of the agent: I/O pauses, and the restarted agent takes the device
//!   back. The first choice whenever the node has it (`frontend: auto`).
//! - **nbdfuse and a loop device**, where the kernel has no `nbd` module (or the StorageClass
//!   says `frontend: fuse`): `nbdfuse` exposes the volume's NBD export as a file in a FUSE
//!   mount, and a loop device on that file is the block device. Its cost, said plainly:
//!   nbdfuse does not reconnect, so when the agent serving the export restarts, I/O on the
//!   device fails until the volume is staged again.
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
use crate::params::Frontend;
use hawser_api::device_client::{DeviceClient, DeviceClientError};

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
    #[error("frontend {frontend} for volume {volume}: {source}")]
    Agent {
        frontend: Frontend,
        volume: String,
        source: DeviceClientError,
    },
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
    /// `fuse` (nbdfuse and the loop device above), or the agent's frontend (`nbd`, `ublk`).
    #[serde(default = "fuse")]
    frontend: String,
    /// The agent's kernel device, once it made one.
    #[serde(default)]
    kernel_device: Option<PathBuf>,
}

fn fuse() -> String {
    "fuse".to_owned()
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
    /// The agent's device API socket.
    agent_socket: PathBuf,
    /// The node's choice when the volume's context has none.
    default_frontend: Frontend,
}

impl Record {
    fn is_kernel(&self) -> bool {
        self.frontend != "fuse"
    }

    /// The agent's kernel device of this volume is still configured in the kernel (it may
    /// be between two lives of the agent: it then holds I/O, and is alive). A kernel NBD
    /// device names its volume in `/sys/block/nbdN/backend`; of a ublk device only the agent
    /// can say whose it is, so the agent is asked, and while it is away (a restart) the
    /// device's existence is taken as alive.
    fn kernel_alive(&self, agent_socket: &Path) -> bool {
        let Some(dev) = self.kernel_device.as_deref() else {
            return false;
        };
        let Some(name) = dev.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            return false;
        };
        if let Some(n) = name.strip_prefix("ublkb") {
            return match DeviceClient::new(agent_socket).list() {
                Ok(devices) => devices
                    .iter()
                    .any(|d| d.volume == self.volume_id && Path::new(&d.path) == dev),
                Err(_) => Path::new(&format!("/sys/class/ublk-char/ublkc{n}")).exists(),
            };
        }
        let backend =
            std::fs::read_to_string(format!("/sys/block/{name}/backend")).unwrap_or_default();
        backend
            .trim_end()
            .ends_with(&format!("/{}", self.volume_id))
    }

    fn alive(&self, agent_socket: &Path) -> bool {
        if self.is_kernel() {
            self.kernel_alive(agent_socket)
        } else {
            self.nbdfuse_alive() && self.fuse_mounted() && self.loop_alive()
        }
    }

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
    pub fn new(
        state_dir: PathBuf,
        agent_socket: PathBuf,
        default_frontend: Frontend,
    ) -> DeviceManager {
        DeviceManager {
            state_dir,
            agent_socket,
            default_frontend,
        }
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
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
        let device = if r.is_kernel() {
            r.kernel_device.clone().unwrap_or_default()
        } else {
            r.loop_device.clone().unwrap_or_default()
        };
        Ok(StagedDevice {
            volume_id: r.volume_id.clone(),
            size_bytes: mounts::block_device_size(&device)?,
            device,
            uri: r.uri.clone(),
        })
    }

    /// The volume's device: the one already staged when it is alive and the same, else a
    /// new one (leftovers of a dead one are cleaned first). `frontend` is the volume's
    /// (its context's); `Auto` there defers to the node's `--frontend`.
    pub fn connect(
        &self,
        id: &str,
        uri: &str,
        read_only: bool,
        frontend: Frontend,
    ) -> Result<StagedDevice> {
        Self::check_id(id)?;
        std::fs::create_dir_all(&self.state_dir).map_err(io_err("create", &self.state_dir))?;
        if let Some(r) = self.load(id)? {
            if r.alive(&self.agent_socket) && r.uri == uri && r.read_only == read_only {
                return Self::staged(&r);
            }
            self.teardown(&r)?;
        }
        let frontend = match frontend {
            Frontend::Auto => self.default_frontend,
            f => f,
        };
        // A read-only stage keeps nbdfuse's read-only export unless a kernel frontend is
        // asked for by name: the agent's devices are read-write.
        let kernel = match frontend {
            Frontend::Fuse => None,
            Frontend::Auto if read_only => None,
            f => Some(f),
        };
        if let Some(f) = kernel {
            match self.connect_kernel(id, uri, read_only, f) {
                Ok(d) => return Ok(d),
                Err(e) if f == Frontend::Auto => {
                    tracing::warn!(volume = id, error = %e, "no kernel frontend; staging through nbdfuse, which does not survive an agent restart");
                }
                Err(e) => return Err(e),
            }
        }
        let mut r = self.new_record(id, uri, read_only, fuse());
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

    /// What is recorded before a device is made: nothing of it exists yet.
    fn new_record(&self, id: &str, uri: &str, read_only: bool, frontend: String) -> Record {
        Record {
            volume_id: id.into(),
            uri: uri.into(),
            read_only,
            fuse_dir: self.state_dir.join("fuse").join(id),
            pid: None,
            loop_device: None,
            frontend,
            kernel_device: None,
        }
    }

    /// The agent makes the volume a kernel device. The record is written first, so a crash
    /// between the two leaves something for unstage to find; the agent answers the same
    /// device to a repeated request.
    fn connect_kernel(
        &self,
        id: &str,
        uri: &str,
        read_only: bool,
        frontend: Frontend,
    ) -> Result<StagedDevice> {
        let mut r = self.new_record(id, uri, read_only, frontend.as_str().to_owned());
        self.save(&r)?;
        let agent = DeviceClient::new(&self.agent_socket);
        let made = agent
            .attach(id, frontend.as_str())
            .map_err(|source| DeviceError::Agent {
                frontend,
                volume: id.into(),
                source,
            });
        let dev = match made {
            Ok(d) => d,
            Err(e) => {
                remove_file(&self.record_path(id))?;
                return Err(e);
            }
        };
        r.frontend = dev.frontend.clone();
        r.kernel_device = Some(PathBuf::from(&dev.path));
        self.save(&r)?;
        tracing::info!(volume = id, device = %dev.path, frontend = %dev.frontend, "staged on a kernel device served by the agent");
        Self::staged(&r)
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
            Some(r) if r.alive(&self.agent_socket) => Self::staged(&r).map(Some),
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
        if r.is_kernel() {
            // The agent ends the device (nothing is mounted on it any more: unstage
            // unmounted first). It may already have none: a detach that crashed midway.
            let agent = DeviceClient::new(&self.agent_socket);
            match agent.detach(&r.volume_id) {
                Ok(()) => {}
                Err(DeviceClientError::Refused { status: 404, .. }) => {}
                Err(source) => {
                    return Err(DeviceError::Agent {
                        frontend: Frontend::parse(&r.frontend).unwrap_or(Frontend::Nbd),
                        volume: r.volume_id.clone(),
                        source,
                    })
                }
            }
            return remove_file(&self.record_path(&r.volume_id));
        }
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
