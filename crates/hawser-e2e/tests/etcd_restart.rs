//! etcd killed with SIGKILL (by the PID the fixture started) and restarted on the same data
//! directory and port, twice, while a loop of volume creates, attaches, detaches and deletes
//! runs against one controller on it, each outage starting under a chosen operation:
//! - a short outage (restarted at once): the controller keeps leading;
//! - an outage longer than the election lease: the controller steps down, answers new
//!   requests with a clear `not_leader` error at once, and leads again once etcd is back.
//!
//! The operations in flight at each kill must finish successfully, every other CLI call must
//! succeed or fail with a clear error (never hang), and afterwards every volume that exists
//! has exactly its replicas, each once on the agents, and no agent holds an orphan replica.
//! Fails if `etcd` is not installed.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hawser_e2e::cluster::hawser_bin;
use hawser_e2e::{assert_volumes_whole, wait_until, Cluster, ClusterOptions};

/// Longest any CLI call may take. The controller retries a store call for 20 s
/// (`STORE_RETRY_DEADLINE`), so an operation spanning an outage ends well inside this; one
/// that takes longer is as good as hung.
const CLI_CALL_LIMIT: Duration = Duration::from_secs(60);
/// Operations that must succeed before each outage and after the last one.
const PROGRESS_OPS: usize = 8;
/// How long those operations may take.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(120);
/// How soon after etcd is back the controller must lead again: less than the 5 s election
/// lease TTL.
const RELEAD_LIMIT: Duration = Duration::from_secs(4);
/// The outages: the operation to kill etcd under, and whether to stay down until the
/// controller has stepped down.
const OUTAGES: [(&str, bool); 4] = [
    ("create", false),
    ("create", true),
    ("delete", false),
    ("attach", true),
];
/// Pause of the loop after a refused operation.
const REFUSED_PAUSE: Duration = Duration::from_millis(250);
/// Upper bound of the loop, whatever happens.
const MAX_ITERATIONS: usize = 400;
/// How long a stepped-down controller may take to refuse a request.
const REFUSAL_LIMIT: Duration = Duration::from_secs(10);

/// One CLI call of the loop.
struct Op {
    args: Vec<String>,
    started: Instant,
    took: Duration,
    ok: bool,
    stderr: String,
}

/// The create / attach / detach / delete loop, run by a thread of its own.
struct OpsLoop {
    url: String,
    /// The admin token file the CLI reads.
    token_file: std::path::PathBuf,
    ca_file: std::path::PathBuf,
    stop: AtomicBool,
    /// The subcommand (`create`, `attach`, ...) of the CLI call running now.
    in_flight: Mutex<Option<String>>,
    succeeded: AtomicUsize,
    ops: Mutex<Vec<Op>>,
}

