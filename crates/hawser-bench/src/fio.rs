//! fio as a subprocess: the command line of each test and of the prefill, running it under a
//! deadline, and reading the numbers out of `--output-format=json`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::suite::{Direction, TestDef};
use crate::target::TargetSpec;

/// How often a running fio is checked for exit; the cost is at most this much per test.
const WAIT_POLL: Duration = Duration::from_millis(50);
/// Lines of fio's stderr quoted in an error.
const STDERR_TAIL_LINES: usize = 20;
/// Block size and queue depth of the prefill pass.
const PREFILL_BLOCK_SIZE: &str = "1M";
const PREFILL_IODEPTH: u32 = 16;

/// One fio invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FioCommand {
    pub program: String,
    pub args: Vec<String>,
}

impl FioCommand {
    /// Program and arguments, as recorded in the JSON report.
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.clone())
            .chain(self.args.iter().cloned())
            .collect()
    }
}

/// The fio command of one standard test on one target.
pub fn test_command(
    fio: &str,
    test: &TestDef,
    target: &TargetSpec,
    size_bytes: u64,
    runtime_secs: u64,
) -> FioCommand {
    let mut args = vec![
        format!("--name={}", test.name),
        "--output-format=json".to_owned(),
    ];
    args.extend(target.fio_args());
    args.extend([
        "--direct=1".to_owned(),
        // Fresh random offsets each run, so a cache warmed by the previous run is not re-hit.
        "--randrepeat=0".to_owned(),
        format!("--size={size_bytes}"),
        format!("--runtime={runtime_secs}"),
        "--time_based=1".to_owned(),
        format!("--rw={}", test.rw),
        format!("--bs={}", test.block_size),
        format!("--iodepth={}", test.iodepth),
    ]);
    if test.numjobs > 1 {
        args.push(format!("--numjobs={}", test.numjobs));
        args.push("--group_reporting=1".to_owned());
    }
    if test.fsync {
        args.push("--fsync=1".to_owned());
    }
    FioCommand {
        program: fio.to_owned(),
        args,
    }
}

/// The fio command that writes the whole region once. fio's default buffers are random, so
/// a target that skips zero writes still allocates every block.
pub fn prefill_command(fio: &str, target: &TargetSpec, size_bytes: u64) -> FioCommand {
    let mut args = vec![
        "--name=prefill".to_owned(),
        "--output-format=json".to_owned(),
    ];
    args.extend(target.fio_args());
    args.extend([
        "--direct=1".to_owned(),
        format!("--size={size_bytes}"),
        "--rw=write".to_owned(),
        format!("--bs={PREFILL_BLOCK_SIZE}"),
        format!("--iodepth={PREFILL_IODEPTH}"),
    ]);
    FioCommand {
        program: fio.to_owned(),
        args,
    }
}

/// fio's numbers for one test, summed over its jobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    pub iops: f64,
    pub bw_bytes_per_sec: f64,
    /// Mean submission-to-completion latency of the data I/Os.
    pub lat_mean_ns: f64,
    /// Mean latency of the flushes `--fsync=1` adds, which `lat_mean_ns` leaves out.
    pub sync_lat_mean_ns: Option<f64>,
    /// Completion-latency percentiles of the data I/Os; `None` when fio printed none.
    pub clat_percentiles_ns: Option<Percentiles>,
    /// Requests completed: the data I/Os plus the flushes `--fsync=1` adds.
    pub requests: u64,
    /// What fio itself (the client) spent: CPU seconds (user + system) and context switches.
    pub client_cpu_secs: f64,
    pub client_ctx_switches: u64,
}

/// Completion-latency (`clat`) percentiles: the ones of fio's default `percentile_list`
/// that tell the typical request (p50) from the tail (p99, p99.9). fio times percentiles on
/// completion latency only unless told otherwise, so they leave out submission time, which
/// the mean latency (`lat`) includes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p99_9: f64,
}

impl Percentiles {
    /// The same percentiles in another unit, e.g. `scaled(1e-3)` for ns to us.
    pub fn scaled(self, factor: f64) -> Percentiles {
        Percentiles {
            p50: self.p50 * factor,
            p99: self.p99 * factor,
            p99_9: self.p99_9 * factor,
        }
    }

    /// Each percentile the larger of the two.
    fn max(self, other: Percentiles) -> Percentiles {
        Percentiles {
            p50: self.p50.max(other.p50),
            p99: self.p99.max(other.p99),
            p99_9: self.p99_9.max(other.p99_9),
        }
    }

