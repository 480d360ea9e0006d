//! The kernel block devices this agent serves, and their records.
//!
//! A device outlives the agent (kernel NBD holds I/O for `dead_conn_timeout` when its sockets
//! die), so each has a record, `<data-dir>/devices/<volume>.json`, replaced atomically. At
//! start the agent goes through the records and, for each device the kernel still has:
//! - serves it again once the volume's engine runs here (the controller restarts engines of
//!   volumes attached here, in the same epoch), so the application saw a pause;
//! - fails it with EIO when the controller says the volume is attached elsewhere, or detached
//!   or gone: the volume moved on while this agent was away, and serving the old device would
//!   serve stale blocks, or take writes the volume will never have.
//!
//! A record whose device the kernel no longer has (a reboot) is removed; a device carrying a
//! Hawser backend id but no record (the agent died between CONNECT and the record) is
//! disconnected. Nothing is leaked across a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hawser_api::agent::Device;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

use crate::frontends::block::ExportRegistry;
use crate::frontends::kernel_nbd::{self, link::DeviceLink, netlink, KernelNbdSettings};

/// Where the cluster says a volume is attached now (the controller, through the agent's
/// link to it): `Ok(None)` when it is detached or gone.
#[async_trait::async_trait]
pub trait WhereAttached: Send + Sync {
    async fn attached_node(&self, volume: &str) -> anyhow::Result<Option<String>>;
}

/// How often a recovering device checks whether the volume's engine runs here yet, and how
/// often it asks the controller again meanwhile.
const ENGINE_POLL: Duration = Duration::from_millis(100);
const CONTROLLER_POLL: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("volume {0} has no engine on this node: attach it to this node first")]
    NotAttachedHere(String),
    #[error("volume {0} has no kernel device on this node")]
    NoDevice(String),
    #[error("unknown frontend {0:?}: expected auto, ublk or nbd")]
    UnknownFrontend(String),
    #[error("no kernel frontend on this node: {0}")]
    NoFrontend(String),
    #[error("kernel NBD for volume {volume}: {source}")]
    KernelNbd {
        volume: String,
        source: kernel_nbd::KernelNbdError,
    },
    #[error("{what} {path}: {source}")]
    Record {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What is kept on disk per device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    volume: String,
    frontend: String,
    index: u32,
    connections: u32,
    size_bytes: u64,
}

impl Record {
    fn device(&self) -> Device {
        Device {
            volume: self.volume.clone(),
            frontend: self.frontend.clone(),
            path: format!("/dev/nbd{}", self.index),
            size_bytes: self.size_bytes,
            connections: self.connections,
        }
    }
}

struct Live {
    record: Record,
    link: DeviceLink,
}

pub struct Devices {
    dir: PathBuf,
    node: String,
    exports: Arc<dyn ExportRegistry>,
    controller: Arc<dyn WhereAttached>,
    settings: KernelNbdSettings,
    live: Mutex<HashMap<String, Live>>,
    shutdown: watch::Receiver<bool>,
}

