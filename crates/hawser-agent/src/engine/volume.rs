//! Drives a `hawser_core::Engine` with real I/O: the local replica through the blocking thread
//! pool, remote replicas through `ReplicaClient`s, membership changes through the controller.
//! The engine state sits behind one mutex that is only held while the state machine runs,
//! never across I/O; the commands it returns are carried out after the lock is released.
//!
//! A maintenance task per engine reconnects replicas the engine wants back and issues
//! background flushes, when the sessions policy (`hawser_core::driver::links`, the code the
//! simulator runs) says so.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use bytes::Bytes;
use hawser_api::agent::{RecoveryReport, StartEngine};
use hawser_api::controller::{QuorumLoss, ReplicaState};
use hawser_core::IdMap;
use hawser_core::{
    ClientOp, Command, Engine, EngineConfig, Initial, IoError, NoQuorum, ReplicaIdx, ReplicaSpec,
    Tag,
};
use hawser_storage::Replica;
use hawser_wire::journal::ACTIVITY_EXTENT_BYTES;
use tokio::sync::{oneshot, Semaphore};

use hawser_core::driver::journal::{self as keeper, Act, Keeper};
use hawser_core::driver::links::{LinkParams, Links};

mod commands;
mod connections;
mod frontend;
mod grow;
mod journal;
mod recover;
mod status;
#[cfg(test)]
mod tests;

pub use status::membership_name;

use crate::constants::{
    ACTIVITY_IDLE_TICKS, ACTIVITY_MAX_EXTENTS, BACKGROUND_FLUSH_INTERVAL, ENGINE_MAX_INFLIGHT,
    ENGINE_REST_RECHECK, ENGINE_STOP_FLUSH_TIMEOUT, ENGINE_TICK, RECONNECT_BACKOFF_MAX,
    RECONNECT_BACKOFF_MIN, RESYNC_SAVE_INTERVAL,
};
use crate::control::link::{ControllerLink, LinkAuth};
use crate::engine::rate_limit::{self, RateLimiter, ResyncRates};
use crate::replica::client::ReplicaClient;
use crate::storage::pools::NodeStorage;

enum Handle {
    Local(Arc<Replica>),
    Remote {
        addr: String,
        /// TLS to the replica's node (clusters with TLS).
        tls: Option<Arc<hawser_tls::rustls::ClientConfig>>,
        client: Mutex<Option<Arc<ReplicaClient>>>,
        /// Generation of the current connection: a late `on_lost` of an older one is ignored.
        gen: AtomicU64,
    },
}

/// The driver's state: the engine, its journal keeper and its sessions policy, under one lock.
struct Inner {
    engine: Engine,
    keeper: Keeper,
    links: Links,
    waiters: IdMap<Tag, oneshot::Sender<Result<Option<Bytes>, IoError>>>,
    next_tag: Tag,
}

pub struct VolumeEngine {
    volume: String,
    /// The controller's signed epoch grant (decoded from `StartEngine::grant`), sent in every
    /// Hello; empty when the controller sent none (an engine outside a cluster).
    grant: Option<Vec<u8>>,
    /// Read on every request, so kept outside the lock; grows (never shrinks) with
    /// [`VolumeEngine::grow`], after the engine's own size under the lock.
    size: AtomicU64,
    epoch: u64,
    replica_ids: Vec<String>,
    handles: Vec<Handle>,
    inner: Mutex<Inner>,
    inflight: Semaphore,
    controller: ControllerLink,
    fenced: AtomicBool,
    /// Local replica requests in flight (inline or on the I/O pool).
    local_inflight: AtomicUsize,
    /// Generation of the local replica's session: raised when the engine disconnects it.
    local_gen: AtomicU64,
    /// The engine's clock starts here (`now_us`, the sessions policy's time).
    born: Instant,
    resync_rate: Option<Arc<RateLimiter>>,
    /// An encrypted volume's cipher (`StartEngine::data_key`; `engine/crypt.rs`).
    cipher: Option<crate::engine::crypt::VolumeCipher>,
    stopped: AtomicBool,
    /// The sequence number of the last journal commit done (`journal.rs`).
    commits: tokio::sync::watch::Sender<u64>,
    /// The keeper finished the journal for a clean stop.
    finished: tokio::sync::watch::Sender<bool>,
    /// Per replica, the reconnect waiting for its join.
    joins: Mutex<Vec<Option<oneshot::Sender<bool>>>>,
    recovery: Mutex<Option<RecoveryReport>>,
    /// When this engine's last scrub pass finished (seconds since the Unix epoch).
    scrub_finished_at: Mutex<Option<u64>>,
    /// Per replica, when its current resync began and the bytes copied to it by then (for
    /// the rate `status` reports); updated by the maintenance task.
    sync_began: Mutex<Vec<Option<(Instant, u64)>>>,
    /// Tasks are spawned here: commands may be carried out on I/O pool threads, outside the
    /// runtime.
    rt: tokio::runtime::Handle,
    me: Weak<VolumeEngine>,
    /// The maintenance task's clock stopped: the engine was at rest (`at_rest`). Every
    /// `drive` that finds it set wakes the task through `wake` (see `maintenance`).
    resting: AtomicBool,
    wake: Arc<tokio::sync::Notify>,
}

