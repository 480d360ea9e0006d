//! `GET /metrics`: the controller's Prometheus metrics.
//!
//! Counted as they happen ([`ControllerMetrics`]): replicas outdated and resynced back in,
//! reports refused for a stale epoch (an engine fenced off by a newer one), and the cluster
//! store's calls (latency and failures), in `state/metrics.rs`. Read from the store at each
//! scrape: nodes (online, heartbeat age), volumes and replicas by state, and whether this controller leads. Any controller answers, a
//! follower too (its own process and leadership; the store as it reads it), so one scrape
//! config covers all of them.

use std::fmt;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use hawser_api::backup::BackupState;
use hawser_api::controller::{ReplicaState, VolumeState};
use hawser_api::metrics::ProcessCollector;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::errors::ControllerError;
use crate::state::metrics::{ControllerMetrics, Labels};
use crate::state::AppState;
use crate::store::leader::Role;
use crate::store::model::{now_ms, NodeRecord, VolumeRecord};

/// The store as read for one scrape.
pub(crate) struct Snapshot {
    leader: bool,
    nodes: Vec<(NodeRecord, bool)>,
    volumes: Arc<Vec<VolumeRecord>>,
    backups: Vec<hawser_api::backup::Backup>,
    now_ms: u64,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Snapshot")
    }
}

const VOLUME_STATES: [VolumeState; 4] = [
    VolumeState::Creating,
    VolumeState::Detached,
    VolumeState::Attached,
    VolumeState::Deleting,
];

const REPLICA_STATES: [ReplicaState; 3] = [
    ReplicaState::InSync,
    ReplicaState::Outdated,
    ReplicaState::Failed,
];

/// The snake_case name serde gives a state.
fn state_name<T: serde::Serialize>(s: &T) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: Vec<(Labels, i64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let e = &mut enc;
        let leader = ConstGauge::new(i64::from(self.leader));
        leader.encode(e.encode_descriptor(
            "controller_leader",
            "1 if this controller serves the API (leads, or is the only one)",
            None,
            MetricType::Gauge,
        )?)?;
        let node = |n: &NodeRecord| vec![("node", n.name.clone())];
        gauges(
            e,
            "node_online",
            "1 if the node's agent was heard within the node timeout",
            None,
            self.nodes
                .iter()
                .map(|(n, up)| (node(n), i64::from(*up)))
                .collect(),
        )?;
        // Seconds as a float would be finer; whole milliseconds / 1000 keep it an integer
        // gauge, so it is written in seconds with millisecond precision below.
        let mut m = e.encode_descriptor(
            "node_heartbeat_age",
            "Time since the node's agent last registered or heartbeat",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for (n, _) in &self.nodes {
            let age = self.now_ms.saturating_sub(n.last_seen_ms) as f64 / 1000.0;
            ConstGauge::new(age).encode(m.encode_family(&node(n))?)?;
        }
        gauges(
            e,
            "volumes",
            "Volumes by state",
            None,
            VOLUME_STATES
                .iter()
                .map(|s| {
                    let n = self.volumes.iter().filter(|v| v.state == *s).count();
                    (vec![("state", state_name(s))], n as i64)
                })
                .collect(),
        )?;
        let mut rows = Vec::new();
        for v in self.volumes.iter() {
            for s in REPLICA_STATES {
                let n = v.replicas.iter().filter(|r| r.state == s).count();
                rows.push((
                    vec![("volume", v.name.clone()), ("state", state_name(&s))],
                    n as i64,
                ));
            }
        }
        gauges(
            e,
            "volume_replicas",
            "Replicas of the volume by store state",
            None,
            rows,
        )?;
        gauges(
            e,
            "volume_replicas_wanted",
            "Replicas the volume should have in sync",
            None,
            self.volumes
                .iter()
                .map(|v| (vec![("volume", v.name.clone())], i64::from(v.replica_count)))
                .collect(),
        )?;
        gauges(
            e,
            "volume_epoch",
            "The volume's epoch in the store",
            None,
            self.volumes
                .iter()
                .map(|v| {
                    let epoch = i64::try_from(v.epoch).unwrap_or(i64::MAX);
                    (vec![("volume", v.name.clone())], epoch)
                })
                .collect(),
        )?;
        self.encode_backups(e)
    }
}

const BACKUP_STATES: [BackupState; 3] = [
    BackupState::Running,
    BackupState::Ready,
    BackupState::Failed,
];

