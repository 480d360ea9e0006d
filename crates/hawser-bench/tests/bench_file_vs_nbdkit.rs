//! End to end: `hawser_bench::run` with real fio against a preallocated file and an nbdkit
//! export over a Unix socket, checking the JSON report and the SVG charts it writes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use serde_json::Value;

/// How long nbdkit may take to start listening.
const NBDKIT_START_DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: hawser_bench::BenchArgs,
}

/// Owns the scratch directory and nbdkit; dropping it (also on panic) kills nbdkit by its PID
/// and removes the files.
struct Scratch {
    dir: PathBuf,
    nbdkit: Option<Child>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(mut child) = self.nbdkit.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn tool_works(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts nbdkit in the foreground on `socket`, serving `file`, and waits for its PID file,
/// which nbdkit writes only once the socket is listening.
fn start_nbdkit(scratch: &mut Scratch, socket: &Path, file: &Path) -> anyhow::Result<u32> {
    let pidfile = scratch.dir.join("nbdkit.pid");
    let child = Command::new("nbdkit")
        .args(["-f", "--exit-with-parent", "-U"])
        .arg(socket)
        .arg("-P")
        .arg(&pidfile)
        .arg("file")
        .arg(file)
        .stdin(Stdio::null())
        .spawn()
        .context("start nbdkit")?;
    let pid = child.id();
    scratch.nbdkit = Some(child);
    let end = Instant::now() + NBDKIT_START_DEADLINE;
    loop {
        let written = fs::read_to_string(&pidfile).unwrap_or_default();
        if written.trim() == pid.to_string() && socket.exists() {
            return Ok(pid);
        }
        if let Some(child) = scratch.nbdkit.as_mut() {
            if let Some(status) = child.try_wait().context("check nbdkit")? {
                anyhow::bail!("nbdkit exited early with {status}");
            }
        }
        ensure!(
            Instant::now() < end,
            "nbdkit did not listen within {NBDKIT_START_DEADLINE:?}"
        );
        std::thread::sleep(POLL);
    }
}

#[test]
fn compares_a_file_with_nbdkit() -> anyhow::Result<()> {
    if !tool_works("fio", &["--enghelp=nbd"]) || !tool_works("nbdkit", &["--version"]) {
        eprintln!("SKIPPED: needs fio with the nbd engine and nbdkit on PATH");
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("hawser-bench-it-{}", std::process::id()));
    let mut scratch = Scratch {
        dir: dir.clone(),
        nbdkit: None,
    };
    fs::create_dir_all(&dir).context("create scratch dir")?;
    let served = dir.join("served.img");
    fs::File::create(&served)?.set_len(64 << 20)?;
    let socket = dir.join("nbd.sock");
    let nbdkit_pid = start_nbdkit(&mut scratch, &socket, &served)?;

    let json = dir.join("results.json");
    let history = dir.join("history");
    fs::create_dir(&history)?;
    fs::write(history.join("truncated.json"), "{\"timestamp\"")?;
    let argv: Vec<String> = vec![
        "bench".into(),
        format!("--target=file=file:{}", dir.join("local.img").display()),
        format!(
            "--target=nbdkit=nbd:nbd+unix:///?socket={}",
            socket.display()
        ),
        "--runtime=1".into(),
        "--size=64MiB".into(),
        "--tests=randwrite_fsync,read".into(),
        format!("--json={}", json.display()),
        format!("--monitor-pid=nbdkit={nbdkit_pid}"),
        "--idle-secs=1".into(),
        "--targets-ratio=nbdkit:file".into(),
        "--expect=nbdkit:read>=0.01".into(),
        format!("--history={}", history.display()),
    ];
    hawser_bench::run(Cli::try_parse_from(argv)?.args)?;
    for chart in ["randwrite_fsync", "read", "history"] {
        let path = dir.join(format!("results.{chart}.svg"));
        let svg = fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        roxmltree::Document::parse(&svg).with_context(|| format!("parse {}", path.display()))?;
    }

    let report: Value = serde_json::from_str(&fs::read_to_string(&json)?)?;
    let results = report["results"].as_array().context("results array")?;
    assert_eq!(results.len(), 4, "{report:#}");
    for target in ["file", "nbdkit"] {
        for test in ["randwrite_fsync", "read"] {
            let r = results
                .iter()
                .find(|r| r["target"] == target && r["test"] == test)
                .with_context(|| format!("result for {test} on {target}"))?;
            assert!(r["iops"].as_f64().is_some_and(|v| v > 0.0), "{r:#}");
            let ratio = r["ratio_to_baseline"]
                .as_f64()
                .context("ratio_to_baseline")?;
            assert!(ratio > 0.0, "{r:#}");
            if target == "file" {
                assert!(
                    (ratio - 1.0).abs() < 1e-12,
                    "the baseline's ratio is 1: {r:#}"
                );
            }
            assert!(r["requests"].as_u64().is_some_and(|n| n > 0), "{r:#}");
            let p = &r["clat_percentiles_us"];
            let (p50, p99, p999) = (p["p50"].as_f64(), p["p99"].as_f64(), p["p99_9"].as_f64());
            assert!(
                p50.is_some_and(|v| v > 0.0) && p50 <= p99 && p99 <= p999,
                "percentiles ordered: {r:#}"
            );
            assert!(r["client_cpu_us_per_request"].as_f64().is_some(), "{r:#}");
            assert!(
                r["server"]["cpu_us_per_request"].as_f64().is_some(),
                "{r:#}"
            );
        }
    }
    // At queue depth 1 nbdkit sleeps in recv between requests: every request wakes it at
    // least once, while the file target's tests leave it idle.
    let switches = |target: &str| {
        results
            .iter()
            .find(|r| r["target"] == target && r["test"] == "randwrite_fsync")
            .and_then(|r| r["server"]["ctx_switches_per_request"].as_f64())
    };
    let (served, idle) = (switches("nbdkit"), switches("file"));
    assert!(served.is_some_and(|s| s >= 0.5), "{served:?}: {report:#}");
    assert!(idle.is_some_and(|i| i < 0.5), "{idle:?}: {report:#}");
    assert_eq!(report["baseline"], "file");
    assert_eq!(report["prefills"].as_array().map(Vec::len), Some(2));
    assert!(
        report["target_ratios"][0]["ratio"].as_f64().is_some(),
        "{report:#}"
    );
    assert_eq!(report["expectations"][0]["pass"], true, "{report:#}");
    let process = &report["processes"][0];
    assert_eq!(process["pid"], nbdkit_pid);
    assert!(
        process["tests"]["rss_peak_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{process:#}"
    );
    assert!(
        process["idle"]["cpu_percent"].as_f64().is_some(),
        "{process:#}"
    );
    Ok(())
}

#[test]
fn names_the_target_and_test_when_fio_fails() -> anyhow::Result<()> {
    if !tool_works("fio", &["--enghelp=nbd"]) {
        eprintln!("SKIPPED: needs fio with the nbd engine on PATH");
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("hawser-bench-it-fail-{}", std::process::id()));
    let scratch = Scratch {
        dir: dir.clone(),
        nbdkit: None,
    };
    fs::create_dir_all(&scratch.dir).context("create scratch dir")?;
    let argv: Vec<String> = vec![
        "bench".into(),
        format!("--target=local=file:{}", dir.join("local.img").display()),
        format!(
            "--target=gone=nbd:nbd+unix:///?socket={}",
            dir.join("none.sock").display()
        ),
        "--runtime=1".into(),
        "--size=8MiB".into(),
        "--tests=randwrite".into(),
        format!("--json={}", dir.join("results.json").display()),
    ];
    let err = hawser_bench::run(Cli::try_parse_from(argv)?.args).expect_err("no server");
    let text = format!("{err:#}");
    assert!(text.contains("test randwrite on target gone"), "{text}");
    assert!(
        text.contains("nbd_connect_uri"),
        "fio's stderr is quoted: {text}"
    );
    assert!(!dir.join("results.json").exists());
    Ok(())
}