/// What [`VolumeEngine::keys`] found.
pub struct Keys {
    cipher: Option<crate::engine::crypt::VolumeCipher>,
    grant: Option<Vec<u8>>,
}

impl VolumeEngine {
    /// Build the engine, raise the local replica's epoch and connect to the remote in-sync
    /// ones. A remote replica that cannot be reached is reported lost (and outdated through
    /// the controller, or kept `Down` if the quorum requires) once the engine runs; outdated
    /// ones are reconnected and resynced by the maintenance task; a newer epoch anywhere
    /// fails the start.
    /// `resync_rate`: bytes per second the engine's resync copies may take.
    pub async fn start(
        req: &StartEngine,
        node: &str,
        storage: &NodeStorage,
        resync_rate: ResyncRates,
    ) -> anyhow::Result<Arc<VolumeEngine>> {
        Self::start_with_auth(req, node, storage, resync_rate, &LinkAuth::default()).await
    }

    /// An engine's data key and grant, checked against each other and against the local
    /// replicas' recorded key checks: a start that would open replicas with another key than
    /// their data's is refused here, before anything is touched (`Engines::start` calls this
    /// before it stops a running engine).
    pub fn keys(req: &StartEngine, node: &str, storage: &NodeStorage) -> anyhow::Result<Keys> {
        let (cipher, check) = match &req.data_key {
            Some(key) => {
                let bytes = key
                    .bytes()
                    .ok_or_else(|| anyhow::anyhow!("the volume's data key is not base64"))?;
                let check = hawser_api::KeyCheck::of(&bytes).0;
                (
                    Some(crate::engine::crypt::VolumeCipher::new(&bytes)?),
                    Some(check),
                )
            }
            None => (None, None),
        };
        let grant = match &req.grant {
            Some(g) => {
                use base64::Engine as _;
                Some(base64::engine::general_purpose::STANDARD.decode(g)?)
            }
            None => None,
        };
        if let Some(g) = &grant {
            // The grant's key check is what the remote replicas compare with theirs; it must be
            // this key's, or they would accept what this engine cannot read (or the reverse).
            let (g, _, _) = hawser_wire::grant::Grant::decode(g)?;
            anyhow::ensure!(
                g.key_check == check,
                "the epoch grant's data key check does not match the data key given with it \
                 (or one of them is missing)"
            );
        }
        for r in req.replicas.iter().filter(|r| r.node == node) {
            if let Some(replica) = storage.replica(&r.replica_id) {
                crate::replica::grants::check_key_of(&r.replica_id, replica.key_check(), check)?;
            }
        }
        Ok(Keys { cipher, grant })
    }

