//! kill -9 of the leading controller during a loop of 100 volume creates and deletes (two
//! controllers on a real etcd, three agents). The other controller takes over; the loop
//! goes on through it; afterwards every volume either exists fully or not at all, and no
//! agent holds a replica, or a replica file, that no volume references.
//!
//! To kill the leader in the middle of a create, not before or after it, two agents are
//! paused (SIGSTOP) under one create: at least one of its two replicas is on a paused agent,
//! so the create is stuck after recording the volume `Creating`. The leader is killed
//! there, then the agents resume and carry out the dead leader's late `create replica`: the
//! new leader must roll the create back and delete that orphan by itself (`reconcile.rs`).
//! Fails if `etcd` is not installed.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hawser_e2e::cluster::hawser_bin;
use hawser_e2e::{wait_until, wait_volumes_whole, Cluster, ClusterOptions};

const ITERATIONS: usize = 100;
/// The leader is killed under the create of this iteration.
const KILL_AT: usize = 30;
/// Longest any CLI call may take: a clear error or success, never a hang.
const CLI_CALL_LIMIT: Duration = Duration::from_secs(60);
/// Pause of the loop after a refused call (a client backing off during the takeover).
const REFUSED_PAUSE: Duration = Duration::from_millis(250);
/// How long the new leader may take to repair what the kill left: a term's first
/// reconcile round comes within a second or two of taking over.
const REPAIR_LIMIT: Duration = Duration::from_secs(30);

struct Call {
    args: Vec<String>,
    started: Instant,
    took: Duration,
    ok: bool,
    stderr: String,
}

/// The create / delete loop, on a thread of its own.
struct CreateDeleteLoop {
    url: String,
    /// The admin token file the CLI reads.
    token_file: std::path::PathBuf,
    ca_file: std::path::PathBuf,
    iteration: AtomicUsize,
    /// Set by the loop when it reaches [`KILL_AT`]; it waits there for `go`.
    at_kill: AtomicBool,
    go: AtomicBool,
    calls: Mutex<Vec<Call>>,
}

impl CreateDeleteLoop {
    fn run(&self) {
        for i in 0..ITERATIONS {
            self.iteration.store(i, Ordering::SeqCst);
            let v = format!("v{i}");
            if i == KILL_AT {
                self.at_kill.store(true, Ordering::SeqCst);
                wait_until("the go for the kill", Duration::from_secs(60), || {
                    self.go.load(Ordering::SeqCst)
                });
            }
            let created = self.cli(&["volume", "create", &v, "--size", "16MiB", "--replicas", "2"]);
            // Deleted even when the create failed: its fate may be unknown (the kill).
            let deleted = self.cli(&["volume", "delete", &v]);
            if !created || !deleted {
                std::thread::sleep(REFUSED_PAUSE);
            }
        }
        self.iteration.store(ITERATIONS, Ordering::SeqCst);
    }

    fn cli(&self, args: &[&str]) -> bool {
        let started = Instant::now();
        let out = Command::new(hawser_bin())
            .env("HAWSER_CONTROLLER", &self.url)
            .env("HAWSER_TOKEN_FILE", &self.token_file)
            .env("HAWSER_CA_FILE", &self.ca_file)
            .args(args)
            .output()
            .expect("run hawser");
        let call = Call {
            args: args.iter().map(|a| a.to_string()).collect(),
            started,
            took: started.elapsed(),
            ok: out.status.success(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        };
        let ok = call.ok;
        self.calls.lock().expect("calls").push(call);
        ok
    }
}

fn describe(c: &Call) -> String {
    let status = if c.ok { "ok" } else { "FAILED" };
    format!("{:?} {status} in {:?}: {}", c.args, c.took, c.stderr)
}

#[test]
fn leader_killed_during_create_delete_loop_leaves_whole_volumes_and_no_orphans() {
    let opts = ClusterOptions {
        etcd_controllers: 2,
        ..ClusterOptions::default()
    };
    let mut c = Cluster::start_with("leader-kill-loop", 3, opts);
    let first = c.wait_leader(Duration::from_secs(20));
    let ops = CreateDeleteLoop {
        url: c.url.clone(),
        token_file: c.tokens.admin.clone(),
        ca_file: c.tokens.ca_file.clone(),
        iteration: AtomicUsize::new(0),
        at_kill: AtomicBool::new(false),
        go: AtomicBool::new(false),
        calls: Mutex::new(Vec::new()),
    };
    let (killed, second) = std::thread::scope(|s| {
        let worker = s.spawn(|| ops.run());
        wait_until(
            &format!("iteration {KILL_AT}"),
            Duration::from_secs(120),
            || ops.at_kill.load(Ordering::SeqCst),
        );
        c.pause_agent("n2");
        c.pause_agent("n3");
        ops.go.store(true, Ordering::SeqCst);
        let v = format!("v{KILL_AT}");
        wait_until(
            &format!("{v} recorded Creating"),
            Duration::from_secs(30),
            || {
                let out = c.cli(&["volume", "show", &v, "-o", "json"]);
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("creating")
            },
        );
        let killed = Instant::now();
        c.kill_controller(first);
        c.resume_agent("n2");
        c.resume_agent("n3");
        let second = c.wait_leader(Duration::from_secs(15));
        println!(
            "takeover after kill -9 of the leader: {:?}",
            killed.elapsed()
        );
        worker.join().expect("the loop panicked");
        (killed, second)
    });
    assert_ne!(first, second);
    let calls = ops.calls.into_inner().expect("calls");
    for call in calls
        .iter()
        .filter(|k| k.started <= killed && killed <= k.started + k.took)
    {
        println!("in flight at the kill: {}", describe(call));
    }
    for call in &calls {
        assert!(
            call.took < CLI_CALL_LIMIT,
            "as good as hung: {}",
            describe(call)
        );
        assert!(
            call.ok || call.stderr.contains("error"),
            "unclear failure: {}",
            describe(call)
        );
    }
    let ok = calls.iter().filter(|k| k.ok).count();
    println!("{} calls, {ok} succeeded", calls.len());
    assert!(
        calls.iter().rev().take(10).all(|k| k.ok),
        "the loop did not recover after the takeover"
    );

    wait_volumes_whole(&c, REPAIR_LIMIT);
    let log = c.log(&c.controllers[second].name);
    println!(
        "new leader's repairs: {}",
        log.lines()
            .filter(|l| l.contains("cleaned up") || l.contains("orphan"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
