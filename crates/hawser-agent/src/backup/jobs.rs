//! The backup jobs of this node, and their two admin routes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use hawser_api::backup::{BackupJob, BackupStats, JobState, StartBackupJob, StartRestoreJob};
use hawser_api::{ApiError, ErrorCode};
use hawser_backup::{BackupPlan, Before, Chunk, Dest, Progress, S3Credentials, Target};

use crate::constants::{MAX_BACKUP_JOBS, MAX_FINISHED_BACKUP_JOBS};
use crate::control::admin_api::{AdminState, Failure};

/// One job: its progress while it runs, then its result.
struct Job {
    progress: Arc<Progress>,
    result: Mutex<Option<Result<BackupStats, String>>>,
    /// Order of finishing, to drop the oldest finished jobs first.
    finished: Mutex<Option<u64>>,
}

/// Every job this agent has run since it started (the finished ones bounded).
#[derive(Default)]
pub struct BackupJobs {
    jobs: Mutex<BTreeMap<String, Arc<Job>>>,
    finishes: std::sync::atomic::AtomicU64,
}

impl BackupJobs {
    fn view(backup: &str, job: &Job) -> BackupJob {
        let result = job.result.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (state, stats, error) = match result {
            None => (JobState::Running, None, None),
            Some(Ok(stats)) => (JobState::Done, Some(stats), None),
            Some(Err(e)) => (JobState::Failed, None, Some(e)),
        };
        BackupJob {
            backup: backup.to_owned(),
            state,
            progress: job.progress.view(),
            stats,
            error,
        }
    }

    fn get(&self, backup: &str) -> Option<BackupJob> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.get(backup).map(|j| Self::view(backup, j))
    }

    /// Registers a new job, or returns the one of that name (a retried start) unless it
    /// failed: a failed job is started again. Refuses past `MAX_BACKUP_JOBS` running, and
    /// drops the oldest finished ones past their bound.
    fn admit(&self, backup: &str, total: u64) -> Result<(Arc<Job>, bool), ApiError> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(j) = jobs.get(backup) {
            let failed = matches!(
                *j.result.lock().unwrap_or_else(|p| p.into_inner()),
                Some(Err(_))
            );
            if !failed {
                return Ok((j.clone(), false));
            }
            jobs.remove(backup);
        }
        let running = jobs
            .values()
            .filter(|j| j.finished.lock().is_ok_and(|f| f.is_none()));
        if running.count() >= MAX_BACKUP_JOBS {
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                format!("{MAX_BACKUP_JOBS} backups are running on this node; retry later"),
            ));
        }
        let mut done: Vec<(u64, String)> = jobs
            .iter()
            .filter_map(|(k, j)| {
                j.finished
                    .lock()
                    .ok()
                    .and_then(|f| *f)
                    .map(|n| (n, k.clone()))
            })
            .collect();
        done.sort();
        let excess = done.len().saturating_sub(MAX_FINISHED_BACKUP_JOBS - 1);
        for (_, k) in done.into_iter().take(excess) {
            jobs.remove(&k);
        }
        let job = Arc::new(Job {
            progress: Arc::new(Progress::new(total)),
            result: Mutex::new(None),
            finished: Mutex::new(None),
        });
        jobs.insert(backup.to_owned(), job.clone());
        Ok((job, true))
    }

    fn finish(&self, job: &Job, result: Result<BackupStats, String>) {
        *job.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        let n = self
            .finishes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *job.finished.lock().unwrap_or_else(|p| p.into_inner()) = Some(n);
    }
}

fn bad(message: String) -> Failure {
    Failure(ApiError::invalid(message))
}