    /// [`VolumeEngine::start`] whose reports to the controller authenticate as `controller_auth`
    /// says (the controller refuses reports without credentials).
    pub async fn start_with_auth(
        req: &StartEngine,
        node: &str,
        storage: &NodeStorage,
        resync_rate: ResyncRates,
        controller_auth: &LinkAuth,
    ) -> anyhow::Result<Arc<VolumeEngine>> {
        let Keys { cipher, grant, .. } = Self::keys(req, node, storage)?;
        let mut handles = Vec::new();
        let mut specs = Vec::new();
        for r in &req.replicas {
            let local = r.node == node;
            let initial = match r.state {
                ReplicaState::InSync => Initial::InSync,
                ReplicaState::Outdated => Initial::Outdated { dirty: None },
                ReplicaState::Failed => Initial::Failed,
            };
            if local {
                let replica = storage
                    .replica(&r.replica_id)
                    .ok_or_else(|| anyhow::anyhow!("local replica {} not found", r.replica_id))?;
                anyhow::ensure!(
                    replica.volume() == req.volume && replica.size() >= req.size_bytes,
                    "local replica {} is of volume {:?} with {} bytes, not of {:?} with {}",
                    r.replica_id,
                    replica.volume(),
                    replica.size(),
                    req.volume,
                    req.size_bytes
                );
                if r.state != ReplicaState::Failed {
                    let (rep, epoch) = (replica.clone(), req.epoch);
                    tokio::task::spawn_blocking(move || rep.raise_epoch(epoch)).await??;
                }
                handles.push(Handle::Local(replica));
            } else {
                let tls = match &controller_auth.node {
                    Some(n) => Some(n.replica_client(&r.node)?),
                    None => None,
                };
                handles.push(Handle::Remote {
                    addr: r.replica_addr.clone(),
                    tls,
                    client: Mutex::new(None),
                    gen: AtomicU64::new(0),
                });
            }
            specs.push(ReplicaSpec { local, initial });
        }
        let n = req.replicas.len();
        let cfg = EngineConfig {
            no_quorum: match req.on_quorum_loss {
                QuorumLoss::Suspend => NoQuorum::Suspend,
                QuorumLoss::Fail => NoQuorum::Fail,
            },
            ..EngineConfig::default()
        };
        let ve = Arc::new_cyclic(|me| VolumeEngine {
            volume: req.volume.clone(),
            grant,
            size: AtomicU64::new(req.size_bytes),
            epoch: req.epoch,
            replica_ids: req.replicas.iter().map(|r| r.replica_id.clone()).collect(),
            handles,
            inner: Mutex::new(Inner {
                engine: Engine::with_config(req.size_bytes, &specs, cfg),
                keeper: Keeper::new(
                    keeper_params(),
                    req.epoch,
                    req.size_bytes,
                    cfg.chunk_bytes,
                    req.replicas.iter().map(|r| r.replica_id.clone()).collect(),
                    1,
                ),
                links: Links::new(link_params(), vec![None; n], 0),
                waiters: IdMap::default(),
                next_tag: 1,
            }),
            inflight: Semaphore::new(ENGINE_MAX_INFLIGHT),
            controller: ControllerLink::new(&req.controller_url).with_auth(controller_auth),
            fenced: AtomicBool::new(false),
            local_inflight: AtomicUsize::new(0),
            local_gen: AtomicU64::new(0),
            born: Instant::now(),
            resync_rate: rate_limit::limiter(resync_rate),
            cipher,
            stopped: AtomicBool::new(false),
            commits: tokio::sync::watch::Sender::new(0),
            finished: tokio::sync::watch::Sender::new(false),
            joins: Mutex::new((0..n).map(|_| None).collect()),
            recovery: Mutex::new(None),
            scrub_finished_at: Mutex::new(None),
            sync_began: Mutex::new(vec![None; n]),
            rt: tokio::runtime::Handle::current(),
            me: me.clone(),
            resting: AtomicBool::new(false),
            wake: Arc::new(tokio::sync::Notify::new()),
        });
        let mut unreachable = Vec::new();
        let mut boots = vec![None; n];
        for (i, r) in req.replicas.iter().enumerate() {
            if r.node == node || r.state != ReplicaState::InSync {
                continue;
            }
            let idx = ReplicaIdx(u8::try_from(i)?);
            match ve.connect_remote(idx).await {
                Ok(boot) => boots[i] = Some(boot),
                Err(e) if e.is_stale_epoch() => anyhow::bail!("fenced: {e}"),
                Err(e) => {
                    tracing::warn!(volume = %req.volume, error = %e, "replica unreachable at attach");
                    unreachable.push(idx);
                }
            }
        }
        ve.lock().links = Links::new(link_params(), boots, ve.now_us());
        ve.recover(req, &specs, cfg, &unreachable).await?;
        ve.rt.spawn(maintenance(Arc::downgrade(&ve)));
        Ok(ve)
    }

