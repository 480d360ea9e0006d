//! ublk: `/dev/ublkbN` served by the volume's engine in this process, over io_uring, with no
//! socket in between. [`abi`] is the driver's interface, [`control`] adds, recovers and
//! removes devices, [`queue`] serves one queue on its own thread, [`request`] maps one
//! request onto the block seam.
//!
//! Devices are made with user recovery and reissue: when the agent dies or is replaced, the
//! kernel holds the device's I/O (and requeues what the dead agent had taken) until a new
//! agent takes the device back with `START_USER_RECOVERY` ... `END_USER_RECOVERY`, or
//! removes it, which fails the held I/O. Which of the two is decided by
//! [`crate::frontends::devices`].

pub mod abi;
pub mod control;
pub mod queue;
pub mod request;

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::warn;

use crate::frontends::block::BlockDevice;
use abi::DevInfo;
use control::{Control, ControlError};
use queue::{Queue, QueueSpec};

/// How this node's ublk devices are set up.
#[derive(Clone, Copy, Debug)]
pub struct UblkSettings {
    /// Queues per device (at most one per CPU; the kernel refuses more).
    pub queues: u16,
    /// Requests in flight per queue.
    pub depth: u16,
    /// Largest request, in bytes (each tag has a buffer this large).
    pub max_io_bytes: u32,
}

impl UblkSettings {
    /// The agent's defaults (`--ublk-queues`, `--ublk-queue-depth`), chosen by measurement:
    /// docs/performance.md, "ublk queues and depth".
    pub const DEFAULT: UblkSettings = UblkSettings {
        queues: 2,
        depth: 64,
        max_io_bytes: 256 << 10,
    };
}

impl Default for UblkSettings {
    fn default() -> UblkSettings {
        UblkSettings::DEFAULT
    }
}

/// How long a restarted agent waits for the kernel to finish with the dead agent's files
/// before the device can be taken back (`START_USER_RECOVERY` answers `EBUSY` meanwhile).
const RECOVERY_WAIT: Duration = Duration::from_secs(20);
const RECOVERY_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum UblkError {
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(
        "the ublk device limit is reached ({0}); raise /sys/module/ublk_drv/parameters/ublks_max"
    )]
    Limit(String),
    #[error("/dev/ublkc{dev_id}: {source}")]
    CharDev { dev_id: u32, source: std::io::Error },
    #[error("ublk queue {q_id} of device {dev_id}: {source}")]
    Queue {
        dev_id: u32,
        q_id: u16,
        source: std::io::Error,
    },
    #[error("ublk device {0} is not ours to take back: {1}")]
    NotOurs(u32, String),
    #[error("ublk task: {0}")]
    Task(String),
    #[error(
        "this kernel's ublk cannot change a live device's size (UBLK_F_UPDATE_SIZE needs \
         Linux 6.16)"
    )]
    NoResize,
}

/// Whose device this is, kept by the kernel in the device's `ublksrv_flags`: the node in the
/// high half, the volume in the low half (FNV-1a hashes), so a restarted agent finds its
/// devices and tells them from another agent's on the same kernel.
pub fn owner_tag(node: &str, volume: &str) -> u64 {
    (u64::from(fnv32(node)) << 32) | u64::from(fnv32(volume))
}

pub fn is_nodes(tag: u64, node: &str) -> bool {
    tag >> 32 == u64::from(fnv32(node)) && tag != 0
}

fn fnv32(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The device numbers the kernel has (`/sys/class/ublk-char/ublkcN`).
pub fn device_ids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/sys/class/ublk-char") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("ublkc")?.parse().ok())
        .collect()
}

/// What the kernel says of device `dev_id`, if it has it.
pub fn info(dev_id: u32) -> Option<DevInfo> {
    Control::open().ok()?.info(dev_id).ok()
}

