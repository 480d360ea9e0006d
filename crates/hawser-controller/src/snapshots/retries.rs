//! When the leader tries a failed job of the cluster again (a restore from a backup), and
//! whether its failure is news: a backoff per job, doubling from [`FIRST`] to [`MOST`].
//! Kept in memory: a new leader tries every job at once, which is what a restart is for.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The wait after a job's first failure.
const FIRST: Duration = Duration::from_secs(5);
/// The longest wait between two tries (a corrupt block fails every try; a target that is
/// down for an hour is tried 12 times an hour).
const MOST: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Failure {
    why: String,
    tries: u32,
    next: Instant,
}

/// The failing jobs, by name.
#[derive(Debug, Default)]
pub struct Retries {
    failing: Mutex<HashMap<String, Failure>>,
}

impl Retries {
    /// Whether `job` may be tried now: it has not failed, or its wait is over.
    pub fn due(&self, job: &str) -> bool {
        self.failing
            .lock()
            .map(|f| f.get(job).is_none_or(|x| Instant::now() >= x.next))
            .unwrap_or(true)
    }

    /// Records that `job` failed for `why`: whether the reason is new (worth an event), and
    /// how long until its next try.
    pub fn failed(&self, job: &str, why: &str) -> (bool, Duration) {
        let Ok(mut failing) = self.failing.lock() else {
            return (true, FIRST);
        };
        let f = failing.entry(job.to_owned()).or_insert(Failure {
            why: String::new(),
            tries: 0,
            next: Instant::now(),
        });
        let fresh = f.why != why;
        f.why = why.to_owned();
        let wait = FIRST.saturating_mul(1 << f.tries.min(16)).min(MOST);
        f.tries = f.tries.saturating_add(1);
        f.next = Instant::now() + wait;
        (fresh, wait)
    }

    /// Forgets `job`'s failures: it went on, or ended.
    pub fn clear(&self, job: &str) {
        if let Ok(mut f) = self.failing.lock() {
            f.remove(job);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_job_waits_longer_each_time_and_only_a_new_reason_is_news() {
        let r = Retries::default();
        assert!(r.due("v"));
        assert_eq!(r.failed("v", "target down"), (true, FIRST));
        assert!(!r.due("v"), "tried again before its wait");
        assert_eq!(r.failed("v", "target down"), (false, FIRST * 2));
        assert_eq!(r.failed("v", "block 3 corrupt"), (true, FIRST * 4));
        for _ in 0..20 {
            r.failed("v", "block 3 corrupt");
        }
        assert_eq!(r.failed("v", "block 3 corrupt").1, MOST);
        assert!(r.due("w"), "another job is not held back");
        r.clear("v");
        assert!(r.due("v"));
        assert!(
            r.failed("v", "block 3 corrupt").0,
            "after a clear, a failure is news"
        );
    }
}
