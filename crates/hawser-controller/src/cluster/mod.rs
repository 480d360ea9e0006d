//! The cluster's identity, and how a controller on a lost store gets its volumes back.
//!
//! The store holds a cluster id, made by the first controller that finds none. Every replica
//! a controller creates records it in its metadata, and every agent sends the id of the
//! cluster its replicas belong to with each heartbeat. A controller refuses a node of
//! another cluster (and lists it as waiting): a wiped store, a store restored from an old
//! backup, or a wrong etcd prefix must not make a controller treat the node's replicas as
//! orphans. `hawser cluster recover` then adopts the waiting nodes' cluster (only into a
//! store without volumes) and rebuilds the record of each volume from its replicas'
//! metadata and journals ([`rebuild`]), an encrypted volume's wrapped data key included (each
//! replica keeps a copy; the KEKs are in the controller's data directory, not the store).

pub(crate) mod agent_client;
pub(crate) mod engine_watch;
pub(crate) mod events;
mod namesakes;
pub(crate) mod node_events;
pub(crate) mod reconcile;
pub(crate) mod waiting;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hawser_api::agent::ReplicaInventory;
use hawser_api::controller::{
    ClusterInfo, RecoverCluster, RecoverReport, Replica, ReplicaState, WaitingNode,
};
use hawser_store::{get_json, put_json, Expect, StoreError};
use serde::{Deserialize, Serialize};

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::{now_ms, VolumeRecord};
use crate::store::records::Records;
use crate::volumes::keys::WrappedKey;

const CLUSTER_KEY: &str = "cluster/identity";

/// How long a recovery waits for an agent's replica inventory.
const INVENTORY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub id: String,
    pub created_ms: u64,
    /// When `hawser cluster recover` adopted this id into the store.
    #[serde(default)]
    pub adopted_ms: Option<u64>,
    /// Set by the adoption, cleared once a recovery has rebuilt the volume records. Until
    /// then every replica the adopted nodes hold predates this store's records, so none of
    /// them is an orphan: the reconciler moves nothing to the trash (`reconcile.rs`). A
    /// recovery that adopted but timed out waiting for a node leaves it set, so the next
    /// `hawser cluster recover` still finds every replica.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recovering: bool,
    /// Plaintext (`--insecure`) clusters only: the Ed25519 key (PKCS#8, base64) that signs
    /// epoch grants (`hawser_wire::grant`), kept in the store so that every controller signs
    /// with it. A TLS cluster derives its grant key from the CA's key instead
    /// (`hawser_wire::grant::GRANT_KEY_PURPOSE`; `grant-root.key` once that CA rotated), which every controller holds and the store never sees: a
    /// copy of the store (an etcd backup) cannot sign grants. Agents learn the public half
    /// when they register.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_key: Option<String>,
}

/// Signs epoch grants with the cluster's key.
pub struct Signer {
    cluster: String,
    key: ring::signature::Ed25519KeyPair,
}

impl Signer {
    fn new(st: &AppState, record: &ClusterRecord) -> Result<Signer, ControllerError> {
        use base64::Engine as _;
        let bad = |what: &str| ControllerError::Refused {
            message: format!("the cluster's grant key is unusable: {what}"),
        };
        if let Some(tls) = &st.tls {
            // Derived for the cluster id: adopting another id gives another key.
            let seed = tls
                .grant_seed(&record.id)
                .map_err(|e| bad(&format!("{e:#}")))?;
            let key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed)
                .map_err(|_| bad("not an Ed25519 seed"))?;
            return Ok(Signer {
                cluster: record.id.clone(),
                key,
            });
        }
        let pkcs8 = base64::engine::general_purpose::STANDARD
            .decode(record.grant_key.as_deref().unwrap_or(""))
            .map_err(|_| bad("not base64"))?;
        let key = ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8)
            .map_err(|_| bad("not an Ed25519 PKCS#8 key"))?;
        Ok(Signer {
            cluster: record.id.clone(),
            key,
        })
    }

    /// The public key, base64, as agents receive it.
    pub fn public_key(&self) -> String {
        use base64::Engine as _;
        use ring::signature::KeyPair as _;
        base64::engine::general_purpose::STANDARD.encode(self.key.public_key().as_ref())
    }

    /// The signed grant (base64) for an engine of `volume` on `node` at `epoch`, carrying an
    /// encrypted volume's key check.
    pub fn grant(
        &self,
        volume: &str,
        node: &str,
        epoch: u64,
        key_check: Option<hawser_api::KeyCheck>,
    ) -> Result<String, ControllerError> {
        use base64::Engine as _;
        let g = hawser_wire::grant::Grant {
            cluster: self.cluster.clone(),
            volume: volume.into(),
            node: node.into(),
            epoch,
            key_check: key_check.map(|k| k.0),
        };
        let mut signed = g
            .body()
            .map_err(|e| ControllerError::invalid(format!("grant for {volume} on {node}: {e}")))?;
        let sig = self.key.sign(&signed);
        signed.extend_from_slice(sig.as_ref());
        Ok(base64::engine::general_purpose::STANDARD.encode(signed))
    }
}