    /// Reads fio's `"percentile": {"50.000000": 102912, ...}`; `None` unless all three are
    /// there.
    fn from_fio(map: &Value) -> Option<Percentiles> {
        let map = map.as_object()?;
        let at = |wanted: f64| {
            map.iter()
                .find(|(k, _)| k.parse::<f64>().is_ok_and(|p| (p - wanted).abs() < 1e-6))
                .and_then(|(_, v)| v.as_f64())
        };
        Some(Percentiles {
            p50: at(50.0)?,
            p99: at(99.0)?,
            p99_9: at(99.9)?,
        })
    }
}

/// Runs `cmd`, killing it after `deadline`, and parses its JSON for `direction`. Errors carry
/// the tail of fio's stderr.
pub fn measure(
    cmd: &FioCommand,
    direction: Direction,
    deadline: Duration,
) -> anyhow::Result<Measurement> {
    let output = execute(cmd, deadline)?;
    parse_output(&output.stdout, direction).with_context(|| {
        format!(
            "read fio's JSON; fio stderr tail:\n{}",
            tail(&output.stderr)
        )
    })
}

/// `fio --version`, e.g. `fio-3.33`; also proves fio can be started at all.
pub fn version(fio: &str) -> anyhow::Result<String> {
    let out = Command::new(fio)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run `{fio} --version` (is fio installed?)"))?;
    ensure!(
        out.status.success(),
        "`{fio} --version` exited with {}",
        out.status
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

struct FioOutput {
    stdout: String,
    stderr: String,
}

fn execute(cmd: &FioCommand, deadline: Duration) -> anyhow::Result<FioOutput> {
    let mut child = Command::new(&cmd.program)
        .args(&cmd.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // fio forks a process per job; its own group lets a deadline kill all of them. The
        // price: a Ctrl-C on the terminal reaches only us, and fio ends at its runtime.
        .process_group(0)
        .spawn()
        .with_context(|| format!("start {}", cmd.program))?;
    let stdout = spawn_reader(child.stdout.take());
    let stderr = spawn_reader(child.stderr.take());
    let status = wait_with_deadline(&mut child, deadline)?;
    let output = FioOutput {
        stdout: join_reader(stdout),
        stderr: join_reader(stderr),
    };
    match status {
        None => bail!(
            "fio did not finish within {} s and was killed; stderr tail:\n{}",
            deadline.as_secs(),
            tail(&output.stderr)
        ),
        Some(status) if !status.success() => {
            bail!(
                "fio exited with {status}; stderr tail:\n{}",
                tail(&output.stderr)
            )
        }
        Some(_) => Ok(output),
    }
}

/// Waits for `child`; past `deadline` kills its process group and returns `None`.
fn wait_with_deadline(child: &mut Child, deadline: Duration) -> anyhow::Result<Option<ExitStatus>> {
    let end = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().context("wait for fio")? {
            return Ok(Some(status));
        }
        if Instant::now() >= end {
            let pgid = i32::try_from(child.id()).context("convert fio pid")?;
            // SAFETY: kill(2) takes plain integers and touches no memory of ours. The group
            // is fio's own (process_group(0)), and fio is not yet reaped, so the id is ours.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            child.wait().context("reap killed fio")?;
            return Ok(None);
        }
        thread::sleep(WAIT_POLL);
    }
}

type Reader = Option<thread::JoinHandle<String>>;

/// Drains a pipe on its own thread so fio never blocks on a full pipe while we wait.
fn spawn_reader(pipe: Option<impl Read + Send + 'static>) -> Reader {
    pipe.map(|mut pipe| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            // A read error leaves what was read; the exit status reports the failure.
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    })
}

fn join_reader(reader: Reader) -> String {
    reader.and_then(|h| h.join().ok()).unwrap_or_default()
}

/// The last lines of fio's stderr, or a note that it was empty.
fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    if lines.is_empty() {
        return "(empty)".to_owned();
    }
    lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n")
}

/// Parses fio's JSON output. Engines may print lines before the JSON (the nbd engine prints
/// "fio: connected to NBD server"), so parsing starts at the first line that opens an object.
pub fn parse_output(stdout: &str, direction: Direction) -> anyhow::Result<Measurement> {
    let start = json_start(stdout).context("find the JSON object in fio's output")?;
    let root: Value = serde_json::Deserializer::from_str(&stdout[start..])
        .into_iter()
        .next()
        .context("fio printed no JSON")?
        .context("parse fio's JSON")?;
    let jobs = root
        .get("jobs")
        .and_then(Value::as_array)
        .filter(|jobs| !jobs.is_empty())
        .context("fio JSON has no jobs[]")?;
    let mut totals = JobTotals::default();
    for (i, job) in jobs.iter().enumerate() {
        totals.add(i, job, direction.json_key())?;
    }
    totals.finish(direction.json_key())
}

