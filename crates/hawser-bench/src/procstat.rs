//! Samples the RSS and CPU time of processes from /proc on a background thread, so a bench
//! run can report what a target's server costs in memory and CPU, idle and under load.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde::Serialize;

/// Time between samples: fine enough to catch an RSS peak that lasts a test, coarse enough to
/// cost nothing next to fio.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// One reading of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcSample {
    pub rss_bytes: u64,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
}

/// Reads /proc/PID/status and /proc/PID/stat.
pub fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    Ok(ProcSample {
        rss_bytes: parse_vm_rss_bytes(&status)?,
        cpu_ticks: parse_cpu_ticks(&stat)?,
    })
}

/// VmRSS from /proc/PID/status, which the kernel prints in kB (KiB).
pub fn parse_vm_rss_bytes(status: &str) -> anyhow::Result<u64> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("find VmRSS in /proc status (kernel threads have none)")?;
    let mut fields = line.split_whitespace();
    let kib: u64 = fields
        .next()
        .context("read VmRSS value")?
        .parse()
        .context("parse VmRSS")?;
    let unit = fields.next().unwrap_or("kB");
    ensure!(unit == "kB", "unexpected VmRSS unit {unit:?}");
    kib.checked_mul(1024).context("VmRSS overflows u64 bytes")
}

/// utime + stime (fields 14 and 15) from /proc/PID/stat. The command name (field 2) is in
/// parentheses and may itself contain spaces and ')', so fields are counted from the last ')'.
pub fn parse_cpu_ticks(stat: &str) -> anyhow::Result<u64> {
    let (_, rest) = stat
        .rsplit_once(')')
        .context("find the end of comm in /proc stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state), so field N is at index N - 3.
    let field = |n: usize| -> anyhow::Result<u64> {
        let text = fields
            .get(n - 3)
            .with_context(|| format!("find field {n} in /proc stat"))?;
        text.parse()
            .with_context(|| format!("parse field {n} of /proc stat: {text:?}"))
    };
    Ok(field(14)? + field(15)?)
}

/// Clock ticks per second, the unit of /proc/PID/stat times.
pub fn clock_ticks_per_sec() -> anyhow::Result<u64> {
    // SAFETY: sysconf only reads its integer argument.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz)
        .ok()
        .filter(|&hz| hz > 0)
        .context("read sysconf(_SC_CLK_TCK)")
}

/// What one process did during one sampling phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseStats {
    pub secs: f64,
    pub samples: u64,
    /// CPU time over wall time, in percent of one core (as top shows it).
    pub cpu_percent: Option<f64>,
    pub rss_mean_bytes: Option<u64>,
    pub rss_peak_bytes: Option<u64>,
    /// The process went away before the phase ended; numbers cover the time it was there.
    pub exited: bool,
}

/// Samples a set of processes every `SAMPLE_INTERVAL` until stopped.
pub struct Sampler {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<Vec<PhaseStats>>,
}

impl Sampler {
    /// Starts sampling `pids`; results come back from `stop` in the same order.
    pub fn start(pids: Vec<u32>, interval: Duration) -> anyhow::Result<Sampler> {
        let hz = clock_ticks_per_sec()?;
        let (stop, stopped) = mpsc::channel();
        let handle = thread::Builder::new()
            .name("bench-procstat".to_owned())
            .spawn(move || {
                let mut trackers: Vec<Tracker> = pids.into_iter().map(Tracker::new).collect();
                // recv_timeout both paces the samples and wakes at once on stop.
                loop {
                    trackers.iter_mut().for_each(Tracker::sample);
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => continue,
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                // A last sample makes the phase end when `stop` was called.
                trackers.iter_mut().for_each(Tracker::sample);
                trackers.into_iter().map(|t| t.finish(hz)).collect()
            })
            .context("spawn the procstat sampler thread")?;
        Ok(Sampler { stop, handle })
    }

    /// Stops sampling and returns each process's stats.
    pub fn stop(self) -> anyhow::Result<Vec<PhaseStats>> {
        // A send error means the thread is already gone; join reports why.
        let _ = self.stop.send(());
        self.handle
            .join()
            .map_err(|_| anyhow::anyhow!("procstat sampler thread panicked"))
    }
}

struct Tracker {
    pid: u32,
    first: Option<(Instant, u64)>,
    last: Option<(Instant, u64)>,
    rss_sum: u128,
    samples: u64,
    rss_peak: u64,
    exited: bool,
}

impl Tracker {
    fn new(pid: u32) -> Tracker {
        Tracker {
            pid,
            first: None,
            last: None,
            rss_sum: 0,
            samples: 0,
            rss_peak: 0,
            exited: false,
        }
    }

