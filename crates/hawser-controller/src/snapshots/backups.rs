//! Backups of a volume to a target (docs/backup.md). The controller takes (or is given) a
//! snapshot, picks a node whose replica holds it, and has that node's agent send the snapshot
//! to the target (`hawser-agent` `backup/`): data never passes through the controller. It
//! records the backup under `backups/<name>` (Running), follows the agent's job until it ends,
//! then records Ready with its cost, or Failed with why, and drops the snapshot it took.

use std::sync::Arc;
use std::time::Duration;

use hawser_api::backup::{Backup, BackupJob, BackupKey, BackupState, CreateBackup, JobState};
use hawser_api::controller::{CreateSnapshot, SnapshotState};
use hawser_store::{get_json, list_json, put_json, Expect};
use serde::{Deserialize, Serialize};

use crate::errors::ControllerError;
use crate::snapshots::restores::JobError;
use crate::state::AppState;
use crate::store::model::{now_ms, SnapshotRecord, VolumeRecord};
use crate::store::records::Records;

const PREFIX: &str = "backups/";
/// How often a running backup's job is read from its node.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);
/// How long a node may not answer about a running backup before the backup is failed.
const UNREACHABLE_FOR: Duration = Duration::from_secs(120);

/// A backup as the store keeps it: the API's view, and what the controller needs to finish it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupRecord {
    #[serde(flatten)]
    pub backup: Backup,
    /// The replica whose snapshot copy is read.
    #[serde(default)]
    pub replica: Option<String>,
    /// The snapshot was taken for this backup, and goes when it ends.
    #[serde(default)]
    pub owns_snapshot: bool,
    /// A schedule made it: its retention may delete it (`snapshots/schedules.rs`).
    #[serde(default)]
    pub scheduled: bool,
}

fn key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

pub async fn record(records: &Records, name: &str) -> Result<BackupRecord, ControllerError> {
    get_json::<BackupRecord>(&*records.store(), &key(name))
        .await?
        .map(|(r, _)| r)
        .ok_or_else(|| ControllerError::NotFound {
            kind: "backup",
            name: name.into(),
        })
}

/// Every backup (of one volume, of one target), oldest first.
pub async fn list(
    st: &AppState,
    volume: Option<&str>,
    target: Option<&str>,
) -> Result<Vec<Backup>, ControllerError> {
    Ok(records(&st.records, volume, target)
        .await?
        .into_iter()
        .map(|r| r.backup)
        .collect())
}

/// [`list`], as the store keeps them.
pub async fn records(
    records: &Records,
    volume: Option<&str>,
    target: Option<&str>,
) -> Result<Vec<BackupRecord>, ControllerError> {
    let all = list_json::<BackupRecord>(&*records.store(), PREFIX).await?;
    let mut out: Vec<BackupRecord> = all
        .into_iter()
        .map(|(_, r, _)| r)
        .filter(|r| {
            volume.is_none_or(|v| r.backup.volume == v)
                && target.is_none_or(|t| r.backup.target == t)
        })
        .collect();
    out.sort_by(|a, b| {
        (a.backup.created_ms, &a.backup.name).cmp(&(b.backup.created_ms, &b.backup.name))
    });
    Ok(out)
}

async fn save(records: &Records, r: &BackupRecord, expect: Expect) -> Result<(), ControllerError> {
    put_json(&*records.store(), &key(&r.backup.name), r, expect).await?;
    Ok(())
}

/// The snapshot to read, and whether it was taken for this backup.
async fn snapshot_for(
    st: &AppState,
    req: &CreateBackup,
    name: &str,
) -> Result<(SnapshotRecord, bool), ControllerError> {
    if let Some(s) = &req.snapshot {
        let v = st.records.existing_volume(&req.volume).await?;
        let found = v
            .snapshots
            .iter()
            .find(|x| x.name == *s && x.state == SnapshotState::Ready);
        return found.cloned().map(|x| (x, false)).ok_or_else(|| {
            ControllerError::SnapshotNotFound {
                snapshot: s.clone(),
            }
        });
    }
    // Snapshot names are at most 63 characters; a backup's may be longer.
    let snap = format!(
        "backup-{}",
        &hawser_backup::block::hash(name.as_bytes())[..16]
    );
    let taken = crate::snapshots::create::create_snapshot(
        st,
        CreateSnapshot {
            name: snap,
            volume: req.volume.clone(),
        },
    )
    .await?;
    Ok((taken, true))
}

