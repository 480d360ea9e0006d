//! The kernel block devices this agent serves, and their records.
//!
//! A device outlives the agent (ublk holds I/O until a new server takes it back; kernel NBD
//! holds it for `dead_conn_timeout` when its sockets die), so each has a record, `<data-dir>/devices/<volume>.json`, replaced atomically. At
//! start the agent goes through the records and, for each device the kernel still has:
//! - serves it again once the controller has confirmed that it is the same volume (its uid),
//!   attached here, in the same attachment (see `device_identity.rs`), and that volume's
//!   engine runs here (the controller restarts engines of volumes attached here), so the
//!   application saw a pause;
//! - fails it with EIO when the controller says otherwise (attached elsewhere, detached, gone,
//!   or a namesake): the volume moved on while this agent was away, and serving the old
//!   device would serve stale blocks, or take writes the volume will never have;
//! - fails it with EIO too when no controller confirms it within `--device-confirm-timeout`:
//!   until then its I/O waits in the kernel. It is never served on a guess.
//!
//! A record whose device the kernel no longer has (a reboot) is removed; a device carrying a
//! Hawser identity (NBD backend id, ublk owner tag) but no record (the agent died between CONNECT and the record) is
//! disconnected. Nothing is leaked across a restart.

//!
//! `auto` picks ublk where the kernel has it, else kernel NBD: ublk has no socket in the data
//! path and holds I/O across a restart without a timeout.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hawser_api::agent::Device;
use hawser_api::controller::{DeviceEvent, DeviceEventReason};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

use crate::frontends::block::{ExportIdentity, ExportRegistry};
use crate::frontends::device_identity::{judge, Attachment, Served, Verdict};
use crate::frontends::kernel::{self, Kind, Link, LinkError, Settings};
use crate::observe::devices::DeviceMetrics;

/// Where the cluster says a volume is attached now (the controller, through the agent's
/// link to it): `Ok(None)` when it is detached or gone.
#[async_trait::async_trait]
pub trait WhereAttached: Send + Sync {
    async fn attachment(&self, volume: &str) -> anyhow::Result<Option<Attachment>>;
    /// Tell the cluster what happened to a device of a volume attached to `node` (its
    /// events, and the Kubernetes Events on the volume's PVC).
    async fn report(&self, node: &str, event: &DeviceEvent) -> anyhow::Result<()>;
}

/// How often a recovering device checks whether the volume's engine runs here yet.
const ENGINE_POLL: Duration = Duration::from_millis(100);

/// How a device left by the last agent waits for the controller's word (`--device-confirm-*`).
#[derive(Clone, Copy, Debug)]
pub struct Confirming {
    /// How often it asks the controller.
    pub retry: Duration,
    /// How long it waits, in all, to be confirmed and served before it is failed.
    pub timeout: Duration,
}

impl Default for Confirming {
    fn default() -> Confirming {
        Confirming {
            retry: Duration::from_secs(2),
            timeout: Duration::from_secs(600),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("volume {0} has no engine on this node: attach it to this node first")]
    NotAttachedHere(String),
    #[error("volume {0} has no kernel device on this node")]
    NoDevice(String),
    #[error(
        "the kernel device of volume {0} is being taken back after an agent restart; try again"
    )]
    NotLive(String),
    #[error("unknown frontend {0:?}: expected auto, ublk or nbd")]
    UnknownFrontend(String),
    #[error("no kernel frontend on this node: {0}")]
    NoFrontend(String),
    #[error("{frontend} device for volume {volume}: {source}")]
    Link {
        volume: String,
        frontend: &'static str,
        source: LinkError,
    },
    #[error("{what} {path}: {source}")]
    Record {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A device's own settings, in place of the agent's (`None`: the agent's).
#[derive(Clone, Copy, Debug, Default)]
pub struct Tuning {
    pub ublk_queues: Option<u16>,
    pub ublk_queue_depth: Option<u16>,
}

/// The bounds the agent's `--ublk-queues` and `--ublk-queue-depth` are held to.
pub const MAX_UBLK_QUEUES: u16 = 64;
pub const MAX_UBLK_QUEUE_DEPTH: u16 = 4096;

/// What is kept on disk per device. `index` is the device number (`/dev/nbdN`,
/// `/dev/ublkbN`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    volume: String,
    frontend: String,
    index: u32,
    connections: u32,
    size_bytes: u64,
    /// The uid of the volume it serves (absent: a volume without one, or a record written
    /// before uids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uid: Option<String>,
    /// The epoch of the engine behind it when it was made (absent in records written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
}

impl Record {
    fn kind(&self) -> Option<Kind> {
        Kind::parse(&self.frontend)
    }

    fn served(&self) -> Served<'_> {
        Served {
            uid: self.uid.as_deref(),
            epoch: self.epoch,
        }
    }

    fn device(&self) -> Device {
        let path = self
            .kind()
            .map_or_else(|| format!("?{}", self.index), |k| k.path(self.index));
        Device {
            volume: self.volume.clone(),
            frontend: self.frontend.clone(),
            path,
            size_bytes: self.size_bytes,
            connections: self.connections,
        }
    }
}

