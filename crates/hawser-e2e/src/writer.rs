//! The verifying writer: a background thread that writes self-describing 4 KiB blocks at
//! seeded random offsets of an NBD export (up to `queue_depth` in flight, a FLUSH every
//! `flush_every` writes) and records each outcome in a [`WriteLog`] (with when each write was
//! submitted and acknowledged); and the verify step that reads every written block back
//! (through NBD or straight from a replica file) and checks it.
//!
//! The writer measures what a fault test wants to assert from real data: error replies, writes
//! whose outcome is unknown, lost connections, and the longest time without a successful reply
//! (so "I/O continues within N s" is measured, not slept). It survives the connection dropping:
//! what was in flight becomes unknown-outcome, and it reconnects if asked to.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::nbd_client::{NbdConn, NbdTarget};
use crate::run::wait_until;
use crate::write_log::{block_content, GapTracker, Mismatch, WriteLog, BLOCK_BYTES};

/// After `stop`, how long the writer waits for the replies of what it has in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between reconnection attempts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
/// Random picks tried to find a block with no write in flight before sending fewer.
const FREE_BLOCK_TRIES: u32 = 16;

#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// Seeds the offsets and the block contents; printed so a failure can be replayed.
    pub seed: u64,
    /// The writer writes into the first `blocks` 4 KiB blocks of the export.
    pub blocks: u64,
    pub queue_depth: usize,
    /// A FLUSH after this many writes (at most one FLUSH in flight).
    pub flush_every: u32,
    /// After losing the connection, reconnect until stopped (else the writer ends).
    pub reconnect: bool,
}

impl Default for WriterOptions {
    fn default() -> WriterOptions {
        WriterOptions {
            seed: 1,
            // 16 MiB: small enough that blocks are overwritten many times (so a lost write
            // shows as an older one) and that the replica files stay cheap to delete.
            blocks: 4096,
            queue_depth: 8,
            flush_every: 64,
            reconnect: false,
        }
    }
}

/// What the writer saw so far.
#[derive(Clone, Debug, Default)]
pub struct WriterStats {
    pub acked_writes: u64,
    pub acked_flushes: u64,
    /// Error replies to writes and flushes.
    pub errors: u64,
    /// Writes that got an error reply or whose connection was lost before the reply.
    pub unknown_writes: u64,
    /// Connections that ended other than by the writer's own DISC.
    pub disconnects: u64,
    pub connects: u64,
    pub connect_failures: u64,
    pub first_error: Option<String>,
    /// The longest time without a successful reply (write or flush), including one still open.
    pub longest_gap: Duration,
    /// When that gap ended, since the writer started.
    pub longest_gap_ended_at: Duration,
    pub elapsed: Duration,
    /// Whether the writer thread has ended (stopped, or lost its connection without reconnect).
    pub ended: bool,
}

struct Shared {
    log: WriteLog,
    stats: WriterStats,
    gaps: GapTracker,
    started: Instant,
}

impl Shared {
    fn error(&mut self, what: String) {
        self.stats.first_error.get_or_insert(what);
    }
}