/// Sums per-job entries. With group_reporting there is one; without, one per job: throughput
/// adds up, and each job's mean latency is weighted by its I/O count. Percentiles cannot be
/// combined from per-job percentiles, so each is the largest over the jobs: an upper bound of
/// the combined one (no job has more than 1% of its I/Os above its own p99, so neither has
/// the whole), exact under group_reporting, which every multi-job standard test uses.
#[derive(Default)]
struct JobTotals {
    requests: u64,
    client_cpu_secs: f64,
    client_ctx_switches: u64,
    iops: f64,
    bw_bytes_per_sec: f64,
    lat_weighted: f64,
    lat_count: f64,
    sync_weighted: f64,
    sync_count: f64,
    clat: Option<Percentiles>,
    /// A job printed no percentiles: then none are reported, as a partial max would flatter.
    clat_missing: bool,
}

impl JobTotals {
    fn add(&mut self, i: usize, job: &Value, key: &str) -> anyhow::Result<()> {
        let error = job.get("error").and_then(Value::as_i64).unwrap_or(0);
        ensure!(error == 0, "fio job jobs[{i}] reported error {error}");
        let dir = job
            .get(key)
            .with_context(|| format!("fio JSON has no jobs[{i}].{key}"))?;
        let number = |path: &[&str]| -> anyhow::Result<f64> {
            let found = path.iter().try_fold(dir, |v, k| v.get(k));
            found.and_then(Value::as_f64).with_context(|| {
                format!(
                    "fio JSON has no number at jobs[{i}].{key}.{}",
                    path.join(".")
                )
            })
        };
        self.iops += number(&["iops"])?;
        self.bw_bytes_per_sec += number(&["bw_bytes"])?;
        let mean = number(&["lat_ns", "mean"])?;
        let n = number(&["lat_ns", "N"]).unwrap_or(1.0);
        self.lat_weighted += mean * n;
        self.lat_count += n;
        match dir
            .get("clat_ns")
            .and_then(|c| c.get("percentile"))
            .and_then(Percentiles::from_fio)
        {
            Some(p) => self.clat = Some(self.clat.map_or(p, |c| c.max(p))),
            None => self.clat_missing = true,
        }
        let count = |path: &[&str]| path.iter().try_fold(dir, |v, k| v.get(k))?.as_u64();
        self.requests += count(&["total_ios"])
            .or_else(|| count(&["lat_ns", "N"]))
            .unwrap_or(0);
        // usr_cpu and sys_cpu are percentages of job_runtime (milliseconds; summed over the
        // jobs under group_reporting); older fio lacks job_runtime, and then counts nothing.
        let job_number = |k: &str| job.get(k).and_then(Value::as_f64);
        let cpu_percent =
            job_number("usr_cpu").unwrap_or(0.0) + job_number("sys_cpu").unwrap_or(0.0);
        let runtime_secs = job_number("job_runtime").unwrap_or(0.0) / 1000.0;
        self.client_cpu_secs += cpu_percent / 100.0 * runtime_secs;
        self.client_ctx_switches += job.get("ctx").and_then(Value::as_u64).unwrap_or(0);
        // Only present (and non-empty) when the job flushed: fsync=1 on writes.
        let sync = job.get("sync").and_then(|s| s.get("lat_ns"));
        let sync_mean = sync.and_then(|l| l.get("mean")).and_then(Value::as_f64);
        let sync_n = sync
            .and_then(|l| l.get("N"))
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        if let Some(mean) = sync_mean.filter(|_| sync_n > 0.0) {
            self.sync_weighted += mean * sync_n;
            self.sync_count += sync_n;
            self.requests += sync
                .and_then(|l| l.get("N"))
                .and_then(Value::as_u64)
                .unwrap_or(0);
        }
        Ok(())
    }

    fn finish(self, key: &str) -> anyhow::Result<Measurement> {
        // Zero I/O would make every ratio against this run meaningless.
        ensure!(self.iops > 0.0, "fio completed no {key} I/O");
        Ok(Measurement {
            iops: self.iops,
            bw_bytes_per_sec: self.bw_bytes_per_sec,
            lat_mean_ns: if self.lat_count > 0.0 {
                self.lat_weighted / self.lat_count
            } else {
                0.0
            },
            sync_lat_mean_ns: (self.sync_count > 0.0).then(|| self.sync_weighted / self.sync_count),
            clat_percentiles_ns: self.clat.filter(|_| !self.clat_missing),
            requests: self.requests,
            client_cpu_secs: self.client_cpu_secs,
            client_ctx_switches: self.client_ctx_switches,
        })
    }
}