/// A replica holding the snapshot, on a node that answers heartbeats: (replica, node).
async fn holder(
    st: &AppState,
    v: &VolumeRecord,
    s: &SnapshotRecord,
) -> Result<(String, crate::store::model::NodeRecord), ControllerError> {
    let nodes = st.records.nodes().await?;
    for id in &s.replicas {
        let Some(r) = v.replicas.iter().find(|r| r.id == *id) else {
            continue;
        };
        if let Some(n) = nodes.iter().find(|n| n.name == r.node && st.is_online(n)) {
            return Ok((id.clone(), n.clone()));
        }
    }
    Err(ControllerError::Refused {
        message: format!(
            "no online node holds snapshot {} of volume {}; retry when one is back",
            s.name, v.name
        ),
    })
}

/// `POST /v1/backups`: starts a backup and answers at once (Running); `hawser backup show`
/// follows it.
pub async fn create(st: &Arc<AppState>, req: CreateBackup) -> Result<Backup, ControllerError> {
    create_as(st, req, false).await
}

/// Starts a backup, made by a schedule or not.
pub async fn create_as(
    st: &Arc<AppState>,
    req: CreateBackup,
    scheduled: bool,
) -> Result<Backup, ControllerError> {
    hawser_api::validate_name("volume", &req.volume)?;
    let v = st.records.existing_volume(&req.volume).await?;
    let (target_rec, credentials, _) =
        crate::snapshots::backup_targets::open(st, &req.target).await?;
    let created = now_ms();
    let mut name = hawser_backup::names::backup_name(&req.volume, created, 0);
    for n in 1..10 {
        if get_json::<BackupRecord>(&*st.records.store(), &key(&name))
            .await?
            .is_none()
        {
            break;
        }
        name = hawser_backup::names::backup_name(&req.volume, created, n);
    }
    let previous = list(st, Some(&req.volume), Some(&req.target))
        .await?
        .into_iter()
        .filter(|b| b.state == BackupState::Ready)
        .max_by_key(|b| b.taken_ms)
        .map(|b| b.name);
    let (snap, owns) = snapshot_for(st, &req, &name).await?;
    let mut rec = BackupRecord {
        backup: Backup {
            name: name.clone(),
            volume: v.name.clone(),
            target: req.target.clone(),
            state: BackupState::Running,
            snapshot: snap.name.clone(),
            taken_ms: snap.created_ms,
            size_bytes: snap.size_bytes,
            node: None,
            progress: None,
            stats: None,
            error: None,
            created_ms: created,
            finished_ms: None,
        },
        replica: None,
        owns_snapshot: owns,
        scheduled,
    };
    save(&st.records, &rec, Expect::Absent).await?;
    let started = start_on_a_holder(st, &mut rec, &snap, &target_rec, credentials, previous).await;
    if let Err(e) = started {
        finish(st, &mut rec, Err(e.to_string())).await;
        return Err(e);
    }
    save(&st.records, &rec, Expect::Any).await?;
    tracing::info!(backup = %name, volume = %v.name, target = %req.target,
        node = ?rec.backup.node, "backup started");
    spawn_follow(st, &name);
    Ok(rec.backup)
}

async fn start_on_a_holder(
    st: &AppState,
    rec: &mut BackupRecord,
    snap: &SnapshotRecord,
    target: &crate::snapshots::backup_targets::TargetRecord,
    credentials: Option<hawser_api::backup::S3Key>,
    previous: Option<String>,
) -> Result<(), ControllerError> {
    let v = st.records.existing_volume(&rec.backup.volume).await?;
    let (replica, node) = holder(st, &v, snap).await?;
    let cluster = crate::cluster::identity(st).await.ok().map(|c| c.id);
    let job = hawser_api::backup::StartBackupJob {
        backup: rec.backup.name.clone(),
        volume: v.name.clone(),
        cluster,
        replica: replica.clone(),
        snapshot: snap.id.clone(),
        taken_ms: snap.created_ms,
        size_bytes: snap.size_bytes,
        target: target.name.clone(),
        spec: target.spec.clone(),
        credentials,
        previous,
        encryption: v.encryption.as_ref().map(|k| BackupKey {
            kek: k.kek,
            wrapped: k.wrapped.clone(),
            check: k.check.hex(),
        }),
        bytes_per_sec: st.backups.bytes_per_sec,
        retry_secs: Some(st.backups.retry_secs),
    };
    let answer = st
        .agents
        .start_backup(node.agent(), &job)
        .await
        .map_err(|source| ControllerError::Agent {
            node: node.name.clone(),
            op: "start a backup".into(),
            source,
        })?;
    rec.backup.node = Some(node.name.clone());
    rec.replica = Some(replica);
    rec.backup.progress = Some(answer.progress);
    Ok(())
}

