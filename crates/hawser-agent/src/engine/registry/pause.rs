//! Holding a volume's requests while its snapshot is taken (`POST /v1/engines/{volume}/pause`
//! and `/resume`).
//!
//! A pause takes the export's gate exclusively, as an engine swap does: new requests wait
//! at the gate, those in flight finish (each one acknowledged or failed before the pause is
//! granted). Then the engine flushes every replica, and the pause answers with the epoch and
//! the in-sync set. From then until the resume, nothing reaches the replicas from clients, so
//! a copy of any in-sync replica is the volume at one point: after every write acknowledged
//! before the pause, before every write acknowledged after it.
//!
//! A pause is a lease: if no resume comes within `lease_ms` (the controller died, or its
//! snapshot calls hang), requests flow again and the resume that comes later is refused, so
//! the controller knows its snapshot copies may have seen later writes and throws them away.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hawser_api::agent::{EnginePaused, EngineResumed};
use tokio::sync::oneshot;

use crate::constants::ENGINE_SWAP_DRAIN_TIMEOUT;
// The pause half of `Engines`' impl, a child module of registry.rs: `Engines` holds the
// `Pauses` below, as it holds each export's gate that a pause takes.
use crate::engine::registry::Engines;
use crate::frontends::block::BlockDevice;

/// The longest pause lease granted.
pub const MAX_PAUSE_LEASE: Duration = Duration::from_secs(60);

/// Why a pause or a resume was refused.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("no engine runs volume {0:?} on this node")]
    NotFound(String),
    #[error("volume {0:?} is paused already")]
    Paused(String),
    #[error("volume {volume:?}: requests in flight did not finish within {after:?}; not paused")]
    Drain { volume: String, after: Duration },
    #[error("volume {volume:?}: flushing the replicas failed ({error}); not paused")]
    Flush { volume: String, error: String },
    #[error(
        "volume {0:?} has no pause of that id: its lease ran out (requests flowed again), or \
         it was never granted"
    )]
    Expired(String),
}

/// Held pauses, by volume.
#[derive(Default)]
pub struct Pauses {
    next_id: AtomicU64,
    held: Mutex<HashMap<String, Held>>,
}

struct Held {
    id: u64,
    /// Asks the holding task to end the pause and say how long it held.
    resume: oneshot::Sender<oneshot::Sender<u64>>,
}

impl Pauses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Engines {
    /// Pauses `volume` (see the module doc) for at most `lease`.
    pub async fn pause(&self, volume: &str, lease: Duration) -> Result<EnginePaused, PauseError> {
        let lease = lease.min(MAX_PAUSE_LEASE);
        let export = self
            .export(volume)
            .ok_or_else(|| PauseError::NotFound(volume.into()))?;
        let pauses = self.pauses().clone();
        if pauses.lock().contains_key(volume) {
            return Err(PauseError::Paused(volume.into()));
        }
        let id = pauses.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (ready_tx, ready_rx) = oneshot::channel();
        let name = volume.to_string();
        tokio::spawn(async move {
            let started = Instant::now();
            let drained =
                tokio::time::timeout(ENGINE_SWAP_DRAIN_TIMEOUT, export.gate.write()).await;
            let Ok(gate) = drained else {
                let after = ENGINE_SWAP_DRAIN_TIMEOUT;
                let _ = ready_tx.send(Err(PauseError::Drain {
                    volume: name,
                    after,
                }));
                return;
            };
            let Some(engine) = export.engine().filter(|e| !e.is_fenced()) else {
                let _ = ready_tx.send(Err(PauseError::NotFound(name)));
                return;
            };
            if let Err(e) = engine.flush().await {
                let error = e.to_string();
                let _ = ready_tx.send(Err(PauseError::Flush {
                    volume: name,
                    error,
                }));
                return;
            }
            let status = engine.status();
            let (resume_tx, resume_rx) = oneshot::channel::<oneshot::Sender<u64>>();
            {
                let mut held = pauses.lock();
                if held.contains_key(&name) {
                    let _ = ready_tx.send(Err(PauseError::Paused(name)));
                    return;
                }
                held.insert(
                    name.clone(),
                    Held {
                        id,
                        resume: resume_tx,
                    },
                );
            }
            let paused = EnginePaused {
                pause_id: id,
                epoch: status.epoch,
                in_sync: status.in_sync,
                drain_micros: micros(started.elapsed()),
            };
            if ready_tx.send(Ok(paused)).is_err() {
                // Whoever asked is gone: nobody will resume.
                pauses.end(&name, id);
                return;
            }
            tokio::select! {
                asked = resume_rx => {
                    if let Ok(reply) = asked {
                        let _ = reply.send(micros(started.elapsed()));
                    }
                }
                () = tokio::time::sleep(lease) => {
                    pauses.end(&name, id);
                    tracing::warn!(
                        volume = %name, lease_ms = lease.as_millis(),
                        "pause lease ran out before the resume: requests flow again"
                    );
                }
            }
            drop(gate);
        });
        ready_rx
            .await
            .unwrap_or_else(|_| Err(PauseError::NotFound(volume.into())))
    }

    /// Ends pause `id` of `volume`; refused when it is not held (its lease ran out).
    pub async fn resume(&self, volume: &str, id: u64) -> Result<EngineResumed, PauseError> {
        let held = {
            let mut map = self.pauses().lock();
            match map.get(volume) {
                Some(h) if h.id == id => map.remove(volume),
                _ => None,
            }
        };
        let held = held.ok_or_else(|| PauseError::Expired(volume.into()))?;
        let (tx, rx) = oneshot::channel();
        held.resume
            .send(tx)
            .map_err(|_| PauseError::Expired(volume.into()))?;
        let held_micros = rx.await.map_err(|_| PauseError::Expired(volume.into()))?;
        Ok(EngineResumed { held_micros })
    }
}

impl Pauses {
    /// Forgets pause `id` of `volume` if it is the one held.
    fn end(&self, volume: &str, id: u64) {
        let mut map = self.lock();
        if map.get(volume).is_some_and(|h| h.id == id) {
            map.remove(volume);
        }
    }
}
