//! A fixed pool of threads for blocking disk I/O on the data path. `spawn_blocking` would grow
//! to one thread per request in flight (128+ at QD128), and on a small node the context
//! switches between them cost more than the I/O; a fixed pool (nbdkit uses 16 too) keeps the
//! disk busy with a bounded number of threads. Jobs are bounded upstream by the in-flight
//! limits of the NBD frontend, the engine and the replica server.

use std::sync::OnceLock;

use crate::constants::IO_THREADS;

type Job = Box<dyn FnOnce() + Send + 'static>;

static POOL: OnceLock<crossbeam_channel::Sender<Job>> = OnceLock::new();

fn sender() -> &'static crossbeam_channel::Sender<Job> {
    POOL.get_or_init(|| {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..IO_THREADS {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("hawser-io-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start an I/O thread");
            }
        }
        tx
    })
}

/// Run `f` on the I/O pool.
pub fn spawn(f: impl FnOnce() + Send + 'static) {
    if let Err(e) = sender().send(Box::new(f)) {
        // Only if every pool thread failed to start: run inline rather than drop the job.
        (e.into_inner())();
    }
}
