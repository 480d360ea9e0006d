//! The sessions with the replicas: opening a remote replica's connection (Hello), reopening
//! the ones the engine wants back, and the sink through which a session's replies and its loss
//! reach the engine. Each session has a generation, so a late loss report of an older one is
//! ignored.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use hawser_core::{ReplicaIdx, ReplicaResult, SubId};
use hawser_wire::grant::HelloRequest;

use super::{Handle, VolumeEngine};
use crate::constants::{RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN};
use crate::replica_client::{ConnectError, ReplicaClient, ReplySink};

impl VolumeEngine {
    /// Open a new session with remote replica `idx` (Hello) and install it.
    pub(super) async fn connect_remote(&self, idx: ReplicaIdx) -> Result<(), ConnectError> {
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
    pub(super) async fn reconnect(self: Arc<Self>, idx: ReplicaIdx) {
        let ok = match &self.handles[usize::from(idx.0)] {
            Handle::Local(r) => !r.is_failed() && self.join(usize::from(idx.0), None).await,
            Handle::Remote { boot, .. } => {
                let before = *boot.lock().unwrap_or_else(|p| p.into_inner());
                match self.connect_remote(idx).await {
                    Ok(()) => {
                        let after = *boot.lock().unwrap_or_else(|p| p.into_inner());
                        // No boot id yet: this engine never had the replica; its journal
                        // tells whether the node rebooted since (the keeper's join).
                        let rebooted = before.map(|b| Some(b) != after);
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
