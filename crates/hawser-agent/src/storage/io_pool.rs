//! A fixed pool of threads for blocking disk I/O on the data path. `spawn_blocking` would grow
//! to one thread per request in flight (128+ at QD128), and on a small node the context
//! switches between them cost more than the I/O; a fixed pool (nbdkit uses 16 too) keeps the
//! disk busy with a bounded number of threads. Jobs are bounded upstream by the in-flight
//! limits of the NBD frontend, the engine and the replica server.
//!
//! The queue is a mutex and a condition variable. An idle thread sleeps in the kernel at once:
//! crossbeam's channel, used before, spun before it slept, and callgrind counted that spinning
//! at 1,500 instructions per 4k request on each agent.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};

use crate::constants::IO_THREADS;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct Queue {
    jobs: Mutex<State>,
    ready: Condvar,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Threads waiting on `ready`: a push wakes one only if there is one to wake.
    idle: usize,
    /// Threads running; 0 if none could start.
    threads: usize,
}

static POOL: OnceLock<Queue> = OnceLock::new();

fn queue() -> &'static Queue {
    POOL.get_or_init(|| {
        let q = Queue::default();
        q.lock().threads = IO_THREADS;
        q
    })
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A job never runs under the lock, so a panic cannot leave the queue half-changed.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn work(&'static self) {
        let mut state = self.lock();
        loop {
            match state.jobs.pop_front() {
                Some(job) => {
                    drop(state);
                    job();
                    state = self.lock();
                }
                None => {
                    state.idle += 1;
                    state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
                    state.idle -= 1;
                }
            }
        }
    }
}

fn start_threads(q: &'static Queue) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let mut started = 0;
        for i in 0..IO_THREADS {
            let spawned = std::thread::Builder::new()
                .name(format!("hawser-io-{i}"))
                .spawn(move || q.work());
            match spawned {
                Ok(_) => started += 1,
                Err(e) => tracing::error!(error = %e, "cannot start an I/O thread"),
            }
        }
        q.lock().threads = started;
    });
}

/// Run `f` on the I/O pool.
pub fn spawn(f: impl FnOnce() + Send + 'static) {
    let q = queue();
    start_threads(q);
    let mut state = q.lock();
    if state.threads == 0 {
        // Only if every pool thread failed to start: run inline rather than drop the job.
        drop(state);
        f();
        return;
    }
    state.jobs.push_back(Box::new(f));
    let wake = state.idle > 0;
    drop(state);
    if wake {
        q.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn every_job_runs_and_many_run_at_once() {
        // IO_THREADS jobs that each wait for all the others to start: they finish only if
        // the pool runs them all at the same time.
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(IO_THREADS));
        let (tx, rx) = mpsc::channel();
        for i in 0..IO_THREADS {
            let (barrier, tx) = (barrier.clone(), tx.clone());
            spawn(move || {
                barrier.wait();
                tx.send(i).expect("the test waits");
            });
        }
        let mut got: Vec<usize> = (0..IO_THREADS)
            .map(|_| {
                rx.recv_timeout(std::time::Duration::from_secs(30))
                    .expect("a job ran")
            })
            .collect();
        got.sort_unstable();
        assert_eq!(got, (0..IO_THREADS).collect::<Vec<_>>());
        // And later jobs still run once the threads have gone idle.
        let (tx, rx) = mpsc::channel();
        for i in 0..100 {
            let tx = tx.clone();
            spawn(move || tx.send(i).expect("the test waits"));
        }
        let mut got: Vec<i32> = (0..100)
            .map(|_| {
                rx.recv_timeout(std::time::Duration::from_secs(30))
                    .expect("a job ran")
            })
            .collect();
        got.sort_unstable();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
    }
}
