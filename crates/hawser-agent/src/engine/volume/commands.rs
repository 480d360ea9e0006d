//! Carries out the engine's commands once the lock is released: requests to the local replica
//! (inline or on the I/O pool) and to the remote ones, resync sends under the rate limit,
//! outdates and in-sync marks asked of the controller, and ends of sessions.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hawser_core::{ClientOp, Command, ReplicaFailure, ReplicaIdx, ReplicaResult, SubId};
use hawser_storage::{ring, Replica, ReplicaIoError};

use super::{Handle, VolumeEngine};
use crate::constants::INLINE_IO_MAX_BYTES;
use crate::control::link::OutdateOutcome;
use crate::storage::io_pool;

impl VolumeEngine {
    pub(super) fn dispatch(&self, c: Command, quiet: bool) {
        match c {
            Command::Send {
                replica,
                sub,
                op,
                background,
            } => match (&self.resync_rate, background, self.me.upgrade()) {
                (Some(limit), true, Some(me)) => {
                    let (limit, bytes) = (limit.clone(), op_bytes(&op));
                    let gen = self.current_gen(replica);
                    self.rt.spawn(async move {
                        limit.acquire(bytes).await;
                        me.send_if_current(replica, gen, sub, op);
                    });
                }
                _ => self.send(replica, sub, op, quiet && !background),
            },
            Command::Outdate { replica, failed } => self.outdate(replica, failed),
            Command::MarkInSync { .. } => unreachable!("the keeper holds marks (`drive`)"),
            Command::Disconnect { replica } => self.disconnect(replica),
            Command::Fenced => {
                self.fenced.store(true, Ordering::Release);
                tracing::error!(volume = %self.volume, epoch = self.epoch, "engine fenced by a newer epoch; failing all I/O");
            }
            Command::Complete { .. } => unreachable!("completions are handled under the lock"),
            Command::Corruption {
                replica,
                offset,
                blocks,
                repaired,
            } => {
                let replica = &self.replica_ids[usize::from(replica.0)];
                if repaired {
                    tracing::warn!(
                        volume = %self.volume, replica = %replica, offset, blocks,
                        "blocks failed their checksum; rewritten from another replica"
                    );
                } else {
                    tracing::error!(
                        volume = %self.volume, replica = %replica, offset, blocks,
                        "blocks failed their checksum on every in-sync replica: unrecoverable, \
                         reads of them fail"
                    );
                }
            }
            Command::ScrubDone {
                found_blocks,
                repaired_blocks,
                unrecoverable_blocks,
            } => {
                tracing::info!(
                    volume = %self.volume, found_blocks, repaired_blocks, unrecoverable_blocks,
                    "scrub pass done"
                );
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                *self
                    .scrub_finished_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(now);
            }
        }
    }

