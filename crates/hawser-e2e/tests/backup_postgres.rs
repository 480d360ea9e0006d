//! Issue 43 acceptance a: PostgreSQL on a volume, under a write load, is backed up to a real
//! S3 server (SeaweedFS) and restored in a second, freshly started cluster that was given only
//! the target. The load is pgbench (TPC-B-like, two clients) and the commit log: one client
//! inserting ids 1, 2, 3, ... each in its own transaction, noting when each COMMIT was
//! acknowledged. The database sits on ext4 on the volume (nbdfuse, a loop device).
//!
//! The backup reads a crash-consistent snapshot taken after it was asked for, so the restored
//! volume is what a power cut at that moment would have left: ext4 needs its journal
//! replayed (and fsck finds it clean after), and PostgreSQL recovers from a crash. Then
//! pg_amcheck finds every table and index of every database sound, pgbench's balances add
//! up, and the commit log holds ids 1..=N with no gap, N at least the last id acknowledged
//! before the backup was asked for, and before its recovery point.

use std::path::Path;
use std::time::{Duration, Instant};

use hawser_api::backup::{Backup, BackupState};
use hawser_e2e::postgres::{self, pg_bin, pgbench_init, CommitLog, Commits, Pgbench, Postgres};
use hawser_e2e::{
    assert_fsck_clean, have, run_ok, wait_until, Cluster, FuseExport, LoopDevice, Mount, S3Server,
    TempDir,
};

/// Room for the database (about 70 MiB with pgbench's tables) and its WAL (max_wal_size
/// 64 MiB); a backup reads only what was written.
const VOLUME_SIZE: &str = "512MiB";
/// pgbench's scale: 100,000 accounts each.
const PGBENCH_SCALE: u32 = 2;
const PGBENCH_CLIENTS: u32 = 2;
/// pgbench ends on its own after this if the test stops early.
const PGBENCH_SECS: u32 = 120;
/// Commits acknowledged before the backup is asked for, so that the load is under way.
const WARM_COMMITS: u64 = 100;
const DB: &str = "bench";

/// What the first site leaves: the backup, what the commit log saw, when it was asked for.
struct Source {
    backup: Backup,
    commits: Commits,
    asked: Instant,
}

fn require_tools() {
    let missing = postgres::missing_programs();
    let tools = [
        "nbdfuse",
        "fusermount3",
        "mkfs.ext4",
        "fsck.ext4",
        "losetup",
    ];
    assert!(
        missing.is_empty() && tools.iter().all(|t| have(t)),
        "this test needs PostgreSQL 15 and nbdfuse (make deps installs postgresql-15): {missing:?}"
    );
}

/// Rows of `sql` in `db`, each split at psql's `|`.
fn rows(pg: &Postgres, db: &str, sql: &str) -> Vec<Vec<i64>> {
    pg.psql(db, sql)
        .lines()
        .map(|l| {
            l.split('|')
                .map(|v| v.parse().unwrap_or_else(|e| panic!("{sql}: {v:?}: {e}")))
                .collect()
        })
        .collect()
}

