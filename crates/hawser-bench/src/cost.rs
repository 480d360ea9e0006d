//! What a request costs: CPU time and context switches of the monitored processes (the
//! targets' servers) over one test, divided by the requests fio completed in it.
//!
//! Tests run one target at a time, so a test's cost is the sum over every monitored process:
//! the servers of the other targets sit idle meanwhile (their idle cost, in the processes
//! table, is the noise floor). CPU is utime + stime from /proc/PID/stat, which includes
//! threads that exited. Context switches are counted per thread (/proc/PID/task/*/status),
//! and a thread takes its count with it when it exits (nbdkit runs a thread per connection),
//! so a watcher polls every thread during the test and keeps what it last saw of each: only
//! the switches of a thread's last poll interval before it exits are missed.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{ensure, Context};
use serde::Serialize;

use crate::procstat::parse_cpu_ticks;

/// How often the watcher reads every monitored thread's context switches.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// utime + stime of all of `pid`'s threads so far, in clock ticks.
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat)
}

/// Every monitored process's CPU ticks at one moment (`None`: it is gone).
pub fn cpu_snapshot(pids: &[u32]) -> Vec<Option<u64>> {
    pids.iter().map(|&pid| cpu_ticks(pid).ok()).collect()
}

/// Each live thread of `pid` and its context switches so far.
pub fn thread_switches(pid: u32) -> anyhow::Result<Vec<(u32, u64)>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("list /proc/{pid}/task"))?;
    let mut out = Vec::new();
    for task in tasks {
        let task = task.with_context(|| format!("list /proc/{pid}/task"))?;
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        // A thread may exit between the listing and the read: its last poll counts.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        out.push((tid, parse_ctx_switches(&status)?));
    }
    Ok(out)
}

/// What the watcher knows of one process: per thread, the count at first sight (0 for a
/// thread born after the watch began) and the last count seen.
#[derive(Default)]
struct Threads {
    seen: BTreeMap<u32, (u64, u64)>,
    polls: u64,
    gone: bool,
}

impl Threads {
    fn poll(&mut self, pid: u32) {
        if !self.gone {
            self.record(thread_switches(pid).ok());
        }
    }

    /// One reading of the process's threads (`None`: the process is gone).
    fn record(&mut self, threads: Option<Vec<(u32, u64)>>) {
        let Some(threads) = threads else {
            self.gone = true;
            return;
        };
        let first_poll = self.polls == 0;
        self.polls += 1;
        for (tid, n) in threads {
            let e = self
                .seen
                .entry(tid)
                .or_insert((if first_poll { n } else { 0 }, n));
            e.1 = e.1.max(n);
        }
    }

    fn total(&self) -> Option<u64> {
        (!self.gone || self.polls > 0).then(|| self.seen.values().map(|(a, b)| b - a).sum())
    }
}

/// Polls the context switches of every thread of some processes until stopped.
pub struct Watch {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<Vec<(Option<u64>, bool)>>,
}

impl Watch {
    /// Starts watching `pids` (the first poll happens before this returns).
    pub fn start(pids: Vec<u32>, interval: Duration) -> anyhow::Result<Watch> {
        let mut threads: Vec<Threads> = pids.iter().map(|_| Threads::default()).collect();
        for (t, &pid) in threads.iter_mut().zip(&pids) {
            t.poll(pid);
        }
        let (stop, stopped) = mpsc::channel();
        let handle = thread::Builder::new()
            .name("bench-switches".to_owned())
            .spawn(move || {
                // recv_timeout both paces the polls and wakes at once on stop.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    for (t, &pid) in threads.iter_mut().zip(&pids) {
                        t.poll(pid);
                    }
                }
                for (t, &pid) in threads.iter_mut().zip(&pids) {
                    t.poll(pid);
                }
                threads.iter().map(|t| (t.total(), t.gone)).collect()
            })
            .context("spawn the context switch watcher")?;
        Ok(Watch { stop, handle })
    }

    /// Stops watching: per process, the switches counted (`None`: never seen) and whether it
    /// went away meanwhile.
    pub fn stop(self) -> anyhow::Result<Vec<(Option<u64>, bool)>> {
        let _ = self.stop.send(());
        self.handle
            .join()
            .map_err(|_| anyhow::anyhow!("context switch watcher panicked"))
    }
}

/// voluntary_ctxt_switches + nonvoluntary_ctxt_switches from a /proc status file.
pub fn parse_ctx_switches(status: &str) -> anyhow::Result<u64> {
    let field = |name: &str| -> anyhow::Result<u64> {
        let text = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .with_context(|| format!("find {name} in /proc status"))?;
        text.trim()
            .parse()
            .with_context(|| format!("parse {name} {text:?}"))
    };
    Ok(field("voluntary_ctxt_switches:")? + field("nonvoluntary_ctxt_switches:")?)
}

/// One monitored process's share of a test.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessCost {
    pub name: String,
    pub cpu_secs: f64,
    pub ctx_switches: u64,
}

/// What the monitored processes spent on one test, per request completed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerCost {
    pub cpu_us_per_request: Option<f64>,
    pub ctx_switches_per_request: Option<f64>,
    pub processes: Vec<ProcessCost>,
    /// A monitored process was gone at the start or the end: its share is not counted.
    pub incomplete: bool,
}