/// A running verifying writer. `stop` ends it and hands back its log; dropping it only asks
/// the thread to stop (it ends when its connection does).
pub struct Writer {
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub fn start(target: NbdTarget, opts: WriterOptions) -> Writer {
        let now = Instant::now();
        let shared = Arc::new(Mutex::new(Shared {
            log: WriteLog::new(opts.seed),
            stats: WriterStats::default(),
            gaps: GapTracker::new(now),
            started: now,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (shared.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("verifying-writer".into())
            .spawn(move || run(&target, &opts, &s, &st))
            .expect("spawn the writer thread");
        Writer {
            stop,
            shared,
            thread: Some(thread),
        }
    }

    pub fn stats(&self) -> WriterStats {
        snapshot(&lock(&self.shared))
    }

    /// Wait until `more` writes beyond those acknowledged now are acknowledged; panics after
    /// `timeout` or if the writer ends first. Returns the stats then.
    pub fn wait_acks(&self, more: u64, timeout: Duration) -> WriterStats {
        let want = self.stats().acked_writes + more;
        wait_until(&format!("{want} acknowledged writes"), timeout, || {
            let s = self.stats();
            assert!(
                !s.ended || s.acked_writes >= want,
                "the writer ended early: {s:?}"
            );
            s.acked_writes >= want
        });
        self.stats()
    }

    /// Stop writing, wait for what is in flight (bounded), disconnect; the log and final stats.
    pub fn stop(mut self) -> (WriteLog, WriterStats) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("writer thread panicked");
        }
        let shared = lock(&self.shared);
        (shared.log.clone(), snapshot(&shared))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

fn snapshot(s: &Shared) -> WriterStats {
    let now = Instant::now();
    let (gap, ended_at) = if s.stats.ended {
        (s.stats.longest_gap, s.stats.longest_gap_ended_at)
    } else {
        s.gaps.longest(now)
    };
    WriterStats {
        longest_gap: gap,
        longest_gap_ended_at: ended_at,
        elapsed: now.saturating_duration_since(s.started),
        ..s.stats.clone()
    }
}

fn run(target: &NbdTarget, opts: &WriterOptions, shared: &Mutex<Shared>, stop: &AtomicBool) {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    while !stop.load(Ordering::Acquire) {
        match NbdConn::connect(target) {
            Ok(conn) => {
                lock(shared).stats.connects += 1;
                match Session::new(conn, opts, shared, stop).run(&mut rng) {
                    Ok(()) => break,
                    Err(e) => {
                        let mut s = lock(shared);
                        s.stats.disconnects += 1;
                        s.error(format!("connection lost: {e}"));
                    }
                }
            }
            Err(e) => {
                let mut s = lock(shared);
                s.stats.connect_failures += 1;
                s.error(format!("connect to {}: {e}", target.socket.display()));
            }
        }
        if !opts.reconnect {
            break;
        }
        std::thread::sleep(RECONNECT_PAUSE);
    }
    let mut s = lock(shared);
    let (gap, ended_at) = s.gaps.longest(Instant::now());
    s.stats.longest_gap = gap;
    s.stats.longest_gap_ended_at = ended_at;
    s.stats.ended = true;
}

#[derive(Clone, Copy)]
enum Pending {
    Write { block: u64, seq: u64 },
    Flush,
}

/// One connection's worth of writing.
struct Session<'a> {
    conn: NbdConn,
    opts: &'a WriterOptions,
    shared: &'a Mutex<Shared>,
    stop: &'a AtomicBool,
    in_flight: HashMap<u64, Pending>,
    next_handle: u64,
    since_flush: u32,
}

impl<'a> Session<'a> {
    fn new(
        conn: NbdConn,
        opts: &'a WriterOptions,
        shared: &'a Mutex<Shared>,
        stop: &'a AtomicBool,
    ) -> Session<'a> {
        Session {
            conn,
            opts,
            shared,
            stop,
            in_flight: HashMap::new(),
            next_handle: 1,
            since_flush: 0,
        }
    }

    /// Write until stopped; `Ok` after a clean drain and DISC. On any error, what was in
    /// flight is recorded as unknown-outcome.
    fn run(mut self, rng: &mut StdRng) -> io::Result<()> {
        let result = self.pump(rng);
        let mut s = lock(self.shared);
        for p in self.in_flight.values() {
            if let Pending::Write { block, seq } = *p {
                s.log.unknown(block, seq);
                s.stats.unknown_writes += 1;
            }
        }
        drop(s);
        if result.is_ok() {
            self.conn.disconnect();
        }
        result
    }

    fn pump(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let end = self.opts.blocks * BLOCK_BYTES as u64;
        if end > self.conn.size {
            let msg = format!(
                "{} blocks exceed the export ({} bytes)",
                self.opts.blocks, self.conn.size
            );
            return Err(io::Error::other(msg));
        }
        let mut stop_seen: Option<Instant> = None;
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            if !stopping {
                self.fill(rng)?;
            }
            if self.in_flight.is_empty() {
                return Ok(());
            }
            let stop = self.stop;
            let mut give_up = || {
                stop.load(Ordering::Acquire)
                    && stop_seen.get_or_insert_with(Instant::now).elapsed() > DRAIN_TIMEOUT
            };
            let reply = self.conn.read_reply(&mut give_up)?;
            let pending = self.in_flight.remove(&reply.handle).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "reply to an unknown handle")
            })?;
            self.settle(pending, reply.error);
        }
    }

    /// Send requests until `queue_depth` are in flight (fewer if random picks hit busy blocks).
    fn fill(&mut self, rng: &mut StdRng) -> io::Result<()> {
        while self.in_flight.len() < self.opts.queue_depth {
            let handle = self.next_handle;
            self.next_handle += 1;
            let flush_in_flight = self.in_flight.values().any(|p| matches!(p, Pending::Flush));
            if self.since_flush >= self.opts.flush_every && !flush_in_flight {
                self.since_flush = 0;
                self.in_flight.insert(handle, Pending::Flush);
                self.conn.send_flush(handle)?;
                continue;
            }
            let Some((block, seq)) = self.begin_free_block(rng) else {
                return Ok(());
            };
            self.since_flush += 1;
            self.in_flight.insert(handle, Pending::Write { block, seq });
            let data = block_content(self.opts.seed, block, seq);
            self.conn
                .send_write(handle, block * BLOCK_BYTES as u64, &data)?;
        }
        Ok(())
    }

    /// A block with no write in flight and the write's sequence number, its submit time taken
    /// now, before the request is sent.
    fn begin_free_block(&mut self, rng: &mut StdRng) -> Option<(u64, u64)> {
        let mut s = lock(self.shared);
        (0..FREE_BLOCK_TRIES).find_map(|_| {
            let block = rng.random_range(0..self.opts.blocks);
            s.log.begin(block).map(|seq| (block, seq))
        })
    }

    fn settle(&mut self, pending: Pending, error: u32) {
        // After the reply was read: the server finished the request before this.
        let now = Instant::now();
        let mut s = lock(self.shared);
        match (pending, error) {
            (Pending::Write { block, seq }, 0) => {
                s.log.acked_at(block, seq, now);
                s.stats.acked_writes += 1;
                s.gaps.ack(now);
            }
            (Pending::Write { block, seq }, e) => {
                s.log.unknown(block, seq);
                s.stats.errors += 1;
                s.stats.unknown_writes += 1;
                s.error(format!("write to block {block} failed: NBD error {e}"));
            }
            (Pending::Flush, 0) => {
                s.stats.acked_flushes += 1;
                s.gaps.ack(now);
            }
            (Pending::Flush, e) => {
                s.stats.errors += 1;
                s.error(format!("flush failed: NBD error {e}"));
            }
        }
    }
}