impl Signer {
    /// The signed snapshot-read grant (base64) letting `node` read the snapshot copies of
    /// `volume`'s replicas (`hawser_wire::grant::SnapshotReadGrant`).
    pub fn snapshot_read_grant(&self, volume: &str, node: &str) -> Result<String, ControllerError> {
        use base64::Engine as _;
        let g = hawser_wire::grant::SnapshotReadGrant {
            cluster: self.cluster.clone(),
            volume: volume.into(),
            node: node.into(),
        };
        let mut signed = g.body().map_err(|e| {
            ControllerError::invalid(format!("snapshot grant for {volume} on {node}: {e}"))
        })?;
        let sig = self.key.sign(&signed);
        signed.extend_from_slice(sig.as_ref());
        Ok(base64::engine::general_purpose::STANDARD.encode(signed))
    }
}

fn new_grant_key() -> Result<String, ControllerError> {
    use base64::Engine as _;
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| {
        ControllerError::Refused {
            message: "cannot make the cluster's grant key (no system randomness?)".into(),
        }
    })?;
    Ok(base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref()))
}

/// The cluster's signer (its record, made or given a key now if needed).
pub async fn signer(st: &AppState) -> Result<Signer, ControllerError> {
    Signer::new(st, &identity(st).await?)
}

/// A grant key for a new cluster record: in the store for plaintext clusters only.
fn stored_grant_key(st: &AppState) -> Result<Option<String>, ControllerError> {
    match st.tls {
        Some(_) => Ok(None),
        None => new_grant_key().map(Some),
    }
}

