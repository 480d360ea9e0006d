//! A volume created from a backup (`hawser volume create NAME --from-backup TARGET/BACKUP`,
//! docs/backup.md), in this cluster or in a new one given only the target (and, for an
//! encrypted volume, the KEK). The volume is created as any other, blank, and marked
//! `restoring` before its lock is let go, so nothing attaches it; then every replica's node
//! reads the backup into its replica (`hawser-agent` `backup/`), each block checked against
//! its hash. When all have, `restoring` is cleared.
//!
//! The restore is the cluster's job, not the request's: the record names the backup
//! (`restore_from`), and the leader's loop ([`step`]) starts every replica's job that is not
//! done and clears `restoring` when all are, so a controller restart, a leader change or an
//! agent restart (whose finished jobs are only in its memory: they run again) delays the
//! restore, and never strands it. A restore that fails says why in an event and is tried
//! again after a backoff (a target or node down comes back; a corrupt block does not, and
//! the volume can only be deleted).

use std::sync::Arc;

use hawser_api::backup::{BackupJob, JobState, StartRestoreJob};
use hawser_api::controller::CreateVolume;
use hawser_backup::Manifest;

use crate::cluster::agent_client::AgentClient;
use crate::errors::ControllerError;
use crate::snapshots::backup_targets::TargetRecord;
use crate::snapshots::restore_holds;
use crate::state::AppState;
use crate::store::model::{BackupRef, NodeRecord, VolumeRecord};
use crate::volumes::keys::WrappedKey;

/// Why a node's job could not be read.
pub enum JobError {
    /// The node, or its job, is no more (its agent restarted): the job will never end.
    Gone(String),
    /// The node did not answer: it may yet.
    Silent(String),
}

/// A backup or restore job on `node` (`hawser-agent` `backup/`).
pub async fn read_job(st: &AppState, node: &str, job: &str) -> Result<BackupJob, JobError> {
    match st.records.node(node).await {
        Ok(Some(n)) => st
            .agents
            .backup_job(n.agent(), job)
            .await
            .map_err(|e| match e.api_code() {
                Some(hawser_api::ErrorCode::NotFound) => JobError::Gone(e.to_string()),
                _ => JobError::Silent(e.to_string()),
            }),
        Ok(None) => Err(JobError::Gone(format!("node {node} is not registered"))),
        Err(e) => Err(JobError::Silent(e.to_string())),
    }
}

/// Where a replica's restore job stands (`drive`).
pub enum Turn {
    Done,
    Running,
    /// It failed for this reason; it is not started again until asked (`restart`).
    Failed(String),
}

/// Reads `req`'s job on `node` and starts it if the node has none (never started, or lost
/// with an agent restart: an agent keeps its jobs in memory only). A failed job is reported,
/// not started again: the caller does that when its backoff is over ([`restart`]), since
/// starting a failed job at once would hide every failure behind a job that looks running.
pub async fn drive(
    st: &AppState,
    node: &NodeRecord,
    req: &StartRestoreJob,
) -> Result<Turn, String> {
    match read_job(st, &node.name, &req.job()).await {
        Ok(job) => Ok(turn_of(job)),
        Err(JobError::Gone(_)) => restart(&st.agents, node, req).await,
        Err(JobError::Silent(e)) => Err(format!("on node {}: {e}", node.name)),
    }
}

/// Starts `req`'s job on `node`, again if it failed (idempotent on the agent for a job that
/// runs or is done).
pub async fn restart(
    agents: &AgentClient,
    node: &NodeRecord,
    req: &StartRestoreJob,
) -> Result<Turn, String> {
    match agents.start_restore(node.agent(), req).await {
        Ok(job) => Ok(turn_of(job)),
        // The node runs its most jobs: come back later.
        Err(e) if e.api_code() == Some(hawser_api::ErrorCode::Unavailable) => Ok(Turn::Running),
        Err(e) => Err(format!("on node {}: {e}", node.name)),
    }
}

fn turn_of(job: BackupJob) -> Turn {
    match job.state {
        JobState::Done => Turn::Done,
        JobState::Running => Turn::Running,
        JobState::Failed => Turn::Failed(job.error.unwrap_or_default()),
    }
}

/// A backup to restore, read from its target.
pub struct RestoreSource {
    pub target: TargetRecord,
    pub manifest: Manifest,
}

impl RestoreSource {
    /// What `restoring` says while it runs.
    pub fn label(&self) -> String {
        format!("backup {}/{}", self.target.name, self.manifest.backup)
    }
}

