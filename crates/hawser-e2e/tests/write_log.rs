//! The verifying writer and its checker against a real (loopback) cluster: a clean run
//! verifies; a planted lost write is caught; an engine restart under the writer (reconnecting)
//! loses no acknowledged write.

use std::time::Duration;

use hawser_e2e::write_log::{block_content, Found};
use hawser_e2e::{verify_nbd, Cluster, NbdConn, NbdTarget, Writer, WriterOptions, BLOCK_BYTES};

const ACK_TIMEOUT: Duration = Duration::from_secs(60);

fn writer_opts(seed: u64, reconnect: bool) -> WriterOptions {
    WriterOptions {
        seed,
        reconnect,
        ..WriterOptions::default()
    }
}

#[test]
fn clean_run_verifies_and_a_lost_acknowledged_write_is_caught() {
    let c = Cluster::start("wlog", 2);
    let target = NbdTarget::from_unix_uri(&c.attached_volume("wlog", "64MiB", 2, "n1"));
    let writer = Writer::start(target.clone(), writer_opts(17, false));
    writer.wait_acks(2000, ACK_TIMEOUT);
    let (log, stats) = writer.stop();
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert_eq!(stats.unknown_writes, 0, "{stats:?}");
    assert!(stats.acked_flushes > 0, "no flush was sent: {stats:?}");
    let report = verify_nbd(&target, &log).expect("verify");
    report.assert_ok();
    assert_eq!(report.checked, log.blocks().count() as u64);

    // Undo one acknowledged write: put back the block's previous content (zeros, or an older
    // write of the writer's). The checker must name exactly that block.
    let block = log.blocks().nth(10).expect("written blocks");
    let acked = log.history(block).and_then(|h| h.acked).expect("acked");
    let old = block_content(log.seed(), block, acked.saturating_sub(1));
    let mut conn = NbdConn::connect(&target).expect("connect");
    conn.write_at(block * BLOCK_BYTES as u64, &old)
        .expect("plant a stale block");
    conn.disconnect();
    let report = verify_nbd(&target, &log).expect("verify");
    assert_eq!(report.mismatches.len(), 1, "{report:?}");
    let m = &report.mismatches[0];
    assert_eq!(m.block, block);
    assert!(
        matches!(m.found, Found::Stamp(s) if s.seq == acked - 1),
        "{m}"
    );
}

/// The agent serving the volume restarts (SIGTERM, as a node shutdown) under the writer: the
/// connection drops, the writer records what was in flight as unknown and reconnects once the
/// volume is attached again; nothing acknowledged is lost.
#[test]
fn writer_survives_an_engine_restart_and_nothing_acknowledged_is_lost() {
    let mut c = Cluster::start("wlog-restart", 2);
    let target = NbdTarget::from_unix_uri(&c.attached_volume("wlr", "64MiB", 2, "n1"));
    let writer = Writer::start(target.clone(), writer_opts(23, true));
    writer.wait_acks(1000, ACK_TIMEOUT);
    c.restart_agent("n1");
    c.cli_ok(&["volume", "attach", "wlr", "--node", "n1"]);
    let s = writer.wait_acks(1000, ACK_TIMEOUT);
    assert!(s.disconnects >= 1, "the connection never dropped: {s:?}");
    assert!(s.connects >= 2, "the writer did not reconnect: {s:?}");
    let (log, stats) = writer.stop();
    eprintln!("across the restart: {stats:?}");
    verify_nbd(&target, &log).expect("verify").assert_ok();
}
