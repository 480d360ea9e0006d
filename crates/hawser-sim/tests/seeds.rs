//! The seeded runs: a range of seeds with every fault, replay of one seed, pinned seeds of bugs
//! found, and proof that the checkers catch deliberate bugs.

use hawser_sim::{run_seed, run_traced, seed_base, Failure, KnownBugs, RunOptions};

/// Seeds per test function (several functions so the test harness runs them in parallel).
const SEEDS_PER_SHARD: u64 = 250;

/// Seeds per shard: `HAWSER_SEEDS_PER_SHARD`, or `SEEDS_PER_SHARD`.
fn per_shard() -> u64 {
    std::env::var("HAWSER_SEEDS_PER_SHARD")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS_PER_SHARD)
}

/// The default options, with `HAWSER_AVOID` (if set) choosing which known bugs to avoid.
fn options() -> RunOptions {
    let d = RunOptions::default();
    RunOptions {
        avoid: KnownBugs::from_env(d.avoid),
        ..d
    }
}

fn shard(i: u64) {
    let n = per_shard();
    let base = seed_base() + i * n;
    let mut failures: Vec<Failure> = Vec::new();
    let (mut copied, mut dirtied, mut missed, mut events) = (0u64, 0u64, 0u64, 0u64);
    let (mut faults, mut writes, mut reads) = (0u64, 0u64, 0u64);
    for seed in base..base + n {
        match run_seed(seed, options()) {
            Ok(s) => {
                copied += s.copied.iter().sum::<u64>();
                dirtied += s.dirtied.iter().sum::<u64>();
                missed += s.missed.iter().sum::<u64>();
                events += s.events;
                faults += s.faults;
                writes += s.writes_ok;
                reads += s.reads_checked;
            }
            Err(f) => failures.push(f),
        }
    }
    println!(
        "seeds {base}..{}: {} failed; {events} events, {faults} faults, {writes} writes \
         acknowledged, {reads} reads checked; resync copied {copied} bytes, chunks dirtied \
         {dirtied} bytes, written while out {missed} bytes",
        base + n,
        failures.len()
    );
    if let Some(first) = failures.first() {
        for f in &failures {
            eprintln!("FAILED seed {}: {}", f.seed, f.message);
        }
        panic!(
            "{} of {n} seeds failed; the first:\n{first}",
            failures.len()
        );
    }
}

#[test]
fn seeds_0() {
    shard(0);
}

#[test]
fn seeds_1() {
    shard(1);
}

#[test]
fn seeds_2() {
    shard(2);
}

#[test]
fn seeds_3() {
    shard(3);
}

/// `HAWSER_SEED=<seed> cargo test --release -p hawser-sim replay -- --nocapture`: run one seed
/// and print its whole trace.
#[test]
fn replay() {
    let Some(seed) = std::env::var("HAWSER_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return;
    };
    let (result, trace) = run_traced(seed, options());
    for l in &trace {
        println!("{l}");
    }
    if let Err(e) = result {
        panic!("seed {seed}: {e}");
    }
}