/// `POST /v1/backup-jobs`: starts backing up a replica's snapshot; 202 with the job, or 200
/// with the job of that name if it was started before.
pub async fn start_job(
    State(s): State<AdminState>,
    Json(req): Json<StartBackupJob>,
) -> Result<(StatusCode, Json<BackupJob>), Failure> {
    let replica = s
        .storage
        .replica(&req.replica)
        .ok_or_else(|| Failure(ApiError::not_found("replica", &req.replica)))?;
    let file = replica
        .snapshot_file(&req.snapshot)
        .map_err(|e| Failure(ApiError::new(ErrorCode::NotFound, e.to_string())))?;
    let retry_secs = req
        .retry_secs
        .unwrap_or(hawser_backup::constants::RETRY_TIMEOUT_SECS);
    let target = open_target(&req.target, &req.spec, req.credentials.as_ref(), retry_secs)?;
    let (job, new) = s
        .backups
        .admit(&req.backup, req.size_bytes)
        .map_err(Failure)?;
    if !new {
        return Ok((StatusCode::OK, Json(BackupJobs::view(&req.backup, &job))));
    }
    let jobs = s.backups.clone();
    let backup = req.backup.clone();
    let view = BackupJobs::view(&backup, &job);
    tracing::info!(backup, volume = %req.volume, replica = %req.replica, target = %req.target,
        "backup started");
    tokio::spawn(async move {
        let result = run(&target, &file, req, job.progress.clone()).await;
        match &result {
            Ok(st) => tracing::info!(
                backup,
                stored = st.stored_bytes,
                new = st.new_blocks,
                reused = st.reused_blocks,
                found = st.found_blocks,
                retries = st.retries,
                micros = st.micros,
                "backup done"
            ),
            Err(e) => tracing::warn!(backup, error = %e, "backup failed"),
        }
        jobs.finish(&job, result);
    });
    Ok((StatusCode::ACCEPTED, Json(view)))
}

async fn run(
    target: &Target,
    file: &std::path::Path,
    req: StartBackupJob,
    progress: Arc<Progress>,
) -> Result<BackupStats, String> {
    // From the first request (the previous manifest's), so retries show while they happen.
    target.report_to(&progress);
    let previous = match &req.previous {
        Some(p) => match hawser_backup::read_manifest(target, p).await {
            Ok(m) if m.volume == req.volume => Some(m),
            Ok(_) => None,
            // A previous backup that went away (pruned by hand): send everything anew.
            Err(hawser_backup::BackupError::NotFound { .. }) => None,
            Err(e) => return Err(e.to_string()),
        },
        None => None,
    };
    let plan = BackupPlan {
        backup: req.backup,
        volume: req.volume,
        cluster: req.cluster,
        snapshot: Some(req.snapshot),
        taken_ms: req.taken_ms,
        size_bytes: req.size_bytes,
        block_bytes: hawser_backup::constants::DEFAULT_BLOCK_BYTES,
        encryption: req.encryption,
        previous,
        bytes_per_sec: req.bytes_per_sec,
    };
    hawser_backup::back_up(target, file, plan, progress)
        .await
        .map(|m| m.stats)
        .map_err(|e| e.to_string())
}

fn open_target(
    name: &str,
    spec: &hawser_api::backup::TargetSpec,
    key: Option<&hawser_api::backup::S3Key>,
    retry_secs: u64,
) -> Result<Target, Failure> {
    let credentials = match key {
        Some(k) => Some(
            S3Credentials::from_api(k)
                .ok_or_else(|| bad("the S3 secret is not base64 of UTF-8 text".into()))?,
        ),
        None => None,
    };
    Target::open_with(name, spec, credentials.as_ref(), retry_secs).map_err(|e| bad(e.to_string()))
}

