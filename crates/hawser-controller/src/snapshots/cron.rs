//! Cron times of backup schedules (`schedules.rs`), apart from the rest so that the volume
//! record's API view (`store::model`) can show a schedule's next run without importing the
//! schedule loop, which imports the store.

use hawser_api::backup::BackupSchedule;

/// A cron expression the schedule cannot run by, with croner's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cron {cron:?}: {why} (give five fields, minute hour day-of-month month day-of-week, in \
     UTC; or six, with seconds first)"
)]
pub struct BadCron {
    pub cron: String,
    pub why: String,
}

/// A cron expression: five fields, or six with seconds first; UTC.
pub fn parse(cron: &str) -> Result<croner::Cron, BadCron> {
    cron.parse::<croner::Cron>().map_err(|e| BadCron {
        cron: cron.to_owned(),
        why: e.to_string(),
    })
}

/// The first cron time after `after_ms` (ms since the Unix epoch), if there is one.
pub fn next_after(cron: &croner::Cron, after_ms: u64) -> Option<u64> {
    let after = chrono::DateTime::from_timestamp_millis(i64::try_from(after_ms).ok()?)?;
    let next = cron.find_next_occurrence(&after, false).ok()?;
    u64::try_from(next.timestamp_millis()).ok()
}

/// Whether a schedule that last ran at `last_ms` is due at `now_ms`: some cron time passed
/// in between (one or many: either way, one run).
pub fn due(cron: &croner::Cron, last_ms: u64, now_ms: u64) -> bool {
    next_after(cron, last_ms).is_some_and(|n| n <= now_ms)
}

/// A schedule as the API shows it: with its next run.
pub fn view(s: &BackupSchedule) -> BackupSchedule {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    };
    let next = parse(&s.cron)
        .ok()
        .and_then(|c| next_after(&c, s.last_run_ms.unwrap_or_else(now)));
    BackupSchedule {
        next_run_ms: next,
        ..s.clone()
    }
}