/// A device this agent serves: its queue threads, and what each sends once it has answered
/// its running requests after the shutdown signal.
pub struct UblkDevice {
    pub dev_id: u32,
    threads: Vec<std::thread::JoinHandle<()>>,
    drained: std::sync::mpsc::Receiver<()>,
}

impl UblkDevice {
    pub fn path(dev_id: u32) -> String {
        format!("/dev/ublkb{dev_id}")
    }

    /// The queues it has (what was asked, cut to the CPU count).
    pub fn queues(&self) -> usize {
        self.threads.len()
    }

    /// After the agent's shutdown signal: wait until every queue has answered its running
    /// requests. The queues keep the device until the process exits; the kernel holds what
    /// comes later for the next agent.
    pub async fn join(self) {
        let (queues, drained) = (self.threads.len(), self.drained);
        let _ = tokio::task::spawn_blocking(move || {
            // A queue whose device stopped meanwhile ends and drops its sender: also done.
            for _ in 0..queues {
                if drained.recv().is_err() {
                    break;
                }
            }
        })
        .await;
    }

    /// Remove the device: the kernel fails its queued I/O, and the queues end.
    pub async fn detach(self) -> Result<(), UblkError> {
        let removed = remove(self.dev_id).await;
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
        removed
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, UblkError> + Send + 'static,
) -> Result<T, UblkError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| UblkError::Task(e.to_string()))?
}

/// Make a new device for `export`, tagged with [`owner_tag`].
pub async fn create(
    tag: u64,
    export: Arc<dyn BlockDevice>,
    settings: UblkSettings,
    shutdown: watch::Receiver<bool>,
) -> Result<UblkDevice, UblkError> {
    let handle = tokio::runtime::Handle::current();
    blocking(move || {
        let mut ctl = Control::open()?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let want = DevInfo {
            nr_hw_queues: settings.queues.clamp(1, u16::try_from(cpus).unwrap_or(1)),
            queue_depth: settings.depth.clamp(1, 4096),
            max_io_buf_bytes: settings.max_io_bytes,
            dev_id: u32::MAX,
            ublksrv_pid: -1,
            flags: abi::F_USER_RECOVERY | abi::F_USER_RECOVERY_REISSUE | abi::F_CMD_IOCTL_ENCODE,
            ublksrv_flags: tag,
            ..DevInfo::default()
        };
        let info = match ctl.add(&want) {
            Err(e) if e.errno() == Some(libc::EACCES) => {
                let max = std::fs::read_to_string("/sys/module/ublk_drv/parameters/ublks_max")
                    .map_or_else(|_| "?".into(), |s| s.trim().to_owned());
                return Err(UblkError::Limit(format!("ublks_max={max}: {e}")));
            }
            other => other?,
        };
        let made = (|| {
            let params = abi::Params {
                dev_sectors: export.size() / 512,
                max_sectors: info.max_io_buf_bytes / 512,
                // One discard or zeroing covers up to 1 GiB.
                max_discard_sectors: 1 << 21,
            };
            ctl.set_params(info.dev_id, &params)?;
            serve(&mut ctl, info, export, handle, shutdown, false)
        })();
        if made.is_err() {
            let _ = ctl.stop(info.dev_id);
            if let Err(e) = ctl.delete(info.dev_id) {
                warn!(dev = info.dev_id, error = %e, "remove a ublk device that failed to start");
            }
        }
        made
    })
    .await
}

/// Take back device `dev_id`, left by an earlier life of this agent, if it carries `tag`.
pub async fn recover(
    dev_id: u32,
    tag: u64,
    export: Arc<dyn BlockDevice>,
    shutdown: watch::Receiver<bool>,
) -> Result<UblkDevice, UblkError> {
    let handle = tokio::runtime::Handle::current();
    blocking(move || {
        let mut ctl = Control::open()?;
        let info = ctl.info(dev_id)?;
        if info.ublksrv_flags != tag {
            return Err(UblkError::NotOurs(dev_id, "another owner tag".into()));
        }
        let began = Instant::now();
        loop {
            match ctl.start_recovery(dev_id) {
                Ok(()) => break,
                Err(e) if e.errno() == Some(libc::EBUSY) && began.elapsed() < RECOVERY_WAIT => {
                    std::thread::sleep(RECOVERY_POLL);
                }
                Err(e) => return Err(e.into()),
            }
        }
        serve(&mut ctl, info, export, handle, shutdown, true)
    })
    .await
}

