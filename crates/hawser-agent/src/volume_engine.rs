//! Drives a `hawser_core::Engine` with real I/O: the local replica through the blocking thread
//! pool, remote replicas through `ReplicaClient`s, membership changes through the controller.
//! The engine state sits behind one mutex that is only held while the state machine runs,
//! never across I/O; the commands it returns are carried out after the lock is released.
//!
//! A maintenance task per engine reconnects replicas the engine wants back (with backoff),
//! telling it whether the replica's node rebooted meanwhile, and issues background flushes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use hawser_api::agent::{EngineReplicaStatus, EngineStatus, RecoveryReport, StartEngine};
use hawser_api::controller::{QuorumLoss, ReplicaState};
use hawser_core::{
    ClientOp, Command, Engine, EngineConfig, Initial, IoError, Membership, NoQuorum,
    ReplicaFailure, ReplicaIdx, ReplicaResult, ReplicaSpec, SubId, Tag,
};
use hawser_storage::{Replica, ReplicaIoError};
use hawser_wire::grant::HelloRequest;
use hawser_wire::journal::ACTIVITY_EXTENT_BYTES;
use tokio::sync::{oneshot, Semaphore};

use crate::recovery;
use crate::replica_access::Access;
use hawser_core::driver::journal::{self as keeper, Act, Keeper};
use hawser_core::driver::recovery::{decide, Decision, Found, Member, Stored};

use crate::block::BlockDevice;
mod journal;

use crate::constants::{
    ACTIVITY_IDLE_TICKS, ACTIVITY_MAX_EXTENTS, BACKGROUND_FLUSH_INTERVAL, ENGINE_MAX_INFLIGHT,
    ENGINE_STOP_FLUSH_TIMEOUT, ENGINE_TICK, INLINE_IO_MAX_BYTES, RECONNECT_BACKOFF_MAX,
    RECONNECT_BACKOFF_MIN, RESYNC_SAVE_INTERVAL,
};
use crate::controller_link::{ControllerLink, LinkAuth, OutdateOutcome};
use crate::io_pool;
use crate::node_storage::NodeStorage;
use crate::rate_limit::{self, RateLimiter, ResyncRates};
use crate::replica_client::{ConnectError, ReplicaClient, ReplySink};

enum Handle {
    Local(Arc<Replica>),
    Remote {
        addr: String,
        /// TLS to the replica's node (clusters with TLS).
        tls: Option<Arc<hawser_tls::rustls::ClientConfig>>,
        client: Mutex<Option<Arc<ReplicaClient>>>,
        /// Generation of the current connection: a late `on_lost` of an older one is ignored.
        gen: AtomicU64,
        /// Boot id the replica's node reported at the last Hello.
        boot: Mutex<Option<u64>>,
    },
}

/// Reconnect bookkeeping of one replica.
struct Reconnect {
    busy: bool,
    next_try: Instant,
    backoff: Duration,
}

/// The driver's state: the engine and its journal keeper, under one lock.
struct Inner {
    engine: Engine,
    keeper: Keeper,
    waiters: HashMap<Tag, oneshot::Sender<Result<Option<Bytes>, IoError>>>,
    next_tag: Tag,
}

pub struct VolumeEngine {
    volume: String,
    /// The controller's signed epoch grant (decoded from `StartEngine::grant`), sent in every
    /// Hello; empty when the controller sent none (an engine outside a cluster).
    grant: Option<Vec<u8>>,
    /// Fixed for the engine's life; read on every request, so kept outside the lock.
    size: u64,
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
    reconnect: Mutex<Vec<Reconnect>>,
    last_flush: Mutex<Instant>,
    resync_rate: Option<Arc<RateLimiter>>,
    stopped: AtomicBool,
    /// The sequence number of the last journal commit done (`journal.rs`).
    commits: tokio::sync::watch::Sender<u64>,
    /// The keeper finished the journal for a clean stop.
    finished: tokio::sync::watch::Sender<bool>,
    /// Per replica, the reconnect waiting for its join.
    joins: Mutex<Vec<Option<oneshot::Sender<bool>>>>,
    recovery: Mutex<Option<RecoveryReport>>,
    /// Per replica, when its current resync began and the bytes copied to it by then (for
    /// the rate `status` reports); updated by the maintenance task.
    sync_began: Mutex<Vec<Option<(Instant, u64)>>>,
    /// Tasks are spawned here: commands may be carried out on I/O pool threads, outside the
    /// runtime.
    rt: tokio::runtime::Handle,
    me: Weak<VolumeEngine>,
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

