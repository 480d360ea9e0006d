//! Sequences a bench run: prepare targets, sample idle processes, run each test on every
//! target in turn (prefilling before the first read), then assemble the report.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use crate::cost;
use crate::fio::{self, FioCommand, Measurement};
use crate::plan::Plan;
use crate::procstat::{clock_ticks_per_sec, PhaseStats, Sampler, SAMPLE_INTERVAL};
use crate::ratio;
use crate::report::{
    rfc3339_utc, ExpectOutcome, PairRatio, PrefillRun, ProcessReport, Report, TargetInfo,
    TestResult,
};
use crate::suite::{Direction, TestDef};
use crate::target::Target;

/// Slack on top of a test's runtime before fio is presumed hung: start-up, connecting, and
/// the final drain of a deep queue on a slow target.
const TEST_DEADLINE_SLACK: Duration = Duration::from_secs(120);
/// The prefill is size-bound, not time-bound; allow it to crawl at this rate before giving up.
const PREFILL_MIN_BYTES_PER_SEC: u64 = 1 << 20;

/// Runs the plan and returns its report; any fio failure aborts the run.
pub fn run(plan: &Plan) -> anyhow::Result<Report> {
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let fio_version = fio::version(&plan.fio)?;
    for target in &plan.targets {
        target
            .spec
            .prepare(plan.size_bytes)
            .with_context(|| format!("prepare {}", target.name))?;
    }
    let idle = sample_idle(plan)?;
    let sampler = start_sampler(plan)?;
    let outcome = run_tests(plan);
    // Stop sampling before looking at the outcome, so a failed run leaves no thread behind.
    let busy = sampler.map(Sampler::stop).transpose()?;
    let (mut results, prefills) = outcome?;

    let baseline = plan.baseline_name();
    ratio::fill_baseline_ratios(&mut results, baseline);
    let target_ratios = plan
        .pairs
        .iter()
        .flat_map(|pair| plan.tests.iter().map(move |test| (pair, test)))
        .map(|(pair, test)| PairRatio {
            target: pair.target.clone(),
            base: pair.base.clone(),
            test: test.name.to_owned(),
            ratio: ratio::between(&results, test.name, &pair.target, &pair.base),
        })
        .collect();
    let expectations = plan
        .expectations
        .iter()
        .map(|e| {
            let (ratio, pass) = e.evaluate(&results, baseline);
            ExpectOutcome {
                expectation: e.text.clone(),
                ratio,
                pass,
            }
        })
        .collect();
    Ok(Report {
        fio_version,
        timestamp: rfc3339_utc(started),
        runtime_secs: plan.runtime_secs,
        size_bytes: plan.size_bytes,
        baseline: baseline.to_owned(),
        prefill: plan.prefill,
        targets: plan.targets.iter().map(target_info).collect(),
        prefills,
        results,
        target_ratios,
        processes: process_reports(plan, idle, busy),
        expectations,
    })
}

fn target_info(t: &Target) -> TargetInfo {
    TargetInfo {
        name: t.name.clone(),
        kind: t.spec.kind(),
        spec: t.spec.to_spec_string(),
    }
}

fn start_sampler(plan: &Plan) -> anyhow::Result<Option<Sampler>> {
    if plan.monitors.is_empty() {
        return Ok(None);
    }
    let pids = plan.monitors.iter().map(|m| m.pid).collect();
    Sampler::start(pids, SAMPLE_INTERVAL).map(Some)
}

/// Samples the monitored processes for `idle_secs` before any I/O: their resting cost.
fn sample_idle(plan: &Plan) -> anyhow::Result<Option<Vec<PhaseStats>>> {
    let Some(sampler) = start_sampler(plan)? else {
        return Ok(None);
    };
    eprintln!(
        "sampling monitored processes at rest for {} s",
        plan.idle_secs
    );
    // The idle window is the measurement itself, not a wait for something to happen.
    std::thread::sleep(Duration::from_secs(plan.idle_secs));
    sampler.stop().map(Some)
}

fn process_reports(
    plan: &Plan,
    idle: Option<Vec<PhaseStats>>,
    busy: Option<Vec<PhaseStats>>,
) -> Vec<ProcessReport> {
    let mut idle = idle.unwrap_or_default().into_iter();
    let mut busy = busy.unwrap_or_default().into_iter();
    plan.monitors
        .iter()
        .map(|m| ProcessReport {
            name: m.name.clone(),
            pid: m.pid,
            idle: idle.next(),
            tests: busy.next(),
        })
        .collect()
}