/// The cost of one test to the processes `names`: their CPU ticks before and after it, the
/// context switches the watcher counted, over `requests` requests.
pub fn between(
    names: &[String],
    cpu: (&[Option<u64>], &[Option<u64>]),
    switches: &[(Option<u64>, bool)],
    ticks_per_sec: u64,
    requests: u64,
) -> anyhow::Result<ServerCost> {
    let (before, after) = cpu;
    ensure!(
        names.len() == before.len() && names.len() == after.len() && names.len() == switches.len(),
        "readings of {}, {} and {} processes for {} names",
        before.len(),
        after.len(),
        switches.len(),
        names.len()
    );
    ensure!(ticks_per_sec > 0, "zero clock ticks per second");
    let mut incomplete = false;
    let mut processes = Vec::with_capacity(names.len());
    for (((name, b), a), &(ctx, gone)) in names.iter().zip(before).zip(after).zip(switches) {
        let (Some(b), Some(a), Some(ctx), false) = (b, a, ctx, gone) else {
            incomplete = true;
            continue;
        };
        processes.push(ProcessCost {
            name: name.clone(),
            cpu_secs: a.saturating_sub(*b) as f64 / ticks_per_sec as f64,
            ctx_switches: ctx,
        });
    }
    let cpu: f64 = processes.iter().map(|p| p.cpu_secs).sum();
    let ctx: u64 = processes.iter().map(|p| p.ctx_switches).sum();
    let per = |total: f64| (requests > 0).then(|| total / requests as f64);
    Ok(ServerCost {
        cpu_us_per_request: per(cpu * 1e6),
        ctx_switches_per_request: per(ctx as f64),
        processes,
        incomplete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_switches_of_threads_that_exited() {
        let mut t = Threads::default();
        t.record(Some(vec![(1, 10), (2, 5)]));
        // Thread 2 switched 4 times, then exited; thread 3 was born and switched 7 times.
        t.record(Some(vec![(1, 15), (2, 9), (3, 7)]));
        t.record(Some(vec![(1, 16), (3, 7)]));
        assert_eq!(t.total(), Some(6 + 4 + 7));
        t.record(None);
        assert!(t.gone);
        assert_eq!(Threads::default().total(), Some(0));
        let mut never = Threads::default();
        never.record(None);
        assert_eq!(never.total(), None, "a process never seen has no count");
    }

    #[test]
    fn watches_live_processes_and_reports_missing_ones() -> anyhow::Result<()> {
        let me = std::process::id();
        let cpu0 = cpu_ticks(me)?;
        let watch = Watch::start(vec![me, u32::MAX], Duration::from_millis(5))?;
        // This thread blocks once: a switch the watcher's final poll sees.
        thread::spawn(|| ())
            .join()
            .map_err(|_| anyhow::anyhow!("thread panicked"))?;
        let got = watch.stop()?;
        assert!(matches!(got[0], (Some(_), false)), "{got:?}");
        assert_eq!(got[1], (None, true), "no such process");
        assert!(thread_switches(me)?.iter().any(|&(tid, _)| tid == me));
        assert!(cpu_ticks(me)? >= cpu0);
        assert!(cpu_ticks(u32::MAX).is_err());
        Ok(())
    }

    #[test]
    fn parses_context_switches_and_rejects_junk() -> anyhow::Result<()> {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t150\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(parse_ctx_switches(status)?, 157);
        assert!(parse_ctx_switches("voluntary_ctxt_switches:\t1\n").is_err());
        assert!(parse_ctx_switches(
            "voluntary_ctxt_switches:\tmany\nnonvoluntary_ctxt_switches:\t1\n"
        )
        .is_err());
        Ok(())
    }

    #[test]
    fn sums_the_processes_and_divides_by_requests() -> anyhow::Result<()> {
        let names = ["b1".to_owned(), "b2".to_owned(), "gone".to_owned()];
        let before = [Some(100), Some(50), None];
        let after = [Some(130), Some(60), Some(1)];
        let switches = [(Some(1_500), false), (Some(500), false), (Some(9), false)];
        // 30 + 10 ticks at 100 Hz = 0.4 s over 10,000 requests = 40 us each.
        let cost = between(&names, (&before, &after), &switches, 100, 10_000)?;
        let us = cost.cpu_us_per_request.expect("requests were made");
        assert!((us - 40.0).abs() < 1e-9, "{cost:?}");
        assert_eq!(cost.ctx_switches_per_request, Some(0.2));
        assert_eq!(cost.processes.len(), 2);
        assert!(
            cost.incomplete,
            "a process missing from a reading is flagged"
        );
        let exited = [(Some(1), false), (Some(1), true), (Some(1), false)];
        let cost = between(
            &names[..2],
            (&before[..2], &after[..2]),
            &exited[..2],
            100,
            1,
        )?;
        assert!(cost.incomplete, "a process that exited mid-test is flagged");
        let one = (&before[..1], &after[..1]);
        let none = between(&names[..1], one, &switches[..1], 100, 0)?;
        assert_eq!(none.cpu_us_per_request, None, "no requests, no ratio");
        assert!(between(&names, (&before[..1], &after), &switches, 100, 1).is_err());
        assert!(between(&names[..1], one, &switches[..1], 0, 1).is_err());
        Ok(())
    }
}