/// Follows `name` in a task of its own, unless this controller follows it already.
fn spawn_follow(st: &Arc<AppState>, name: &str) {
    let fresh = st
        .backups
        .following
        .lock()
        .is_ok_and(|mut f| f.insert(name.to_owned()));
    if !fresh {
        return;
    }
    let (st, name) = (st.clone(), name.to_owned());
    tokio::spawn(async move {
        follow(&st, &name).await;
        if let Ok(mut f) = st.backups.following.lock() {
            f.remove(&name);
        }
    });
}

/// Follows a running backup's job on its node until it ends, recording its progress.
async fn follow(st: &AppState, name: &str) {
    let mut silent_since: Option<std::time::Instant> = None;
    loop {
        tokio::time::sleep(FOLLOW_EVERY).await;
        let Ok(mut rec) = record(&st.records, name).await else {
            return;
        };
        if rec.backup.state != BackupState::Running {
            return;
        }
        let Some(node) = rec.backup.node.clone() else {
            return;
        };
        let job = crate::snapshots::restores::read_job(st, &node, name).await;
        match job {
            Ok(BackupJob {
                state: JobState::Running,
                progress,
                ..
            }) => {
                silent_since = None;
                rec.backup.progress = Some(progress);
                if let Err(e) = save(&st.records, &rec, Expect::Any).await {
                    tracing::warn!(backup = name, error = %e, "cannot record a backup's progress");
                }
            }
            Ok(job) => {
                rec.backup.progress = Some(job.progress);
                let result = match job.state {
                    JobState::Done => Ok(job.stats.unwrap_or_default()),
                    _ => Err(job
                        .error
                        .unwrap_or_else(|| "the node gave no reason".into())),
                };
                finish(st, &mut rec, result).await;
                return;
            }
            Err(JobError::Gone(e)) => {
                let why = format!("node {node} has no such job (its agent restarted?): {e}");
                finish(st, &mut rec, Err(why)).await;
                return;
            }
            Err(JobError::Silent(e)) => {
                let since = *silent_since.get_or_insert_with(std::time::Instant::now);
                if let Some(why) = went_offline(st, &node).await {
                    finish(st, &mut rec, Err(format!("{why}: {e}"))).await;
                    return;
                }
                if since.elapsed() > UNREACHABLE_FOR {
                    let why = format!("node {node} did not answer for {UNREACHABLE_FOR:?}: {e}");
                    finish(st, &mut rec, Err(why)).await;
                    return;
                }
            }
        }
    }
}

/// Why the backup job on `node` is lost, if the node is offline: no heartbeat for the node
/// timeout (its agent was killed, or its machine stopped). A job lives in its agent's memory,
/// so an agent that comes back does not have it; waiting `UNREACHABLE_FOR` would only keep a
/// dead backup `running`. (A node cut off but alive may still finish its job: its manifest
/// is then on the target while the record says failed; a later backup reuses its blocks.)
async fn went_offline(st: &AppState, node: &str) -> Option<String> {
    let n = st.records.node(node).await.ok()??;
    if st.is_online(&n) {
        return None;
    }
    Some(format!(
        "node {node} went offline (no heartbeat for {} s) while it ran the backup, and the \
         job is lost with it",
        st.node_timeout_ms / 1000
    ))
}

