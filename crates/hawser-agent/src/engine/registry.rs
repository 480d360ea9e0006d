//! The volume engines running on this node, each behind its NBD export.
//!
//! An export outlives the engine behind it: when the controller changes a volume's replicas
//! (a replacement, an evacuation) it starts a new engine, in a new epoch, on the node where
//! the volume is attached, and the agent swaps it in under the connected NBD clients. The
//! swap closes a gate that every request passes (a read lock held while the request runs),
//! so the old engine is stopped with nothing in flight (its final flush succeeds and its
//! journal says so: the new engine's recovery compares nothing), the new one starts, and the
//! requests that arrived meanwhile run on it. Clients see a pause, never an error.
//!
//! Only an engine of the same volume is swapped in: one of the same name but another uid is
//! a namesake (the volume was deleted and another created under its name), so the old
//! export is ended (its clients and kernel devices get errors from now on, never the
//! namesake's blocks) and the namesake gets an export of its own.

pub mod pause;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use hawser_api::agent::{EngineStatus, StartEngine, VolumeIoCounters};
use hawser_api::Qos;
use hawser_core::IoError;

use crate::constants::ENGINE_SWAP_DRAIN_TIMEOUT;
use crate::control::link::LinkAuth;
use crate::engine::qos::{Cost, QosLimiter};
use crate::engine::rate_limit::ResyncRates;
use crate::engine::volume::VolumeEngine;
use crate::frontends::block::{BlockDevice, ExportIdentity, ExportRegistry};
use crate::observe::io::{IoMetrics, IoOp, VolumeIo};
use crate::storage::pools::NodeStorage;

/// One volume's NBD export and the engine currently behind it.
pub struct Export {
    /// The size NBD clients and kernel devices are given: the engine's, raised after the
    /// engine's own on an online grow (never before: a request in the new range must find an
    /// engine that takes it).
    size: AtomicU64,
    /// Requests hold it shared while they run; a swap or a pause holds it exclusively.
    pub(crate) gate: tokio::sync::RwLock<()>,
    engine: Mutex<Option<Arc<VolumeEngine>>>,
    /// Offered to NBD clients (`StartEngine::export`): not while the engine only syncs the
    /// new replicas of a detached volume.
    nbd: AtomicBool,
    /// Its request metrics (see `metrics`).
    io: VolumeIo,
    /// The volume's limits (`StartEngine::qos`, changed live by `PUT .../qos`): they apply
    /// to the volume, whichever engine serves it.
    qos: QosLimiter,
    /// The volume's uid (`StartEngine::uid`), fixed for the export's life: every engine it
    /// is given serves the same volume.
    uid: Option<String>,
    /// The epoch of the engine behind it (the last started).
    epoch: AtomicU64,
}

impl Export {
    fn new(engine: Arc<VolumeEngine>, req: &StartEngine, io: VolumeIo) -> Export {
        Export {
            uid: req.uid.clone(),
            epoch: AtomicU64::new(req.epoch),
            size: AtomicU64::new(BlockDevice::size(&*engine)),
            gate: tokio::sync::RwLock::new(()),
            engine: Mutex::new(Some(engine)),
            nbd: AtomicBool::new(req.export),
            io,
            qos: QosLimiter::new(req.qos),
        }
    }

    /// Who it serves now.
    pub fn identity(&self) -> ExportIdentity {
        ExportIdentity {
            uid: self.uid.clone(),
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }

    /// Runs `f` (a request of `op` moving `bytes` if it succeeds) once the volume's limits
    /// let it start, then with the gate open, counted in the volume's request metrics (its
    /// latency includes the wait for the limits, as the client sees it).
    async fn counted<T>(
        &self,
        op: IoOp,
        bytes: u64,
        f: impl std::future::Future<Output = Result<T, IoError>>,
    ) -> Result<T, IoError> {
        let started = self.io.start(op);
        let waited = self.qos.admit(cost_of(op, bytes)).await;
        if !waited.is_zero() {
            self.io.throttled(waited);
        }
        let result = {
            let _open = self.gate.read().await;
            f.await
        };
        self.io.done(started, bytes, result.is_ok());
        result
    }

    pub fn engine(&self) -> Option<Arc<VolumeEngine>> {
        self.engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, e: Option<Arc<VolumeEngine>>) -> Option<Arc<VolumeEngine>> {
        std::mem::replace(
            &mut *self.engine.lock().unwrap_or_else(|p| p.into_inner()),
            e,
        )
    }

    /// Its engine's status with the volume's limits.
    fn status(&self) -> Option<EngineStatus> {
        let mut status = self.engine()?.status();
        status.qos = self.qos.get();
        Some(status)
    }

    /// The engine a request runs on, or `ShutDown` when there is none (stopped, fenced).
    fn current(&self) -> Result<Arc<VolumeEngine>, IoError> {
        self.engine()
            .filter(|e| !e.is_fenced())
            .ok_or(IoError::ShutDown)
    }
}

#[async_trait]
impl BlockDevice for Export {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError> {
        self.counted(IoOp::Read, u64::from(len), async {
            self.current()?.read(offset, len).await
        })
        .await
    }
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), IoError> {
        let len = data.len() as u64;
        self.counted(IoOp::Write, len, async {
            self.current()?.write(offset, data, fua).await
        })
        .await
    }
    async fn flush(&self) -> Result<(), IoError> {
        self.counted(IoOp::Flush, 0, async { self.current()?.flush().await })
            .await
    }
    async fn trim(&self, offset: u64, len: u32) -> Result<(), IoError> {
        self.counted(IoOp::Trim, u64::from(len), async {
            self.current()?.trim(offset, len).await
        })
        .await
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    ) -> Result<(), IoError> {
        self.counted(IoOp::WriteZeroes, u64::from(len), async {
            self.current()?
                .write_zeroes(offset, len, fua, may_trim)
                .await
        })
        .await
    }
}

