//! PostgreSQL 15 from Debian's packages (postgresql-15, postgresql-client-15) for tests that
//! put a database on a volume: a server run as an unprivileged user with a unix socket only
//! (no TCP), stopped by its PID on drop; queries through `psql`; pgbench's load; and the
//! commit log, a client that inserts increasing ids one at a time in autocommit and notes
//! when each COMMIT was acknowledged.
//!
//! The programs come from Debian's own directory ([`PG_BIN`]), not PATH, where a machine may
//! have other copies: the version is the one `make deps` installs.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cluster::signal;
use crate::run::wait_until;

/// Where Debian's postgresql-15 and postgresql-client-15 put their programs.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// The server runs as `nobody` (uid and gid 65534 on Debian): PostgreSQL refuses root.
const SERVER_UID: u32 = 65534;
/// The superuser `initdb` makes; every client here connects as it (trust, on the socket).
pub const SUPERUSER: &str = "postgres";
/// A server recovering from a crash takes longer than a clean start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// After a fast shutdown's deadline, SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Settings given on the command line. The durability ones are the defaults, said out loud
/// because the tests rely on them; the sizes keep the data directory small.
const SETTINGS: &[&str] = &[
    "listen_addresses=",
    "fsync=on",
    "synchronous_commit=on",
    "full_page_writes=on",
    "wal_sync_method=fdatasync",
    "shared_buffers=32MB",
    "max_wal_size=64MB",
    "min_wal_size=32MB",
    "max_connections=20",
];

/// A program of Debian's PostgreSQL 15 (make deps installs postgresql-15).
pub fn pg_bin(bin: &str) -> PathBuf {
    Path::new(PG_BIN).join(bin)
}

/// The programs the tests use, those of them missing.
pub fn missing_programs() -> Vec<PathBuf> {
    [
        pg_bin("initdb"),
        pg_bin("postgres"),
        pg_bin("psql"),
        pg_bin("pgbench"),
        pg_bin("pg_amcheck"),
    ]
    .into_iter()
    .filter(|p| !p.is_file())
    .collect()
}

/// `prog` run as the server's user.
fn as_server(prog: PathBuf) -> Command {
    let mut c = Command::new(prog);
    // std drops the supplementary groups too when it sets the uid.
    c.uid(SERVER_UID).gid(SERVER_UID);
    c
}

/// Gives `dir` to the server's user with `mode`.
fn give_to_server(dir: &Path, mode: u32) {
    std::os::unix::fs::chown(dir, Some(SERVER_UID), Some(SERVER_UID))
        .unwrap_or_else(|e| panic!("chown {}: {e}", dir.display()));
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", dir.display()));
}

/// Requires `out` to be a success; returns its stdout.
pub fn check_output(what: &str, out: std::io::Result<Output>) -> String {
    let out = out.unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A running server, stopped (fast shutdown, then SIGKILL) on drop.
pub struct Postgres {
    child: Child,
    pub data: PathBuf,
    /// Holds the socket and the server's log (`postgres.log`).
    pub run_dir: PathBuf,
}

impl Postgres {
    /// `initdb` into `data` (made, and given to the server's user), with page checksums, so
    /// that a torn or stale page is an error when read. initdb syncs what it wrote.
    pub fn init(data: &Path) {
        std::fs::create_dir_all(data).expect("create the data directory");
        give_to_server(data, 0o700);
        let out = as_server(pg_bin("initdb"))
            .arg("-D")
            .arg(data)
            .args(["-U", SUPERUSER, "-A", "trust", "--no-locale", "-E", "UTF8"])
            .arg("--data-checksums")
            .output();
        check_output("initdb", out);
    }

    /// Starts the server on `data`; its socket and log go in `run_dir` (made). Waits until it
    /// accepts connections, which after a crash is when its recovery is over.
    pub fn start(data: &Path, run_dir: &Path) -> Postgres {
        std::fs::create_dir_all(run_dir).expect("create the run directory");
        give_to_server(run_dir, 0o755);
        let log = File::create(run_dir.join("postgres.log")).expect("create the server's log");
        let mut cmd = as_server(pg_bin("postgres"));
        cmd.arg("-D").arg(data).arg("-k").arg(run_dir);
        for s in SETTINGS {
            cmd.args(["-c", s]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start postgres");
        let mut pg = Postgres {
            child,
            data: data.to_owned(),
            run_dir: run_dir.to_owned(),
        };
        pg.wait_ready();
        pg
    }

    /// Until the server's postmaster.pid names it and says `ready` (as `pg_ctl -w` waits).
    /// The file a crashed server left says `ready` too, with its own PID.
    fn wait_ready(&mut self) {
        let pid_file = self.data.join("postmaster.pid");
        let (pid, log) = (self.child.id().to_string(), self.log());
        let child = &mut self.child;
        wait_until("PostgreSQL to accept connections", START_TIMEOUT, || {
            if let Ok(Some(st)) = child.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("postgres exited ({st}) while starting:\n{log}");
            }
            let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            lines.first() == Some(&pid.as_str()) && lines.get(7) == Some(&"ready")
        });
    }

    pub fn log(&self) -> PathBuf {
        self.run_dir.join("postgres.log")
    }

    /// A client program (psql, pgbench, pg_amcheck) connecting to this server as
    /// [`SUPERUSER`], through the socket.
    pub fn client(&self, prog: PathBuf) -> Command {
        let mut c = Command::new(prog);
        c.arg("-h").arg(&self.run_dir).args(["-U", SUPERUSER]);
        c
    }

    /// `sql` run by psql in database `db`, stopping at the first error; its rows, unaligned.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = self
            .client(pg_bin("psql"))
            .args([
                "-X",
                "-q",
                "-tA",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                db,
                "-c",
                sql,
            ])
            .output();
        check_output(&format!("psql {sql:?}"), out)
    }

    /// Stops the server with a fast shutdown (SIGINT), SIGKILL after [`STOP_TIMEOUT`].
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        signal(&self.child, libc::SIGINT);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.shut_down();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.log()).unwrap_or_default();
            eprintln!("--- {} ---\n{log}", self.log().display());
        }
    }
}

