//! Backups on a schedule (docs/backup.md): `hawser backup schedule VOLUME --target T --cron
//! "0 * * * *" --retain 24`. A schedule lives in its volume's record (`backup_schedules`, so
//! on Kubernetes a field of the HawserVolume, which `kubectl edit` can set too), one per
//! target. The leader runs each when due, and applies its retention (`retention.rs`).
//!
//! A run is due when a cron time has passed since `last_run_ms`; running sets `last_run_ms`
//! to now, not to that cron time, so a controller that was down across several cron times
//! runs the schedule once when it is back, not once for each. A run that finds the
//! schedule's previous backup still running is skipped (and says so): backups of one
//! volume never queue up behind a slow target.

use std::sync::Arc;
use std::time::Duration;

use hawser_api::backup::{BackupSchedule, BackupState, CreateBackup, SetBackupSchedule};

use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::{now_ms, VolumeRecord};
use crate::store::records::Records;

/// The most backups one schedule keeps.
pub const MAX_RETAIN: u32 = 10_000;
/// The loop looks at every schedule at least this often, for one set by hand in the store
/// (`kubectl edit hawservolume`), which nothing wakes it for.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Nor more often than this, whatever a cron with seconds says.
const MIN_WAIT: Duration = Duration::from_secs(1);

/// A cron expression, or the error the API gives for it.
pub fn parse(cron: &str) -> Result<croner::Cron, ControllerError> {
    crate::snapshots::cron::parse(cron).map_err(|e| ControllerError::invalid(e.to_string()))
}

pub use crate::snapshots::cron::{due, next_after};

/// `PUT /v1/volumes/{name}/backup-schedules/{target}`: sets the volume's schedule for the
/// target, or replaces it (keeping when it last ran).
pub async fn set(
    st: &AppState,
    volume: &str,
    target: &str,
    req: SetBackupSchedule,
) -> Result<BackupSchedule, ControllerError> {
    hawser_api::validate_name("volume", volume)?;
    check(st, target, &req).await?;
    let (_, set) = st
        .records
        .update_volume(volume, |v| {
            if let Some(s) = &v.standby {
                return Err(ControllerError::restoring(v, &s.label()));
            }
            let last = v.backup_schedules.iter().find(|s| s.target == target);
            let schedule = BackupSchedule {
                target: target.to_owned(),
                cron: req.cron.clone(),
                retain: req.retain,
                last_run_ms: last.and_then(|s| s.last_run_ms).or(Some(now_ms())),
                last_backup: last.and_then(|s| s.last_backup.clone()),
                error: None,
                next_run_ms: None,
            };
            v.backup_schedules.retain(|s| s.target != target);
            v.backup_schedules.push(schedule.clone());
            v.backup_schedules.sort_by(|a, b| a.target.cmp(&b.target));
            Ok(schedule)
        })
        .await?;
    st.backups.schedule_wake.notify_one();
    tracing::info!(volume, target, cron = %set.cron, retain = set.retain, "backup schedule set");
    Ok(crate::snapshots::cron::view(&set))
}

/// Refuses a schedule whose target is not configured, whose cron does not parse, or that
/// would keep no backup.
async fn check(
    st: &AppState,
    target: &str,
    req: &SetBackupSchedule,
) -> Result<(), ControllerError> {
    hawser_api::validate_name("backup target", target)?;
    parse(&req.cron)?;
    if req.retain == 0 || req.retain > MAX_RETAIN {
        return Err(ControllerError::invalid(format!(
            "--retain {}: keep from 1 to {MAX_RETAIN} backups (a schedule that keeps none \
             would delete each backup it makes)",
            req.retain
        )));
    }
    crate::snapshots::backup_targets::target_record(&st.records, target).await?;
    Ok(())
}