/// The outcome of checking a write log against a volume or a replica file.
#[derive(Debug)]
pub struct VerifyReport {
    /// What was read (an NBD URI or a file path).
    pub source: String,
    pub checked: u64,
    pub mismatches: Vec<Mismatch>,
}

impl VerifyReport {
    /// Panic with the first mismatches, if any.
    pub fn assert_ok(&self) {
        if self.mismatches.is_empty() {
            return;
        }
        let lines: Vec<String> = self
            .mismatches
            .iter()
            .take(20)
            .map(|m| m.to_string())
            .collect();
        panic!(
            "{} of {} blocks of {} are wrong (acknowledged writes lost?):\n{}",
            self.mismatches.len(),
            self.checked,
            self.source,
            lines.join("\n")
        );
    }
}

/// Read every block the log wrote through a new NBD connection and check it.
pub fn verify_nbd(target: &NbdTarget, log: &WriteLog) -> io::Result<VerifyReport> {
    let mut conn = NbdConn::connect(target)?;
    let source = format!(
        "nbd+unix:///{}?socket={}",
        target.export,
        target.socket.display()
    );
    let report = verify_with(log, source, |offset, buf| conn.read_at(offset, buf))?;
    conn.disconnect();
    Ok(report)
}

/// Check a replica's data file directly (the volume's bytes at their own offsets).
pub fn verify_file(path: &Path, log: &WriteLog) -> io::Result<VerifyReport> {
    let file = std::fs::File::open(path)?;
    let source = path.display().to_string();
    verify_with(log, source, |offset, buf| file.read_exact_at(buf, offset))
}

fn verify_with(
    log: &WriteLog,
    source: String,
    mut read_at: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<VerifyReport> {
    let mut buf = vec![0u8; BLOCK_BYTES];
    let mut report = VerifyReport {
        source,
        checked: 0,
        mismatches: Vec::new(),
    };
    for block in log.blocks() {
        read_at(block * BLOCK_BYTES as u64, &mut buf)?;
        report.checked += 1;
        if let Err(m) = log.check(block, &buf) {
            report.mismatches.push(m);
        }
    }
    Ok(report)
}