/// Runs every test on every target, test by test, so slow drift on a noisy machine hits all
/// targets alike rather than whichever target happened to run last.
fn run_tests(plan: &Plan) -> anyhow::Result<(Vec<TestResult>, Vec<PrefillRun>)> {
    let total = plan.tests.len() * plan.targets.len();
    let mut results = Vec::with_capacity(total);
    let mut prefills = Vec::new();
    for test in &plan.tests {
        if plan.prefill && test.direction == Direction::Read && prefills.is_empty() {
            for target in &plan.targets {
                prefills.push(prefill(plan, target)?);
            }
        }
        for target in &plan.targets {
            eprint!(
                "[{}/{total}] {} on {} ... ",
                results.len() + 1,
                test.name,
                target.name
            );
            let result = run_one(plan, test, target).inspect_err(|_| eprintln!("failed"))?;
            eprintln!("{:.0} IOPS, {:.1} MiB/s", result.iops, result.mib_per_sec);
            results.push(result);
        }
    }
    Ok((results, prefills))
}

fn run_one(plan: &Plan, test: &TestDef, target: &Target) -> anyhow::Result<TestResult> {
    let cmd = fio::test_command(
        &plan.fio,
        test,
        &target.spec,
        plan.size_bytes,
        plan.runtime_secs,
    );
    let deadline = Duration::from_secs(plan.runtime_secs) + TEST_DEADLINE_SLACK;
    let pids: Vec<u32> = plan.monitors.iter().map(|m| m.pid).collect();
    let watch = cost::Watch::start(pids.clone(), cost::WATCH_INTERVAL)?;
    let before = cost::cpu_snapshot(&pids);
    let measured = fio::measure(&cmd, test.direction, deadline);
    let after = cost::cpu_snapshot(&pids);
    let switches = watch.stop()?;
    let m: Measurement = measured
        .with_context(|| format!("run fio test {} on target {}", test.name, target.name))?;
    let server = if pids.is_empty() {
        None
    } else {
        let names: Vec<String> = plan.monitors.iter().map(|m| m.name.clone()).collect();
        let hz = clock_ticks_per_sec()?;
        let cpu = (before.as_slice(), after.as_slice());
        Some(cost::between(&names, cpu, &switches, hz, m.requests)?)
    };
    let per_request = |total: f64| (m.requests > 0).then(|| total / m.requests as f64);
    Ok(TestResult {
        test: test.name.to_owned(),
        target: target.name.clone(),
        iops: m.iops,
        bw_bytes_per_sec: m.bw_bytes_per_sec,
        mib_per_sec: m.bw_bytes_per_sec / 1048576.0,
        lat_mean_us: m.lat_mean_ns / 1000.0,
        sync_lat_mean_us: m.sync_lat_mean_ns.map(|ns| ns / 1000.0),
        clat_percentiles_us: m.clat_percentiles_ns.map(|p| p.scaled(1e-3)),
        ratio_metric: test.ratio_metric(),
        ratio_to_baseline: None,
        requests: m.requests,
        client_cpu_us_per_request: per_request(m.client_cpu_secs * 1e6),
        client_ctx_switches_per_request: per_request(m.client_ctx_switches as f64),
        server,
        command: cmd.argv(),
    })
}

/// Writes the whole region once so reads hit allocated data: a thin target returning zeros
/// for holes would otherwise look faster than it is.
fn prefill(plan: &Plan, target: &Target) -> anyhow::Result<PrefillRun> {
    let cmd: FioCommand = fio::prefill_command(&plan.fio, &target.spec, plan.size_bytes);
    let deadline =
        Duration::from_secs(plan.size_bytes / PREFILL_MIN_BYTES_PER_SEC) + TEST_DEADLINE_SLACK;
    eprint!(
        "prefilling {} ({} MiB) ... ",
        target.name,
        plan.size_bytes >> 20
    );
    let started = Instant::now();
    let m = fio::measure(&cmd, Direction::Write, deadline)
        .inspect_err(|_| eprintln!("failed"))
        .with_context(|| format!("prefill target {}", target.name))?;
    let secs = started.elapsed().as_secs_f64();
    let mib_per_sec = m.bw_bytes_per_sec / 1048576.0;
    eprintln!("{secs:.1} s, {mib_per_sec:.0} MiB/s");
    Ok(PrefillRun {
        target: target.name.clone(),
        secs,
        mib_per_sec,
        command: cmd.argv(),
    })
}