impl OpsLoop {
    fn new(c: &Cluster) -> OpsLoop {
        OpsLoop {
            url: c.url.clone(),
            token_file: c.tokens.admin.clone(),
            ca_file: c.tokens.ca_file.clone(),
            stop: AtomicBool::new(false),
            in_flight: Mutex::new(None),
            succeeded: AtomicUsize::new(0),
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Iteration i: create v{i} (2 replicas), attach it to a node in turn, detach it, and
    /// delete every other one, so volumes both come and go. A step that fails skips the
    /// rest of its iteration.
    fn run(&self) {
        for i in 0..MAX_ITERATIONS {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let v = format!("v{i}");
            let node = format!("n{}", i % 3 + 1);
            let ok = self.cli(&["volume", "create", &v, "--size", "16MiB", "--replicas", "2"])
                && self.cli(&["volume", "attach", &v, "--node", &node])
                && self.cli(&["volume", "detach", &v]);
            if ok && i % 2 == 0 {
                self.cli(&["volume", "delete", &v]);
            }
            if !ok {
                // A client backs off after a refusal instead of spinning through the loop.
                std::thread::sleep(REFUSED_PAUSE);
            }
        }
    }

    fn cli(&self, args: &[&str]) -> bool {
        *self.in_flight.lock().expect("in flight") = args.get(1).map(|a| a.to_string());
        let started = Instant::now();
        let out = Command::new(hawser_bin())
            .env("HAWSER_CONTROLLER", &self.url)
            .env("HAWSER_TOKEN_FILE", &self.token_file)
            .env("HAWSER_CA_FILE", &self.ca_file)
            .args(args)
            .output()
            .expect("run hawser");
        let took = started.elapsed();
        *self.in_flight.lock().expect("in flight") = None;
        let ok = out.status.success();
        if ok {
            self.succeeded.fetch_add(1, Ordering::SeqCst);
        }
        let op = Op {
            args: args.iter().map(|a| a.to_string()).collect(),
            started,
            took,
            ok,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        };
        self.ops.lock().expect("ops").push(op);
        ok
    }

    /// Waits until `n` more operations have succeeded; panics with the last ones if not.
    fn wait_progress(&self, n: usize, what: &str) {
        let target = self.succeeded.load(Ordering::SeqCst) + n;
        let deadline = Instant::now() + PROGRESS_TIMEOUT;
        while self.succeeded.load(Ordering::SeqCst) < target {
            if Instant::now() > deadline {
                let ops = self.ops.lock().expect("ops");
                let last: Vec<String> = ops.iter().rev().take(8).rev().map(describe).collect();
                panic!(
                    "no {what} within {PROGRESS_TIMEOUT:?}; last operations:\n{}",
                    last.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Stops the loop when dropped, so a failing assertion does not leave the test waiting for
/// the loop thread to run out of iterations.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Whether the controller at `url` answers with `not_leader` (it has stepped down).
fn answers_not_leader(http: &reqwest::blocking::Client, url: &str, bearer: &str) -> bool {
    http.get(format!("{url}/v1/nodes"))
        .header("authorization", bearer)
        .send()
        .and_then(|r| r.json::<serde_json::Value>())
        .is_ok_and(|body| body["code"] == "not_leader")
}

/// Kills etcd while a `volume <verb>` is in flight, restarts it (after the controller
/// stepped down when `long`), and waits until the controller leads again. Returns when etcd
/// died.
fn outage(c: &mut Cluster, ops: &OpsLoop, verb: &str, long: bool) -> Instant {
    let kind = if long { "long" } else { "short" };
    ops.wait_progress(PROGRESS_OPS, &format!("progress before the {kind} outage"));
    wait_until(
        &format!("a volume {verb} in flight"),
        Duration::from_secs(60),
        || ops.in_flight.lock().expect("in flight").as_deref() == Some(verb),
    );
    let killed = Instant::now();
    c.etcd.as_mut().expect("etcd").kill();
    if long {
        let url = c.controllers[0].url.clone();
        let bearer = c.tokens.admin_bearer();
        let http = c.controller_http();
        wait_until(
            "the controller to step down",
            Duration::from_secs(30),
            || answers_not_leader(&http, &url, &bearer),
        );
        let t = Instant::now();
        let out = c.cli(&["volume", "list"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "volume list succeeded without etcd");
        assert!(err.contains("not the leader"), "unclear error: {err}");
        assert!(
            t.elapsed() < REFUSAL_LIMIT,
            "refusal took {:?}",
            t.elapsed()
        );
    }
    let down = killed.elapsed();
    c.etcd
        .as_mut()
        .expect("etcd")
        .restart()
        .unwrap_or_else(|e| panic!("restart etcd: {e}"));
    let restarted = Instant::now();
    c.wait_leader(Duration::from_secs(30));
    let back = restarted.elapsed();
    println!("{kind} outage: etcd down {down:?}, controller leads {back:?} after etcd is back");
    // Not a lease TTL later: the controller revokes its stale lease (which the restarted
    // etcd renewed, leader key and all) instead of waiting for it to expire.
    assert!(back < RELEAD_LIMIT, "leading again took {back:?}");
    killed
}

/// The operations whose CLI call was running at `at`.
fn in_flight_at(ops: &[Op], at: Instant) -> Vec<&Op> {
    ops.iter()
        .filter(|o| o.started <= at && at <= o.started + o.took)
        .collect()
}

fn describe(op: &Op) -> String {
    let status = if op.ok { "ok" } else { "FAILED" };
    format!("{:?} {status} in {:?}: {}", op.args, op.took, op.stderr)
}

#[test]
fn etcd_killed_and_restarted_mid_operation_controller_finishes_them() {
    let opts = ClusterOptions {
        etcd_controllers: 1,
        ..ClusterOptions::default()
    };
    let mut c = Cluster::start_with("etcd-restart", 3, opts);
    let ops = OpsLoop::new(&c);
    let kills = std::thread::scope(|s| {
        let _stop = StopOnDrop(&ops.stop);
        let worker = s.spawn(|| ops.run());
        let kills: Vec<Instant> = OUTAGES
            .iter()
            .map(|&(verb, long)| outage(&mut c, &ops, verb, long))
            .collect();
        ops.wait_progress(PROGRESS_OPS, "progress after the outages");
        ops.stop.store(true, Ordering::SeqCst);
        worker.join().expect("the operations loop panicked");
        kills
    });
    let ops = ops.ops.into_inner().expect("ops");

    // The operations running when etcd died were finished, not abandoned.
    for (i, kill) in kills.iter().enumerate() {
        let running = in_flight_at(&ops, *kill);
        assert!(
            !running.is_empty(),
            "outage {i}: no operation was in flight"
        );
        for op in running {
            println!("outage {i}: in flight: {}", describe(op));
            assert!(op.ok, "outage {i}: not finished: {}", describe(op));
        }
    }
    // Nothing hung; a refusal is the clear `not_leader` of a controller that stepped down.
    for op in &ops {
        assert!(
            op.took < CLI_CALL_LIMIT,
            "as good as hung: {}",
            describe(op)
        );
        if !op.ok {
            assert!(
                op.stderr.contains("error") && op.stderr.contains("not the leader"),
                "unexpected failure: {}",
                describe(op)
            );
        }
    }
    let failed = ops.iter().filter(|o| !o.ok).count();
    println!(
        "{} operations, {failed} refused while no controller led",
        ops.len()
    );

    // The controller serves again, and the records match the agents one for one.
    c.wait_leader(Duration::from_secs(10));
    assert_volumes_whole(&c);
    assert!(!c.volumes().is_empty(), "the loop left no volume to check");
}
