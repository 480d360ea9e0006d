//! A volume created from a backup (`hawser volume create NAME --from-backup TARGET/BACKUP`,
//! docs/backup.md), in this cluster or in a new one given only the target (and, for an
//! encrypted volume, the KEK). The volume is created as any other, blank, and marked
//! `restoring` before its lock is let go, so nothing attaches it; then every replica's node
//! reads the backup into its replica (`hawser-agent` `backup/`), each block checked against
//! its hash. When all have, `restoring` is cleared; a restore that fails keeps the volume
//! `restoring`, says why in an event, and the volume can only be deleted.

use std::sync::Arc;
use std::time::Duration;

use hawser_api::backup::{BackupJob, JobState, S3Key, StartRestoreJob};
use hawser_api::controller::CreateVolume;
use hawser_backup::Manifest;

use crate::errors::ControllerError;
use crate::snapshots::backup_targets::TargetRecord;
use crate::state::AppState;
use crate::store::model::VolumeRecord;
use crate::volumes::keys::WrappedKey;

/// How often the replicas' jobs are read.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);
/// How long a node may not answer about a restore before the restore is failed.
const UNREACHABLE_FOR: Duration = Duration::from_secs(120);

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

/// A backup to restore, read from its target.
pub struct RestoreSource {
    pub target: TargetRecord,
    pub credentials: Option<S3Key>,
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
    let (record, credentials, t) = crate::snapshots::backup_targets::open(st, target).await?;
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
        credentials,
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

/// Marks the created volume `restoring` (under its lock, before anyone may attach it), then
/// starts its replicas' jobs and follows them in a task of their own.
pub async fn start(
    st: &Arc<AppState>,
    v: &VolumeRecord,
    src: RestoreSource,
) -> Result<VolumeRecord, ControllerError> {
    let label = src.label();
    let (marked, ()) = st
        .records
        .update_volume(&v.name, |v| {
            v.restoring = Some(label.clone());
            Ok(())
        })
        .await?;
    let nodes = st.records.nodes().await?;
    let mut jobs = Vec::new();
    for r in &marked.replicas {
        let Some(node) = nodes.iter().find(|n| n.name == r.node) else {
            continue;
        };
        let req = StartRestoreJob {
            replica: r.id.clone(),
            backup: src.manifest.backup.clone(),
            target: src.target.name.clone(),
            spec: src.target.spec.clone(),
            credentials: src.credentials.clone(),
            bytes_per_sec: st.backups.bytes_per_sec,
            base: None,
        };
        st.agents
            .start_restore(node.agent(), &req)
            .await
            .map_err(|source| ControllerError::Agent {
                node: node.name.clone(),
                op: "start a restore".into(),
                source,
            })?;
        jobs.push((node.name.clone(), req.job()));
    }
    tracing::info!(volume = %v.name, from = %label, replicas = jobs.len(), "restore started");
    let (st, name) = (st.clone(), v.name.clone());
    tokio::spawn(async move { follow(&st, &name, &label, jobs).await });
    Ok(marked)
}

/// Waits for every replica's job; clears `restoring` when all are done.
async fn follow(st: &AppState, volume: &str, label: &str, jobs: Vec<(String, String)>) {
    let mut silent_since: Option<std::time::Instant> = None;
    let failure = loop {
        tokio::time::sleep(FOLLOW_EVERY).await;
        let mut done = 0;
        let mut failed = None;
        let mut silent = None;
        for (node, job) in &jobs {
            let answer = read_job(st, node, job).await;
            match answer {
                Ok(BackupJob {
                    state: JobState::Done,
                    ..
                }) => done += 1,
                Ok(BackupJob {
                    state: JobState::Failed,
                    error,
                    ..
                }) => {
                    failed = Some(format!("on node {node}: {}", error.unwrap_or_default()));
                }
                Ok(_) => {}
                Err(JobError::Gone(e)) => {
                    failed = Some(format!("node {node} has no restore job (restarted?): {e}"));
                }
                Err(JobError::Silent(e)) => silent = Some(e),
            }
        }
        if let Some(f) = failed {
            break Some(f);
        }
        if done == jobs.len() {
            break None;
        }
        match silent {
            Some(e) => {
                let since = *silent_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > UNREACHABLE_FOR {
                    break Some(format!(
                        "a node did not answer for {UNREACHABLE_FOR:?}: {e}"
                    ));
                }
            }
            None => silent_since = None,
        }
    };
    match failure {
        None => {
            let cleared = st
                .records
                .update_volume(volume, |v| {
                    if v.restoring.as_deref() == Some(label) {
                        v.restoring = None;
                    }
                    Ok(())
                })
                .await;
            if let Err(e) = cleared {
                tracing::warn!(volume, error = %e, "restore done, but the record not updated");
                return;
            }
            tracing::info!(volume, from = label, "restore done");
            st.events.keep(
                Some(volume),
                None,
                false,
                "RestoreDone",
                &format!("volume {volume} restored from {label}"),
            );
        }
        Some(why) => {
            tracing::warn!(volume, from = label, error = %why, "restore failed");
            st.events.keep(
                Some(volume),
                None,
                true,
                "RestoreFailed",
                &format!(
                    "restore of volume {volume} from {label} failed {why}; delete the \
                          volume and create it again"
                ),
            );
        }
    }
}
