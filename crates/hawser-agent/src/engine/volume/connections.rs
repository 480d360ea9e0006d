//! The sessions with the replicas: opening a remote replica's connection (Hello), reopening
//! the ones the engine wants back, and the sink through which a session's replies and its loss
//! reach the engine. Each session has a generation, so a late loss report of an older one is
//! ignored.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use hawser_core::{ReplicaIdx, ReplicaResult, SubId};
use hawser_wire::grant::HelloRequest;

use super::{Handle, VolumeEngine};
use crate::replica::client::{ConnectError, ReplicaClient, ReplySink};

impl VolumeEngine {
    /// Open a new session with remote replica `idx` (Hello) and install it. Returns the boot
    /// id its node reported.
    pub(super) async fn connect_remote(&self, idx: ReplicaIdx) -> Result<u64, ConnectError> {
        let Handle::Remote { addr, tls, gen, .. } = &self.handles[usize::from(idx.0)] else {
            unreachable!("only remote replicas have sessions to open")
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
        self.set_client(idx, Some(Arc::new(client)));
        Ok(info.boot_id)
    }

    /// Reconnect a replica the sessions policy says is due (`Links::due`), and tell the
    /// engine; the policy hears how it ended.
    pub(super) async fn reconnect(self: Arc<Self>, idx: ReplicaIdx) {
        let i = usize::from(idx.0);
        let ok = match &self.handles[i] {
            Handle::Local(r) => {
                // In the engine's process: no boot id; its journal tells (the keeper's join).
                let rebooted = self.lock().links.opened(idx, None);
                !r.is_failed() && self.join(i, rebooted).await
            }
            Handle::Remote { .. } => {
                match self.connect_remote(idx).await {
                    Ok(boot) => {
                        // `None`: this engine never had the replica; its journal tells.
                        let rebooted = self.lock().links.opened(idx, Some(boot));
                        tracing::info!(volume = %self.volume, replica = %self.replica_ids[i], rebooted, "replica reconnected");
                        let joined = self.join(i, rebooted).await;
                        if !joined {
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
        let now = self.now_us();
        self.lock().links.ended(idx, ok, now);
    }

    pub(super) fn set_client(&self, idx: ReplicaIdx, client: Option<Arc<ReplicaClient>>) {
        if let Handle::Remote { client: slot, .. } = &self.handles[usize::from(idx.0)] {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = client;
        }
    }

    pub(super) fn client(&self, idx: ReplicaIdx) -> Option<Arc<ReplicaClient>> {
        match &self.handles[usize::from(idx.0)] {
            Handle::Remote { client, .. } => {
                client.lock().unwrap_or_else(|p| p.into_inner()).clone()
            }
            Handle::Local(_) => None,
        }
    }

    pub(super) fn current_gen(&self, idx: ReplicaIdx) -> u64 {
        match &self.handles[usize::from(idx.0)] {
            Handle::Remote { gen, .. } => gen.load(Ordering::Acquire),
            Handle::Local(_) => self.local_gen.load(Ordering::Acquire),
        }
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
