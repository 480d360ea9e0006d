//! The agent's metrics read at scrape time from what already exists: each engine's status
//! (epoch, replica states, resync progress, activity log) and each pool's usage. See
//! `metrics.rs` for the rest and for the rules on labels.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::engine::registry::Engines;
use crate::storage::pools::NodeStorage;

type Labels = Vec<(&'static str, String)>;

/// Reads the engines' and pools' state at each scrape.
pub(crate) struct StateCollector {
    pub(crate) engines: Arc<Engines>,
    pub(crate) storage: Arc<NodeStorage>,
}

impl fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StateCollector")
    }
}

/// The engine states an engine reports for a replica (`EngineReplicaStatus::state`).
const REPLICA_STATES: [&str; 7] = [
    "in_sync",
    "down",
    "outdating",
    "outdated",
    "syncing",
    "marking",
    "failed",
];

/// One family of values: name, help, unit, type, and (labels, value) rows.
fn family<V: Copy>(
    enc: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<Unit>),
    counter: bool,
    rows: &[(Labels, V)],
    encode: impl Fn(V, MetricEncoder) -> fmt::Result,
) -> fmt::Result {
    let ty = if counter {
        MetricType::Counter
    } else {
        MetricType::Gauge
    };
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), ty)?;
    for (labels, v) in rows {
        encode(*v, m.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge(v: i64, m: MetricEncoder) -> fmt::Result {
    ConstGauge::new(v).encode(m)
}

fn counter(v: u64, m: MetricEncoder) -> fmt::Result {
    ConstCounter::new(v).encode(m)
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for StateCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let statuses = self.engines.statuses();
        let mut epoch = Vec::new();
        let mut in_sync = Vec::new();
        let mut extents = Vec::new();
        let mut state = Vec::new();
        let mut connected = Vec::new();
        let mut copied = Vec::new();
        let mut dirty = Vec::new();
        let mut rate = Vec::new();
        let mut corrupt = Vec::new();
        let mut limits = Vec::new();
        for s in &statuses {
            let v = || vec![("volume", s.volume.clone())];
            epoch.push((v(), int(s.epoch)));
            for (field, value) in s.qos.fields() {
                if value != 0 {
                    let mut l = v();
                    l.push(("limit", field.csi_parameter().to_string()));
                    limits.push((l, int(value)));
                }
            }
            in_sync.push((v(), s.in_sync.len() as i64));
            extents.push((v(), int(s.active_extents)));
            for r in &s.replicas {
                let rl = || {
                    vec![
                        ("volume", s.volume.clone()),
                        ("replica", r.replica_id.clone()),
                    ]
                };
                for st in REPLICA_STATES {
                    let mut l = rl();
                    l.push(("state", st.to_string()));
                    state.push((l, i64::from(r.state == st)));
                }
                connected.push((rl(), i64::from(r.connected)));
                copied.push((rl(), r.copied_bytes));
                dirty.push((rl(), int(r.dirty_bytes)));
                rate.push((rl(), int(r.resync_bytes_per_sec)));
                for (outcome, n) in [
                    ("found", r.corrupt_found_blocks),
                    ("repaired", r.corrupt_repaired_blocks),
                    ("unrecoverable", r.corrupt_unrecoverable_blocks),
                ] {
                    let mut l = rl();
                    l.push(("outcome", outcome.to_string()));
                    corrupt.push((l, n));
                }
            }
        }
        let mut commits: Vec<(Labels, u64)> = self
            .engines
            .all()
            .iter()
            .map(|e| {
                let (volume, n) = e.journal_commits();
                (vec![("volume", volume)], n)
            })
            .collect();
        commits.sort();
        let e = &mut enc;
        family(
            e,
            (
                "volume_journal_commits",
                "Journal commits (activity log and what replicas out of sync lack) this \
                 engine completed",
                None,
            ),
            true,
            &commits,
            counter,
        )?;
        family(
            e,
            (
                "volume_qos_limit",
                "The volume's limits on client requests (docs/qos.md): requests or bytes per \
                 second, by limit (iopsLimit, writeBandwidthLimit, ...); none when unlimited",
                None,
            ),
            false,
            &limits,
            gauge,
        )?;
        family(
            e,
            (
                "volume_epoch",
                "The epoch of the volume's engine on this node",
                None,
            ),
            false,
            &epoch,
            gauge,
        )?;
        family(
            e,
            (
                "volume_replicas_in_sync",
                "Replicas in the engine's in-sync set",
                None,
            ),
            false,
            &in_sync,
            gauge,
        )?;
        family(
            e,
            (
                "volume_activity_log_extents",
                "Extents (4 MiB) in the activity log: what crash recovery would compare",
                None,
            ),
            false,
            &extents,
            gauge,
        )?;
        family(
            e,
            (
                "volume_replica_state",
                "1 for the state the engine sees the replica in, 0 for the others",
                None,
            ),
            false,
            &state,
            gauge,
        )?;
        family(
            e,
            (
                "volume_replica_connected",
                "1 if the engine has a session with the replica",
                None,
            ),
            false,
            &connected,
            gauge,
        )?;
        family(
            e,
            (
                "volume_replica_corrupt_blocks",
                "4 KiB blocks whose data failed its checksum on the replica during this \
                 engine's life (docs/checksums.md), by outcome: found, repaired (rewritten from \
                 a good replica), unrecoverable (no replica had it right: the read failed)",
                None,
            ),
            true,
            &corrupt,
            counter,
        )?;
        family(
            e,
            (
                "volume_resync_copied",
                "Bytes resync copied to the replica during this engine's life",
                Some(Unit::Bytes),
            ),
            true,
            &copied,
            counter,
        )?;
        family(
            e,
            (
                "volume_resync_remaining",
                "Bytes of dirty chunks still to copy to the replica",
                Some(Unit::Bytes),
            ),
            false,
            &dirty,
            gauge,
        )?;
        family(
            e,
            (
                "volume_resync_rate",
                "Copy rate of the replica's current resync, bytes per second",
                None,
            ),
            false,
            &rate,
            gauge,
        )?;

        let pools = self.storage.pool_infos();
        let rows = |f: fn(&hawser_api::controller::PoolInfo) -> u64| -> Vec<(Labels, i64)> {
            pools
                .iter()
                .map(|p| (vec![("pool", p.name.clone())], int(f(p))))
                .collect()
        };
        family(
            e,
            (
                "pool_capacity",
                "Size of the pool's filesystem (or its configured limit)",
                Some(Unit::Bytes),
            ),
            false,
            &rows(|p| p.capacity_bytes),
            gauge,
        )?;
        family(
            e,
            (
                "pool_used",
                "Bytes used on the pool's filesystem",
                Some(Unit::Bytes),
            ),
            false,
            &rows(|p| p.capacity_bytes.saturating_sub(p.free_bytes)),
            gauge,
        )?;
        family(
            e,
            (
                "pool_provisioned",
                "Sum of the sizes of the pool's replicas (thin ones at full size)",
                Some(Unit::Bytes),
            ),
            false,
            &rows(|p| p.provisioned_bytes),
            gauge,
        )?;
        family(
            e,
            ("pool_replicas", "Replicas in the pool", None),
            false,
            &rows(|p| u64::from(p.replicas)),
            gauge,
        )?;
        family(
            e,
            ("pool_snapshots", "Snapshot copies in the pool", None),
            false,
            &rows(|p| u64::from(p.snapshots)),
            gauge,
        )?;
        family(
            e,
            (
                "pool_snapshot",
                "Bytes the pool's snapshot copies occupy (extents shared by reflinks counted \
                 in full)",
                Some(Unit::Bytes),
            ),
            false,
            &rows(|p| p.snapshot_bytes),
            gauge,
        )?;
        Ok(())
    }
}