impl Devices {
    pub fn new(
        data_dir: &Path,
        node: &str,
        exports: Arc<dyn ExportRegistry>,
        controller: Arc<dyn WhereAttached>,
        settings: KernelNbdSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Devices {
        Devices {
            dir: data_dir.join("devices"),
            node: node.to_owned(),
            exports,
            controller,
            settings,
            live: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    fn record_path(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.json"))
    }

    fn save(&self, r: &Record) -> Result<(), DeviceError> {
        let path = self.record_path(&r.volume);
        let err = |what| {
            let path = path.clone();
            move |source| DeviceError::Record { what, path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(err("create the directory of"))?;
        // Serialising a plain struct cannot fail.
        let bytes = serde_json::to_vec_pretty(r).unwrap_or_default();
        hawser_storage::file_ops::replace_file(&path, &bytes).map_err(err("write"))
    }

    fn remove_record(&self, volume: &str) {
        let path = self.record_path(volume);
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(path = %path.display(), error = %e, "remove device record");
            }
        }
    }

    fn records(&self) -> Vec<Record> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in dir.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path).map(|b| serde_json::from_slice::<Record>(&b)) {
                Ok(Ok(r)) => out.push(r),
                Ok(Err(e)) => {
                    warn!(path = %path.display(), error = %e, "unreadable device record; ignored")
                }
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "unreadable device record; ignored")
                }
            }
        }
        out
    }

    /// Make `volume` (whose engine runs here) a kernel block device; the same device again if
    /// it has one.
    pub async fn attach(&self, volume: &str, frontend: &str) -> Result<Device, DeviceError> {
        match frontend {
            "auto" | "nbd" => {}
            // ublk lands here next (issue 42); until then it is refused, not silently swapped.
            "ublk" => {
                return Err(DeviceError::NoFrontend(
                    "the ublk frontend is not built yet; use nbd or auto".into(),
                ))
            }
            other => return Err(DeviceError::UnknownFrontend(other.to_owned())),
        }
        let mut live = self.live.lock().await;
        if let Some(l) = live.get(volume) {
            return Ok(l.record.device());
        }
        let export = self
            .exports
            .lookup(volume)
            .ok_or_else(|| DeviceError::NotAttachedHere(volume.to_owned()))?;
        ensure_nbd_module().await?;
        let size_bytes = export.size();
        let backend = kernel_nbd::backend_id(&self.node, volume);
        let link = kernel_nbd::connect(backend, export, self.settings, self.shutdown.clone())
            .await
            .map_err(|source| DeviceError::KernelNbd {
                volume: volume.to_owned(),
                source,
            })?;
        let record = Record {
            volume: volume.to_owned(),
            frontend: "nbd".into(),
            index: link.index,
            connections: u32::try_from(self.settings.connections).unwrap_or(1),
            size_bytes,
        };
        if let Err(e) = self.save(&record) {
            // Without a record a restarted agent could not find the device: end it now.
            let _ = link.detach().await;
            return Err(e);
        }
        info!(%volume, device = %record.device().path, "kernel NBD device attached");
        let device = record.device();
        live.insert(volume.to_owned(), Live { record, link });
        Ok(device)
    }

    /// End `volume`'s device: I/O still queued on it fails with EIO, and the record goes.
    pub async fn detach(&self, volume: &str) -> Result<(), DeviceError> {
        let taken = self.live.lock().await.remove(volume);
        let Some(l) = taken else {
            // A device being recovered has a record but is not live yet.
            let Some(r) = self.records().into_iter().find(|r| r.volume == volume) else {
                return Err(DeviceError::NoDevice(volume.to_owned()));
            };
            fail_device(&self.node, &r).await;
            self.remove_record(volume);
            return Ok(());
        };
        l.link.detach().await.map_err(|e| DeviceError::KernelNbd {
            volume: volume.to_owned(),
            source: e.into(),
        })?;
        self.remove_record(volume);
        info!(%volume, "kernel device detached");
        Ok(())
    }

    pub async fn list(&self) -> Vec<Device> {
        let live = self.live.lock().await;
        let mut out: Vec<Device> = self
            .records()
            .into_iter()
            .map(|r| {
                live.get(&r.volume)
                    .map_or_else(|| r.device(), |l| l.record.device())
            })
            .collect();
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        out
    }

    /// After the agent's shutdown signal: wait for every device's connections to end (their
    /// requests in flight answered) before the engines stop. The devices stay configured in
    /// the kernel, holding I/O for the next agent.
    pub async fn drain(&self) {
        let all: Vec<Live> = self.live.lock().await.drain().map(|(_, l)| l).collect();
        for l in all {
            l.link.join().await;
        }
    }

    /// Take back the devices an earlier life of this agent left (see the module doc). Runs
    /// until each is served again or failed.
    pub async fn recover(self: Arc<Self>) {
        let records = self.records();
        let ours: Vec<u32> = records.iter().map(|r| r.index).collect();
        for index in orphans(&self.node, &ours) {
            warn!(device = %format!("/dev/nbd{index}"), "a Hawser device without a record; disconnecting it");
            if let Err(e) = kernel_nbd::disconnect(index).await {
                warn!(error = %e, "disconnect an orphan device");
            }
        }
        let mut tasks = tokio::task::JoinSet::new();
        for r in records {
            if netlink::backend_of(r.index).as_deref()
                != Some(kernel_nbd::backend_id(&self.node, &r.volume).as_str())
            {
                info!(volume = %r.volume, device = %r.device().path, "the kernel no longer has this device (a reboot?); record removed");
                self.remove_record(&r.volume);
                continue;
            }
            let me = Arc::clone(&self);
            tasks.spawn(async move { me.recover_one(r).await });
        }
        while tasks.join_next().await.is_some() {}
    }

    async fn recover_one(&self, r: Record) {
        let mut shutdown = self.shutdown.clone();
        let mut asked: Option<std::time::Instant> = None;
        loop {
            if *shutdown.borrow() {
                return;
            }
            if asked.is_none_or(|t| t.elapsed() >= CONTROLLER_POLL) {
                asked = Some(std::time::Instant::now());
                match self.controller.attached_node(&r.volume).await {
                    Ok(Some(n)) if n == self.node => {}
                    Ok(other) => {
                        let now = other.as_deref().unwrap_or("no node");
                        warn!(volume = %r.volume, device = %r.device().path, attached = now,
                            "the volume is no longer attached here: failing its device with EIO");
                        fail_device(&self.node, &r).await;
                        self.remove_record(&r.volume);
                        return;
                    }
                    Err(e) => {
                        warn!(volume = %r.volume, error = %e, "cannot ask the controller about a device left by the last agent; waiting")
                    }
                }
            }
            if let Some(export) = self.exports.lookup(&r.volume) {
                let settings = KernelNbdSettings {
                    connections: r.connections.max(1) as usize,
                    ..self.settings
                };
                match kernel_nbd::reconnect(
                    r.index,
                    kernel_nbd::backend_id(&self.node, &r.volume),
                    export,
                    settings,
                    shutdown.clone(),
                )
                .await
                {
                    Ok(link) => {
                        info!(volume = %r.volume, device = %r.device().path, "kernel NBD device taken back");
                        self.live
                            .lock()
                            .await
                            .insert(r.volume.clone(), Live { record: r, link });
                    }
                    Err(e) => {
                        warn!(volume = %r.volume, error = %e, "kernel NBD device could not be taken back")
                    }
                }
                return;
            }
            tokio::select! {
                _ = shutdown.changed() => {}
                () = tokio::time::sleep(ENGINE_POLL) => {}
            }
        }
    }
}