/// Reads the manifest `TARGET/BACKUP` names, and fits the request to it: its size (at least
/// the backup's; 0 takes the backup's), and encrypted if the backup is.
pub async fn resolve(
    st: &AppState,
    req: &mut CreateVolume,
    from: &str,
) -> Result<RestoreSource, ControllerError> {
    let Some((target, backup)) = from.split_once('/') else {
        return Err(ControllerError::invalid(format!(
            "--from-backup {from:?}: give TARGET/BACKUP (hawser backup list)"
        )));
    };
    let (record, _, t) = crate::snapshots::backup_targets::open(st, target).await?;
    let manifest = hawser_backup::read_manifest(&t, backup)
        .await
        .map_err(|e| match e {
            hawser_backup::BackupError::NotFound { .. } => ControllerError::NotFound {
                kind: "backup",
                name: from.into(),
            },
            e => ControllerError::BackupTarget {
                target: target.into(),
                reason: e.to_string(),
            },
        })?;
    fit(req, &manifest, from)?;
    Ok(RestoreSource {
        target: record,
        manifest,
    })
}

/// Fits a create request to the backup it starts from: its size (at least the backup's; 0
/// takes the backup's), and encrypted if the backup is.
pub fn fit(req: &mut CreateVolume, manifest: &Manifest, from: &str) -> Result<(), ControllerError> {
    if req.size_bytes == 0 {
        req.size_bytes = manifest.size_bytes;
    }
    if req.size_bytes < manifest.size_bytes {
        return Err(ControllerError::invalid(format!(
            "backup {from} is of {} bytes; a volume restored from it cannot be smaller",
            manifest.size_bytes
        )));
    }
    req.encrypted = manifest.encryption.is_some();
    Ok(())
}

/// The new volume's data key: the backup's, unwrapped under the name it was backed up as
/// (the wrapping names its volume) and wrapped again for the new name.
pub async fn data_key(
    st: &AppState,
    name: &str,
    src: &RestoreSource,
) -> Result<Option<WrappedKey>, ControllerError> {
    let Some(k) = &src.manifest.encryption else {
        return Ok(None);
    };
    let keys = |e: crate::volumes::keys::KeyError| ControllerError::invalid(e.to_string());
    let check = hawser_api::KeyCheck::parse_hex(&k.check).ok_or_else(|| {
        ControllerError::invalid(format!("backup {}: key check {:?}", src.label(), k.check))
    })?;
    let wrapped = WrappedKey {
        kek: k.kek,
        wrapped: k.wrapped.clone(),
        check,
    };
    st.keks.ready().await.map_err(keys)?;
    st.keks.fetch(k.kek).await.map_err(keys)?;
    let key = st
        .keks
        .unwrap(&src.manifest.volume, &wrapped)
        .map_err(keys)?;
    st.keks.wrap(name, &key).map_err(keys).map(Some)
}

/// Marks the created volume `restoring` from `src` (under its lock, before anyone may attach
/// it) and wakes the leader's loop, which starts its replicas' jobs and follows them
/// ([`step`]): a restore is a job of the cluster, not of this request or this controller.
pub async fn start(
    st: &Arc<AppState>,
    v: &VolumeRecord,
    src: RestoreSource,
) -> Result<VolumeRecord, ControllerError> {
    let label = src.label();
    let from = BackupRef {
        target: src.target.name.clone(),
        backup: src.manifest.backup.clone(),
    };
    // The restore holds its backup from now on (restore_holds.rs): the lock is written
    // before the volume is marked, so a delete and a prune that follow this request keep
    // the backup. A target that cannot be reached now is held from the leader's loop.
    let held = match crate::snapshots::backup_targets::open(st, &from.target).await {
        Ok((_, _, t)) => {
            let holder = restore_holds::holder(&restore_holds::prefix(v));
            let written = hawser_backup::ReadHold::write_as(&t, &from.backup, &holder).await;
            if let Err(e) = &written {
                tracing::warn!(volume = %v.name, from = %label, error = %e,
                    "cannot hold the backup yet; the restore's loop tries again");
            }
            Some((t, written.ok()))
        }
        Err(_) => None,
    };
    let marked = st
        .records
        .update_volume(&v.name, |v| {
            v.restoring = Some(label.clone());
            v.restore_from = Some(from.clone());
            Ok(())
        })
        .await;
    let marked = match (marked, held) {
        (Ok((marked, ())), Some((t, written))) => {
            st.backups.restore_holds.keep(v, &from, t, written);
            marked
        }
        (Ok((marked, ())), None) => marked,
        (Err(e), held) => {
            if let Some((_, Some(written))) = held {
                written.release().await;
            }
            return Err(e);
        }
    };
    tracing::info!(volume = %v.name, from = %label, "restore started");
    st.backups.standby_wake.notify_one();
    Ok(marked)
}

/// The backup `v` is being restored from, if it is: its record says so, or, in a record of
/// a controller older than `restore_from`, its `restoring` label does ("backup T/B"; a
/// snapshot's name, the other label, has no space).
pub fn source_of(v: &VolumeRecord) -> Option<BackupRef> {
    if v.standby.is_some() {
        return None;
    }
    if let Some(from) = &v.restore_from {
        return Some(from.clone());
    }
    let (target, backup) = v
        .restoring
        .as_deref()?
        .strip_prefix("backup ")?
        .split_once('/')?;
    Some(BackupRef {
        target: target.to_owned(),
        backup: backup.to_owned(),
    })
}