impl Snapshot {
    /// Backups by state, each running one's progress, and each volume's recovery point per
    /// target (the age of its newest ready backup: what an alert on stale backups watches).
    fn encode_backups(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        gauges(
            e,
            "backups",
            "Backups by state",
            None,
            BACKUP_STATES
                .iter()
                .map(|s| {
                    let n = self.backups.iter().filter(|b| b.state == *s).count();
                    (vec![("state", state_name(s))], n as i64)
                })
                .collect(),
        )?;
        let running: Vec<_> = self
            .backups
            .iter()
            .filter(|b| b.state == BackupState::Running)
            .collect();
        let done = |b: &&hawser_api::backup::Backup| {
            let n = b.progress.as_ref().map_or(0, |p| p.done_bytes);
            (
                vec![("backup", b.name.clone()), ("volume", b.volume.clone())],
                i64::try_from(n).unwrap_or(i64::MAX),
            )
        };
        gauges(
            e,
            "backup_done",
            "Bytes of the volume a running backup has gone through",
            Some(Unit::Bytes),
            running.iter().map(done).collect(),
        )?;
        let mut newest: std::collections::BTreeMap<(String, String), u64> = Default::default();
        for b in self
            .backups
            .iter()
            .filter(|b| b.state == BackupState::Ready)
        {
            let at = newest
                .entry((b.volume.clone(), b.target.clone()))
                .or_default();
            *at = (*at).max(b.taken_ms);
        }
        let mut m = e.encode_descriptor(
            "volume_recovery_point_age",
            "Time since the snapshot of the volume's newest ready backup on the target was taken",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for ((volume, target), taken) in newest {
            let age = self.now_ms.saturating_sub(taken) as f64 / 1000.0;
            let labels: Labels = vec![("volume", volume), ("target", target)];
            ConstGauge::new(age).encode(m.encode_family(&labels)?)?;
        }
        self.encode_standbys(e)
    }

    /// Each standby volume's recovery point: the age of the backup it holds (absent until
    /// its first restore is done), and whether its last check or apply failed.
    fn encode_standbys(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let standbys: Vec<_> = self
            .volumes
            .iter()
            .filter_map(|v| v.standby.as_ref().map(|s| (v, s)))
            .collect();
        let mut m = e.encode_descriptor(
            "standby_recovery_point_age",
            "Time since the snapshot of the backup a standby volume holds was taken",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for (v, s) in &standbys {
            let Some(a) = &s.applied else { continue };
            let age = self.now_ms.saturating_sub(a.taken_ms) as f64 / 1000.0;
            let labels: Labels = vec![("volume", v.name.clone()), ("target", s.target.clone())];
            ConstGauge::new(age).encode(m.encode_family(&labels)?)?;
        }
        gauges(
            e,
            "standby_failing",
            "1 for a standby volume whose last check or apply of its target failed",
            None,
            standbys
                .iter()
                .map(|(v, s)| {
                    (
                        vec![("volume", v.name.clone())],
                        i64::from(s.error.is_some()),
                    )
                })
                .collect(),
        )
    }
}

/// The registry of one scrape: the counters, the process, and `snapshot`.
pub(crate) fn registry(m: &ControllerMetrics, snapshot: Option<Snapshot>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(ProcessCollector));
    let h = r.sub_registry_with_prefix("hawser");
    h.register(
        "replica_outdates",
        "Replicas taken out of the in-sync set because an engine lost them",
        m.outdated.clone(),
    );
    h.register(
        "replica_failures",
        "Replicas marked failed (an I/O error, not only a lost connection)",
        m.failed.clone(),
    );
    h.register(
        "replica_resyncs_completed",
        "Outdated replicas resynced and marked in-sync again",
        m.resynced.clone(),
    );
    h.register(
        "stale_epoch_reports",
        "Reports from an engine of an older epoch, refused (the engine is fenced)",
        m.stale_epoch_reports.clone(),
    );
    h.register_with_unit(
        "store_request_duration",
        "Cluster store calls by operation, retries included",
        Unit::Seconds,
        m.store.latency.clone(),
    );
    h.register(
        "store_errors",
        "Cluster store calls that failed after their retries (lost compare-and-swaps aside)",
        m.store.errors.clone(),
    );
    if let Some(s) = snapshot {
        h.register_collector(Box::new(s));
    }
    r
}

pub async fn scrape(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let leader = !matches!(st.leadership.role(), Role::Follower { .. });
    let read = async {
        let nodes = st.records.nodes().await?;
        let volumes = st.records.volumes_seen().await?;
        let backups = crate::snapshots::backups::list(&st, None, None).await?;
        Ok::<_, ControllerError>((nodes, volumes, backups))
    };
    let snapshot = match read.await {
        Ok((nodes, volumes, backups)) => Some(Snapshot {
            leader,
            nodes: nodes
                .into_iter()
                .map(|n| {
                    let up = st.is_online(&n);
                    (n, up)
                })
                .collect(),
            volumes,
            backups,
            now_ms: now_ms(),
        }),
        Err(e) => {
            // Still answer: the process metrics and counters say something, and the missing
            // store series (with store_errors) say the rest.
            // Counted with the store's errors already.
            tracing::warn!(error = %e, "metrics: cannot read the store");
            None
        }
    };
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) =
        hawser_api::metrics::render(&registry(&st.metrics, snapshot), accept);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}
