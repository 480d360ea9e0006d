//! One kernel block device, whichever frontend makes it: ublk or kernel NBD. [`Link`] is a
//! device being served; the free functions make, take back, fail and find devices by
//! frontend, so [`super::devices`] keeps one set of rules for both.

use std::sync::Arc;

use tokio::sync::watch;
use tracing::warn;

use crate::frontends::block::BlockDevice;
use crate::frontends::kernel_nbd::{self, link::DeviceLink, netlink, KernelNbdSettings};
use crate::frontends::ublk::{self, UblkDevice, UblkSettings};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ublk,
    Nbd,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ublk => "ublk",
            Kind::Nbd => "nbd",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "ublk" => Some(Kind::Ublk),
            "nbd" => Some(Kind::Nbd),
            _ => None,
        }
    }

    /// The block device's path for device number `index`.
    pub fn path(self, index: u32) -> String {
        match self {
            Kind::Ublk => UblkDevice::path(index),
            Kind::Nbd => format!("/dev/nbd{index}"),
        }
    }

    /// The kernel module, loaded if it is not (netlink families and `/dev/ublk-control` are
    /// not auto-loaded everywhere). The error says why not.
    pub async fn ensure_module(self) -> Result<(), MissingModule> {
        let (module, present): (&str, fn() -> bool) = match self {
            Kind::Nbd => ("nbd", || std::path::Path::new("/sys/module/nbd").exists()),
            Kind::Ublk => ("ublk_drv", || {
                std::path::Path::new(ublk::control::CONTROL_PATH).exists()
            }),
        };
        if present() {
            return Ok(());
        }
        let out = tokio::process::Command::new("modprobe")
            .arg(module)
            .output()
            .await;
        if present() {
            return Ok(());
        }
        let why = match out {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
            Err(e) => format!("modprobe: {e}"),
        };
        Err(MissingModule { module, why })
    }
}

/// A frontend's kernel module that is not loaded and that `modprobe` did not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the kernel has no {module} module ({why})")]
pub struct MissingModule {
    pub module: &'static str,
    /// modprobe's own words, or why it did not run.
    pub why: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("kernel NBD: {0}")]
    Nbd(#[from] kernel_nbd::KernelNbdError),
    #[error("ublk: {0}")]
    Ublk(#[from] ublk::UblkError),
    #[error(
        "{device} did not take its new size {size_bytes} (it has {}; kernel NBD needs Linux 5.3)",
        now.map_or_else(|| "an unreadable size".to_string(), |n| format!("{n} bytes"))
    )]
    NotResized {
        device: String,
        size_bytes: u64,
        now: Option<u64>,
    },
}

#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub nbd: KernelNbdSettings,
    pub ublk: UblkSettings,
}

/// A device being served by this agent.
pub enum Link {
    Nbd(DeviceLink),
    Ublk(UblkDevice),
}

impl Link {
    pub fn index(&self) -> u32 {
        match self {
            Link::Nbd(l) => l.index,
            Link::Ublk(d) => d.dev_id,
        }
    }

    /// End the device: I/O still queued on it fails with EIO.
    pub async fn detach(self) -> Result<(), LinkError> {
        match self {
            Link::Nbd(l) => l.detach().await.map_err(|e| LinkError::Nbd(e.into())),
            Link::Ublk(d) => Ok(d.detach().await?),
        }
    }

    /// Wait until it stops being served (after the shutdown signal); the kernel keeps the
    /// device and holds its I/O for the next agent.
    pub async fn join(self) {
        match self {
            Link::Nbd(l) => l.join().await,
            Link::Ublk(d) => d.join().await,
        }
    }
}

/// The identity a device of `volume` on `node` carries in the kernel.
fn nbd_backend(node: &str, volume: &str) -> String {
    kernel_nbd::backend_id(node, volume)
}

/// Make a new device of `kind` for `export`.
pub async fn make(
    kind: Kind,
    node: &str,
    volume: &str,
    export: Arc<dyn BlockDevice>,
    settings: &Settings,
    shutdown: watch::Receiver<bool>,
) -> Result<Link, LinkError> {
    Ok(match kind {
        Kind::Nbd => Link::Nbd(
            kernel_nbd::connect(nbd_backend(node, volume), export, settings.nbd, shutdown).await?,
        ),
        Kind::Ublk => Link::Ublk(
            ublk::create(
                ublk::owner_tag(node, volume),
                export,
                settings.ublk,
                shutdown,
            )
            .await?,
        ),
    })
}