/// The label `restoring` carries for a restore from `from`.
fn label_of(from: &BackupRef) -> String {
    format!("backup {}/{}", from.target, from.backup)
}

/// On the leader, each turn of the loop over volumes reading backups (`standby::run`): starts
/// `v`'s restore on every replica whose job is not done (starting is idempotent on the
/// agent: a running or done job is returned, a failed or lost one starts again, and writing
/// a block twice is harmless), then clears `restoring` once all are done. True while the
/// restore goes on (the loop comes back within a second).
pub async fn step(st: &AppState, v: &VolumeRecord) -> bool {
    let Some(from) = source_of(v) else {
        return false;
    };
    if !st.backups.restore_retries.due(&v.name) {
        return true;
    }
    hold(st, v, &from).await;
    match start_jobs(st, v, &from).await {
        Ok(true) => finish(st, v, &from).await,
        Ok(false) => {
            st.backups.restore_retries.clear(&v.name);
            true
        }
        Err(why) => {
            failed(st, v, &from, &why);
            true
        }
    }
}

/// Takes `v`'s hold on its backup if it has none (a new leader, a target that was down).
async fn hold(st: &AppState, v: &VolumeRecord, from: &BackupRef) {
    let holds = &st.backups.restore_holds;
    if !holds.wanted(&v.name, from) {
        return;
    }
    if let Ok((_, _, t)) = crate::snapshots::backup_targets::open(st, &from.target).await {
        holds.keep(v, from, t, None);
    }
}

/// Starts or reads every replica's job: true once all are done.
async fn start_jobs(st: &AppState, v: &VolumeRecord, from: &BackupRef) -> Result<bool, String> {
    let (target, credentials, _) = crate::snapshots::backup_targets::open(st, &from.target)
        .await
        .map_err(|e| format!("cannot open target {}: {e}", from.target))?;
    let nodes = st.records.nodes().await.map_err(|e| e.to_string())?;
    let mut done = 0;
    for r in &v.replicas {
        let node = nodes
            .iter()
            .find(|n| n.name == r.node)
            .ok_or_else(|| format!("replica {} is on node {}, not registered", r.id, r.node))?;
        let req = StartRestoreJob {
            replica: r.id.clone(),
            backup: from.backup.clone(),
            target: target.name.clone(),
            spec: target.spec.clone(),
            credentials: credentials.clone(),
            bytes_per_sec: st.backups.bytes_per_sec,
            base: None,
            base_unknown: false,
        };
        match drive(st, node, &req).await? {
            Turn::Done => done += 1,
            Turn::Running => {}
            // Started again now; read again after the backoff this failure sets.
            Turn::Failed(why) => {
                restart(&st.agents, node, &req).await?;
                return Err(format!("on node {}: {why}", r.node));
            }
        }
    }
    Ok(done == v.replicas.len())
}

/// Clears `restoring` if it is still this restore's: one compare-and-swap, so the volume
/// leaves `restoring` once, whoever else finished it too. False: nothing left to do.
async fn finish(st: &AppState, v: &VolumeRecord, from: &BackupRef) -> bool {
    let label = label_of(from);
    let cleared = st
        .records
        .update_volume(&v.name, |r| {
            if source_of(r).as_ref() != Some(from) {
                return Ok(false);
            }
            r.restore_from = None;
            if r.restoring.as_deref() == Some(label.as_str()) {
                r.restoring = None;
            }
            Ok(true)
        })
        .await;
    match cleared {
        Ok((_, true)) => {
            st.backups.restore_holds.release(&v.name);
            st.backups.restore_retries.clear(&v.name);
            tracing::info!(volume = %v.name, from = %label, "restore done");
            st.events.keep(
                Some(&v.name),
                None,
                false,
                "RestoreDone",
                &format!("volume {} restored from {label}", v.name),
            );
            false
        }
        Ok((_, false)) => {
            st.backups.restore_holds.release(&v.name);
            false
        }
        // Tried again at the next turn: the jobs are done, and say so again.
        Err(e) => {
            tracing::warn!(volume = %v.name, error = %e, "restore done, record not updated yet");
            true
        }
    }
}

/// Records why a restore could not go on, with an event when the reason is new; it is tried
/// again after a backoff (`Retries`).
fn failed(st: &AppState, v: &VolumeRecord, from: &BackupRef, why: &str) {
    let (fresh, wait) = st.backups.restore_retries.failed(&v.name, why);
    if !fresh {
        return;
    }
    let label = label_of(from);
    tracing::warn!(volume = %v.name, from = %label, error = %why, "restore failed");
    st.events.keep(
        Some(&v.name),
        None,
        true,
        "RestoreFailed",
        &format!(
            "restore of volume {} from {label} failed {why}; it is tried again in {} s (delete \
             the volume to give up)",
            v.name,
            wait.as_secs()
        ),
    );
}