/// What a request costs against the volume's limits: trims and zeroings count as writes
/// that move no data.
fn cost_of(op: IoOp, bytes: u64) -> Cost {
    match op {
        IoOp::Read => Cost::Read { bytes },
        IoOp::Write => Cost::Write { bytes },
        IoOp::Trim | IoOp::WriteZeroes => Cost::Write { bytes: 0 },
        IoOp::Flush => Cost::Free,
    }
}

#[derive(Default)]
pub struct Engines {
    map: Mutex<HashMap<String, Arc<Export>>>,
    io: IoMetrics,
    /// Volumes held for a snapshot (`pause.rs`).
    pauses: Arc<self::pause::Pauses>,
}

impl Engines {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Export>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn export(&self, volume: &str) -> Option<Arc<Export>> {
        self.lock().get(volume).cloned()
    }

    pub(crate) fn pauses(&self) -> &Arc<self::pause::Pauses> {
        &self.pauses
    }

    /// The request metrics of every export.
    pub fn io(&self) -> &IoMetrics {
        &self.io
    }

    pub fn get(&self, volume: &str) -> Option<Arc<VolumeEngine>> {
        self.lock().get(volume).and_then(|x| x.engine())
    }

    /// Starts the engine `req` describes. With an engine of another epoch running for the
    /// volume, swaps it (see the module doc): waits at most [`ENGINE_SWAP_DRAIN_TIMEOUT`] for
    /// its requests to finish, failing the start (and keeping the old engine) if they do not.
    /// If the new engine cannot start, the export stays without one (requests fail) until a
    /// later start succeeds.
    pub async fn start(
        &self,
        req: &StartEngine,
        node: &str,
        storage: &NodeStorage,
        resync_rate: ResyncRates,
        controller_auth: &LinkAuth,
    ) -> anyhow::Result<Arc<VolumeEngine>> {
        // A wrong key is refused before a running engine is stopped for it.
        VolumeEngine::keys(req, node, storage)?;
        let mut existing = self.lock().get(&req.volume).cloned();
        if let Some(old) = existing.take_if(|x| x.uid != req.uid) {
            tracing::warn!(
                volume = %req.volume, old_uid = ?old.uid, new_uid = ?req.uid,
                "an engine of another volume of the same name: ending the old volume's export \
                 (its clients and devices get errors) before serving the new one"
            );
            self.end_export(&req.volume, &old).await;
        }
        let Some(export) = existing else {
            let engine =
                VolumeEngine::start_with_auth(req, node, storage, resync_rate, controller_auth)
                    .await?;
            let io = self.io.volume(&req.volume);
            let export = Arc::new(Export::new(engine.clone(), req, io));
            let replaced = self.lock().insert(req.volume.clone(), export);
            if let Some(old) = replaced {
                // A concurrent first start of the same volume; the controller serialises
                // them, so this is not expected, but the loser must not keep running.
                if let Some(e) = old.set(None) {
                    e.stop().await;
                }
            }
            return Ok(engine);
        };
        let closed = tokio::time::timeout(ENGINE_SWAP_DRAIN_TIMEOUT, export.gate.write())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "requests of the running engine did not finish within \
                     {ENGINE_SWAP_DRAIN_TIMEOUT:?}; it keeps running"
                )
            })?;
        if let Some(old) = export.set(None) {
            old.stop().await;
        }
        let engine =
            VolumeEngine::start_with_auth(req, node, storage, resync_rate, controller_auth).await?;
        export.set(Some(engine.clone()));
        export.epoch.store(req.epoch, Ordering::Release);
        // A volume grown while no engine ran here (the record had the new size).
        export
            .size
            .fetch_max(BlockDevice::size(&*engine), Ordering::AcqRel);
        export.nbd.store(req.export, Ordering::Release);
        export.qos.set(req.qos);
        drop(closed);
        Ok(engine)
    }

    /// Removes `old` (if it is still the volume's export) and stops its engine: requests of
    /// its clients and devices fail from now on, as after [`Engines::stop`].
    async fn end_export(&self, volume: &str, old: &Arc<Export>) {
        {
            let mut map = self.lock();
            if map.get(volume).is_some_and(|x| Arc::ptr_eq(x, old)) {
                map.remove(volume);
            }
        }
        if let Some(e) = old.set(None) {
            e.stop().await;
        }
    }

    /// Stops the volume's engine and removes its export (clients' requests fail from now on).
    pub async fn stop(&self, volume: &str) -> bool {
        let Some(export) = self.export(volume) else {
            return false;
        };
        self.end_export(volume, &export).await;
        true
    }

    pub fn all(&self) -> Vec<Arc<VolumeEngine>> {
        self.lock().values().filter_map(|x| x.engine()).collect()
    }

    /// Every export's request counters (`GET /v1/io`), by volume name.
    pub fn io_counters(&self, node: &str) -> Vec<VolumeIoCounters> {
        let mut v: Vec<VolumeIoCounters> =
            self.lock().values().map(|x| x.io.counters(node)).collect();
        v.sort_by(|a, b| a.volume.cmp(&b.volume));
        v
    }

    pub fn statuses(&self) -> Vec<EngineStatus> {
        let exports: Vec<Arc<Export>> = self.lock().values().cloned().collect();
        let mut v: Vec<EngineStatus> = exports.iter().filter_map(|x| x.status()).collect();
        v.sort_by(|a, b| a.volume.cmp(&b.volume));
        v
    }

    /// The status of the volume's engine, if one runs.
    pub fn status(&self, volume: &str) -> Option<EngineStatus> {
        self.export(volume)?.status()
    }

    /// Starts a scrub pass of the volume's engine; `None` if none runs here, else whether a
    /// pass started (false: one is under way) and the engine's status.
    pub fn start_scrub(&self, volume: &str) -> Option<(bool, EngineStatus)> {
        let x = self.export(volume)?;
        let started = x.current().ok()?.start_scrub();
        Some((started, x.status()?))
    }

    /// The size the volume's export has here, if it has one.
    pub fn size_of(&self, volume: &str) -> Option<u64> {
        self.export(volume).map(|x| BlockDevice::size(&*x))
    }

    /// Grow the volume's engine, then its export, to `size` bytes (see `volume/grow.rs`).
    /// The gate is held shared, as by a request, so an engine swap waits for the grow.
    pub async fn grow(&self, volume: &str, size: u64) -> anyhow::Result<()> {
        let x = self
            .export(volume)
            .ok_or_else(|| anyhow::anyhow!("no engine of volume {volume} runs here"))?;
        let _open = x.gate.read().await;
        let engine = x
            .current()
            .map_err(|e| anyhow::anyhow!("volume {volume} has no running engine: {e}"))?;
        engine.grow(size)?;
        x.size.fetch_max(size, Ordering::AcqRel);
        Ok(())
    }

    /// Changes the volume's limits now; false if no engine of the volume runs here.
    pub fn set_qos(&self, volume: &str, qos: Qos) -> bool {
        match self.export(volume) {
            Some(x) => {
                x.qos.set(qos);
                true
            }
            None => false,
        }
    }
}

impl Engines {
    /// The volume's export if it is offered to clients: between engines (a swap) it still is
    /// (its requests wait at the gate); an export that only syncs replicas, or whose engine is
    /// fenced (the volume is served elsewhere now), is not.
    fn offered(&self, name: &str) -> Option<Arc<Export>> {
        let export = self.export(name)?;
        let fenced = export.engine().is_some_and(|e| e.is_fenced());
        (export.nbd.load(Ordering::Acquire) && !fenced).then_some(export)
    }
}

impl ExportRegistry for Engines {
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.offered(name).map(|x| x as Arc<dyn BlockDevice>)
    }

    fn lookup_identified(&self, name: &str) -> Option<(Arc<dyn BlockDevice>, ExportIdentity)> {
        let export = self.offered(name)?;
        let identity = export.identity();
        Some((export as Arc<dyn BlockDevice>, identity))
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, x)| x.nbd.load(Ordering::Acquire))
            .map(|(k, _)| k.clone())
            .collect();
        names.sort();
        names
    }
}