fn json_start(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with('{') {
            return Some(offset);
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{by_name, STANDARD};

    const JOBS4: &str = include_str!("../testdata/libaio_randwrite_jobs4.json");
    const NBD_FSYNC: &str = include_str!("../testdata/nbd_randwrite_fsync.txt");
    const UNGROUPED: &str = include_str!("../testdata/libaio_read_jobs2_ungrouped.json");
    /// Untrimmed fio 3.33 output of two ungrouped 4k randread jobs, with `clat_ns` percentiles.
    const PERCENTILES: &str = include_str!("../testdata/libaio_randread_jobs2_percentiles.json");

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn parses_group_reported_jobs() -> anyhow::Result<()> {
        let m = parse_output(JOBS4, Direction::Write)?;
        assert!(close(m.iops, 143253.240279), "{m:?}");
        assert!(close(m.bw_bytes_per_sec, 586765272.0), "{m:?}");
        assert!(close(m.lat_mean_ns, 3554077.881788), "{m:?}");
        assert_eq!(m.sync_lat_mean_ns, None);
        assert_eq!(m.requests, 143683);
        // 20.754246 % of 4,004 ms (four jobs of about 1 s, group reported).
        assert!(close(m.client_cpu_secs, 0.20754246 * 4.004), "{m:?}");
        assert_eq!(m.client_ctx_switches, 3836);
        let err = parse_output(JOBS4, Direction::Read).expect_err("no reads happened");
        assert!(err.to_string().contains("no read I/O"), "{err}");
        Ok(())
    }

    #[test]
    fn skips_engine_chatter_and_reads_sync_latency() -> anyhow::Result<()> {
        assert!(NBD_FSYNC.starts_with("fio: connected to NBD server\n"));
        let m = parse_output(NBD_FSYNC, Direction::Write)?;
        assert!(close(m.iops, 598.401598), "{m:?}");
        assert!(close(m.lat_mean_ns, 85378.33389), "{m:?}");
        let sync = m.sync_lat_mean_ns.expect("fsync=1 reports flush latency");
        assert!(close(sync, 1577214.307179), "{m:?}");
        assert_eq!(m.requests, 599 * 2, "each write and its flush are requests");
        assert!(close(m.client_cpu_secs, 0.041), "{m:?}");
        assert_eq!(m.client_ctx_switches, 1284);
        Ok(())
    }

    #[test]
    fn sums_ungrouped_jobs_and_weights_latency() -> anyhow::Result<()> {
        let m = parse_output(UNGROUPED, Direction::Read)?;
        assert!(close(m.iops, 158.301158 + 152.884615), "{m:?}");
        assert!(
            close(m.bw_bytes_per_sec, 663963181.0 + 641244553.0),
            "{m:?}"
        );
        let lat = (87489150.52439 * 164.0 + 87661708.886792 * 159.0) / 323.0;
        assert!(close(m.lat_mean_ns, lat), "{m:?}");
        assert_eq!(m.requests, 323);
        assert_eq!(m.client_ctx_switches, 38 + 76);
        Ok(())
    }

    #[test]
    fn reads_clat_percentiles_as_the_largest_over_ungrouped_jobs() -> anyhow::Result<()> {
        let m = parse_output(PERCENTILES, Direction::Read)?;
        let p = m
            .clat_percentiles_ns
            .context("fio printed clat percentiles")?;
        // Job 0: 102912 / 232448 / 774144 ns; job 1: 103936 / 232448 / 806912 ns.
        assert_eq!(
            p,
            Percentiles {
                p50: 103936.0,
                p99: 232448.0,
                p99_9: 806912.0
            }
        );
        assert_eq!(p.scaled(1e-3).p99_9, 806.912);
        // One job without percentiles: a max over the other alone would understate the tail.
        let root: Value = serde_json::from_str(PERCENTILES)?;
        let mut partial = root.clone();
        partial["jobs"][1]["read"]["clat_ns"]
            .as_object_mut()
            .context("clat_ns object")?
            .remove("percentile");
        let m = parse_output(&partial.to_string(), Direction::Read)?;
        assert_eq!(m.clat_percentiles_ns, None);
        let mut no_p999 = root;
        no_p999["jobs"][0]["read"]["clat_ns"]["percentile"]["99.900000"] = Value::Null;
        let m = parse_output(&no_p999.to_string(), Direction::Read)?;
        assert_eq!(m.clat_percentiles_ns, None, "all three or none");
        // The trimmed outputs carry no clat_ns at all.
        assert_eq!(
            parse_output(JOBS4, Direction::Write)?.clat_percentiles_ns,
            None
        );
        Ok(())
    }

    #[test]
    fn missing_fields_and_garbage_are_errors() {
        let no_lat = JOBS4.replace("\"lat_ns\"", "\"lat_gone\"");
        let err = parse_output(&no_lat, Direction::Write).expect_err("lat missing");
        assert!(
            err.to_string().contains("jobs[0].write.lat_ns.mean"),
            "{err}"
        );
        let failed = JOBS4.replace("\"error\": 0", "\"error\": 5");
        assert!(parse_output(&failed, Direction::Write).is_err());
        assert!(parse_output("fio: engine nbd not loadable\n", Direction::Write).is_err());
        assert!(parse_output("{\n  \"jobs\": []\n}\n", Direction::Write).is_err());
        assert!(parse_output("{\n  \"jobs\": [ {\n", Direction::Write).is_err());
    }

    #[test]
    fn builds_test_commands_for_both_engines() {
        let file = TargetSpec::File("/dev/vdb".into());
        let nbd = TargetSpec::Nbd("nbd://127.0.0.1:10809/demo".into());
        let fsync = by_name("randwrite_fsync").expect("standard test");
        let cmd = test_command("fio", fsync, &file, 1 << 30, 10);
        assert_eq!(
            cmd.argv().join(" "),
            "fio --name=randwrite_fsync --output-format=json --ioengine=libaio \
             --filename=/dev/vdb --direct=1 --randrepeat=0 --size=1073741824 --runtime=10 \
             --time_based=1 --rw=randwrite --bs=4k --iodepth=1 --fsync=1"
        );
        let jobs4 = by_name("randread_jobs4").expect("standard test");
        let cmd = test_command("/usr/bin/fio", jobs4, &nbd, 64 << 20, 1);
        assert_eq!(
            cmd.argv().join(" "),
            "/usr/bin/fio --name=randread_jobs4 --output-format=json --ioengine=nbd \
             --uri=nbd://127.0.0.1:10809/demo --direct=1 --randrepeat=0 --size=67108864 \
             --runtime=1 --time_based=1 --rw=randread --bs=4k --iodepth=128 --numjobs=4 \
             --group_reporting=1"
        );
        let read = by_name("read").expect("standard test");
        let args = test_command("fio", read, &nbd, 1 << 30, 10).args;
        assert!(args.contains(&"--bs=4M".to_owned()) && args.contains(&"--iodepth=16".to_owned()));
        for test in STANDARD {
            let args = test_command("fio", &test, &file, 1 << 30, 10).args;
            assert_eq!(
                args.contains(&"--fsync=1".to_owned()),
                test.name.ends_with("_fsync")
            );
            assert_eq!(
                args.contains(&"--numjobs=4".to_owned()),
                test.name.ends_with("_jobs4")
            );
        }
    }

    #[test]
    fn builds_the_prefill_command() {
        let nbd = TargetSpec::Nbd("nbd+unix:///?socket=/tmp/s".into());
        assert_eq!(
            prefill_command("fio", &nbd, 1 << 30).argv().join(" "),
            "fio --name=prefill --output-format=json --ioengine=nbd \
             --uri=nbd+unix:///?socket=/tmp/s --direct=1 --size=1073741824 --rw=write \
             --bs=1M --iodepth=16"
        );
    }

    #[test]
    fn reports_failure_with_stderr_tail_and_enforces_the_deadline() {
        let sh = |script: &str| FioCommand {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
        };
        let err = measure(
            &sh("echo boom >&2; exit 3"),
            Direction::Read,
            Duration::from_secs(5),
        )
        .expect_err("exit 3 fails");
        let text = format!("{err:#}");
        assert!(
            text.contains("exit status: 3") && text.contains("boom"),
            "{text}"
        );
        let err = measure(
            &sh("echo '{}'; echo why >&2"),
            Direction::Read,
            Duration::from_secs(5),
        )
        .expect_err("no jobs");
        assert!(format!("{err:#}").contains("why"), "{err:#}");
        let started = Instant::now();
        let err = measure(&sh("sleep 30"), Direction::Read, Duration::from_millis(200))
            .expect_err("deadline");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(err.to_string().contains("killed"), "{err:#}");
    }

    #[test]
    fn tails_long_stderr() {
        let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let t = tail(&long);
        assert!(t.starts_with("line 80\n") && t.ends_with("line 99"), "{t}");
        assert_eq!(tail(""), "(empty)");
    }
}