/// Whether the kernel still has device `index` of `kind` as `volume`'s on `node`.
pub fn still_ours(kind: Kind, index: u32, node: &str, volume: &str) -> bool {
    match kind {
        Kind::Nbd => {
            netlink::backend_of(index).as_deref() == Some(nbd_backend(node, volume).as_str())
        }
        Kind::Ublk => {
            ublk::info(index).is_some_and(|i| i.ublksrv_flags == ublk::owner_tag(node, volume))
        }
    }
}

/// Serve again device `index` of `kind`, left by an earlier life of this agent.
pub async fn take_back(
    kind: Kind,
    index: u32,
    node: &str,
    volume: &str,
    export: Arc<dyn BlockDevice>,
    settings: &Settings,
    shutdown: watch::Receiver<bool>,
) -> Result<Link, LinkError> {
    Ok(match kind {
        Kind::Nbd => Link::Nbd(
            kernel_nbd::reconnect(
                index,
                nbd_backend(node, volume),
                export,
                settings.nbd,
                shutdown,
            )
            .await?,
        ),
        Kind::Ublk => {
            Link::Ublk(ublk::recover(index, ublk::owner_tag(node, volume), export, shutdown).await?)
        }
    })
}

/// Why a live device of `kind` cannot be told that its volume grew (`None`: it can).
pub fn cannot_resize(kind: Kind) -> Option<String> {
    match kind {
        // RECONFIGURE takes a size since Linux 5.3; `resize` checks that the kernel did.
        Kind::Nbd => None,
        Kind::Ublk => (!ublk::can_resize()).then(|| ublk::UblkError::NoResize.to_string()),
    }
}

/// Tell device `index` of `kind`, `volume`'s on `node`, that its volume is now `size_bytes`.
pub async fn resize(
    kind: Kind,
    index: u32,
    node: &str,
    volume: &str,
    size_bytes: u64,
) -> Result<(), LinkError> {
    match kind {
        Kind::Nbd => {
            kernel_nbd::resize(index, nbd_backend(node, volume), size_bytes).await?;
            // A kernel before 5.3 ignores the size it does not know to take.
            let sectors = std::fs::read_to_string(format!("/sys/block/nbd{index}/size"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            match sectors {
                Some(n) if n * 512 == size_bytes => Ok(()),
                other => Err(LinkError::NotResized {
                    device: kind.path(index),
                    size_bytes,
                    now: other.map(|n| n * 512),
                }),
            }
        }
        Kind::Ublk => Ok(ublk::resize(index, size_bytes).await?),
    }
}

/// End device `index` of `kind` without serving it: its held I/O fails with EIO.
pub async fn fail(kind: Kind, index: u32) -> Result<(), LinkError> {
    match kind {
        Kind::Nbd => Ok(kernel_nbd::disconnect(index).await?),
        Kind::Ublk => Ok(ublk::remove(index).await?),
    }
}

/// Devices of `kind` carrying this node's identity whose number is not in `recorded` (other
/// agents, on this machine in tests, have their own).
pub fn orphans(kind: Kind, node: &str, recorded: &[u32]) -> Vec<u32> {
    match kind {
        Kind::Nbd => {
            let prefix = nbd_backend(node, "");
            let Ok(dir) = std::fs::read_dir("/sys/block") else {
                return Vec::new();
            };
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("nbd")?.parse().ok())
                .filter(|i| !recorded.contains(i))
                .filter(|&i| netlink::backend_of(i).is_some_and(|b| b.starts_with(&prefix)))
                .collect()
        }
        Kind::Ublk => ublk::device_ids()
            .into_iter()
            .filter(|i| !recorded.contains(i))
            .filter(|&i| ublk::info(i).is_some_and(|d| ublk::is_nodes(d.ublksrv_flags, node)))
            .collect(),
    }
}

/// Fail device `index` of `kind` if the kernel still has it as `volume`'s.
pub async fn fail_if_ours(kind: Kind, index: u32, node: &str, volume: &str) {
    if still_ours(kind, index, node, volume) {
        if let Err(e) = fail(kind, index).await {
            warn!(%volume, device = %kind.path(index), error = %e, "end a stale device");
        }
    }
}