/// The schedules a volume is created with (`CreateVolume.backup_schedules`), checked as
/// [`set`] checks one, before anything is created. They start now: the first run is at the
/// first cron time after the create.
pub async fn initial(
    st: &AppState,
    req: &hawser_api::controller::CreateVolume,
) -> Result<Vec<BackupSchedule>, ControllerError> {
    if req.standby_of.is_some() && !req.backup_schedules.is_empty() {
        return Err(ControllerError::invalid(
            "a standby volume cannot have backup schedules: it is a copy of another \
             cluster's backups until it is activated",
        ));
    }
    let mut all: Vec<BackupSchedule> = Vec::new();
    for s in &req.backup_schedules {
        if all.iter().any(|a| a.target == s.target) {
            return Err(ControllerError::invalid(format!(
                "two backup schedules for target {:?}: a volume has one per target",
                s.target
            )));
        }
        let set = SetBackupSchedule {
            cron: s.cron.clone(),
            retain: s.retain,
        };
        // The target is a field of the request here, not a name in its path: invalid.
        check(st, &s.target, &set).await.map_err(|e| match e {
            ControllerError::NotFound { kind, name } => ControllerError::invalid(format!(
                "backup schedule: {kind} {name:?} is not configured here (`hawser backup \
                 target add`)"
            )),
            e => e,
        })?;
        all.push(BackupSchedule {
            target: s.target.clone(),
            cron: set.cron,
            retain: set.retain,
            last_run_ms: Some(now_ms()),
            last_backup: None,
            error: None,
            next_run_ms: None,
        });
    }
    all.sort_by(|a, b| a.target.cmp(&b.target));
    Ok(all)
}

/// `DELETE /v1/volumes/{name}/backup-schedules/{target}`: no more backups on that schedule.
/// The backups it made stay.
pub async fn remove(records: &Records, volume: &str, target: &str) -> Result<(), ControllerError> {
    records
        .update_volume(volume, |v| {
            let before = v.backup_schedules.len();
            v.backup_schedules.retain(|s| s.target != target);
            if v.backup_schedules.len() == before {
                return Err(ControllerError::NotFound {
                    kind: "backup schedule",
                    name: format!("{volume}/{target}"),
                });
            }
            Ok(())
        })
        .await?;
    tracing::info!(volume, target, "backup schedule removed");
    Ok(())
}

/// On the leader: applies the schedules' retention, prunes the targets that retention (or
/// `hawser backup delete`) left blocks on, then runs the schedules that are due. In that
/// order, so that a prune finds the backups of the last runs finished rather than always
/// the new ones started. Sleeps until the next cron time (at most `MAX_WAIT`), or until a
/// schedule is set or a prune asked for.
pub async fn run(st: Arc<AppState>) {
    let mut wait = MIN_WAIT;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = st.backups.schedule_wake.notified() => {}
        }
        wait = MAX_WAIT;
        if matches!(
            st.leadership.role(),
            crate::store::leader::Role::Follower { .. }
        ) {
            continue;
        }
        // With this controller's own writes: a wake comes right after a schedule was set,
        // and the watch-fed copy may not show that yet; read before it did, the schedule
        // waited out MAX_WAIT (e2e backup_schedule, once, under load).
        let Ok(volumes) = st.records.volumes().await else {
            wait = MIN_WAIT * 5;
            continue;
        };
        // Owned: a future that holds borrows of its locals across awaits trips the
        // compiler's Send check of `tokio::spawn` (rust-lang/rust#102211).
        let scheduled: Vec<(VolumeRecord, BackupSchedule)> = volumes
            .iter()
            .filter(|v| !v.backup_schedules.is_empty())
            .flat_map(|v| {
                let all = v.backup_schedules.clone();
                all.into_iter().map(move |s| (v.clone(), s))
            })
            .collect();
        for (v, s) in scheduled.clone() {
            if let Err(e) = crate::snapshots::retention::apply(&st, &v.name, &s).await {
                tracing::warn!(volume = %v.name, target = %s.target, error = %e,
                    "cannot apply a backup schedule's retention");
            }
        }
        crate::snapshots::retention::prune_wanted(&st).await;
        let now = now_ms();
        for (v, s) in scheduled {
            if let Some(next) = step(&st, &v, &s, now).await {
                let ms = next.saturating_sub(now_ms());
                wait = wait.min(Duration::from_millis(ms).max(MIN_WAIT));
            }
        }
    }
}

