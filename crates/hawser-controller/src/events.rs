//! Kubernetes Events on a volume's PVC for what happens to it: `Attached`, `Degraded` (a
//! replica outdated or failed), `Resynced` (back in sync). `kubectl describe pvc` shows them.
//!
//! Emitting never waits and never fails an operation: events go into a bounded queue (dropped
//! when it is full, with a log line) and a task posts them, finding the PVC of a volume through
//! the PersistentVolumes (listed again when a volume is not known yet, at most every few
//! seconds; an event of a volume that has none then is not Kubernetes' and is dropped).
//! Without Kubernetes, emitting does nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::kube::{HawserPv, Kube};

/// Events waiting to be posted, at most.
const QUEUE: usize = 256;
/// The PersistentVolumes are listed again for an unknown volume at most this often.
const RELIST_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct VolumeEvent {
    volume: String,
    warning: bool,
    reason: &'static str,
    message: String,
}

/// Where the controller's operations report what happened to a volume.
#[derive(Clone)]
pub struct VolumeEvents {
    tx: Option<mpsc::Sender<VolumeEvent>>,
}

impl VolumeEvents {
    /// Reports nothing (no Kubernetes).
    pub fn none() -> VolumeEvents {
        VolumeEvents { tx: None }
    }

    /// Posts through `kube` from a task of its own.
    pub fn start(kube: Arc<Kube>) -> VolumeEvents {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(post(kube, rx));
        VolumeEvents { tx: Some(tx) }
    }

    pub fn normal(&self, volume: &str, reason: &'static str, message: String) {
        self.emit(volume, false, reason, message);
    }

    pub fn warning(&self, volume: &str, reason: &'static str, message: String) {
        self.emit(volume, true, reason, message);
    }

    fn emit(&self, volume: &str, warning: bool, reason: &'static str, message: String) {
        let Some(tx) = &self.tx else { return };
        let ev = VolumeEvent {
            volume: volume.to_string(),
            warning,
            reason,
            message,
        };
        if let Err(e) = tx.try_send(ev) {
            tracing::warn!(volume, reason, error = %e, "event dropped");
        }
    }
}

async fn post(kube: Arc<Kube>, mut rx: mpsc::Receiver<VolumeEvent>) {
    let mut claims: HashMap<String, HawserPv> = HashMap::new();
    let mut listed: Option<Instant> = None;
    while let Some(ev) = rx.recv().await {
        if !claims.contains_key(&ev.volume) {
            // Its PersistentVolume may be newer than the last listing: list again, but not
            // more often than RELIST_EVERY (the events behind this one wait meanwhile).
            if let Some(t) = listed {
                tokio::time::sleep(RELIST_EVERY.saturating_sub(t.elapsed())).await;
            }
            listed = Some(Instant::now());
            match kube.hawser_pvs().await {
                Ok(pvs) => claims = pvs.into_iter().map(|p| (p.volume.clone(), p)).collect(),
                Err(e) => tracing::debug!(error = %e, "cannot list PersistentVolumes for events"),
            }
        }
        // A volume without a PersistentVolume (made with the CLI) has no PVC to tell.
        let Some(pv) = claims.get(&ev.volume) else {
            continue;
        };
        if let Err(e) = kube
            .event(
                "PersistentVolumeClaim",
                &pv.claim_namespace,
                &pv.claim,
                ev.warning,
                ev.reason,
                &ev.message,
            )
            .await
        {
            tracing::debug!(volume = %ev.volume, error = %e, "cannot post an event");
        }
    }
}