struct Live {
    record: Record,
    link: Link,
}

pub struct Devices {
    dir: PathBuf,
    node: String,
    exports: Arc<dyn ExportRegistry>,
    controller: Arc<dyn WhereAttached>,
    settings: Settings,
    live: Mutex<HashMap<String, Live>>,
    shutdown: watch::Receiver<bool>,
    metrics: DeviceMetrics,
    confirming: Confirming,
}

impl Devices {
    pub fn new(
        data_dir: &Path,
        node: &str,
        exports: Arc<dyn ExportRegistry>,
        controller: Arc<dyn WhereAttached>,
        settings: Settings,
        shutdown: watch::Receiver<bool>,
        metrics: DeviceMetrics,
    ) -> Devices {
        Devices {
            dir: data_dir.join("devices"),
            node: node.to_owned(),
            exports,
            controller,
            settings,
            live: Mutex::new(HashMap::new()),
            shutdown,
            metrics,
            confirming: Confirming::default(),
        }
    }

    /// How devices left by the last agent wait for the controller (the default: every 2 s,
    /// for 10 minutes).
    pub fn confirming(mut self, c: Confirming) -> Devices {
        self.confirming = c;
        self
    }

    /// Report `reason` about `volume` to the controller, in the background (an event must
    /// not hold up an attach).
    fn report(&self, volume: &str, reason: DeviceEventReason, message: String) {
        let (controller, node) = (Arc::clone(&self.controller), self.node.clone());
        let event = DeviceEvent {
            volume: volume.to_owned(),
            reason,
            message,
        };
        tokio::spawn(async move {
            if let Err(e) = controller.report(&node, &event).await {
                warn!(volume = %event.volume, error = %e, "could not report a device event to the controller");
            }
        });
    }