/// Site A: ext4 on volume `db`, PostgreSQL on it, the load, and a backup taken under it.
fn back_up_under_load(a: &Cluster, work: &Path) -> Source {
    let uri = a.attached_volume("db", VOLUME_SIZE, 1, "n1");
    // Declared outermost first: dropped (stopped, unmounted, detached) in reverse.
    let fuse = FuseExport::new(&uri, &work.join("fuse-a"));
    let lo = LoopDevice::attach(&fuse.file);
    // Inode tables written now, not by ext4's lazy init while the test runs.
    let mkfs_opts = "lazy_itable_init=0,lazy_journal_init=0";
    run_ok("mkfs.ext4", &["-q", "-F", "-E", mkfs_opts, &lo.dev]);
    let mount = Mount::new(&lo.dev, &work.join("mnt-a"));
    let data = mount.dir.join("pgdata");
    Postgres::init(&data);
    let pg = Postgres::start(&data, &work.join("run-a"));
    pg.psql("postgres", &format!("CREATE DATABASE {DB}"));
    pgbench_init(&pg, DB, PGBENCH_SCALE);
    let log = CommitLog::start(&pg, DB);
    let mut bench = Pgbench::start(&pg, DB, PGBENCH_CLIENTS, PGBENCH_SECS);
    wait_until("the load to be under way", Duration::from_secs(60), || {
        assert!(log.error().is_none(), "commit log: {:?}", log.error());
        assert!(bench.running(), "pgbench ended early (run-a/pgbench.log)");
        log.acked() >= WARM_COMMITS
            && rows(&pg, DB, "SELECT count(*) FROM pgbench_history")[0][0] > 0
    });

    let asked = Instant::now();
    let out = a.cli_ok(&[
        "backup", "create", "db", "--target", "offsite", "--wait", "-o", "json",
    ]);
    let done = Instant::now();
    let backup: Backup = serde_json::from_str(&out).expect("backup JSON");
    assert_eq!(backup.state, BackupState::Ready, "{backup:?}");
    assert!(bench.running(), "pgbench ended during the backup");
    drop(bench);
    let commits = log.stop();
    assert!(commits.error.is_none(), "commit log: {:?}", commits.error);
    // The load ran while the backup did.
    let during = commits
        .acked
        .iter()
        .filter(|c| c.at > asked && c.at < done)
        .count();
    assert!(during > 0, "no commit was acknowledged during the backup");
    eprintln!(
        "postgres: backup {} of {} bytes in {:?}, {during} commits acknowledged meanwhile",
        backup.name,
        backup.stats.as_ref().map_or(0, |s| s.stored_bytes),
        done - asked
    );
    pg.stop();
    drop((mount, lo, fuse));
    Source {
        backup,
        commits,
        asked,
    }
}

/// The restored volume, attached on `b`'s n1, through nbdfuse and a loop device.
fn restore(b: &Cluster, backup: &str, work: &Path) -> (FuseExport, LoopDevice) {
    let from = format!("offsite/{backup}");
    b.cli_ok(&[
        "volume",
        "create",
        "db",
        "--from-backup",
        &from,
        "--replicas",
        "1",
    ]);
    wait_until("the restore", Duration::from_secs(120), || {
        b.volume("db").restoring.is_none()
    });
    b.cli_ok(&["volume", "attach", "db", "--node", "n1"]);
    let uri = b.volume("db").nbd_unix_uri.expect("an NBD URI");
    let fuse = FuseExport::new(&uri, &work.join("fuse-b"));
    let lo = LoopDevice::attach(&fuse.file);
    (fuse, lo)
}

/// The filesystem as a power cut leaves it: mounted when the snapshot was taken, so its
/// journal needs replaying. A mount replays it; after that fsck finds nothing to fix.
fn replay_and_fsck(dev: &str, mnt: &Path) {
    let sb = run_ok("dumpe2fs", &["-h", dev]);
    assert!(
        sb.contains("needs_recovery"),
        "the restored ext4 was not left as mounted:\n{sb}"
    );
    drop(Mount::new(dev, mnt));
    assert_fsck_clean(dev, "the restored volume after its journal was replayed");
}

/// pg_amcheck over every database (amcheck installed where missing): heap pages, every
/// B-tree index, and that each index holds every row. Returns what it checked (stderr).
fn amcheck(pg: &Postgres) -> String {
    let out = pg
        .client(pg_bin("pg_amcheck"))
        .args([
            "--all",
            "--install-missing",
            "--heapallindexed",
            "--verbose",
        ])
        .output()
        .expect("run pg_amcheck");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.trim().is_empty(),
        "pg_amcheck found corruption ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stderr.into_owned()
}

