//! What happens in the cluster, told two ways:
//! - **recent events**, the newest [`RECENT`] in the leader's memory, for `GET /v1/events`
//!   (`hawser events`, the dashboard): every event below, and those of nodes (silent, back);
//! - **Kubernetes Events** on a volume's PVC for what happens to it: `Attached`, `Degraded` (a
//!   replica outdated or failed), `Resynced` (back in sync), `ReplicaReplaced`.
//!   `kubectl describe pvc` shows them.
//!
//! Recent events are not stored: they are what an operator looks at to see what just
//! happened, and a new leader starts with none (the log lines and Kubernetes Events stay).
//!
//! Emitting never waits and never fails an operation: events go into a bounded queue (dropped
//! when it is full, with a log line) and a task posts them, finding the PVC of a volume through
//! the PersistentVolumes (listed again when a volume is not known yet, at most every few
//! seconds; an event of a volume that has none then is not Kubernetes' and is dropped).
//! Without Kubernetes, emitting does nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hawser_api::controller::ClusterEvent;
use tokio::sync::mpsc;

use crate::ha::kube::{HawserPv, Kube};

/// Events waiting to be posted, at most.
const QUEUE: usize = 256;
/// Recent events kept for `GET /v1/events`, at most.
pub const RECENT: usize = 256;
/// The PersistentVolumes are listed again for an unknown volume at most this often.
const RELIST_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct VolumeEvent {
    volume: String,
    warning: bool,
    reason: &'static str,
    message: String,
}

/// The newest events, oldest first.
#[derive(Default)]
struct Recent {
    next_seq: u64,
    events: VecDeque<ClusterEvent>,
}

/// Where the controller's operations report what happened. Clones share the recent events.
#[derive(Clone)]
pub struct ClusterEvents {
    tx: Option<mpsc::Sender<VolumeEvent>>,
    recent: Arc<Mutex<Recent>>,
}

impl ClusterEvents {
    /// Keeps recent events only (no Kubernetes).
    pub fn none() -> ClusterEvents {
        ClusterEvents {
            tx: None,
            recent: Arc::default(),
        }
    }

    /// Also posts volume events through `kube`, from a task of its own.
    pub fn start(kube: Arc<Kube>) -> ClusterEvents {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(post(kube, rx));
        ClusterEvents {
            tx: Some(tx),
            ..ClusterEvents::none()
        }
    }

    /// A volume event, kept and posted on its PVC.
    pub fn normal(&self, volume: &str, reason: &'static str, message: String) {
        self.emit(volume, false, reason, message);
    }

    /// A volume warning, kept and posted on its PVC.
    pub fn warning(&self, volume: &str, reason: &'static str, message: String) {
        self.emit(volume, true, reason, message);
    }

    /// Kept only: for a node's events, and for those already posted to Kubernetes where
    /// they happened (failover posts on pods too).
    pub fn keep(
        &self,
        volume: Option<&str>,
        node: Option<&str>,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        r.next_seq += 1;
        let ev = ClusterEvent {
            seq: r.next_seq,
            at_ms: crate::store::model::now_ms(),
            warning,
            reason: reason.to_string(),
            volume: volume.map(str::to_string),
            node: node.map(str::to_string),
            message: message.to_string(),
        };
        if r.events.len() == RECENT {
            r.events.pop_front();
        }
        r.events.push_back(ev);
    }

    /// The recent events, newest first.
    pub fn recent(&self) -> Vec<ClusterEvent> {
        let r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        r.events.iter().rev().cloned().collect()
    }

    fn emit(&self, volume: &str, warning: bool, reason: &'static str, message: String) {
        self.keep(Some(volume), None, warning, reason, &message);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn recent_events_are_numbered_newest_first_and_bounded() {
        let ev = ClusterEvents::none();
        for i in 0..RECENT + 3 {
            ev.normal("v", "Resynced", format!("event {i}"));
        }
        ev.keep(
            None,
            Some("n1"),
            true,
            "NodeSilent",
            "node n1 stopped heartbeating",
        );
        let r = ev.recent();
        assert_eq!(r.len(), RECENT);
        assert_eq!(r[0].reason, "NodeSilent");
        assert_eq!(r[0].node.as_deref(), Some("n1"));
        assert_eq!(r[0].seq, u64::try_from(RECENT).unwrap() + 4);
        assert!(r.windows(2).all(|w| w[0].seq == w[1].seq + 1));
        // The oldest four went.
        assert_eq!(r[RECENT - 1].message, "event 4");
        assert_eq!(r[1].volume.as_deref(), Some("v"));
    }
}