/// One schedule's turn: run it if due. Returns its next cron time.
async fn step(st: &Arc<AppState>, v: &VolumeRecord, s: &BackupSchedule, now: u64) -> Option<u64> {
    let cron = match parse(&s.cron) {
        Ok(c) => c,
        Err(e) => {
            // Set by hand in the store: said once, in the schedule itself.
            let why = e.to_string();
            if s.error.as_deref() != Some(why.as_str()) {
                record(st, v, s, |x| x.error = Some(why.clone())).await;
            }
            return None;
        }
    };
    let Some(last) = s.last_run_ms else {
        // First seen (set in the store by hand): the first run is at the next cron time.
        record(st, v, s, |x| x.last_run_ms = Some(now)).await;
        return next_after(&cron, now);
    };
    if due(&cron, last, now) {
        let outcome = run_once(st, v, s).await;
        record(st, v, s, |x| {
            x.last_run_ms = Some(now);
            match &outcome {
                Ok(b) => {
                    x.last_backup = Some(b.clone());
                    x.error = None;
                }
                Err(e) => x.error = Some(e.clone()),
            }
        })
        .await;
    }
    next_after(&cron, now)
}

/// Starts the schedule's backup, unless its previous one is still running.
async fn run_once(
    st: &Arc<AppState>,
    v: &VolumeRecord,
    s: &BackupSchedule,
) -> Result<String, String> {
    let running = crate::snapshots::backups::list(st, Some(&v.name), Some(&s.target))
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|b| b.state == BackupState::Running);
    let started = match running {
        Some(b) => Err(format!(
            "the run at {} was skipped: backup {} is still running",
            hawser_api::time::rfc3339(now_ms() / 1000),
            b.name
        )),
        None => crate::snapshots::backups::create_as(
            st,
            CreateBackup {
                volume: v.name.clone(),
                target: s.target.clone(),
                snapshot: None,
            },
            true,
        )
        .await
        .map(|b| b.name)
        .map_err(|e| e.to_string()),
    };
    match &started {
        Ok(b) => tracing::info!(volume = %v.name, target = %s.target, backup = %b,
            "scheduled backup started"),
        Err(why) => {
            tracing::warn!(volume = %v.name, target = %s.target, error = %why,
                "scheduled backup not started");
            st.events.keep(
                Some(&v.name),
                None,
                true,
                "BackupScheduleFailed",
                &format!("scheduled backup to target {}: {why}", s.target),
            );
        }
    }
    started
}

/// Writes `change` into the volume's schedule for the same target, if it is still there.
async fn record(
    st: &AppState,
    v: &VolumeRecord,
    s: &BackupSchedule,
    change: impl Fn(&mut BackupSchedule),
) {
    let done = st
        .records
        .update_volume(&v.name, |rec| {
            if let Some(x) = rec
                .backup_schedules
                .iter_mut()
                .find(|x| x.target == s.target)
            {
                change(x);
            }
            Ok(())
        })
        .await;
    if let Err(e) = done {
        tracing::warn!(volume = %v.name, target = %s.target, error = %e,
            "cannot record a backup schedule's run");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// 2026-11-28 10:15:00 UTC.
    const T: u64 = 1_795_860_900_000;
    const MIN: u64 = 60_000;

    #[test]
    fn cron_times_are_utc_and_bad_ones_say_why() {
        let hourly = parse("0 * * * *").unwrap();
        assert_eq!(next_after(&hourly, T), Some(T + 45 * MIN));
        // Strictly after: a run at a cron time does not make it due again.
        assert_eq!(next_after(&hourly, T + 45 * MIN), Some(T + 105 * MIN));
        let every_5s = parse("*/5 * * * * *").unwrap();
        assert_eq!(next_after(&every_5s, T + 1), Some(T + 5000));
        for bad in ["", "* * *", "61 * * * *", "junk", "* * * * * * * *"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("cron"), "{bad:?}: {e}");
        }
    }

    /// The controller was down for five hours: one run, then the next at its cron time.
    #[test]
    fn missed_runs_are_run_once() {
        let hourly = parse("0 * * * *").unwrap();
        let last = T;
        assert!(!due(&hourly, last, T + 44 * MIN));
        let back = T + 5 * 60 * MIN;
        assert!(due(&hourly, last, back));
        // The run records `back` as its time: not due again until the next hour.
        assert!(!due(&hourly, back, back + MIN));
        assert!(due(&hourly, back, T + 6 * 60 * MIN - 15 * MIN));
    }
}