    /// [`VolumeEngine::start`] whose reports to the controller authenticate as `controller_auth`
    /// says (the controller refuses reports without credentials).
    pub async fn start_with_auth(
        req: &StartEngine,
        node: &str,
        storage: &NodeStorage,
        resync_rate: ResyncRates,
        controller_auth: &LinkAuth,
    ) -> anyhow::Result<Arc<VolumeEngine>> {
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
                    boot: Mutex::new(None),
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
        let grant = match &req.grant {
            Some(g) => {
                use base64::Engine as _;
                Some(base64::engine::general_purpose::STANDARD.decode(g)?)
            }
            None => None,
        };
        let ve = Arc::new_cyclic(|me| VolumeEngine {
            volume: req.volume.clone(),
            grant,
            size: req.size_bytes,
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
                waiters: HashMap::new(),
                next_tag: 1,
            }),
            inflight: Semaphore::new(ENGINE_MAX_INFLIGHT),
            controller: ControllerLink::new(&req.controller_url).with_auth(controller_auth),
            fenced: AtomicBool::new(false),
            local_inflight: AtomicUsize::new(0),
            local_gen: AtomicU64::new(0),
            reconnect: Mutex::new(
                (0..n)
                    .map(|_| Reconnect {
                        busy: false,
                        next_try: Instant::now(),
                        backoff: RECONNECT_BACKOFF_MIN,
                    })
                    .collect(),
            ),
            last_flush: Mutex::new(Instant::now()),
            resync_rate: rate_limit::limiter(resync_rate),
            stopped: AtomicBool::new(false),
            commits: tokio::sync::watch::Sender::new(0),
            finished: tokio::sync::watch::Sender::new(false),
            joins: Mutex::new((0..n).map(|_| None).collect()),
            recovery: Mutex::new(None),
            sync_began: Mutex::new(vec![None; n]),
            rt: tokio::runtime::Handle::current(),
            me: me.clone(),
        });
        let mut unreachable = Vec::new();
        for (i, r) in req.replicas.iter().enumerate() {
            if r.node == node || r.state != ReplicaState::InSync {
                continue;
            }
            let idx = ReplicaIdx(u8::try_from(i)?);
            match ve.connect_remote(idx).await {
                Ok(()) => {}
                Err(e) if e.is_stale_epoch() => anyhow::bail!("fenced: {e}"),
                Err(e) => {
                    tracing::warn!(volume = %req.volume, error = %e, "replica unreachable at attach");
                    unreachable.push(idx);
                }
            }
        }
        ve.recover(req, &specs, cfg, &unreachable).await?;
        ve.rt.spawn(maintenance(Arc::downgrade(&ve)));
        Ok(ve)
    }

    /// Crash recovery (see `recovery.rs`) before any I/O: reconcile the reachable in-sync
    /// replicas over the previous engine's activity logs, work out what the others lack, then
    /// commit this engine's first journal.
    async fn recover(
        &self,
        req: &StartEngine,
        specs: &[ReplicaSpec],
        cfg: EngineConfig,
        unreachable: &[ReplicaIdx],
    ) -> anyhow::Result<()> {
        // What the attach finds of each replica; the decision is `hawser_core::driver`'s,
        // the one the simulator runs.
        let mut members = Vec::with_capacity(req.replicas.len());
        let mut access: Vec<Option<Access>> = Vec::with_capacity(req.replicas.len());
        for (i, r) in req.replicas.iter().enumerate() {
            let stored = match r.state {
                ReplicaState::InSync => Stored::InSync,
                ReplicaState::Outdated => Stored::Outdated { blank: r.blank },
                ReplicaState::Failed => Stored::Failed,
            };
            let a = self.access(i);
            let found = match (&a, stored) {
                (_, Stored::Outdated { .. } | Stored::Failed) => Found::NotAsked,
                _ if unreachable.contains(&Self::idx(i)) => Found::Unreachable,
                (None, _) => Found::Unreachable,
                (Some(a), _) => match a.get_journal(self.epoch).await {
                    Ok(j) => Found::Journal {
                        rebooted: j.as_ref().is_none_or(|j| j.rebooted),
                        journal: j.map(|s| s.journal),
                    },
                    Err(e) if e.is_stale_epoch() => anyhow::bail!("fenced: {e}"),
                    // A replica whose disk fails its journal read is failed, not waited for:
                    // one broken disk must not keep the volume from attaching.
                    Err(e) if e.is_disk_error() => {
                        tracing::error!(volume = %req.volume, error = %e, "in-sync replica failed at attach; it will be marked failed");
                        Found::DiskError
                    }
                    Err(e) => anyhow::bail!("crash recovery: {e}"),
                },
            };
            members.push(Member {
                id: r.replica_id.clone(),
                local: specs[i].local,
                stored,
                found,
            });
            access.push(a);
        }
        let start = match decide(self.epoch, self.size, cfg.chunk_bytes, &members) {
            Decision::Start(s) => s,
            Decision::Refuse(why) => {
                anyhow::bail!("crash recovery of volume {}: {why}", req.volume)
            }
        };
        let reach: Vec<Access> = start
            .sources
            .iter()
            .filter_map(|&i| access[i].clone())
            .collect();
        if start.source_not_whole && reach.len() > 1 {
            tracing::warn!(volume = %req.volume, "no in-sync replica is known to be whole (every node rebooted?); writes none of them had flushed may be lost");
        } else if !members[start.sources[0]].local
            && start.sources.iter().any(|&i| members[i].local)
        {
            tracing::info!(volume = %req.volume, source = reach[0].id(), "crash recovery source: a whole replica rather than the local one");
        }
        let started = Instant::now();
        let done = recovery::reconcile(self.epoch, &reach, &start.plan)
            .await
            .map_err(|e| anyhow::anyhow!("crash recovery: {e}"))?;
        let report = RecoveryReport {
            replicas: u32::try_from(reach.len()).unwrap_or(u32::MAX),
            compared_bytes: done.compared_bytes,
            copied_bytes: done.copied_bytes,
            millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        tracing::info!(volume = %self.volume, ?report, "crash recovery done");
        *self.recovery.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
        {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.engine = start.engine(self.size, cfg);
            inner.keeper = Keeper::new(
                keeper_params(),
                self.epoch,
                self.size,
                cfg.chunk_bytes,
                self.replica_ids.clone(),
                start.plan.next_seq,
            );
        }
        for &idx in &start.unreachable {
            self.run(|e, out| e.on_replica_lost(idx, out));
        }
        for &idx in &start.broken {
            // What it lacks does not matter: it is never resynced, only replaced.
            self.run(|e, out| e.on_replica_disk_error(idx, out));
        }
        self.commit(0).await;
        Ok(())
    }

    /// Open a new session with remote replica `idx` (Hello) and install it.
    async fn connect_remote(&self, idx: ReplicaIdx) -> Result<(), ConnectError> {
        let Handle::Remote {
            addr,
            tls,
            gen,
            boot,
            ..
        } = &self.handles[usize::from(idx.0)]
        else {
            return Ok(());
        };
        let g = gen.fetch_add(1, Ordering::AcqRel) + 1;
        let sink = Arc::new(Sink {
            engine: self.me.clone(),
            replica: idx,
            gen: g,
        });
        let id = &self.replica_ids[usize::from(idx.0)];
        let hello = HelloRequest {
            replica: id.clone(),
            grant: self.grant.clone(),
        };
        let (client, info) =
            ReplicaClient::connect(addr, tls.clone(), &hello, self.epoch, sink).await?;
        *boot.lock().unwrap_or_else(|p| p.into_inner()) = Some(info.boot_id);
        self.set_client(idx, Some(Arc::new(client)));
        Ok(())
    }

    /// Reconnect a replica the engine wants back, and tell the engine.
    async fn reconnect(self: Arc<Self>, idx: ReplicaIdx) {
        let ok = match &self.handles[usize::from(idx.0)] {
            Handle::Local(r) => !r.is_failed() && self.join(usize::from(idx.0), false).await,
            Handle::Remote { boot, .. } => {
                let before = *boot.lock().unwrap_or_else(|p| p.into_inner());
                match self.connect_remote(idx).await {
                    Ok(()) => {
                        let after = *boot.lock().unwrap_or_else(|p| p.into_inner());
                        let rebooted = before.is_none() || before != after;
                        tracing::info!(volume = %self.volume, replica = %self.replica_ids[usize::from(idx.0)], rebooted, "replica reconnected");
                        let joined = self.join(usize::from(idx.0), rebooted).await;
                        if !joined {
                            // The engine was not told: the next attempt must still see the
                            // reboot, or what the replica lost with its power is never
                            // recopied (found by the simulator).
                            *boot.lock().unwrap_or_else(|p| p.into_inner()) = before;
                            if let Some(c) = self.client(idx) {
                                self.set_client(idx, None);
                                c.close();
                            }
                        }
                        joined
                    }
                    Err(e) if e.is_stale_epoch() => {
                        self.run(|e, out| e.on_fenced(out));
                        false
                    }
                    Err(e) => {
                        tracing::debug!(volume = %self.volume, error = %e, "reconnect failed");
                        false
                    }
                }
            }
        };
        let mut rc = self.reconnect.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut rc[usize::from(idx.0)];
        slot.busy = false;
        if ok {
            slot.backoff = RECONNECT_BACKOFF_MIN;
        } else {
            slot.next_try = Instant::now() + slot.backoff;
            slot.backoff = (slot.backoff * 2).min(RECONNECT_BACKOFF_MAX);
        }
    }

    /// One maintenance round: reconnects and a background flush.
    fn tick(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let (wanted, wants_flush) = {
            let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let e = &inner.engine;
            self.note_resyncs(e);
            let wanted: Vec<ReplicaIdx> = (0..self.handles.len())
                .map(|i| ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS")))
                .filter(|&r| e.wants_connection(r))
                .collect();
            (wanted, e.wants_flush())
        };
        // The journal's clock: commits when extents may leave or maps are behind, saves.
        self.drive(|k, e, acts| k.tick(e, acts));
        let now = Instant::now();
        for idx in wanted {
            let mut rc = self.reconnect.lock().unwrap_or_else(|p| p.into_inner());
            let slot = &mut rc[usize::from(idx.0)];
            if slot.busy || now < slot.next_try {
                continue;
            }
            slot.busy = true;
            drop(rc);
            self.rt.spawn(me.clone().reconnect(idx));
        }
        let mut last = self.last_flush.lock().unwrap_or_else(|p| p.into_inner());
        if wants_flush && now.duration_since(*last) >= BACKGROUND_FLUSH_INTERVAL {
            *last = now;
            let me = me.clone();
            self.rt.spawn(async move {
                if let Err(e) = me.submit(ClientOp::Flush).await {
                    tracing::debug!(volume = %me.volume, error = %e, "background flush failed");
                }
            });
        }
    }

    /// Remembers when each replica's resync began (and forgets it when it ends).
    fn note_resyncs(&self, e: &Engine) {
        let mut began = self.sync_began.lock().unwrap_or_else(|p| p.into_inner());
        for (i, b) in began.iter_mut().enumerate() {
            let v = e.replica_view(Self::idx(i));
            let syncing = matches!(v.membership, Membership::Syncing | Membership::Marking);
            match (syncing, &b) {
                (true, None) => *b = Some((Instant::now(), v.copied_bytes)),
                (false, Some(_)) => *b = None,
                _ => {}
            }
        }
    }

    /// Bytes per second copied to replica `i` since its resync began.
    fn resync_speed(&self, i: usize, copied_now: u64) -> u64 {
        let began = self.sync_began.lock().unwrap_or_else(|p| p.into_inner());
        match began.get(i).copied().flatten() {
            Some((at, copied)) => {
                let ms = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
                if ms < 500 {
                    return 0;
                }
                copied_now.saturating_sub(copied).saturating_mul(1000) / ms
            }
            None => 0,
        }
    }

    fn set_client(&self, idx: ReplicaIdx, client: Option<Arc<ReplicaClient>>) {
        if let Handle::Remote { client: slot, .. } = &self.handles[usize::from(idx.0)] {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = client;
        }
    }

    fn client(&self, idx: ReplicaIdx) -> Option<Arc<ReplicaClient>> {
        match &self.handles[usize::from(idx.0)] {
            Handle::Remote { client, .. } => {
                client.lock().unwrap_or_else(|p| p.into_inner()).clone()
            }
            Handle::Local(_) => None,
        }
    }

    fn current_gen(&self, idx: ReplicaIdx) -> u64 {
        match &self.handles[usize::from(idx.0)] {
            Handle::Remote { gen, .. } => gen.load(Ordering::Acquire),
            Handle::Local(_) => self.local_gen.load(Ordering::Acquire),
        }
    }

    pub fn status(&self) -> EngineStatus {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        EngineStatus {
            volume: self.volume.clone(),
            epoch: self.epoch,
            size_bytes: inner.engine.size(),
            in_sync: inner
                .engine
                .in_sync()
                .into_iter()
                .map(|r| self.replica_ids[usize::from(r.0)].clone())
                .collect(),
            replicas: (0..self.handles.len())
                .map(|i| {
                    let idx = ReplicaIdx(u8::try_from(i).expect("at most MAX_REPLICAS"));
                    let v = inner.engine.replica_view(idx);
                    EngineReplicaStatus {
                        replica_id: self.replica_ids[i].clone(),
                        state: membership_name(v.membership).into(),
                        connected: v.connected,
                        dirty_bytes: v.dirty_bytes,
                        copied_bytes: v.copied_bytes,
                        resync_bytes_per_sec: self.resync_speed(i, v.copied_bytes),
                    }
                })
                .collect(),
            recovery: *self.recovery.lock().unwrap_or_else(|p| p.into_inner()),
            active_extents: inner.keeper.active_extents() as u64,
        }
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
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
        let mut acts = Vec::new();
        let mut rest = Vec::new();
        let quiet;
        {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let inner = &mut *guard;
            f(&mut inner.keeper, &mut inner.engine, &mut acts);
            // At most one client request in flight: the queue-depth-1 case.
            quiet = inner.engine.in_flight() <= 1;
            let mut queue = std::collections::VecDeque::from(acts);
            while let Some(a) = queue.pop_front() {
                match a {
                    Act::Engine(Command::Complete { tag, result }) => {
                        inner.keeper.completed(tag, result.is_ok());
                        if let Some(w) = inner.waiters.remove(&tag) {
                            let _ = w.send(result);
                        }
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
    }

    fn dispatch(&self, c: Command, quiet: bool) {
        match c {
            Command::Send {
                replica,
                sub,
                op,
                background,
            } => match (&self.resync_rate, background, self.me.upgrade()) {
                (Some(limit), true, Some(me)) => {
                    let (limit, bytes) = (limit.clone(), op_bytes(&op));
                    let gen = self.current_gen(replica);
                    self.rt.spawn(async move {
                        limit.acquire(bytes).await;
                        me.send_if_current(replica, gen, sub, op);
                    });
                }
                _ => self.send(replica, sub, op, quiet && !background),
            },
            Command::Outdate { replica, failed } => self.outdate(replica, failed),
            Command::MarkInSync { replica } => self.mark_in_sync(replica),
            Command::Disconnect { replica } => self.disconnect(replica),
            Command::Fenced => {
                self.fenced.store(true, Ordering::Release);
                tracing::error!(volume = %self.volume, epoch = self.epoch, "engine fenced by a newer epoch; failing all I/O");
            }
            Command::Complete { .. } => unreachable!("completions are handled under the lock"),
        }
    }

    /// Send a resync request that waited for the rate limiter, unless the replica's session
    /// changed meanwhile (`gen`: the session it was meant for). The engine already counted
    /// such a request lost with its session; sent now, a copy's stale data would land on the
    /// new session, possibly after newer writes to the same chunks.
    fn send_if_current(&self, replica: ReplicaIdx, gen: u64, sub: SubId, op: ClientOp) {
        let local = matches!(self.handles[usize::from(replica.0)], Handle::Local(_));
        if local {
            // Counted across the check, so a local disconnect waits for it (see `disconnect`).
            self.local_inflight.fetch_add(1, Ordering::AcqRel);
        }
        if self.current_gen(replica) == gen {
            self.send(replica, sub, op, false);
        } else {
            tracing::debug!(volume = %self.volume, sub, "resync send for a closed session dropped");
        }
        if local {
            self.local_inflight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// `quiet`: the engine has no other client request in flight, so a small local request
    /// may run inline (see below) without holding anything else up.
    fn send(&self, replica: ReplicaIdx, sub: SubId, op: ClientOp, quiet: bool) {
        match &self.handles[usize::from(replica.0)] {
            Handle::Local(r) => {
                // Idle engine, small request: do it here. Handing it to an I/O thread and back
                // costs two thread wake-ups, which on a VM exceed a 4k O_DIRECT read or write.
                // Under load (anything local in flight) requests go to the pool as usual.
                if quiet && is_small(&op) && self.local_inflight.load(Ordering::Acquire) == 0 {
                    self.local_inflight.fetch_add(1, Ordering::AcqRel);
                    let result = run_local(r, self.epoch, &op);
                    self.local_inflight.fetch_sub(1, Ordering::AcqRel);
                    self.run(|e, out| e.on_reply(sub, result, out));
                    return;
                }
                self.local_inflight.fetch_add(1, Ordering::AcqRel);
                let (r, epoch, me) = (r.clone(), self.epoch, self.me.clone());
                io_pool::spawn(move || {
                    let result = run_local(&r, epoch, &op);
                    if let Some(me) = me.upgrade() {
                        me.local_inflight.fetch_sub(1, Ordering::AcqRel);
                        me.run(|e, out| e.on_reply(sub, result, out));
                    }
                });
            }
            Handle::Remote { .. } => match self.client(replica) {
                Some(c) => c.send(sub, &op, quiet),
                None => self.run(|e, out| e.on_reply(sub, Err(ReplicaFailure::Lost), out)),
            },
        }
    }

    /// Ask the controller to take `replica` out of the in-sync set; retry until it answers.
    fn outdate(&self, replica: ReplicaIdx, failed: bool) {
        let Some(me) = self.me.upgrade() else { return };
        let id = self.replica_ids[usize::from(replica.0)].clone();
        self.rt.spawn(async move {
            let reason = format!("engine of epoch {} lost the replica", me.epoch);
            match me
                .controller
                .outdate(&me.volume, &id, me.epoch, &reason, failed)
                .await
            {
                OutdateOutcome::Done => {
                    tracing::warn!(volume = %me.volume, replica = %id, failed, "replica outdated");
                    me.run(|e, out| e.on_outdate_done(replica, out));
                }
                OutdateOutcome::Fenced => me.run(|e, out| e.on_fenced(out)),
                OutdateOutcome::Refused | OutdateOutcome::GaveUp => {
                    tracing::warn!(volume = %me.volume, "engine stopped before outdate")
                }
            }
        });
    }

    /// Ask the controller to make a resynced `replica` in-sync again.
    fn mark_in_sync(&self, replica: ReplicaIdx) {
        let Some(me) = self.me.upgrade() else { return };
        let id = self.replica_ids[usize::from(replica.0)].clone();
        self.rt.spawn(async move {
            match me.controller.mark_in_sync(&me.volume, &id, me.epoch).await {
                OutdateOutcome::Done => {
                    tracing::info!(volume = %me.volume, replica = %id, "replica resynced and in-sync");
                    me.run(|e, out| e.on_mark_in_sync_done(replica, true, out));
                }
                OutdateOutcome::Refused => {
                    me.run(|e, out| e.on_mark_in_sync_done(replica, false, out))
                }
                OutdateOutcome::Fenced => me.run(|e, out| e.on_fenced(out)),
                OutdateOutcome::GaveUp => {}
            }
        });
    }

    /// End the session with `replica`; the engine hears `on_replica_lost` once nothing of
    /// that session can still reach the disk through this driver.
    fn disconnect(&self, replica: ReplicaIdx) {
        match &self.handles[usize::from(replica.0)] {
            Handle::Remote { .. } => {
                if let Some(c) = self.client(replica) {
                    self.set_client(replica, None);
                    c.close(); // its sink reports the loss
                }
            }
            Handle::Local(_) => {
                // Resync sends still waiting for the rate limiter are dropped from now on.
                self.local_gen.fetch_add(1, Ordering::AcqRel);
                let Some(me) = self.me.upgrade() else { return };
                self.rt.spawn(async move {
                    // Local requests already running finish first, so none lands after a
                    // later resync of the same chunks.
                    while me.local_inflight.load(Ordering::Acquire) > 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    me.run(|e, out| e.on_replica_lost(replica, out));
                });
            }
        }
    }

    /// A request from the volume's client (the frontend): it also makes resync yield (see
    /// [`rate_limit`]).
    async fn client_request(&self, op: ClientOp) -> Result<Option<Bytes>, IoError> {
        if let Some(limit) = &self.resync_rate {
            limit.note_client_io();
        }
        self.submit(op).await
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
        self.drive(|k, e, acts| k.submit(e, tag, op, acts));
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

#[async_trait]
impl BlockDevice for VolumeEngine {
    fn size(&self) -> u64 {
        self.size
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError> {
        Ok(self
            .client_request(ClientOp::Read { offset, len })
            .await?
            .unwrap_or_default())
    }
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), IoError> {
        self.client_request(ClientOp::Write { offset, data, fua })
            .await
            .map(|_| ())
    }
    async fn flush(&self) -> Result<(), IoError> {
        self.client_request(ClientOp::Flush).await.map(|_| ())
    }
    async fn trim(&self, offset: u64, len: u32) -> Result<(), IoError> {
        self.client_request(ClientOp::Trim { offset, len })
            .await
            .map(|_| ())
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    ) -> Result<(), IoError> {
        self.client_request(ClientOp::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        })
        .await
        .map(|_| ())
    }
}

struct Sink {
    engine: Weak<VolumeEngine>,
    replica: ReplicaIdx,
    gen: u64,
}

impl ReplySink for Sink {
    fn on_reply(&self, sub: SubId, result: ReplicaResult) {
        if let Some(e) = self.engine.upgrade() {
            e.run(|en, out| en.on_reply(sub, result, out));
        }
    }
    fn on_lost(&self, corrupt: bool) {
        if let Some(e) = self.engine.upgrade() {
            if e.current_gen(self.replica) != self.gen {
                return; // an older session of this replica; already handled
            }
            tracing::warn!(volume = %e.volume, replica = %e.replica_ids[usize::from(self.replica.0)], "replica connection lost");
            let r = self.replica;
            if corrupt {
                e.run(|en, out| en.on_replica_corrupt(r, out));
            } else {
                e.run(|en, out| en.on_replica_lost(r, out));
            }
        }
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
    }
}

/// The maintenance loop of one engine; ends when the engine is dropped or stopped.
async fn maintenance(engine: Weak<VolumeEngine>) {
    let mut tick = tokio::time::interval(ENGINE_TICK);
    loop {
        tick.tick().await;
        let Some(e) = engine.upgrade() else { return };
        if e.stopped.load(Ordering::Acquire) || e.is_fenced() {
            return;
        }
        e.tick();
    }
}

/// Bytes a resync send counts against the rate limit: the copy's write (its read is free,
/// so the limit is the copy rate; so is a copy of zeroes, sent as a WriteZeroes without data).
fn op_bytes(op: &ClientOp) -> u64 {
    match op {
        ClientOp::Write { data, .. } => data.len() as u64,
        _ => 0,
    }
}

pub fn membership_name(m: Membership) -> &'static str {
    match m {
        Membership::InSync => "in_sync",
        Membership::Down => "down",
        Membership::Outdating => "outdating",
        Membership::Outdated => "outdated",
        Membership::Syncing => "syncing",
        Membership::Marking => "marking",
        Membership::Failed => "failed",
    }
}

/// Requests cheap enough to run inline on an idle engine: small reads and writes, and flushes.
/// A flush is the disk's latency, but on an idle engine nothing else of this volume waits for
/// it, and at queue depth 1 (`fsync` after every write: databases) the two thread wake-ups
/// of the pool were a third of the flush's latency. A slow disk then holds one runtime worker
/// for that flush; the others run everything else.
fn is_small(op: &ClientOp) -> bool {
    match op {
        ClientOp::Read { len, .. } => *len <= INLINE_IO_MAX_BYTES,
        ClientOp::Write { data, .. } => data.len() <= INLINE_IO_MAX_BYTES as usize,
        ClientOp::Flush => true,
        _ => false,
    }
}

/// Execute one request on the local replica (blocking).
fn run_local(r: &Replica, epoch: u64, op: &ClientOp) -> ReplicaResult {
    let result = match op {
        ClientOp::Read { offset, len } => r.read(epoch, *offset, *len).map(Some),
        ClientOp::Write { offset, data, fua } => r.write(epoch, *offset, data, *fua).map(|()| None),
        ClientOp::Flush => r.flush(epoch).map(|()| None),
        ClientOp::Trim { offset, len } => r.trim(epoch, *offset, *len).map(|()| None),
        ClientOp::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        } => r
            .write_zeroes(epoch, *offset, *len, *fua, *may_trim)
            .map(|()| None),
    };
    result.map_err(|e| {
        if matches!(e, ReplicaIoError::Io { .. }) {
            tracing::error!(replica = r.id(), error = %e, "local replica disk error");
        }
        failure_of(e)
    })
}

fn failure_of(e: ReplicaIoError) -> ReplicaFailure {
    match e {
        ReplicaIoError::StaleEpoch { .. } => ReplicaFailure::StaleEpoch,
        ReplicaIoError::NoSpace => ReplicaFailure::NoSpace,
        ReplicaIoError::OutOfRange | ReplicaIoError::Io { .. } | ReplicaIoError::Failed => {
            ReplicaFailure::Io
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_api::agent::EngineReplica;
    use hawser_storage::{NewReplica, Pool};

    const SIZE: u64 = 1 << 20;

    fn write(byte: u8) -> ClientOp {
        ClientOp::Write {
            offset: 0,
            data: Bytes::from(vec![byte; 4096]),
            fua: false,
        }
    }

    async fn local_idle(ve: &VolumeEngine) {
        while ve.local_inflight.load(Ordering::Acquire) > 0 {
            tokio::task::yield_now().await;
        }
    }

    /// Sim bug 7: a rate-limited resync send that waited while its replica's session was
    /// closed must not land (the engine counted it lost; newer writes may follow).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queued_resync_send_for_a_closed_session_is_dropped() {
        let dir = std::env::temp_dir().join(format!("hawser-ve-gen-{}", std::process::id()));
        let cfg = crate::agent::parse_pool(&format!("default={}", dir.display())).expect("pool");
        let storage = NodeStorage::new("a".into(), vec![Pool::open(cfg).expect("open pool")]);
        let new = NewReplica {
            id: "vol-a".into(),
            volume: "vol".into(),
            size: SIZE,
            thin: true,
            cluster: None,
        };
        let replica = storage.create("default", &new).expect("create replica");
        let req = StartEngine {
            volume: "vol".into(),
            size_bytes: SIZE,
            epoch: 1,
            replicas: vec![EngineReplica {
                replica_id: "vol-a".into(),
                node: "a".into(),
                replica_addr: String::new(),
                state: ReplicaState::InSync,
                blank: false,
            }],
            controller_url: "http://127.0.0.1:9".into(),
            on_quorum_loss: Default::default(),
            export: true,
            grant: None,
        };
        let ve = VolumeEngine::start(
            &req,
            "a",
            &storage,
            ResyncRates {
                max: 1 << 30,
                busy: 0,
            },
        )
        .await
        .expect("start engine");
        let r = ReplicaIdx(0);
        let gen = ve.current_gen(r);
        ve.send_if_current(r, gen, 1 << 40, write(1));
        local_idle(&ve).await;
        assert_eq!(replica.read(1, 0, 4096).expect("read")[0], 1);
        // The engine closes the session; a send queued for it arrives after.
        ve.disconnect(r);
        ve.send_if_current(r, gen, (1 << 40) + 1, write(2));
        local_idle(&ve).await;
        assert_eq!(
            replica.read(1, 0, 4096).expect("read")[0],
            1,
            "a resync write for a closed session landed"
        );
        ve.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