/// The store's cluster record, made now if the store has none. A plaintext cluster's record
/// is given a grant key if it has none; a TLS cluster's loses the one it has (a cluster that
/// was plaintext, or written by an older controller): the key is derived from the CA.
pub async fn identity(st: &AppState) -> Result<ClusterRecord, ControllerError> {
    let store = st.records.store();
    for _ in 0..3 {
        if let Some((mut c, version)) = get_json::<ClusterRecord>(&*store, CLUSTER_KEY).await? {
            let wanted = st.tls.is_none();
            if c.grant_key.is_some() == wanted {
                return Ok(c);
            }
            c.grant_key = stored_grant_key(st)?;
            if !wanted {
                tracing::warn!(
                    "removing the grant key from the store: a TLS cluster derives it from its CA"
                );
            }
            match put_json(&*store, CLUSTER_KEY, &c, Expect::Version(version)).await {
                Ok(_) => return Ok(c),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let new = ClusterRecord {
            id: new_id(),
            created_ms: now_ms(),
            adopted_ms: None,
            recovering: false,
            grant_key: stored_grant_key(st)?,
        };
        match put_json(&*store, CLUSTER_KEY, &new, Expect::Absent).await {
            Ok(_) => {
                tracing::info!(cluster = %new.id, "new cluster: the store had no cluster id");
                return Ok(new);
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ControllerError::Contention {
        key: CLUSTER_KEY.into(),
        retries: 3,
    })
}

fn new_id() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a registering node's cluster against the store's; returns what the node joins.
pub async fn admit(
    st: &AppState,
    node: &str,
    admin_addr: &str,
    theirs: Option<&str>,
) -> Result<hawser_api::controller::ClusterJoin, ControllerError> {
    let ours = identity(st).await?;
    match theirs {
        Some(t) if t != ours.id => {
            st.waiting.add(WaitingNode {
                node: node.into(),
                cluster_id: t.into(),
                admin_addr: admin_addr.into(),
                last_seen_ms: now_ms(),
            });
            Err(ControllerError::OtherCluster {
                node: node.into(),
                theirs: t.into(),
                ours: ours.id,
            })
        }
        _ => {
            st.waiting.remove(node);
            let signer = Signer::new(st, &ours)?;
            Ok(hawser_api::controller::ClusterJoin {
                id: ours.id,
                grant_key: signer.public_key(),
                metrics_sha256: st.tokens.metrics_digests_hex(),
                ca: st
                    .tls
                    .as_deref()
                    .and_then(crate::auth::ca_rotation::cluster_ca),
            })
        }
    }
}

/// The cluster's id and the nodes waiting for a recovery (`GET /v1/cluster`).
pub async fn show(st: &AppState) -> Result<ClusterInfo, ControllerError> {
    let c = identity(st).await?;
    Ok(ClusterInfo {
        id: c.id,
        created_ms: c.created_ms,
        waiting: st.waiting.list(),
    })
}

/// `hawser cluster recover` (`POST /v1/cluster/recover`): adopts the waiting nodes' cluster
/// into a store without volumes, if they name one, and rebuilds every volume's record from
/// its replicas.
pub async fn recover(st: &AppState, req: RecoverCluster) -> Result<RecoverReport, ControllerError> {
    let _guard = st.volume_locks.lock(CLUSTER_KEY).await;
    let ours = identity(st).await?;
    let waiting = st.waiting.list();
    let theirs: BTreeSet<&str> = waiting.iter().map(|w| w.cluster_id.as_str()).collect();
    let mut adopted = false;
    let cluster_id = match theirs.into_iter().collect::<Vec<_>>()[..] {
        [] => ours.id.clone(),
        [one] => {
            let volumes = st.records.volumes().await?;
            if !volumes.is_empty() {
                return Err(ControllerError::Refused {
                    message: format!(
                        "nodes {:?} hold replicas of cluster {one}, but this store already \
                         holds {} volumes of cluster {}; recovery adopts a cluster only into \
                         a store without volumes",
                        waiting.iter().map(|w| &w.node).collect::<Vec<_>>(),
                        volumes.len(),
                        ours.id
                    ),
                });
            }
            adopt(st, one).await?;
            adopted = true;
            wait_for(&st.records, &waiting, req.wait_secs.unwrap_or(30)).await?;
            one.to_owned()
        }
        ref many => {
            return Err(ControllerError::Refused {
                message: format!(
                    "the waiting nodes hold replicas of several clusters ({many:?}); \
                     recovery adopts one cluster at a time: stop the nodes of the others"
                ),
            })
        }
    };
    let (volumes, skipped) = rebuild_all(st, &cluster_id).await?;
    recovered(&st.records).await?;
    Ok(RecoverReport {
        cluster_id,
        adopted,
        volumes: volumes.iter().map(|v| v.to_api(None)).collect(),
        skipped,
    })
}

/// Replaces the store's cluster id with `id` (the store holds no volumes).
async fn adopt(st: &AppState, id: &str) -> Result<(), ControllerError> {
    let store = st.records.store();
    // A new grant key (plaintext: the old one was lost with the store; TLS: it is derived
    // for the adopted id). The agents learn it at their next registration.
    let record = ClusterRecord {
        id: id.into(),
        created_ms: now_ms(),
        adopted_ms: Some(now_ms()),
        recovering: true,
        grant_key: stored_grant_key(st)?,
    };
    let expect = match get_json::<ClusterRecord>(&*store, CLUSTER_KEY).await? {
        Some((_, version)) => Expect::Version(version),
        None => Expect::Absent,
    };
    put_json(&*store, CLUSTER_KEY, &record, expect).await?;
    st.waiting.clear();
    tracing::warn!(cluster = id, "adopted the nodes' cluster id into the store");
    Ok(())
}

/// Whether an adoption's recovery is unfinished ([`ClusterRecord::recovering`]).
pub(crate) async fn recovering(records: &Records) -> Result<bool, ControllerError> {
    let store = records.store();
    Ok(get_json::<ClusterRecord>(&*store, CLUSTER_KEY)
        .await?
        .is_some_and(|(c, _)| c.recovering))
}

/// Clears [`ClusterRecord::recovering`]: the volume records are rebuilt, so a replica none
/// of them names is an orphan again.
async fn recovered(records: &Records) -> Result<(), ControllerError> {
    let store = records.store();
    for _ in 0..3 {
        let Some((mut c, version)) = get_json::<ClusterRecord>(&*store, CLUSTER_KEY).await? else {
            return Ok(());
        };
        if !c.recovering {
            return Ok(());
        }
        c.recovering = false;
        match put_json(&*store, CLUSTER_KEY, &c, Expect::Version(version)).await {
            Ok(_) => {
                tracing::info!(cluster = %c.id, "recovery finished: orphan replicas go to the trash again");
                return Ok(());
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ControllerError::Contention {
        key: CLUSTER_KEY.into(),
        retries: 3,
    })
}

/// Waits (polling the node records) until each adopted node has registered again.
async fn wait_for(
    records: &Records,
    nodes: &[WaitingNode],
    secs: u64,
) -> Result<(), ControllerError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let registered = records.nodes().await?;
        let missing: Vec<&str> = nodes
            .iter()
            .map(|w| w.node.as_str())
            .filter(|n| !registered.iter().any(|r| r.name == *n))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ControllerError::Refused {
                message: format!(
                    "adopted the cluster, but nodes {missing:?} did not register within \
                     {secs}s; run recover again once they have"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asks every registered agent for its replicas and creates the records [`rebuild`] finds.
async fn rebuild_all(
    st: &AppState,
    cluster_id: &str,
) -> Result<(Vec<VolumeRecord>, Vec<String>), ControllerError> {
    let nodes = st.records.nodes().await?;
    let mut found: Vec<(String, ReplicaInventory)> = Vec::new();
    let mut skipped = Vec::new();
    for n in &nodes {
        match tokio::time::timeout(INVENTORY_TIMEOUT, st.agents.inventory(n.agent())).await {
            Ok(Ok(list)) => found.extend(list.into_iter().map(|r| (n.name.clone(), r))),
            Ok(Err(e)) => skipped.push(format!("node {}: {e}", n.name)),
            Err(_) => skipped.push(format!("node {}: no answer", n.name)),
        }
    }
    let existing = st.records.volumes().await?;
    // On Kubernetes, the KEKs this controller has not copied from the Secret yet.
    if let Err(e) = st.keks.sync().await {
        skipped.push(format!("the key-encryption keys: {e}"));
    }
    let keks: BTreeSet<u32> = match st.keks.ids() {
        Ok(ids) => ids.into_iter().collect(),
        Err(e) => {
            skipped.push(format!("the key-encryption keys: {e}"));
            BTreeSet::new()
        }
    };
    let (records, why) = rebuild(cluster_id, &existing, &found, &keks);
    skipped.extend(why);
    let mut created = Vec::new();
    for r in records {
        let _lock = st.volume_locks.lock(&r.name).await;
        match st.records.create_volume(&r).await {
            Ok(()) => {
                tracing::warn!(volume = %r.name, epoch = r.epoch, replicas = ?r.replicas, "volume recovered from its replicas");
                created.push(r);
            }
            Err(e) => skipped.push(format!("volume {}: {e}", r.name)),
        }
    }
    Ok((created, skipped))
}

/// The volume records that `found` (each replica with its node) supports and `existing`
/// lacks. Per volume: the newest journal among its replicas (greatest epoch and sequence)
/// names the replicas its engine knew to lack data; the replicas at the highest epoch that
/// it does not name, and that are not failed, are in sync; the rest are outdated (resynced
/// at the next attach) or failed. The record's epoch is the highest, so the next attach
/// fences every engine that ever ran. A volume none of whose replicas qualifies as in sync
/// is left alone, with why. An encrypted volume's wrapped key comes from its replicas
/// ([`encryption_of`]); `keks` are the ids of the KEKs this controller has.
pub fn rebuild(
    cluster_id: &str,
    existing: &[VolumeRecord],
    found: &[(String, ReplicaInventory)],
    keks: &BTreeSet<u32>,
) -> (Vec<VolumeRecord>, Vec<String>) {
    let known: BTreeSet<&str> = existing
        .iter()
        .flat_map(|v| v.replicas.iter().chain(&v.retired).map(|r| r.id.as_str()))
        .collect();
    let names: BTreeSet<&str> = existing.iter().map(|v| v.name.as_str()).collect();
    let mut by_volume: BTreeMap<&str, Vec<&(String, ReplicaInventory)>> = BTreeMap::new();
    let mut skipped = Vec::new();
    for f in found {
        let s = &f.1.status;
        if known.contains(s.replica_id.as_str()) {
            continue;
        }
        if s.cluster_id.as_deref().is_some_and(|c| c != cluster_id) {
            skipped.push(format!(
                "replica {} on {}: of cluster {:?}",
                s.replica_id, f.0, s.cluster_id
            ));
            continue;
        }
        if names.contains(s.volume.as_str()) {
            skipped.push(format!(
                "replica {} on {}: volume {} exists and does not name it (left as an orphan)",
                s.replica_id, f.0, s.volume
            ));
            continue;
        }
        by_volume.entry(s.volume.as_str()).or_default().push(f);
    }
    let mut records = Vec::new();
    for (name, reps) in by_volume {
        if hawser_api::validate_name("volume", name).is_err() {
            skipped.push(format!("volume {name:?}: not a valid volume name"));
            continue;
        }
        let Some((uid, reps)) = namesakes::newest_volume(name, reps, &mut skipped) else {
            continue;
        };
        let epoch = reps.iter().map(|f| f.1.status.epoch).max().unwrap_or(0);
        let newest = reps
            .iter()
            .filter_map(|f| f.1.journal.as_ref())
            .max_by_key(|j| (j.epoch, j.seq));
        let lacking: BTreeSet<&str> = newest
            .map(|j| j.lacking.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let replicas: Vec<Replica> = reps
            .iter()
            .map(|(node, inv)| {
                let s = &inv.status;
                let state = if s.failed {
                    ReplicaState::Failed
                } else if s.epoch == epoch && !lacking.contains(s.replica_id.as_str()) {
                    ReplicaState::InSync
                } else {
                    ReplicaState::Outdated
                };
                Replica {
                    id: s.replica_id.clone(),
                    node: node.clone(),
                    pool: s.pool.clone(),
                    state,
                    blank: false,
                    engine: None,
                }
            })
            .collect();
        if !replicas.iter().any(|r| r.state == ReplicaState::InSync) {
            skipped.push(format!(
                "volume {name}: no replica can be trusted as in sync ({replicas:?})"
            ));
            continue;
        }
        let in_sync_sizes = reps
            .iter()
            .zip(&replicas)
            .filter(|(_, r)| r.state == ReplicaState::InSync)
            .map(|(f, _)| f.1.status.size_bytes);
        let size = match newest {
            Some(j) => j.size_bytes,
            None => in_sync_sizes.min().unwrap_or(0),
        };
        let encryption = match encryption_of(name, &reps, keks) {
            Ok((w, note)) => {
                skipped.extend(note);
                w
            }
            Err(why) => {
                skipped.push(why);
                continue;
            }
        };
        let n = u32::try_from(replicas.len()).unwrap_or(u32::MAX);
        records.push(VolumeRecord {
            thin: reps[0].1.status.thin,
            epoch,
            replicas,
            encryption,
            // In the replicas' metadata: replacements keep sums if every replica found does.
            checksums: reps.iter().all(|f| f.1.status.checksums),
            uid,
            ..VolumeRecord::new(name, size, n.min(crate::constants::MAX_REPLICAS))
        });
    }
    (records, skipped)
}

/// An encrypted volume's wrapping, from the copies its replicas keep, with a note for the
/// report when it is not the obvious one; `Err` (why) when the replicas' key checks disagree.
///
/// 1. No replica has a key check: a plain volume.
/// 2. Every replica must have the same key check; otherwise the volume is left alone.
/// 3. The copies (every one of that check) usually agree. When they do not (a rotation that
///    missed a replica), the one under the newest KEK in `keks` wins. If `keks` has none of
///    theirs, the newest one, with a note: its KEK file must come back before an attach.
/// 4. Encrypted, but no replica has a copy (created before replicas kept one): rebuilt as it
///    was before, without its key, with a note; its replicas refuse every engine of it.
fn encryption_of(
    name: &str,
    reps: &[&(String, ReplicaInventory)],
    keks: &BTreeSet<u32>,
) -> Result<(Option<WrappedKey>, Option<String>), String> {
    let checks: BTreeSet<Option<[u8; hawser_api::secret::KEY_CHECK_BYTES]>> = reps
        .iter()
        .map(|f| f.1.status.key_check.map(|k| k.0))
        .collect();
    let check = match checks.iter().collect::<Vec<_>>()[..] {
        [None] | [] => return Ok((None, None)),
        [Some(c)] => hawser_api::KeyCheck(*c),
        ref many => {
            let shown: Vec<String> = many
                .iter()
                .map(|c| c.map_or("none".into(), |c| hawser_api::KeyCheck(c).hex()))
                .collect();
            return Err(format!(
                "volume {name}: its replicas disagree on the data key's check ({}); left alone",
                shown.join(", ")
            ));
        }
    };
    let mut copies: Vec<&WrappedKey> = reps
        .iter()
        .filter_map(|f| f.1.status.wrapped_key.as_ref())
        .filter(|w| w.check == check)
        .collect();
    copies.sort_by_key(|w| std::cmp::Reverse(w.kek));
    copies.dedup();
    let Some(newest) = copies.first() else {
        return Ok((
            None,
            Some(format!(
                "volume {name}: encrypted, but no replica keeps its wrapped data key (made \
                 before replicas kept it): rebuilt without it, and its replicas refuse every \
                 engine of it"
            )),
        ));
    };
    // The newest KEK this controller has; without any of theirs, the newest.
    let chosen = copies
        .iter()
        .find(|w| keks.contains(&w.kek))
        .unwrap_or(newest);
    let note = (!keks.contains(&chosen.kek)).then(|| {
        format!(
            "volume {name}: its replicas keep its data key under key-encryption keys {:?}, \
             none of which this controller has: rebuilt with key {}; put its file back \
             before attaching",
            copies.iter().map(|w| w.kek).collect::<Vec<_>>(),
            chosen.kek
        )
    });
    Ok((Some((*chosen).clone()), note))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_api::agent::{JournalSummary, ReplicaStatus};
    use hawser_api::controller::VolumeState;

    fn inv(
        id: &str,
        volume: &str,
        epoch: u64,
        journal: Option<(u64, u64, &[&str])>,
    ) -> ReplicaInventory {
        ReplicaInventory {
            status: ReplicaStatus {
                replica_id: id.into(),
                volume: volume.into(),
                pool: "default".into(),
                size_bytes: 1 << 30,
                thin: true,
                epoch,
                allocated_bytes: 0,
                data_path: String::new(),
                failed: false,
                error: None,
                cluster_id: Some("c1".into()),
                key_check: None,
                checksums: false,
                wrapped_key: None,
                volume_uid: None,
            },
            journal: journal.map(|(epoch, seq, lacking)| JournalSummary {
                epoch,
                seq,
                size_bytes: 1 << 29,
                lacking: lacking.iter().map(|s| s.to_string()).collect(),
            }),
        }
    }

    fn states(v: &VolumeRecord) -> Vec<(String, ReplicaState)> {
        v.replicas.iter().map(|r| (r.id.clone(), r.state)).collect()
    }

    fn of_uid(mut i: ReplicaInventory, uid: &str) -> ReplicaInventory {
        i.status.volume_uid = Some(uid.into());
        i
    }

    /// Replicas of two volumes that had the same name (an orphan of the deleted one, and
    /// the namesake's): the record is the newer volume's, with its uid, and the other's
    /// replica is left as an orphan; two equally new volumes are left alone.
    #[test]
    fn namesakes_are_split_by_uid_and_the_newest_volume_is_rebuilt() {
        let (old, new) = ("0".repeat(32), "f".repeat(32));
        let found = vec![
            (
                "n1".to_string(),
                of_uid(inv("old-a", "v", 9, Some((9, 40, &[]))), &old),
            ),
            (
                "n1".to_string(),
                of_uid(inv("new-a", "v", 3, Some((3, 2, &[]))), &new),
            ),
            (
                "n2".to_string(),
                of_uid(inv("new-b", "v", 12, Some((12, 1, &[]))), &new),
            ),
        ];
        let (records, skipped) = rebuild("c1", &[], &found, &BTreeSet::new());
        assert_eq!(records.len(), 1, "{skipped:?}");
        let v = &records[0];
        assert_eq!(v.uid.as_deref(), Some(new.as_str()));
        let ids: Vec<&str> = v.replicas.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["new-a", "new-b"]);
        assert!(
            skipped.len() == 1 && skipped[0].contains("old-a") && skipped[0].contains("orphan"),
            "{skipped:?}"
        );
        let tie = vec![
            (
                "n1".to_string(),
                of_uid(inv("x", "w", 4, Some((4, 1, &[]))), &old),
            ),
            (
                "n2".to_string(),
                of_uid(inv("y", "w", 4, Some((4, 1, &[]))), &new),
            ),
        ];
        let (records, skipped) = rebuild("c1", &[], &tie, &BTreeSet::new());
        assert!(records.is_empty(), "{records:?}");
        assert!(skipped[0].contains("left alone"), "{skipped:?}");
        // One uid throughout: kept as it is, a volume from before uids keeps none.
        let one = vec![("n1".to_string(), of_uid(inv("z", "u", 1, None), &new))];
        let (records, _) = rebuild("c1", &[], &one, &BTreeSet::new());
        assert_eq!(records[0].uid.as_deref(), Some(new.as_str()));
        let legacy = vec![("n1".to_string(), inv("z", "u", 1, None))];
        let (records, _) = rebuild("c1", &[], &legacy, &BTreeSet::new());
        assert_eq!(records[0].uid, None);
    }

    #[test]
    fn the_newest_journal_and_the_highest_epoch_decide_who_is_in_sync() {
        use ReplicaState::{InSync, Outdated};
        let found = vec![
            ("n1".to_string(), inv("a", "v", 7, Some((7, 3, &["c"])))),
            ("n2".to_string(), inv("b", "v", 7, Some((7, 2, &[])))),
            // Named lacking by the newest journal, though at the highest epoch.
            ("n3".to_string(), inv("c", "v", 7, Some((6, 9, &[])))),
            // Left behind at an older epoch, named by nobody.
            ("n4".to_string(), inv("d", "v", 5, None)),
        ];
        let (records, skipped) = rebuild("c1", &[], &found, &BTreeSet::new());
        assert!(skipped.is_empty(), "{skipped:?}");
        let v = &records[0];
        assert_eq!(
            states(v),
            [
                ("a".into(), InSync),
                ("b".into(), InSync),
                ("c".into(), Outdated),
                ("d".into(), Outdated)
            ]
        );
        assert_eq!(
            (v.epoch, v.size_bytes, v.state),
            (7, 1 << 29, VolumeState::Detached)
        );
        assert_eq!(v.replicas[3].node, "n4");
    }

    #[test]
    fn known_foreign_and_untrustworthy_replicas_are_left_alone() {
        let mut foreign = inv("x", "w", 1, None);
        foreign.status.cluster_id = Some("other".into());
        let mut failed = inv("f", "u", 3, None);
        failed.status.failed = true;
        let existing: VolumeRecord = serde_json::from_str(
            r#"{"name": "v", "size_bytes": 4096, "replica_count": 1, "thin": true,
                "state": "detached", "epoch": 2, "attached_node": null,
                "replicas": [{"id": "a", "node": "n1", "pool": "default", "state": "in_sync"}]}"#,
        )
        .unwrap();
        let found = vec![
            ("n1".to_string(), inv("a", "v", 2, None)),
            ("n2".to_string(), inv("b", "v", 2, None)),
            ("n2".to_string(), foreign),
            ("n3".to_string(), failed),
        ];
        let (records, skipped) = rebuild("c1", &[existing], &found, &BTreeSet::new());
        assert!(records.is_empty(), "{records:?}");
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(skipped[0].contains("volume v exists"), "{skipped:?}");
        assert!(skipped[1].contains("of cluster"), "{skipped:?}");
        assert!(
            skipped[2].contains("no replica can be trusted"),
            "{skipped:?}"
        );
    }

    /// A rebuilt volume has block checksums only if every replica found has them (its
    /// replacements are made as its record says).
    #[test]
    fn a_rebuilt_volume_keeps_checksums_only_where_every_replica_has_them() {
        let summed = |id: &str, volume: &str, on: bool| {
            let mut r = inv(id, volume, 1, None);
            r.status.checksums = on;
            r
        };
        let found = vec![
            ("n1".to_string(), summed("a", "all", true)),
            ("n2".to_string(), summed("b", "all", true)),
            ("n1".to_string(), summed("c", "mixed", true)),
            ("n2".to_string(), summed("d", "mixed", false)),
        ];
        let (records, skipped) = rebuild("c1", &[], &found, &BTreeSet::new());
        assert!(skipped.is_empty(), "{skipped:?}");
        let sums: Vec<(&str, bool)> = records
            .iter()
            .map(|v| (v.name.as_str(), v.checksums))
            .collect();
        assert_eq!(sums, [("all", true), ("mixed", false)]);
    }

    /// `inv` of an encrypted volume's replica keeping `wrapped` (its key check `check`).
    fn keyed(id: &str, check: u8, wrapped: Option<WrappedKey>) -> ReplicaInventory {
        let mut r = inv(id, "sec", 1, None);
        r.status.key_check = Some(hawser_api::KeyCheck([check; 16]));
        r.status.wrapped_key = wrapped;
        r
    }

    /// The store is lost, the KEK files are not: an encrypted volume comes back with the
    /// wrapped key its replicas keep, which opens to its data key with this controller's
    /// KEKs (the one its record had, after a rotation too). Without the KEK file it comes
    /// back too, and the report names the key to put back.
    #[tokio::test]
    async fn an_encrypted_volume_is_rebuilt_with_the_wrapped_key_its_replicas_keep() {
        let dir = tempfile::tempdir().unwrap();
        let keks = crate::volumes::keys::Keks::new(dir.path());
        let (key, w1) = keks.new_data_key("sec").unwrap();
        let on = |w: &WrappedKey| {
            let mut r = keyed("x", 0, Some(w.clone()));
            r.status.key_check = Some(w.check);
            r
        };
        let found = |w: &WrappedKey| {
            let mut a = on(w);
            a.status.replica_id = "a".into();
            let mut b = on(w);
            b.status.replica_id = "b".into();
            vec![("n1".to_string(), a), ("n2".to_string(), b)]
        };
        let have: BTreeSet<u32> = keks.ids().unwrap().into_iter().collect();
        let (records, skipped) = rebuild("c1", &[], &found(&w1), &have);
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(records[0].encryption.as_ref(), Some(&w1));
        let rebuilt = records[0].encryption.as_ref().unwrap();
        assert_eq!(keks.unwrap("sec", rebuilt).unwrap(), key);
        // Its KEK file is missing here: rebuilt all the same, and the report says which file
        // to put back.
        let (records, skipped) = rebuild("c1", &[], &found(&w1), &BTreeSet::new());
        assert_eq!(records[0].encryption.as_ref(), Some(&w1));
        assert!(skipped[0].contains("put its file back"), "{skipped:?}");

        assert_eq!(keks.rotate().await.unwrap(), 2);
        let w2 = keks.rewrap("sec", &w1).unwrap();
        let have: BTreeSet<u32> = keks.ids().unwrap().into_iter().collect();
        let (records, _) = rebuild("c1", &[], &found(&w2), &have);
        let rebuilt = records[0].encryption.as_ref().unwrap();
        assert_eq!(
            (rebuilt.kek, keks.unwrap("sec", rebuilt).unwrap()),
            (2, key)
        );
    }

    /// Replicas whose copies differ (a rotation missed one): the copy under the newest KEK this
    /// controller has wins; with none of theirs, the newest, and the report says which file
    /// to put back.
    #[test]
    fn disagreeing_copies_give_the_newest_kek_this_controller_has() {
        let w = |kek: u32| WrappedKey {
            kek,
            wrapped: format!("c2VhbGVk{kek}"),
            check: hawser_api::KeyCheck([7; 16]),
        };
        let found = vec![
            ("n1".to_string(), keyed("a", 7, Some(w(1)))),
            ("n2".to_string(), keyed("b", 7, Some(w(3)))),
            // Made by an older agent or controller: no copy, the same check.
            ("n3".to_string(), keyed("c", 7, None)),
        ];
        for (have, want, noted) in [
            (vec![1, 2, 3], 3, false),
            (vec![1, 2], 1, false),
            (vec![2], 3, true),
        ] {
            let have: BTreeSet<u32> = have.into_iter().collect();
            let (records, skipped) = rebuild("c1", &[], &found, &have);
            assert_eq!(records.len(), 1, "{skipped:?}");
            assert_eq!(records[0].encryption, Some(w(want)), "{have:?}");
            assert_eq!(records[0].replicas.len(), 3);
            assert_eq!(!skipped.is_empty(), noted, "{have:?}: {skipped:?}");
            if noted {
                assert!(skipped[0].contains("put its file back"), "{skipped:?}");
            }
        }
    }

    /// Replicas that disagree on the data key's check are left alone; encrypted replicas with
    /// no copy at all (made before replicas kept one) come back without a key, as before, and
    /// the report says so.
    #[test]
    fn disagreeing_key_checks_are_left_alone_and_missing_copies_are_reported() {
        let w = WrappedKey {
            kek: 1,
            wrapped: "c2VhbGVk".into(),
            check: hawser_api::KeyCheck([7; 16]),
        };
        let mut plain = inv("p", "sec", 1, None);
        plain.status.volume = "sec".into();
        for other in [keyed("b", 8, None), plain] {
            let found = vec![
                ("n1".to_string(), keyed("a", 7, Some(w.clone()))),
                ("n2".to_string(), other),
            ];
            let (records, skipped) = rebuild("c1", &[], &found, &BTreeSet::from([1]));
            assert!(records.is_empty(), "{records:?}");
            assert!(skipped[0].contains("disagree"), "{skipped:?}");
        }
        let found = vec![
            ("n1".to_string(), keyed("a", 7, None)),
            ("n2".to_string(), keyed("b", 7, None)),
        ];
        let (records, skipped) = rebuild("c1", &[], &found, &BTreeSet::from([1]));
        assert_eq!(records[0].encryption, None);
        assert!(skipped[0].contains("no replica keeps"), "{skipped:?}");
    }
}