/// `POST /v1/restore-jobs`: fills a blank replica of this node from a backup, or brings a
/// standby's replica from the backup it holds (`base`) to the next, through the replica's
/// own writes (so its checksums and allocation follow), every block checked against its
/// hash first. Refused for a replica whose size or key check is not the backup's.
pub async fn start_restore(
    State(s): State<AdminState>,
    Json(req): Json<StartRestoreJob>,
) -> Result<(StatusCode, Json<BackupJob>), Failure> {
    let replica = s
        .storage
        .replica(&req.replica)
        .ok_or_else(|| Failure(ApiError::not_found("replica", &req.replica)))?;
    let retry_secs = hawser_backup::constants::RETRY_TIMEOUT_SECS;
    let target = open_target(&req.target, &req.spec, req.credentials.as_ref(), retry_secs)?;
    let name = req.job();
    let (job, new) = s.backups.admit(&name, replica.size()).map_err(Failure)?;
    let view = BackupJobs::view(&name, &job);
    if !new {
        return Ok((StatusCode::OK, Json(view)));
    }
    let jobs = s.backups.clone();
    tracing::info!(replica = %req.replica, backup = %req.backup, target = %req.target,
        "restore from a backup started");
    tokio::spawn(async move {
        let result = restore(&target, replica, &req, job.progress.clone()).await;
        match &result {
            Ok(_) => tracing::info!(replica = %req.replica, backup = %req.backup, "restore done"),
            Err(e) => tracing::warn!(replica = %req.replica, backup = %req.backup, error = %e,
                "restore failed"),
        }
        jobs.finish(&job, result);
    });
    Ok((StatusCode::ACCEPTED, Json(view)))
}

async fn restore(
    target: &Target,
    replica: Arc<hawser_storage::Replica>,
    req: &StartRestoreJob,
    progress: Arc<Progress>,
) -> Result<BackupStats, String> {
    // Live or retired: a backup deleted after its restore began is still held for it
    // (hawser_backup::readers), and a job re-run after a restart must find it too.
    let m = hawser_backup::read_held_manifest(target, &req.backup)
        .await
        .map_err(|e| e.to_string())?;
    if m.size_bytes > replica.size() {
        return Err(format!(
            "backup {} is of {} bytes; replica {} has {}",
            m.backup,
            m.size_bytes,
            req.replica,
            replica.size()
        ));
    }
    let mine = replica.key_check().map(|c| hawser_api::KeyCheck(c).hex());
    let theirs = m.encryption.as_ref().map(|k| k.check.clone());
    if mine != theirs {
        return Err(format!(
            "backup {} holds data under key check {theirs:?}, replica {} expects {mine:?}",
            m.backup, req.replica
        ));
    }
    // The backup a standby's replica holds. One gone from the target (pruned) leaves the
    // replica's content unknown: every block is written, zeros too.
    let base = match &req.base {
        Some(b) => match hawser_backup::read_held_manifest(target, b).await {
            Ok(base) => Some(base),
            Err(hawser_backup::BackupError::NotFound { .. }) => None,
            Err(e) => return Err(e.to_string()),
        },
        None => None,
    };
    let before = match (&req.base, &base) {
        // Parts of a vanished backup over an older one: nothing is known.
        _ if req.base_unknown => Before::Unknown,
        (_, Some(b)) => Before::Backup(b),
        (Some(_), None) => Before::Unknown,
        (None, None) => Before::Blank,
    };
    let epoch = replica.epoch();
    let r = replica.clone();
    let write: hawser_backup::restore::BlockSink = Arc::new(move |at, chunk| {
        let done = match chunk {
            Chunk::Data(data) => r.write(epoch, at, data, false),
            Chunk::Zeros(len) => {
                let len = u32::try_from(len).map_err(std::io::Error::other)?;
                r.write_zeroes(epoch, at, len, false, true)
            }
        };
        done.map_err(|e| std::io::Error::other(format!("{e:?}")))
    });
    let dest = Dest::Sink {
        name: &req.replica,
        write,
    };
    hawser_backup::restore_over(target, &m, before, dest, progress, req.bytes_per_sec)
        .await
        .map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || replica.flush(epoch))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("flush replica {}: {e:?}", req.replica))?;
    Ok(BackupStats {
        read_bytes: m.size_bytes,
        ..Default::default()
    })
}

/// `GET /v1/backup-jobs/{backup}`.
pub async fn get_job(
    State(s): State<AdminState>,
    Path(backup): Path<String>,
) -> Result<Json<BackupJob>, Failure> {
    s.backups
        .get(&backup)
        .map(Json)
        .ok_or_else(|| Failure(ApiError::not_found("backup job", &backup)))
}