/// Records how a backup ended, and drops the snapshot it took.
async fn finish(
    st: &AppState,
    rec: &mut BackupRecord,
    result: Result<hawser_api::backup::BackupStats, String>,
) {
    let name = rec.backup.name.clone();
    // Before the end is recorded, so whoever waits for it finds the snapshot gone.
    if rec.owns_snapshot {
        if let Err(e) = crate::snapshots::create::delete_snapshot(st, &rec.backup.snapshot).await {
            tracing::warn!(backup = %name, snapshot = %rec.backup.snapshot, error = %e,
                "cannot delete the snapshot a backup took");
        }
    }
    rec.backup.finished_ms = Some(now_ms());
    match result {
        Ok(stats) => {
            rec.backup.state = BackupState::Ready;
            tracing::info!(backup = %name, stored = stats.stored_bytes, "backup ready");
            st.events.keep(
                Some(&rec.backup.volume),
                None,
                false,
                "BackupReady",
                &format!("backup {name} is on target {}", rec.backup.target),
            );
            rec.backup.stats = Some(stats);
        }
        Err(why) => {
            rec.backup.state = BackupState::Failed;
            tracing::warn!(backup = %name, error = %why, "backup failed");
            st.events.keep(
                Some(&rec.backup.volume),
                None,
                true,
                "BackupFailed",
                &format!(
                    "backup {name} to target {} failed: {why}",
                    rec.backup.target
                ),
            );
            rec.backup.error = Some(why);
        }
    }
    if let Err(e) = save(&st.records, rec, Expect::Any).await {
        tracing::warn!(backup = %name, error = %e, "cannot record how a backup ended");
    }
}

/// `DELETE /v1/backups/{name}`: deletes the backup's manifest from its target, then its
/// record. Its blocks stay until the target is pruned (`POST /v1/backup-targets/{t}/prune`,
/// or the prune after a schedule's retention), since other backups may name them. A running
/// backup is refused: it would write its manifest after this. A failed one may have one
/// (written by a node the controller had given up on), and it goes the same way.
pub async fn delete(st: &AppState, name: &str) -> Result<(), ControllerError> {
    hawser_api::validate_name_up_to(
        "backup",
        name,
        hawser_backup::constants::MAX_BACKUP_NAME_BYTES,
    )?;
    let (rec, version) = get_json::<BackupRecord>(&*st.records.store(), &key(name))
        .await?
        .ok_or_else(|| ControllerError::NotFound {
            kind: "backup",
            name: name.into(),
        })?;
    if rec.backup.state == BackupState::Running {
        return Err(ControllerError::Refused {
            message: format!(
                "backup {name} is running; delete it once it is ready or failed (`hawser \
                 backup show {name}`)"
            ),
        });
    }
    // Any state but running: a backup recorded failed may have written its manifest after
    // all (its node was only cut off), and that manifest must go too, or its blocks would
    // never be pruned. Retired, not dropped: a restore reading it keeps its blocks until it
    // ends (hawser_backup::readers).
    // A failed backup of a target since removed has nothing left to clean.
    let opened = crate::snapshots::backup_targets::open(st, &rec.backup.target).await;
    let had_manifest = match opened {
        Err(ControllerError::NotFound { .. }) if rec.backup.state == BackupState::Failed => false,
        opened => hawser_backup::retire(&opened?.2, name).await.map_err(|e| {
            ControllerError::BackupTarget {
                target: rec.backup.target.clone(),
                reason: e.to_string(),
            }
        })?,
    };
    st.records
        .store()
        .delete(&key(name), Expect::Version(version))
        .await?;
    tracing::info!(backup = name, target = %rec.backup.target, "backup deleted");
    if had_manifest {
        st.backups.want_prune(&rec.backup.target);
    }
    st.events.keep(
        Some(&rec.backup.volume),
        None,
        false,
        "BackupDeleted",
        &format!(
            "backup {name} was deleted from target {}; its blocks go at the next prune",
            rec.backup.target
        ),
    );
    Ok(())
}

/// On the leader, within a second of its start or its taking over and then every `every`:
/// follow the running backups nobody here follows (after this controller started, or took
/// over from another that was following them).
pub async fn run(st: Arc<AppState>, every: Duration) {
    // Due at once: a controller that starts, or takes over, follows the backups it finds
    // running within a second (a backup it does not follow is never recorded ready).
    let mut due = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(every.min(Duration::from_secs(1))).await;
        if matches!(
            st.leadership.role(),
            crate::store::leader::Role::Follower { .. }
        ) {
            due = tokio::time::Instant::now();
            continue;
        }
        if tokio::time::Instant::now() < due {
            continue;
        }
        due = tokio::time::Instant::now() + every;
        let Ok(all) = list(&st, None, None).await else {
            continue;
        };
        for b in all.into_iter().filter(|b| b.state == BackupState::Running) {
            spawn_follow(&st, &b.name);
        }
    }
}