/// Site B's checks on the restored database.
fn check_database(pg: &Postgres, source: &Source) {
    let log = std::fs::read_to_string(pg.log()).expect("the server's log");
    assert!(
        log.contains("database system was not properly shut down; automatic recovery"),
        "PostgreSQL did not recover from a crash:\n{log}"
    );
    let checked = amcheck(pg);
    // pg_amcheck --verbose names each relation it checks.
    for rel in [
        "heap table \"bench.public.commits\"",
        "btree index \"bench.public.commits_pkey\"",
        "heap table \"bench.public.pgbench_accounts\"",
        "btree index \"bench.public.pgbench_accounts_pkey\"",
    ] {
        assert!(
            checked.contains(&format!("checking {rel}")),
            "pg_amcheck did not check {rel}:\n{checked}"
        );
    }

    // pgbench's transactions are whole: each moved the same delta through an account, a
    // teller and a branch, and wrote it in the history.
    let sums = &rows(
        pg,
        DB,
        "SELECT (SELECT count(*) FROM pgbench_history), \
         (SELECT sum(abalance) FROM pgbench_accounts), \
         (SELECT coalesce(sum(delta), 0) FROM pgbench_history), \
         (SELECT sum(tbalance) FROM pgbench_tellers), \
         (SELECT sum(bbalance) FROM pgbench_branches)",
    )[0];
    assert!(sums[0] > 0, "no pgbench transaction in the backup");
    assert!(
        sums[1..].iter().all(|s| *s == sums[1]),
        "pgbench's balances disagree (accounts, history, tellers, branches): {sums:?}"
    );

    // One client, one transaction at a time: the ids present are 1..=N, N between the last
    // id acknowledged before the backup was asked for and the last one sent.
    let c = &source.commits;
    let before_ask = c.last_acked_before(source.asked);
    let before_point = c.last_acked_before_ms(source.backup.taken_ms);
    let sql = "SELECT count(*), coalesce(min(id), 1), coalesce(max(id), 0) FROM commits";
    let got: Vec<u64> = rows(pg, DB, sql)[0]
        .iter()
        .map(|v| u64::try_from(*v).expect("a count or an id"))
        .collect();
    let (count, min, max) = (got[0], got[1], got[2]);
    assert!(
        min == 1 && count == max,
        "the commit log has gaps: {count} ids, {min}..={max}"
    );
    assert!(
        max >= before_ask && max >= before_point,
        "acknowledged commits lost: the restored log ends at {max}, but {before_ask} was \
         acknowledged before the backup was asked for, {before_point} before its recovery point"
    );
    assert!(
        max <= c.sent,
        "id {max} was never sent (last sent {})",
        c.sent
    );
    assert!(
        before_ask >= WARM_COMMITS,
        "{before_ask} commits before the backup"
    );
    eprintln!(
        "postgres: restored ids 1..={max}; acknowledged before the request {before_ask}, \
         before the recovery point {before_point}, in all {} (last sent {}); \
         {} pgbench transactions",
        c.acked.len(),
        c.sent,
        sums[0]
    );
}

#[test]
fn postgres_backed_up_under_load_restores_in_a_new_cluster_with_every_acknowledged_commit() {
    require_tools();
    let start = Instant::now();
    let work = TempDir::new("pg-work");
    let s3 = S3Server::start(work.path(), "backups");

    let a = Cluster::start("pg-site-a", 1);
    s3.add_to(&a, "offsite", "site-a");
    let source = back_up_under_load(&a, work.path());
    drop(a);
    eprintln!("postgres: site A done after {:?}", start.elapsed());

    // Site B knows nothing of site A but the target.
    let b = Cluster::start("pg-site-b", 1);
    s3.add_to(&b, "offsite", "site-a");
    let (fuse, lo) = restore(&b, &source.backup.name, work.path());
    let mnt = work.path().join("mnt-b");
    replay_and_fsck(&lo.dev, &mnt);
    let mount = Mount::new(&lo.dev, &mnt);
    let pg = Postgres::start(&mount.dir.join("pgdata"), &work.path().join("run-b"));
    check_database(&pg, &source);
    pg.stop();
    drop((mount, lo, fuse));
    drop(b);
    drop(s3);
    eprintln!("postgres: done after {:?}", start.elapsed());
}