/// Whether this kernel can change a live device's size.
pub fn can_resize() -> bool {
    Control::open().is_ok_and(|mut c| c.features() & abi::F_UPDATE_SIZE != 0)
}

/// Set device `dev_id`'s size to `size_bytes`; [`UblkError::NoResize`] on kernels before 6.16.
pub async fn resize(dev_id: u32, size_bytes: u64) -> Result<(), UblkError> {
    blocking(move || {
        let mut ctl = Control::open()?;
        if ctl.features() & abi::F_UPDATE_SIZE == 0 {
            return Err(UblkError::NoResize);
        }
        ctl.update_size(dev_id, size_bytes / 512)?;
        Ok(())
    })
    .await
}

/// Stop and delete device `dev_id`: its held and queued I/O fails with EIO.
pub async fn remove(dev_id: u32) -> Result<(), UblkError> {
    blocking(move || {
        let mut ctl = Control::open()?;
        ctl.stop(dev_id)?;
        ctl.delete(dev_id)?;
        Ok(())
    })
    .await
}

/// Open the char device, start the queue threads, and once every queue has fetched, start
/// the device (or end its recovery).
fn serve(
    ctl: &mut Control,
    info: DevInfo,
    export: Arc<dyn BlockDevice>,
    handle: tokio::runtime::Handle,
    shutdown: watch::Receiver<bool>,
    recovering: bool,
) -> Result<UblkDevice, UblkError> {
    let dev_id = info.dev_id;
    let char_dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/ublkc{dev_id}"))
        .map_err(|source| UblkError::CharDev { dev_id, source })?;
    let char_dev = Arc::new(char_dev);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (drained_tx, drained) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for q_id in 0..info.nr_hw_queues {
        let spec = QueueSpec {
            dev_id,
            q_id,
            depth: info.queue_depth,
            max_io_bytes: info.max_io_buf_bytes,
        };
        let (char_dev, export, handle, shutdown, ready, drained) = (
            Arc::clone(&char_dev),
            Arc::clone(&export),
            handle.clone(),
            shutdown.clone(),
            ready_tx.clone(),
            drained_tx.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("ublk{dev_id}q{q_id}"))
            .spawn(move || match Queue::fetch_all(spec, char_dev) {
                Ok(q) => {
                    let _ = ready.send(Ok(()));
                    handle.block_on(q.run(export, shutdown, drained));
                }
                Err(e) => {
                    let _ = ready.send(Err((q_id, e)));
                }
            })
            .map_err(|source| UblkError::Queue {
                dev_id,
                q_id,
                source,
            })?;
        threads.push(thread);
    }
    drop(ready_tx);
    drop(drained_tx);
    for _ in 0..info.nr_hw_queues {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err((q_id, source))) => {
                return Err(UblkError::Queue {
                    dev_id,
                    q_id,
                    source,
                })
            }
            Err(_) => return Err(UblkError::Task("a queue thread ended".into())),
        }
    }
    if recovering {
        ctl.end_recovery(dev_id)?;
    } else {
        ctl.start(dev_id)?;
    }
    let _keep: &File = &char_dev;
    Ok(UblkDevice {
        dev_id,
        threads,
        drained,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tags_name_the_node_and_the_volume() {
        let a = owner_tag("n1", "v1");
        assert!(is_nodes(a, "n1"));
        assert!(!is_nodes(a, "n2"));
        assert_ne!(a, owner_tag("n1", "v2"));
        assert!(!is_nodes(0, "n1"));
    }
}