/// `pgbench -i` of database `db` at scale `scale` (100,000 accounts each).
pub fn pgbench_init(pg: &Postgres, db: &str, scale: u32) {
    let out = pg
        .client(pg_bin("pgbench"))
        .args(["-i", "-q", "-s", &scale.to_string(), db])
        .output();
    check_output("pgbench -i", out);
}

/// pgbench's TPC-B-like load running on a database, killed by its PID on drop.
pub struct Pgbench {
    child: Child,
}

impl Pgbench {
    /// `clients` clients for at most `secs` seconds; its output in `run_dir/pgbench.log`.
    pub fn start(pg: &Postgres, db: &str, clients: u32, secs: u32) -> Pgbench {
        let log = File::create(pg.run_dir.join("pgbench.log")).expect("pgbench log");
        let c = clients.to_string();
        let child = pg
            .client(pg_bin("pgbench"))
            .args(["-n", "-c", &c, "-j", &c, "-T", &secs.to_string(), db])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start pgbench");
        Pgbench { child }
    }

    /// Whether it is still running (it ends on its own after its time, or on an error).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Pgbench {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An id whose INSERT's COMMIT was acknowledged, and when the client read the answer (after
/// the server sent it): on the monotonic clock and in ms since the Unix epoch.
#[derive(Debug, Clone, Copy)]
pub struct Ack {
    pub id: u64,
    pub at: Instant,
    pub at_ms: u64,
}

/// What the commit log's client saw.
#[derive(Debug, Default, Clone)]
pub struct Commits {
    /// In the order of their ids.
    pub acked: Vec<Ack>,
    /// The last id sent (acknowledged or not).
    pub sent: u64,
    pub error: Option<String>,
}

impl Commits {
    /// The last id acknowledged before `t` (0 if none).
    pub fn last_acked_before(&self, t: Instant) -> u64 {
        self.acked
            .iter()
            .take_while(|a| a.at < t)
            .last()
            .map_or(0, |a| a.id)
    }

    /// The last id acknowledged before `ms` since the Unix epoch (0 if none).
    pub fn last_acked_before_ms(&self, ms: u64) -> u64 {
        self.acked
            .iter()
            .take_while(|a| a.at_ms < ms)
            .last()
            .map_or(0, |a| a.id)
    }
}

/// One client inserting ids 1, 2, 3, ... into table `commits`, each in its own transaction
/// (autocommit), the next only once the last one's COMMIT was acknowledged: one psql
/// reading statements from a pipe, each answered with the id it inserted.
pub struct CommitLog {
    psql: Child,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Commits>>,
    thread: Option<JoinHandle<()>>,
}

impl CommitLog {
    /// Creates table `commits` in `db` and starts the client.
    pub fn start(pg: &Postgres, db: &str) -> CommitLog {
        pg.psql(db, "CREATE TABLE commits (id bigint PRIMARY KEY)");
        let log = File::create(pg.run_dir.join("commit-log.log")).expect("commit log's log");
        let mut psql = pg
            .client(pg_bin("psql"))
            .args(["-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-d", db])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start psql");
        let stdin = psql.stdin.take().expect("psql stdin");
        let stdout = BufReader::new(psql.stdout.take().expect("psql stdout"));
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Commits::default()));
        let (s, sn) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || insert_loop(stdin, stdout, &s, &sn));
        CommitLog {
            psql,
            stop,
            seen,
            thread: Some(thread),
        }
    }

    pub fn acked(&self) -> u64 {
        self.seen.lock().expect("lock").acked.len() as u64
    }

    pub fn error(&self) -> Option<String> {
        self.seen.lock().expect("lock").error.clone()
    }

    /// Lets the insert under way finish, then stops; returns what was seen.
    pub fn stop(mut self) -> Commits {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("commit log thread");
        }
        let _ = self.psql.wait();
        self.seen.lock().expect("lock").clone()
    }
}

impl Drop for CommitLog {
    fn drop(&mut self) {
        // Only after a panic: the thread may wait on a server that will not answer.
        self.stop.store(true, Ordering::Release);
        let _ = self.psql.kill();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = self.psql.wait();
    }
}

fn insert_loop(
    mut stdin: ChildStdin,
    mut stdout: BufReader<ChildStdout>,
    stop: &AtomicBool,
    seen: &Mutex<Commits>,
) {
    let mut line = String::new();
    for id in 1u64.. {
        if stop.load(Ordering::Acquire) {
            break;
        }
        seen.lock().expect("lock").sent = id;
        let sql = format!("INSERT INTO commits (id) VALUES ({id}) RETURNING id;\n");
        line.clear();
        let answer = stdin
            .write_all(sql.as_bytes())
            .and_then(|()| stdin.flush())
            .and_then(|()| stdout.read_line(&mut line));
        let mut g = seen.lock().expect("lock");
        match answer {
            Ok(_) if line.trim() == id.to_string() => g.acked.push(Ack {
                id,
                at: Instant::now(),
                at_ms: now_ms(),
            }),
            Ok(_) => {
                // Its error is in commit-log.log.
                g.error = Some(format!("insert {id}: psql answered {line:?}"));
                break;
            }
            Err(e) => {
                g.error = Some(format!("insert {id}: {e}"));
                break;
            }
        }
    }
}

fn now_ms() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970");
    u64::try_from(d.as_millis()).expect("ms fit in u64")
}
