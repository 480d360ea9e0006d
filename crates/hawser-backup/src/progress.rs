//! A running backup's or restore's progress, read while it runs (`hawser backup show`,
//! metrics), and the rate limit that keeps it from slowing the volume.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counters that the job bumps and anyone may read.
#[derive(Debug)]
pub struct Progress {
    started: Instant,
    total: AtomicU64,
    done: AtomicU64,
    sent: AtomicU64,
    /// Requests to the target retried so far (bumped by the target as they happen).
    retries: AtomicU64,
}

pub use hawser_api::backup::ProgressView;

impl Progress {
    pub fn new(total: u64) -> Progress {
        Progress {
            started: Instant::now(),
            total: AtomicU64::new(total),
            done: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        }
    }

    pub(crate) fn advance(&self, bytes: u64, transferred: u64) {
        self.done.fetch_add(bytes, Relaxed);
        self.sent.fetch_add(transferred, Relaxed);
    }

    /// A request to the target is being retried.
    pub(crate) fn retried(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    pub fn view(&self) -> ProgressView {
        let (total, done) = (self.total.load(Relaxed), self.done.load(Relaxed));
        let millis = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let rate = done.saturating_mul(1000).checked_div(millis).unwrap_or(0);
        ProgressView {
            total_bytes: total,
            done_bytes: done,
            transferred_bytes: self.sent.load(Relaxed),
            bytes_per_sec: rate,
            eta_secs: (rate > 0).then(|| total.saturating_sub(done) / rate),
            retries: self.retries.load(Relaxed),
        }
    }
}

/// Paces a job to `bytes_per_sec` of the volume, averaged from its start; unlimited at 0.
#[derive(Debug)]
pub struct Pacer {
    bytes_per_sec: u64,
    start: tokio::time::Instant,
    taken: Mutex<u64>,
}

impl Pacer {
    pub fn new(bytes_per_sec: u64) -> Pacer {
        Pacer {
            bytes_per_sec,
            start: tokio::time::Instant::now(),
            taken: Mutex::new(0),
        }
    }

    /// Waits until `bytes` more fit the rate.
    pub async fn take(&self, bytes: u64) {
        if self.bytes_per_sec == 0 {
            return;
        }
        let due = {
            let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
            *taken += bytes;
            Duration::from_secs_f64(*taken as f64 / self.bytes_per_sec as f64)
        };
        let now = self.start.elapsed();
        if due > now {
            tokio::time::sleep(due - now).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_pacer_holds_the_rate() {
        let p = Pacer::new(1 << 20);
        let t = tokio::time::Instant::now();
        for _ in 0..4 {
            p.take(1 << 20).await;
        }
        // Four MiB at one MiB/s: the last take returns at 4 s (a paused clock is exact).
        let took = t.elapsed();
        assert!(
            took >= Duration::from_secs(4) && took < Duration::from_millis(4100),
            "{took:?}"
        );
    }

    #[test]
    fn progress_reads_back() {
        let p = Progress::new(100);
        p.advance(40, 10);
        let v = p.view();
        assert_eq!(
            (v.total_bytes, v.done_bytes, v.transferred_bytes),
            (100, 40, 10)
        );
    }
}