    /// Send a resync request that waited for the rate limiter, unless the replica's session
    /// changed meanwhile (`gen`: the session it was meant for). The engine already counted
    /// such a request lost with its session; sent now, a copy's stale data would land on the
    /// new session, possibly after newer writes to the same chunks.
    pub(super) fn send_if_current(&self, replica: ReplicaIdx, gen: u64, sub: SubId, op: ClientOp) {
        let local = matches!(self.handles[usize::from(replica.0)], Handle::Local(_));
        if local {
            // Counted across the check, so a local disconnect waits for it (see `disconnect`).
            self.local_inflight.fetch_add(1, Ordering::AcqRel);
        }
        if self.current_gen(replica) == gen {
            self.send(replica, sub, op, false);
        } else {
            tracing::debug!(volume = %self.volume, sub, "resync send for a closed session dropped");
        }
        if local {
            self.local_inflight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// `quiet`: the engine has no other client request in flight, so a small local request
    /// may run inline (see below) without holding anything else up.
    fn send(&self, replica: ReplicaIdx, sub: SubId, op: ClientOp, quiet: bool) {
        match &self.handles[usize::from(replica.0)] {
            Handle::Local(r) => {
                // Idle engine, small request: do it here. Handing it to an I/O thread and back
                // costs two thread wake-ups, which on a VM exceed a 4k O_DIRECT read or write.
                // Under load (anything local in flight) requests go to the ring or the pool.
                // Never on the ring's completion thread: synchronous I/O waits for the epoch
                // gate, and an epoch change waiting there would wait for this thread.
                if quiet
                    && is_small(&op)
                    && self.local_inflight.load(Ordering::Acquire) == 0
                    && !ring::on_completion_thread()
                {
                    self.local_inflight.fetch_add(1, Ordering::AcqRel);
                    let result = run_local(r, self.epoch, &op);
                    self.local_inflight.fetch_sub(1, Ordering::AcqRel);
                    self.run(|e, out| e.on_reply(sub, result, out));
                    return;
                }
                self.local_inflight.fetch_add(1, Ordering::AcqRel);
                let me = self.me.clone();
                let done = move |result: ReplicaResult| {
                    if let Some(me) = me.upgrade() {
                        me.local_inflight.fetch_sub(1, Ordering::AcqRel);
                        me.run(|e, out| e.on_reply(sub, result, out));
                    }
                };
                start_local(r, self.epoch, op, done);
            }
            Handle::Remote { .. } => match self.client(replica) {
                Some(c) => c.send(sub, &op, quiet),
                None => self.run(|e, out| e.on_reply(sub, Err(ReplicaFailure::Lost), out)),
            },
        }
    }

    /// Ask the controller to take `replica` out of the in-sync set; retry until it answers.
    fn outdate(&self, replica: ReplicaIdx, failed: bool) {
        let Some(me) = self.me.upgrade() else { return };
        let id = self.replica_ids[usize::from(replica.0)].clone();
        self.rt.spawn(async move {
            let reason = format!("engine of epoch {} lost the replica", me.epoch);
            match me
                .controller
                .outdate(&me.volume, &id, me.epoch, &reason, failed)
                .await
            {
                OutdateOutcome::Done => {
                    tracing::warn!(volume = %me.volume, replica = %id, failed, "replica outdated");
                    me.run(|e, out| e.on_outdate_done(replica, out));
                }
                OutdateOutcome::Fenced => me.run(|e, out| e.on_fenced(out)),
                OutdateOutcome::Refused | OutdateOutcome::GaveUp => {
                    tracing::warn!(volume = %me.volume, "engine stopped before outdate")
                }
            }
        });
    }

    /// Ask the controller to make a resynced `replica` in-sync again.
    pub(super) fn mark_in_sync(&self, replica: ReplicaIdx) {
        let Some(me) = self.me.upgrade() else { return };
        let id = self.replica_ids[usize::from(replica.0)].clone();
        self.rt.spawn(async move {
            match me.controller.mark_in_sync(&me.volume, &id, me.epoch).await {
                OutdateOutcome::Done => {
                    tracing::info!(volume = %me.volume, replica = %id, "replica resynced and in-sync");
                    me.run(|e, out| e.on_mark_in_sync_done(replica, true, out));
                }
                OutdateOutcome::Refused => {
                    me.run(|e, out| e.on_mark_in_sync_done(replica, false, out))
                }
                OutdateOutcome::Fenced => me.run(|e, out| e.on_fenced(out)),
                OutdateOutcome::GaveUp => {}
            }
        });
    }

    /// End the session with `replica`; the engine hears `on_replica_lost` once nothing of
    /// that session can still reach the disk through this driver.
    pub(super) fn disconnect(&self, replica: ReplicaIdx) {
        match &self.handles[usize::from(replica.0)] {
            Handle::Remote { .. } => {
                if let Some(c) = self.client(replica) {
                    self.set_client(replica, None);
                    c.close(); // its sink reports the loss
                }
            }
            Handle::Local(_) => {
                // Resync sends still waiting for the rate limiter are dropped from now on.
                self.local_gen.fetch_add(1, Ordering::AcqRel);
                let Some(me) = self.me.upgrade() else { return };
                self.rt.spawn(async move {
                    // Local requests already running finish first, so none lands after a
                    // later resync of the same chunks.
                    while me.local_inflight.load(Ordering::Acquire) > 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    me.run(|e, out| e.on_replica_lost(replica, out));
                });
            }
        }
    }
}

/// Bytes a resync send counts against the rate limit: the copy's write (its read is free,
/// so the limit is the copy rate; so is a copy of zeroes, sent as a WriteZeroes without data).
fn op_bytes(op: &ClientOp) -> u64 {
    match op {
        ClientOp::Write { data, .. } => data.len() as u64,
        _ => 0,
    }
}

/// Requests cheap enough to run inline on an idle engine: small reads and writes, and flushes.
/// A flush is the disk's latency, but on an idle engine nothing else of this volume waits for
/// it, and at queue depth 1 (`fsync` after every write: databases) the two thread wake-ups
/// of the pool were a third of the flush's latency. A slow disk then holds one runtime worker
/// for that flush; the others run everything else.
fn is_small(op: &ClientOp) -> bool {
    match op {
        ClientOp::Read { len, .. } => *len <= INLINE_IO_MAX_BYTES,
        ClientOp::Write { data, .. } => data.len() <= INLINE_IO_MAX_BYTES as usize,
        ClientOp::Flush => true,
        _ => false,
    }
}

/// Start a request on the local replica off the caller's thread: reads and writes on the
/// io_uring (`hawser_storage::ring`); the rest (flushes too: see `replica::server::start`), and
/// what the ring cannot take now, on the I/O pool. `done` runs on the thread that finished it.
fn start_local(
    r: &Arc<Replica>,
    epoch: u64,
    op: ClientOp,
    done: impl FnOnce(ReplicaResult) + Send + 'static,
) {
    let id = r.id().to_owned();
    let failed = move |e| logged_failure(&id, e);
    match op {
        ClientOp::Read { offset, len } => {
            let ring = r.start_read(epoch, offset, len, move |res| {
                done(res.map(Some).map_err(failed));
            });
            if let Err(done) = ring {
                let r = r.clone();
                io_pool::spawn(move || done(r.read(epoch, offset, len)));
            }
        }
        ClientOp::Write { offset, data, fua } => {
            let copy = data.clone();
            let ring = r.start_write(epoch, offset, data, fua, move |res| {
                done(res.map(|()| None).map_err(failed));
            });
            if let Err(done) = ring {
                let r = r.clone();
                io_pool::spawn(move || done(r.write(epoch, offset, &copy, fua)));
            }
        }
        other => {
            let r = r.clone();
            io_pool::spawn(move || done(run_local(&r, epoch, &other)));
        }
    }
}

/// Execute one request on the local replica (blocking).
fn run_local(r: &Replica, epoch: u64, op: &ClientOp) -> ReplicaResult {
    let result = match op {
        ClientOp::Read { offset, len } => r.read(epoch, *offset, *len).map(Some),
        ClientOp::Write { offset, data, fua } => r.write(epoch, *offset, data, *fua).map(|()| None),
        ClientOp::Flush => r.flush(epoch).map(|()| None),
        ClientOp::Trim { offset, len } => r.trim(epoch, *offset, *len).map(|()| None),
        ClientOp::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        } => r
            .write_zeroes(epoch, *offset, *len, *fua, *may_trim)
            .map(|()| None),
    };
    result.map_err(|e| logged_failure(r.id(), e))
}

fn logged_failure(replica: &str, e: ReplicaIoError) -> ReplicaFailure {
    if matches!(e, ReplicaIoError::Io { .. }) {
        tracing::error!(replica, error = %e, "local replica disk error");
    }
    failure_of(e)
}

fn failure_of(e: ReplicaIoError) -> ReplicaFailure {
    match e {
        ReplicaIoError::StaleEpoch { .. } => ReplicaFailure::StaleEpoch,
        ReplicaIoError::NoSpace => ReplicaFailure::NoSpace,
        ReplicaIoError::Corrupt { offset, blocks } => ReplicaFailure::Corrupt {
            first: offset,
            blocks,
        },
        ReplicaIoError::OutOfRange | ReplicaIoError::Io { .. } | ReplicaIoError::Failed => {
            ReplicaFailure::Io
        }
    }
}
