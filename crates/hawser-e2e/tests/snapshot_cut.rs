//! Issue 20, acceptance b: a snapshot taken while writes with verification run at queue depth
//! 32 matches, byte for byte, the volume at one point between two acknowledged writes.
//!
//! The verifying writer (`writer.rs`) keeps 32 self-describing 4 KiB writes in flight on an
//! attached 2-replica volume and logs when each write was submitted and acknowledged. Several
//! snapshots are taken through the CLI mid-run. For each, the copies on both replicas must be
//! identical, and every block of them is decoded and checked against the log
//! (`WriteLog::check_cut`): there must be a moment after every write the snapshot holds was
//! submitted and before every later write to those blocks was acknowledged; every write
//! acknowledged before the CLI call must be in it, none submitted after the call returned, and
//! nothing the writer never wrote. The volume as it is at the end must fail the same check (the
//! checker is not vacuous on real data). Then the live volume verifies against the whole log:
//! the pauses lost no acknowledged write.
//!
//! No fio job runs: fio's verification cannot say which of its writes a snapshot must hold
//! and which it must not. The writer is our fio with a log, which can.

use std::time::{Duration, Instant};

use hawser_api::controller::SnapshotState;
use hawser_e2e::write_log::WriteLog;
use hawser_e2e::{
    assert_same_contents, verify_nbd, Cluster, CutError, CutWindow, NbdConn, NbdTarget, Writer,
    WriterOptions, BLOCK_BYTES,
};

const ACK_TIMEOUT: Duration = Duration::from_secs(60);
const QUEUE_DEPTH: usize = 32;
/// Snapshots taken, and the acknowledged writes before each (every block overwritten about
/// once) and after the last.
const SNAPSHOTS: usize = 4;
const ACKS_BETWEEN: u64 = 4000;
const ACKS_AFTER: u64 = 2000;

/// A snapshot taken mid-run: its name, the CLI call's window, and the writes acknowledged
/// before the call.
struct Taken {
    name: String,
    window: CutWindow,
    acked_before: u64,
}

fn take(c: &Cluster, w: &Writer, name: &str) -> Taken {
    let acked_before = w.stats().acked_writes;
    let asked = Instant::now();
    let out = c.cli_ok(&["snapshot", "create", name, "--volume", "cut"]);
    let returned = Instant::now();
    assert!(
        out.contains(&format!("snapshot {name} of volume cut")),
        "{out}"
    );
    Taken {
        name: name.into(),
        window: CutWindow { asked, returned },
        acked_before,
    }
}

/// Both replicas' copies of `t` are identical and a cut of `log` within its window.
fn check(c: &Cluster, log: &WriteLog, t: &Taken) {
    let s = c.snapshot(&t.name);
    assert_eq!(s.state, SnapshotState::Ready, "{s:?}");
    assert_eq!(s.replicas.len(), 2, "both replicas hold it: {s:?}");
    let copies: Vec<_> = s
        .replicas
        .iter()
        .map(|r| {
            c.replica_path(r)
                .with_extension("snaps")
                .join(format!("{}.snap", s.id))
        })
        .collect();
    assert_same_contents(&copies[0], &copies[1], s.size_bytes);
    let image = std::fs::read(&copies[0]).expect("read the snapshot's copy");
    assert_eq!(image.len() as u64, s.size_bytes, "{}", copies[0].display());
    let report = log
        .check_cut(&image, t.window)
        .unwrap_or_else(|e| panic!("snapshot {} ({}): {e}", t.name, copies[0].display()));
    let (asked, returned) = (t.window.asked, t.window.returned);
    let during = log
        .blocks()
        .flat_map(|b| log.writes(b))
        .filter(|w| w.submitted > asked && w.submitted < returned)
        .count();
    println!(
        "snapshot {}: writes held {} µs ({}), CLI call {:.1?}, {during} writes submitted during \
         it; image of {} blocks, {} written: {} writes included, {} excluded; the cut's window \
         {:.1?} wide",
        t.name,
        s.pause_micros.expect("an attached volume is paused"),
        s.how.as_deref().unwrap_or("?"),
        returned - asked,
        report.blocks,
        report.written_blocks,
        report.included,
        report.excluded,
        report.slack().unwrap_or_default()
    );
    assert!(during > 0, "the writer was idle during the snapshot call");
    assert!(report.included >= t.acked_before, "{report:?}");
    assert!(report.excluded > 0, "nothing written after it: {report:?}");
}

/// The first `blocks` blocks of the volume, read through NBD.
fn read_volume(target: &NbdTarget, blocks: u64) -> Vec<u8> {
    let mut conn = NbdConn::connect(target).expect("connect");
    let mut image = vec![0u8; usize::try_from(blocks).expect("blocks") * BLOCK_BYTES];
    for (i, chunk) in (0u64..).zip(image.chunks_mut(1 << 20)) {
        conn.read_at(i << 20, chunk).expect("read the volume");
    }
    conn.disconnect();
    image
}

#[test]
fn snapshots_under_qd32_verified_writes_are_the_volume_between_two_acknowledged_writes() {
    let c = Cluster::start("snap-cut", 2);
    let target = NbdTarget::from_unix_uri(&c.attached_volume("cut", "64MiB", 2, "n1"));
    let opts = WriterOptions {
        seed: 0x5c07,
        queue_depth: QUEUE_DEPTH,
        ..WriterOptions::default()
    };
    let blocks = opts.blocks;
    let writer = Writer::start(target.clone(), opts);
    let taken: Vec<Taken> = (0..SNAPSHOTS)
        .map(|i| {
            writer.wait_acks(ACKS_BETWEEN, ACK_TIMEOUT);
            take(&c, &writer, &format!("mid-{i}"))
        })
        .collect();
    writer.wait_acks(ACKS_AFTER, ACK_TIMEOUT);
    let (log, stats) = writer.stop();
    println!(
        "writer: {} writes, {} flushes acknowledged in {:.1?}; longest gap {:.1?}",
        stats.acked_writes, stats.acked_flushes, stats.elapsed, stats.longest_gap
    );
    assert_eq!(
        (stats.errors, stats.unknown_writes, stats.disconnects),
        (0, 0, 0),
        "{stats:?}"
    );
    for t in &taken {
        check(&c, &log, t);
    }
    // The volume now holds writes submitted after every snapshot call returned.
    let last = taken.last().expect("a snapshot").window;
    let now = log.check_cut(&read_volume(&target, blocks), last);
    assert!(
        matches!(
            now,
            Err(CutError::TooLate { .. } | CutError::NotACut { .. })
        ),
        "the volume at the end passes for the last snapshot: {now:?}"
    );
    verify_nbd(&target, &log)
        .expect("read the volume back")
        .assert_ok();
}