    /// Serve `l` from now on, and show it in the metrics.
    fn insert(&self, live: &mut HashMap<String, Live>, l: Live) {
        let d = l.record.device();
        self.metrics.served(&d.volume, &d.frontend, &d.path);
        live.insert(d.volume, l);
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
    /// it has one. `auto` tries ublk, then kernel NBD, and says in the log why it fell back.
    pub async fn attach(&self, volume: &str, frontend: &str) -> Result<Device, DeviceError> {
        self.attach_tuned(volume, frontend, Tuning::default()).await
    }

    /// `attach`, with a ublk device's queues and depth in place of the agent's settings. A
    /// device taken back after a restart keeps them: the kernel holds them.
    pub async fn attach_tuned(
        &self,
        volume: &str,
        frontend: &str,
        tuning: Tuning,
    ) -> Result<Device, DeviceError> {
        let mut settings = self.settings;
        if let Some(q) = tuning.ublk_queues {
            settings.ublk.queues = q.clamp(1, MAX_UBLK_QUEUES);
        }
        if let Some(d) = tuning.ublk_queue_depth {
            settings.ublk.depth = d.clamp(1, MAX_UBLK_QUEUE_DEPTH);
        }
        let kinds: &[Kind] = match frontend {
            "auto" => &[Kind::Ublk, Kind::Nbd],
            "ublk" => &[Kind::Ublk],
            "nbd" => &[Kind::Nbd],
            other => return Err(DeviceError::UnknownFrontend(other.to_owned())),
        };
        let mut live = self.live.lock().await;
        let found = self.exports.lookup_identified(volume);
        if let Some(l) = live.get(volume) {
            let namesake = found
                .as_ref()
                .is_some_and(|(_, id)| l.record.uid.is_some() && id.uid != l.record.uid);
            if !namesake {
                return Ok(l.record.device());
            }
            // The volume it served was deleted and another made under its name: the old
            // device ends (its I/O fails), and the new volume gets a device of its own.
            if let Some(old) = live.remove(volume) {
                warn!(%volume, device = %old.record.device().path, "a device of a deleted volume of the same name: ending it");
                self.end(old).await?;
            }
        } else if self.records().iter().any(|r| r.volume == volume) {
            // Left by the last agent and not judged yet: it keeps its record and its index.
            return Err(DeviceError::NotLive(volume.to_owned()));
        }
        let (export, identity) =
            found.ok_or_else(|| DeviceError::NotAttachedHere(volume.to_owned()))?;
        let size_bytes = export.size();
        let mut last = None;
        for (i, &kind) in kinds.iter().enumerate() {
            let made = match kind.ensure_module().await {
                Err(missing) => Err(DeviceError::NoFrontend(missing.to_string())),
                Ok(()) => kernel::make(
                    kind,
                    &self.node,
                    volume,
                    Arc::clone(&export),
                    &settings,
                    self.shutdown.clone(),
                )
                .await
                .map_err(|source| DeviceError::Link {
                    volume: volume.to_owned(),
                    frontend: kind.name(),
                    source,
                }),
            };
            match made {
                Ok(link) => {
                    let connections = match &link {
                        Link::Nbd(_) => settings.nbd.connections,
                        Link::Ublk(d) => d.queues(),
                    };
                    let record = Record {
                        volume: volume.to_owned(),
                        frontend: kind.name().into(),
                        index: link.index(),
                        connections: u32::try_from(connections).unwrap_or(1),
                        size_bytes,
                        uid: identity.uid.clone(),
                        epoch: Some(identity.epoch),
                    };
                    if let Err(e) = self.save(&record) {
                        // Without a record a restarted agent could not find the device.
                        let _ = link.detach().await;
                        return Err(e);
                    }
                    info!(%volume, device = %record.device().path, "kernel device attached");
                    if let Some(e) = last.as_ref().filter(|_| frontend == "auto") {
                        let message = format!(
                            "{} is {} because a better frontend was unavailable: {e}",
                            volume,
                            record.device().path
                        );
                        self.report(volume, DeviceEventReason::FrontendFallback, message);
                    }
                    let device = record.device();
                    self.insert(&mut live, Live { record, link });
                    return Ok(device);
                }
                Err(e) => {
                    if let Some(next) = kinds.get(i + 1) {
                        warn!(%volume, error = %e, next = next.name(), "kernel frontend unavailable; trying the next");
                    }
                    last = Some(e);
                }
            }
        }
        let err = last.unwrap_or_else(|| DeviceError::NoFrontend("none tried".into()));
        if frontend == "auto" {
            let message = format!("no kernel frontend for {volume}: {err}");
            self.report(volume, DeviceEventReason::NoKernelFrontend, message);
        }
        Err(err)
    }

    /// Ends a live device (I/O still queued on it fails with EIO) and removes its record;
    /// a device the kernel would not end keeps its record, so the next agent finds it.
    async fn end(&self, l: Live) -> Result<(), DeviceError> {
        let frontend = l.record.kind().map_or("kernel", Kind::name);
        let d = l.record.device();
        self.metrics.gone(&d.volume, &d.frontend, &d.path);
        l.link.detach().await.map_err(|source| DeviceError::Link {
            volume: d.volume.clone(),
            frontend,
            source,
        })?;
        self.remove_record(&d.volume);
        Ok(())
    }

    /// End `volume`'s device: I/O still queued on it fails with EIO, and the record goes.
    pub async fn detach(&self, volume: &str) -> Result<(), DeviceError> {
        let taken = self.live.lock().await.remove(volume);
        let Some(l) = taken else {
            // A device being recovered has a record but is not live yet.
            let Some(r) = self.records().into_iter().find(|r| r.volume == volume) else {
                return Err(DeviceError::NoDevice(volume.to_owned()));
            };
            if let Some(kind) = r.kind() {
                kernel::fail_if_ours(kind, r.index, &self.node, &r.volume).await;
            }
            self.remove_record(volume);
            return Ok(());
        };
        self.end(l).await?;
        info!(%volume, "kernel device detached");
        Ok(())
    }

    /// Why `volume`'s device here could not follow its volume if it grew now (`None`: it
    /// can, or the volume has no device here). Asked before anything grows, so a volume on a
    /// device that cannot grow is refused whole, not grown under it.
    pub async fn cannot_grow(&self, volume: &str) -> Option<String> {
        let kind = match self.live.lock().await.get(volume) {
            Some(l) => l.record.kind(),
            // Being taken back after a restart: its record says which frontend it is.
            None => self
                .records()
                .into_iter()
                .find(|r| r.volume == volume)
                .and_then(|r| r.kind()),
        }?;
        kernel::cannot_resize(kind).map(|why| format!("{} device: {why}", kind.name()))
    }

    /// Tell `volume`'s device, if it has one here, that the volume is now `size_bytes`, and
    /// keep the size in its record.
    pub async fn grow(&self, volume: &str, size_bytes: u64) -> Result<(), DeviceError> {
        let mut live = self.live.lock().await;
        let Some(l) = live.get_mut(volume) else {
            if self.records().iter().any(|r| r.volume == volume) {
                return Err(DeviceError::NotLive(volume.to_owned()));
            }
            return Ok(());
        };
        if l.record.size_bytes >= size_bytes {
            return Ok(());
        }
        let kind = l.record.kind().unwrap_or(Kind::Nbd);
        kernel::resize(kind, l.record.index, &self.node, volume, size_bytes)
            .await
            .map_err(|source| DeviceError::Link {
                volume: volume.to_owned(),
                frontend: kind.name(),
                source,
            })?;
        let mut record = l.record.clone();
        record.size_bytes = size_bytes;
        self.save(&record)?;
        l.record = record;
        info!(%volume, device = %l.record.device().path, size_bytes, "kernel device grown");
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

    /// After the agent's shutdown signal: wait for every device to stop being served (its
    /// requests in flight answered) before the engines stop. The devices stay in the kernel,
    /// holding I/O for the next agent.
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
        for kind in [Kind::Ublk, Kind::Nbd] {
            let ours: Vec<u32> = records
                .iter()
                .filter(|r| r.kind() == Some(kind))
                .map(|r| r.index)
                .collect();
            for index in kernel::orphans(kind, &self.node, &ours) {
                warn!(device = %kind.path(index), "a Hawser device without a record; ending it");
                if let Err(e) = kernel::fail(kind, index).await {
                    warn!(error = %e, "end an orphan device");
                }
            }
        }
        let mut tasks = tokio::task::JoinSet::new();
        for r in records {
            let Some(kind) = r.kind() else {
                warn!(volume = %r.volume, frontend = %r.frontend, "device record of an unknown frontend; removed");
                self.remove_record(&r.volume);
                continue;
            };
            if !kernel::still_ours(kind, r.index, &self.node, &r.volume) {
                info!(volume = %r.volume, device = %r.device().path, "the kernel no longer has this device (a reboot?); record removed");
                self.remove_record(&r.volume);
                continue;
            }
            let me = Arc::clone(&self);
            tasks.spawn(async move { me.recover_one(kind, r).await });
        }
        while tasks.join_next().await.is_some() {}
    }

    async fn recover_one(&self, kind: Kind, r: Record) {
        let mut shutdown = self.shutdown.clone();
        let started = std::time::Instant::now();
        let mut asked: Option<std::time::Instant> = None;
        let mut confirmed = false;
        loop {
            if *shutdown.borrow() {
                return;
            }
            if asked.is_none_or(|t| t.elapsed() >= self.confirming.retry) {
                asked = Some(std::time::Instant::now());
                match self.controller.attachment(&r.volume).await {
                    Ok(now) => match judge(&r.volume, &self.node, r.served(), now.as_ref()) {
                        Verdict::TakeBack => confirmed = true,
                        Verdict::Fail(why) => return self.fail_left(kind, &r, &why).await,
                    },
                    Err(e) => {
                        warn!(volume = %r.volume, error = %e, "cannot ask the controller about a device left by the last agent; its I/O waits")
                    }
                }
            }
            // The engine of the volume confirmed: an export of another uid is a namesake's,
            // which the device never serves (it waits for the right one, or its time).
            let export = self
                .exports
                .lookup_identified(&r.volume)
                .filter(|(_, id)| confirmed && (r.uid.is_none() || id.uid == r.uid));
            if let Some((export, identity)) = export {
                let mut settings = self.settings;
                settings.nbd.connections = r.connections.max(1) as usize;
                match kernel::take_back(
                    kind,
                    r.index,
                    &self.node,
                    &r.volume,
                    export,
                    &settings,
                    shutdown.clone(),
                )
                .await
                {
                    Ok(link) => {
                        info!(volume = %r.volume, device = %r.device().path, "kernel device taken back");
                        let r = self.reidentified(r, identity);
                        let volume = r.volume.clone();
                        let grown = self.exports.lookup(&volume).map(|x| x.size());
                        {
                            let mut live = self.live.lock().await;
                            self.insert(&mut live, Live { record: r, link });
                        }
                        // The volume grew while no agent served the device.
                        if let Some(size) = grown {
                            if let Err(e) = self.grow(&volume, size).await {
                                warn!(%volume, error = %e, "the device could not follow its grown volume");
                            }
                        }
                    }
                    Err(e) => {
                        warn!(volume = %r.volume, device = %r.device().path, error = %e, "kernel device could not be taken back")
                    }
                }
                return;
            }
            if started.elapsed() >= self.confirming.timeout {
                let why = match confirmed {
                    true => "its volume's engine did not start here",
                    false => "no controller confirmed that it is still its volume's",
                };
                let why = format!("{why} within {:?}", self.confirming.timeout);
                return self.fail_left(kind, &r, &why).await;
            }
            tokio::select! {
                _ = shutdown.changed() => {}
                () = tokio::time::sleep(ENGINE_POLL) => {}
            }
        }
    }

    /// `r` naming the uid and epoch of the export it is served from again, saved: a record
    /// written before uids gets them, so a later restart judges it by uid and attachment.
    fn reidentified(&self, mut r: Record, id: ExportIdentity) -> Record {
        if r.uid == id.uid && r.epoch.is_some() {
            return r;
        }
        r.uid = id.uid;
        r.epoch = Some(id.epoch);
        if let Err(e) = self.save(&r) {
            warn!(volume = %r.volume, error = %e, "cannot rewrite a device's record with its volume's uid");
        }
        r
    }

    /// Fails a device left by the last agent with EIO, removes its record, and says why (in
    /// the log and the volume's events).
    async fn fail_left(&self, kind: Kind, r: &Record, why: &str) {
        warn!(volume = %r.volume, device = %r.device().path, reason = why,
            "a device left by the last agent is not served again: failing it with EIO");
        kernel::fail_if_ours(kind, r.index, &self.node, &r.volume).await;
        self.remove_record(&r.volume);
        let message = format!("{} failed with EIO: {why}", r.device().path);
        self.report(&r.volume, DeviceEventReason::DeviceFailed, message);
    }
}