    /// One maintenance round: reconnects and a background flush.
    fn tick(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let now = self.now_us();
        let (due, flush) = {
            let mut guard = self.lock();
            let inner = &mut *guard;
            self.note_resyncs(&inner.engine);
            let due = inner.links.due(&inner.engine, now);
            (due, inner.links.flush_due(&inner.engine, now))
        };
        // The journal's clock: commits when extents may leave or maps are behind, saves.
        self.drive(|k, e, acts| k.tick(e, acts));
        for idx in due {
            self.rt.spawn(me.clone().reconnect(idx));
        }
        if flush {
            let me = me.clone();
            self.rt.spawn(async move {
                if let Err(e) = me.submit(ClientOp::Flush).await {
                    tracing::debug!(volume = %me.volume, error = %e, "background flush failed");
                }
            });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Microseconds since the engine was built: the sessions policy's clock.
    fn now_us(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Run an engine step (see `drive`).
    fn run(&self, f: impl FnOnce(&mut Engine, &mut Vec<Command>)) {
        self.drive(|_, e, acts| {
            let mut out = Vec::new();
            f(e, &mut out);
            acts.extend(out.into_iter().map(Act::Engine));
        });
    }

    /// Run the driver's state machines (engine and journal keeper) under the lock, complete
    /// waiters, then carry out the rest in order.
    fn drive(&self, f: impl FnOnce(&mut Keeper, &mut Engine, &mut Vec<Act>)) {
        self.drive_with(true, f)
    }

    /// `drive`, where `may_be_quiet` false rules out running anything inline (`send`): the
    /// caller knows more requests follow. The engine alone cannot tell: a frontend that runs
    /// each request to completion before it reads the next header would, at queue depth
    /// 128, find the engine idle every time and run the whole queue inline, one at a time.
    fn drive_with(
        &self,
        may_be_quiet: bool,
        f: impl FnOnce(&mut Keeper, &mut Engine, &mut Vec<Act>),
    ) {
        let mut acts = Vec::new();
        let mut rest = Vec::new();
        let quiet;
        {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let inner = &mut *guard;
            f(&mut inner.keeper, &mut inner.engine, &mut acts);
            // At most one client request in flight: the queue-depth-1 case.
            quiet = may_be_quiet && inner.engine.in_flight() <= 1;
            let mut queue = std::collections::VecDeque::from(acts);
            while let Some(a) = queue.pop_front() {
                match a {
                    Act::Engine(Command::Complete { tag, result }) => {
                        inner.keeper.completed(tag, result.is_ok());
                        if let Some(w) = inner.waiters.remove(&tag) {
                            let _ = w.send(result);
                        }
                    }
                    // Held by the keeper until a journal says the replica lacks nothing.
                    Act::Engine(Command::MarkInSync { replica }) => {
                        let mut more = Vec::new();
                        inner.keeper.resynced(&mut inner.engine, replica, &mut more);
                        queue.extend(more);
                    }
                    Act::Engine(Command::Fenced) => {
                        let mut failed = Vec::new();
                        inner.keeper.fail_waiting(&mut failed);
                        queue.extend(failed);
                        rest.push(Act::Engine(Command::Fenced));
                    }
                    other => rest.push(other),
                }
            }
        }
        // Remote sends first: a local request may run inline (see `send`), and the network
        // round trip should overlap it, not follow it. Journal acts keep their place.
        let is_local = |a: &Act| {
            matches!(a, Act::Engine(Command::Send { replica, .. })
                if matches!(self.handles[usize::from(replica.0)], Handle::Local(_)))
        };
        let (local, other): (Vec<Act>, Vec<Act>) = rest.into_iter().partition(is_local);
        for a in other.into_iter().chain(local) {
            match a {
                Act::Engine(c) => self.dispatch(c, quiet),
                other => self.journal_act(other),
            }
        }
        // Read after the state changed under the lock: either the maintenance task's last
        // look (under the same lock, after it set the flag) saw the change, or this sees the
        // flag (and a `notify_one` before the task waits is kept for it).
        if self.resting.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Whether nothing is left for the maintenance task's clock: the engine, its journal and
    /// its sessions are all at rest (hawser-core's `at_rest`s).
    fn at_rest(&self) -> bool {
        let inner = self.lock();
        inner.engine.at_rest() && inner.keeper.at_rest(&inner.engine) && inner.links.at_rest()
    }

    /// Whether the maintenance task's clock is stopped now (the engine rests).
    pub fn is_resting(&self) -> bool {
        self.resting.load(Ordering::SeqCst)
    }

    /// A request, under the activity log's rules (the keeper's): a modifying one waits until
    /// its extents are in the committed log; a successful flush lets extents leave it.
    async fn submit(&self, op: ClientOp) -> Result<Option<Bytes>, IoError> {
        let _permit = self
            .inflight
            .acquire()
            .await
            .map_err(|_| IoError::ShutDown)?;
        let (tx, rx) = oneshot::channel();
        let tag = {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let tag = inner.next_tag;
            inner.next_tag += 1;
            inner.waiters.insert(tag, tx);
            tag
        };
        // A request its frontend knows has others queued behind it never runs inline, even
        // if the engine has nothing else in flight yet (see `drive_with`).
        let alone = crate::frontends::block::request_is_alone();
        self.drive_with(alone, |k, e, acts| k.submit(e, tag, op, acts));
        rx.await.unwrap_or(Err(IoError::ShutDown))
    }

    /// Flush, then fail anything still in flight and drop the replica connections.
    pub async fn stop(&self) {
        // Bounded: if a replica and the controller are both gone, the flush cannot be
        // acknowledged (it waits for an outdate); shutting down then fails it instead, which
        // acknowledges nothing that is not safe.
        match tokio::time::timeout(ENGINE_STOP_FLUSH_TIMEOUT, self.submit(ClientOp::Flush)).await {
            // Everything is flushed: an empty log lets the next attach skip recovery, and a
            // resync under way resumes where it stopped.
            Ok(Ok(_)) => {
                if let Some(me) = self.me.upgrade() {
                    me.finish_journal().await;
                }
            }
            Ok(Err(e)) => tracing::warn!(volume = %self.volume, error = %e, "final flush failed"),
            Err(_) => tracing::error!(
                volume = %self.volume,
                "final flush did not complete in {ENGINE_STOP_FLUSH_TIMEOUT:?}; failing in-flight I/O"
            ),
        }
        self.stopped.store(true, Ordering::Release);
        self.controller.stop();
        self.drive(|k, e, acts| {
            let mut out = Vec::new();
            e.shutdown(&mut out);
            acts.extend(out.into_iter().map(Act::Engine));
            k.fail_waiting(acts);
        });
        journal::drop_joins(&mut self.joins.lock().unwrap_or_else(|p| p.into_inner()));
        // Wakes anything waiting for a commit that will not come.
        self.commits.send_replace(u64::MAX);
        for i in 0..self.handles.len() {
            // i < MAX_REPLICAS, so it fits in u8.
            let idx = ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS"));
            if let Some(c) = self.client(idx) {
                self.set_client(idx, None);
                c.close();
            }
        }
    }
}

/// The sessions policy's tunables in the agent (`constants.rs`), in microseconds.
fn link_params() -> LinkParams {
    let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    LinkParams {
        backoff_min: us(RECONNECT_BACKOFF_MIN),
        backoff_max: us(RECONNECT_BACKOFF_MAX),
        flush_interval: us(BACKGROUND_FLUSH_INTERVAL),
    }
}

/// The journal keeper's tunables in the agent (`constants.rs`).
fn keeper_params() -> keeper::Params {
    keeper::Params {
        extent_bytes: ACTIVITY_EXTENT_BYTES,
        max_extents: ACTIVITY_MAX_EXTENTS,
        idle_ticks: ACTIVITY_IDLE_TICKS,
        save_ticks: (RESYNC_SAVE_INTERVAL.as_millis() / ENGINE_TICK.as_millis().max(1))
            .try_into()
            .unwrap_or(u64::MAX),
        in_sync_commit: true,
    }
}

/// The maintenance loop of one engine; ends when the engine is dropped or stopped.
///
/// It ticks every [`ENGINE_TICK`] while there is something to tick for, and stops its clock
/// while the engine is at rest (`VolumeEngine::at_rest`): 1,000 idle volumes on a node
/// ticked 2,000 times a second (issue 44). The next `drive` (a request, a reply, a lost
/// replica, a stop) wakes it, and it looks again every [`ENGINE_REST_RECHECK`] in any case,
/// which also ends it soon after the engine was dropped (it holds no reference meanwhile).
async fn maintenance(engine: Weak<VolumeEngine>) {
    let mut tick = tokio::time::interval(ENGINE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(e) = engine.upgrade() else { return };
        if e.stopped.load(Ordering::Acquire) || e.is_fenced() {
            return;
        }
        e.tick();
        if !e.at_rest() {
            continue;
        }
        e.resting.store(true, Ordering::SeqCst);
        if !e.at_rest() {
            e.resting.store(false, Ordering::SeqCst);
            continue;
        }
        let wake = e.wake.clone();
        drop(e);
        let _ = tokio::time::timeout(ENGINE_REST_RECHECK, wake.notified()).await;
        let Some(e) = engine.upgrade() else { return };
        e.resting.store(false, Ordering::SeqCst);
        tick.reset();
    }
}