/// Disconnect a recorded device if the kernel still has it as this volume's.
async fn fail_device(node: &str, r: &Record) {
    if netlink::backend_of(r.index).as_deref()
        == Some(kernel_nbd::backend_id(node, &r.volume).as_str())
    {
        if let Err(e) = kernel_nbd::disconnect(r.index).await {
            warn!(volume = %r.volume, error = %e, "disconnect a stale device");
        }
    }
}

/// Configured `nbd` devices carrying this node's backend id whose index no record names
/// (other agents, on this machine in tests, have their own).
fn orphans(node: &str, recorded: &[u32]) -> Vec<u32> {
    let prefix = kernel_nbd::backend_id(node, "");
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(index) = name.strip_prefix("nbd").and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if recorded.contains(&index) {
            continue;
        }
        if netlink::backend_of(index).is_some_and(|b| b.starts_with(&prefix)) {
            out.push(index);
        }
    }
    out
}

/// The `nbd` module, loaded if it is not (the kernel's own auto-load does not cover netlink
/// families).
async fn ensure_nbd_module() -> Result<(), DeviceError> {
    let present = || std::path::Path::new("/sys/module/nbd").exists();
    if present() {
        return Ok(());
    }
    let out = tokio::process::Command::new("modprobe")
        .arg("nbd")
        .output()
        .await;
    if present() {
        return Ok(());
    }
    let why = match out {
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
        Err(e) => format!("modprobe: {e}"),
    };
    Err(DeviceError::NoFrontend(format!(
        "the kernel has no nbd module ({why})"
    )))
}