    fn sample(&mut self) {
        if self.exited {
            return;
        }
        let Ok(s) = sample(self.pid) else {
            self.exited = true;
            return;
        };
        let now = Instant::now();
        self.first.get_or_insert((now, s.cpu_ticks));
        self.last = Some((now, s.cpu_ticks));
        self.rss_sum += u128::from(s.rss_bytes);
        self.samples += 1;
        self.rss_peak = self.rss_peak.max(s.rss_bytes);
    }

    fn finish(self, hz: u64) -> PhaseStats {
        let window = self.first.zip(self.last).map(|((t0, c0), (t1, c1))| {
            let secs = t1.duration_since(t0).as_secs_f64();
            (secs, c1.saturating_sub(c0) as f64 / hz as f64)
        });
        let mean = (self.samples > 0)
            .then(|| u64::try_from(self.rss_sum / u128::from(self.samples)).unwrap_or(u64::MAX));
        PhaseStats {
            secs: window.map_or(0.0, |(secs, _)| secs),
            samples: self.samples,
            cpu_percent: window
                .filter(|(secs, _)| *secs > 0.0)
                .map(|(s, cpu)| cpu / s * 100.0),
            rss_mean_bytes: mean,
            rss_peak_bytes: (self.samples > 0).then_some(self.rss_peak),
            exited: self.exited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_proc_self() -> anyhow::Result<()> {
        let s = sample(std::process::id())?;
        // A running test binary has megabytes resident, and a few MiB bounds nothing real.
        assert!(s.rss_bytes > 1 << 20, "{s:?}");
        assert!(s.rss_bytes % 1024 == 0);
        let status = std::fs::read_to_string("/proc/self/status")?;
        assert!(parse_vm_rss_bytes(&status)? > 0);
        let stat = std::fs::read_to_string("/proc/self/stat")?;
        parse_cpu_ticks(&stat)?;
        assert!(clock_ticks_per_sec()? >= 1);
        Ok(())
    }

    #[test]
    fn parses_tricky_comm_and_rejects_junk() -> anyhow::Result<()> {
        // comm "a) b (c" with spaces and parens; utime=7, stime=5.
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 9 1 2";
        assert_eq!(parse_cpu_ticks(stat)?, 12);
        assert!(parse_cpu_ticks("42 (x) S 1 2").is_err());
        assert!(parse_cpu_ticks("no parens").is_err());
        assert_eq!(
            parse_vm_rss_bytes("Name:\tx\nVmRSS:\t    1234 kB\n")?,
            1234 * 1024
        );
        assert!(parse_vm_rss_bytes("Name:\tkthreadd\n").is_err());
        assert!(parse_vm_rss_bytes("VmRSS:\tlots kB\n").is_err());
        Ok(())
    }

    #[test]
    fn sampler_reports_own_process_and_flags_a_dead_one() -> anyhow::Result<()> {
        let mut child = std::process::Command::new("true").spawn()?;
        let dead = child.id();
        child.wait()?;
        let sampler = Sampler::start(vec![std::process::id(), dead], Duration::from_millis(10))?;
        // Burn a little CPU so the percentage has something to measure.
        let end = Instant::now() + Duration::from_millis(100);
        let mut spins = 0u64;
        while Instant::now() < end {
            spins = spins.wrapping_add(1);
        }
        let stats = sampler.stop()?;
        assert!(spins > 0);
        assert_eq!(stats.len(), 2);
        let me = &stats[0];
        assert!(me.samples >= 2 && !me.exited, "{me:?}");
        assert!(me.rss_peak_bytes >= me.rss_mean_bytes && me.rss_mean_bytes > Some(0));
        assert!(me.cpu_percent.is_some_and(|p| p > 0.0), "{me:?}");
        assert!(stats[1].exited && stats[1].samples == 0, "{:?}", stats[1]);
        Ok(())
    }
}
