//! What attached idle volumes cost their node (issue 44), for `make bench` (ignored by `make
//! test`: it measures): a three-node cluster, then 10, 100 and 1,000 two-replica volumes
//! attached on n1 (`HAWSER_IDLE_VOLUMES` sets the steps), and at each step the CPU and RSS
//! of every agent and the controller over a quiet window. Target: 1,000 on one agent at
//! ≤ 5% of a core and ≤ 128 MiB RSS.
//!
//! With `HAWSER_IDLE_SPREAD=1` the volumes are attached on n1, n2 and n3 in turn instead
//! (the "1,000 volumes spread over three nodes").
//!
//! Prints one `idle:` line per step; `make bench` greps them, and with
//! `HAWSER_BENCH_FIGURES` they are appended there too, for its charts.

use std::io::Write;
use std::time::{Duration, Instant};

use hawser_bench::cluster_figures::{self, Figure, IdleFigure, ProcessCost};
use hawser_e2e::run::cpu_ticks;
use hawser_e2e::Cluster;
use serde_json::json;

/// Each step waits this long before it measures: attaches end with background work (crash
/// recovery's resync, the journal's first save).
const SETTLE: Duration = Duration::from_secs(10);
/// How long each step measures.
const WINDOW: Duration = Duration::from_secs(20);

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn steps() -> Vec<usize> {
    std::env::var("HAWSER_IDLE_VOLUMES")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("HAWSER_IDLE_VOLUMES: counts, comma-separated")
        })
        .collect()
}

#[test]
#[ignore = "a measurement for make bench"]
fn idle_cost_of_attached_volumes() {
    let c = Cluster::start("idlevolumes", 3);
    let http = c.controller_http();
    let url = c.controllers[0].url.clone();
    let bearer = c.tokens.admin_bearer();
    let post = |path: &str, body: serde_json::Value| {
        let r = http
            .post(format!("{url}{path}"))
            .header("authorization", &bearer)
            .json(&body)
            .send()
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status();
        let text = r.text().unwrap_or_default();
        assert!(status.is_success(), "POST {path}: {status}: {text}");
    };
    let mut pids: Vec<(String, u32)> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| (n.to_string(), c.agent(n).child.id()))
        .collect();
    pids.push(("controller".into(), c.controllers[0].child.id()));
    let spread = std::env::var("HAWSER_IDLE_SPREAD").is_ok_and(|v| v == "1");
    let engine_node = |i: usize| {
        if spread {
            ["n1", "n2", "n3"][i % 3]
        } else {
            "n1"
        }
    };
    let mut attached = 0usize;
    for want in steps() {
        let t = Instant::now();
        while attached < want {
            let name = format!("idle{attached}");
            post(
                "/v1/volumes",
                json!({"name": name, "size_bytes": 64u64 << 20, "replicas": 2}),
            );
            let node = engine_node(attached);
            post(&format!("/v1/volumes/{name}/attach"), json!({"node": node}));
            attached += 1;
        }
        let made = t.elapsed();
        std::thread::sleep(SETTLE);
        let before: Vec<u64> = pids.iter().map(|(_, p)| cpu_ticks(*p)).collect();
        let t = Instant::now();
        std::thread::sleep(WINDOW);
        let secs = t.elapsed().as_secs_f64();
        let mut line = format!(
            "idle: {attached} volumes attached on {} (2 replicas each; the last {} in {:.0?}):",
            if spread {
                "n1, n2 and n3 in turn"
            } else {
                "n1"
            },
            attached.min(want),
            made
        );
        let mut processes = Vec::new();
        for ((name, pid), b) in pids.iter().zip(&before) {
            let ticks = cpu_ticks(*pid).saturating_sub(*b);
            // Ticks are hundredths of a second: ticks / secs is percent of one core.
            #[allow(clippy::cast_precision_loss)]
            let cost = ProcessCost {
                name: name.clone(),
                cpu_pct: ticks as f64 / secs,
                rss_mib: hawser_e2e::run::rss_kib(*pid) / 1024,
                fds: open_fds(*pid) as u64,
                threads: threads(*pid),
            };
            line.push_str(&format!(
                " {name} {:.1}% of a core, {} MiB RSS, {} fds, {} threads;",
                cost.cpu_pct, cost.rss_mib, cost.fds, cost.threads
            ));
            processes.push(cost);
        }
        println!("{line}");
        let _ = std::io::stdout().flush();
        let figure = Figure::Idle(IdleFigure {
            volumes: attached as u64,
            spread,
            processes,
        });
        cluster_figures::record(&figure).expect("record the figure for make bench's charts");
    }
    // For a profiler: `HAWSER_IDLE_HOLD=SECS` keeps the cluster up that long after the last
    // step, with the processes' pids printed.
    if let Some(hold) = std::env::var("HAWSER_IDLE_HOLD")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        println!("idle-hold: {pids:?} for {hold} s");
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_secs(hold));
    }
    // Every volume is still attached where it was: a step that measured fewer would say
    // nothing.
    let vols = c.volumes();
    let still = (0..attached)
        .filter(|i| {
            let name = format!("idle{i}");
            vols.iter()
                .any(|v| v.name == name && v.attached_node.as_deref() == Some(engine_node(*i)))
        })
        .count();
    assert_eq!(
        still, attached,
        "volumes still attached where they were at the end"
    );
}
