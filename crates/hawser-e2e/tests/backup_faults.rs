//! Backups that meet a fault (issue 43, acceptance c), on real processes: the agent running a
//! backup killed with SIGKILL midway, a real S3 server (SeaweedFS) that throttles with
//! `503 SlowDown` from its own circuit breaker, briefly and then for longer than the retry
//! time, and a directory target on a small loop-mounted ext4 that fills. Each time: no
//! manifest of the failed backup on the target, the backup `failed` with a reason that says
//! what happened, a `BackupFailed` event, the volume reads back what was written, and the
//! next backup, once the fault is gone, is complete and reuses the blocks already stored.

use std::sync::Arc;
use std::time::Duration;

use hawser_api::backup::{Backup, BackupState};
use hawser_backup::{BackupError, Dest, Progress, Target, TargetSpec};
use hawser_e2e::cluster::{hawser_bin, Cluster, ClusterOptions};
use hawser_e2e::{wait_until, NbdConn, NbdTarget, S3Server, SmallFs, TempDir};

const MIB: u64 = 1 << 20;
const MIB_BYTES: usize = 1 << 20;

fn cluster(name: &str, agents: usize, controller_args: &[&str]) -> Cluster {
    let opts = ClusterOptions {
        controller_args: controller_args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    Cluster::start_with(name, agents, opts)
}

/// 1 MiB of noise for block `i` of a run seeded `seed` (xorshift: distinct per block and
/// seed, and incompressible, so each block is one object of about its size).
fn block(seed: u64, i: u64) -> Vec<u8> {
    let mut x = (seed << 32 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(MIB_BYTES);
    while out.len() < MIB_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn nbd(uri: &str) -> NbdConn {
    NbdConn::connect(&NbdTarget::from_unix_uri(uri)).expect("connect to the volume")
}

/// Writes blocks `blocks` of run `seed` at their index (in MiB) and flushes.
fn write_blocks(uri: &str, seed: u64, blocks: std::ops::Range<u64>) {
    let mut conn = nbd(uri);
    for i in blocks {
        conn.write_at(i * MIB, &block(seed, i))
            .expect("write a block");
    }
    conn.send_flush(1).expect("flush");
    let reply = conn.read_reply(&mut || false).expect("flush reply");
    assert_eq!(reply.error, 0, "flush failed");
    conn.disconnect();
}

/// The volume reads back blocks `blocks` of run `seed`: nothing was lost.
fn assert_blocks(uri: &str, seed: u64, blocks: std::ops::Range<u64>) {
    let mut conn = nbd(uri);
    let mut buf = vec![0u8; MIB_BYTES];
    for i in blocks {
        conn.read_at(i * MIB, &mut buf).expect("read a block");
        assert!(buf == block(seed, i), "block {i} of the volume changed");
    }
    conn.disconnect();
}

fn show(c: &Cluster, name: &str) -> Backup {
    serde_json::from_str(&c.cli_ok(&["backup", "show", name, "-o", "json"])).expect("backup JSON")
}

/// `hawser backup create` without `--wait`: the backup, running.
fn start_backup(c: &Cluster, volume: &str, target: &str) -> Backup {
    let out = c.cli_ok(&["backup", "create", volume, "--target", target, "-o", "json"]);
    let b: Backup = serde_json::from_str(&out).expect("backup JSON");
    assert_eq!(b.state, BackupState::Running, "{b:?}");
    b
}

fn wait_ended(c: &Cluster, name: &str, within: Duration) -> Backup {
    let mut b = None;
    wait_until(&format!("backup {name} to end"), within, || {
        let now = show(c, name);
        let done = now.state != BackupState::Running;
        b = Some(now);
        done
    });
    b.expect("the backup")
}

/// `hawser backup create --wait` of a backup that must succeed.
fn backup_ok(c: &Cluster, volume: &str, target: &str) -> Backup {
    let out = c.cli_ok(&[
        "backup", "create", volume, "--target", target, "--wait", "-o", "json",
    ]);
    let b: Backup = serde_json::from_str(&out).expect("backup JSON");
    assert_eq!(b.state, BackupState::Ready, "{b:?}");
    b
}

/// The backup failed with `words` in its reason, and a `BackupFailed` event says so.
fn assert_failed(c: &Cluster, b: &Backup, words: &[&str]) {
    assert_eq!(b.state, BackupState::Failed, "{b:?}");
    let why = b.error.clone().unwrap_or_default();
    for w in words {
        assert!(why.contains(w), "{w:?} not in the reason: {why}");
    }
    eprintln!("backup_faults: {} failed: {why}", b.name);
    let events = c.cli_ok(&["events"]);
    assert!(
        events
            .lines()
            .any(|l| l.contains("BackupFailed") && l.contains(&b.name)),
        "{events}"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

/// No manifest of `backup` on `target`: it is not listed, and reading it finds nothing.
fn assert_no_manifest(rt: &tokio::runtime::Runtime, target: &Target, backup: &str) {
    let listed = rt.block_on(target.list("backups")).expect("list backups/");
    assert!(
        !listed.iter().any(|m| m.contains(backup)),
        "a manifest of the failed backup {backup}: {listed:?}"
    );
    match rt.block_on(hawser_backup::read_manifest(target, backup)) {
        Err(BackupError::NotFound { .. }) => {}
        other => panic!("manifest of the failed backup {backup}: {other:?}"),
    }
}

#[test]
fn kill9_of_the_agent_mid_upload_fails_the_backup_and_the_next_one_reuses_its_blocks() {
    // 6 MiB/s: a 48 MiB volume takes 8 s, long enough to be caught midway.
    let rate = (6 * MIB).to_string();
    let mut c = cluster(
        "backup-kill9",
        2,
        &["--backup-rate", &rate, "--node-timeout-secs", "5"],
    );
    let dir = TempDir::new("backup-kill9-s3");
    let s3 = S3Server::start(dir.path(), "backups");
    s3.add_to(&c, "offsite", "cluster-1");
    let uri = c.attached_volume("db", "48MiB", 2, "n1");
    write_blocks(&uri, 1, 0..40);
    // Detached, so that killing whichever node runs the backup stops no engine.
    c.cli_ok(&["volume", "detach", "db"]);

    let b = start_backup(&c, "db", "offsite");
    let node = b.node.clone().expect("the backup runs on a node");
    wait_until(
        "the backup to be a quarter through",
        Duration::from_secs(30),
        || {
            let now = show(&c, &b.name);
            assert_eq!(now.state, BackupState::Running, "ended early: {now:?}");
            now.progress.is_some_and(|p| p.done_bytes >= 12 * MIB)
        },
    );
    c.kill_agent(&node);
    let failed = wait_ended(&c, &b.name, Duration::from_secs(30));
    assert_failed(&c, &failed, &[&node, "offline", "lost"]);
    let rt = runtime();
    let target = s3.target("offsite", "cluster-1", 10);
    assert_no_manifest(&rt, &target, &b.name);
    let left = rt.block_on(target.list("blocks")).expect("list blocks/");
    assert!(
        !left.is_empty() && left.len() < 40,
        "the killed run stored {} of 40 blocks",
        left.len()
    );

    // Back: the next backup is whole, and sends none of the blocks already there.
    c.restart_agent_from(&node, &hawser_bin(), false);
    c.wait_nodes_online(2);
    let next = backup_ok(&c, "db", "offsite");
    let st = next.stats.clone().expect("stats");
    eprintln!(
        "backup_faults: after the kill, {} blocks on the target; the next backup: {st:?}",
        left.len()
    );
    assert!(st.found_blocks >= left.len() as u64, "{st:?}");
    assert_eq!(st.found_blocks + st.new_blocks, 40, "{st:?}");
    assert_eq!(st.reused_blocks, st.found_blocks, "{st:?}");
    let shown = c.cli_ok(&["backup", "show", &next.name]);
    assert!(shown.contains("found on the target"), "{shown}");
    let out = dir.path().join("restored");
    hawser_e2e::backups::restore_to_file(&target, &next.name, &out, 48 * MIB);
    let restored = std::fs::read(&out).expect("read the restored file");
    for i in 0..40u64 {
        let at = usize::try_from(i * MIB).expect("an offset");
        assert!(
            restored[at..at + MIB_BYTES] == block(1, i),
            "block {i} restored wrong"
        );
    }

    // Nothing lost: the volume reads back what was written, and takes writes.
    c.cli_ok(&["volume", "attach", "db", "--node", "n1"]);
    let uri = c.volume("db").nbd_unix_uri.expect("an NBD URI");
    assert_blocks(&uri, 1, 0..40);
    write_blocks(&uri, 2, 40..41);
    assert_blocks(&uri, 2, 40..41);
}

/// The controller's `hawser_backups{state="failed"}`, scraped with the metrics token.
fn failed_backups_metric(c: &Cluster) -> u64 {
    let token = std::fs::read_to_string(c.dir.path().join("controller/metrics.token"))
        .expect("the metrics token");
    let body = c
        .controller_http()
        .get(format!("{}/metrics", c.url))
        .bearer_auth(token.trim())
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.text())
        .expect("scrape the controller");
    body.lines()
        .find_map(|l| l.strip_prefix("hawser_backups{state=\"failed\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no hawser_backups{{state=\"failed\"}} in:\n{body}"))
}

/// Whether a request to the target is answered `503 SlowDown` now (a lookup not retried).
fn throttled(rt: &tokio::runtime::Runtime, probe: &Target) -> bool {
    match rt.block_on(probe.size(hawser_backup::names::MARKER)) {
        Err(BackupError::Throttled { answer, .. }) => answer.contains("503"),
        Ok(_) => false,
        Err(e) => panic!("probing the target: {e}"),
    }
}

#[test]
fn s3_throttling_is_ridden_out_with_retries_and_past_the_retry_time_fails_clearly() {
    // Requests are retried for 12 s: long enough to lift a brief throttle, short for a test.
    let c = cluster("backup-throttle", 1, &["--backup-retry-secs", "12"]);
    let dir = TempDir::new("backup-throttle-s3");
    let s3 = S3Server::start(dir.path(), "backups");
    s3.add_to(&c, "offsite", "cluster-1");
    let uri = c.attached_volume("db", "16MiB", 1, "n1");
    write_blocks(&uri, 3, 0..8);
    let rt = runtime();
    let probe = s3.target("offsite", "cluster-1", 0);

    // Briefly: the backup retries, shows it, and completes once the store lets it.
    s3.throttle(true);
    wait_until("the store to throttle", Duration::from_secs(20), || {
        throttled(&rt, &probe)
    });
    let b = start_backup(&c, "db", "offsite");
    wait_until(
        "the backup to show retries",
        Duration::from_secs(20),
        || {
            let now = show(&c, &b.name);
            assert_eq!(
                now.state,
                BackupState::Running,
                "ended while throttled: {now:?}"
            );
            now.progress.is_some_and(|p| p.retries > 0)
        },
    );
    let shown = c.cli_ok(&["backup", "show", &b.name]);
    assert!(shown.contains("requests retried"), "{shown}");
    s3.throttle(false);
    wait_until(
        "the store to stop throttling",
        Duration::from_secs(20),
        || !throttled(&rt, &probe),
    );
    let done = wait_ended(&c, &b.name, Duration::from_secs(60));
    assert_eq!(done.state, BackupState::Ready, "{done:?}");
    let st = done.stats.clone().expect("stats");
    assert!(st.retries > 0 && st.new_blocks == 8, "{st:?}");
    let log = c.log("n1");
    assert!(
        log.contains("503") && log.contains("backing off"),
        "the agent's log shows no retry"
    );
    eprintln!("backup_faults: throttled briefly: {st:?}");

    // Longer than the retry time: failed, saying the target throttles; the volume serves on.
    let failed_before = failed_backups_metric(&c);
    s3.throttle(true);
    wait_until("the store to throttle", Duration::from_secs(20), || {
        throttled(&rt, &probe)
    });
    let b = start_backup(&c, "db", "offsite");
    write_blocks(&uri, 4, 8..12);
    assert_blocks(&uri, 4, 8..12);
    let failed = wait_ended(&c, &b.name, Duration::from_secs(60));
    // (The code, SlowDown, is in the answer's body, which a HEAD does not have.)
    assert_failed(
        &c,
        &failed,
        &["offsite", "is throttling requests", "HTTP 503"],
    );
    assert_eq!(failed_backups_metric(&c), failed_before + 1);
    s3.throttle(false);
    wait_until(
        "the store to stop throttling",
        Duration::from_secs(20),
        || !throttled(&rt, &probe),
    );
    assert_no_manifest(&rt, &s3.target("offsite", "cluster-1", 10), &b.name);
    assert_blocks(&uri, 3, 0..8);
    assert_blocks(&uri, 4, 8..12);
}

/// Bytes free on the filesystem at `dir` (statvfs; root's, reserved blocks included, as the
/// agent runs as root here).
fn free_bytes(dir: &std::path::Path) -> u64 {
    let out = hawser_e2e::run_ok("stat", &["-f", "-c", "%S %f", &dir.display().to_string()]);
    let v: Vec<u64> = out
        .split_whitespace()
        .map(|x| x.parse().expect("stat number"))
        .collect();
    v[0] * v[1]
}

/// The names of every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

#[test]
fn a_full_directory_target_fails_the_backup_saying_so_and_the_next_one_completes() {
    let dir = TempDir::new("backup-full");
    let fs = SmallFs::new(dir.path(), 40);
    let c = cluster("backup-full", 1, &[]);
    let path = fs.mount.dir.join("backups");
    std::fs::create_dir(&path).expect("make the target directory");
    let path_arg = path.display().to_string();
    c.cli_ok(&["backup", "target", "add", "small", "--dir", &path_arg]);
    // Room for about 5 of the volume's 12 incompressible 1 MiB blocks.
    let ballast = fs.mount.dir.join("ballast");
    let room = free_bytes(&fs.mount.dir).saturating_sub(5 * MIB + MIB / 2);
    let room = usize::try_from(room).expect("a size");
    std::fs::write(&ballast, vec![0x5au8; room]).expect("write the ballast");
    let uri = c.attached_volume("db", "16MiB", 1, "n1");
    write_blocks(&uri, 5, 0..12);

    let out = c.cli(&[
        "backup", "create", "db", "--target", "small", "--wait", "-o", "json",
    ]);
    assert!(!out.status.success(), "a backup to a full target succeeded");
    let list: Vec<Backup> =
        serde_json::from_str(&c.cli_ok(&["backup", "list", "--volume", "db", "-o", "json"]))
            .expect("list JSON");
    let failed = list.last().expect("the backup").clone();
    assert_failed(
        &c,
        &failed,
        &["backup target small is full", "No space left"],
    );
    let rt = runtime();
    let target =
        Target::open("small", &TargetSpec::Dir { path: path_arg }, None).expect("open the target");
    assert_no_manifest(&rt, &target, &failed.name);
    // No half-written block either: a block is written aside and renamed when whole.
    let stored = rt.block_on(target.list("blocks")).expect("list blocks/");
    let files = files_under(&path.join("blocks"));
    assert!(
        files.len() == stored.len() && files.iter().all(|f| f.ends_with(".zst")),
        "a staging file was left: {files:?}"
    );
    eprintln!("backup_faults: full after {} blocks", stored.len());
    assert_blocks(&uri, 5, 0..12);
    write_blocks(&uri, 6, 12..13);

    // Space freed: the next backup completes, reusing what the full one stored.
    std::fs::remove_file(&ballast).expect("remove the ballast");
    let next = backup_ok(&c, "db", "small");
    let st = next.stats.clone().expect("stats");
    assert_eq!(st.found_blocks, stored.len() as u64, "{st:?}");
    assert_eq!(st.found_blocks + st.new_blocks, 13, "{st:?}");
    let m = rt
        .block_on(hawser_backup::read_manifest(&target, &next.name))
        .expect("the manifest");
    rt.block_on(hawser_backup::restore(
        &target,
        &m,
        Dest::Verify,
        Arc::new(Progress::new(0)),
        0,
    ))
    .expect("every block of the next backup checks out");
    assert_blocks(&uri, 5, 0..12);
    assert_blocks(&uri, 6, 12..13);
    drop(c);
    drop(fs);
}
