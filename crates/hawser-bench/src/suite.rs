//! The eight standard fio tests: the workload knobs that define each one, in the order they run.

use serde::{Deserialize, Serialize};

/// Which side of fio's per-job JSON (`read` or `write`) holds a test's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Read,
    Write,
}

impl Direction {
    /// The key of this direction's object in fio's per-job JSON.
    pub fn json_key(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
        }
    }
}

/// What a test's ratio compares. With one block size per test the two give the same number;
/// naming it keeps the report honest about which figure was divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RatioMetric {
    Iops,
    Bandwidth,
}

/// One standard test: a fio workload run for `--runtime` seconds on each target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestDef {
    pub name: &'static str,
    /// fio `--rw`.
    pub rw: &'static str,
    /// fio `--bs`.
    pub block_size: &'static str,
    pub iodepth: u32,
    /// More than one job runs with `group_reporting`, so fio reports one aggregate entry.
    pub numjobs: u32,
    /// fio `--fsync=1`: a flush after every write (fio issues none for reads).
    pub fsync: bool,
    pub direction: Direction,
}

impl TestDef {
    /// The figure this test's ratios divide: the 4M sequential tests are about bandwidth, the
    /// 4k ones about operations.
    pub fn ratio_metric(&self) -> RatioMetric {
        if self.block_size == "4M" {
            RatioMetric::Bandwidth
        } else {
            RatioMetric::Iops
        }
    }
}

const fn test(
    name: &'static str,
    rw: &'static str,
    direction: Direction,
    block_size: &'static str,
    iodepth: u32,
    numjobs: u32,
    fsync: bool,
) -> TestDef {
    TestDef {
        name,
        rw,
        block_size,
        iodepth,
        numjobs,
        fsync,
        direction,
    }
}

const R: Direction = Direction::Read;
const W: Direction = Direction::Write;

/// The standard suite. Writes come before reads so the prefill (run before the first read)
/// never erases what a write test measured, and runs always follow this order whatever order
/// `--tests` lists, so numbers from different runs are comparable.
pub const STANDARD: [TestDef; 8] = [
    test("randwrite_fsync", "randwrite", W, "4k", 1, 1, true),
    test("randwrite_jobs4", "randwrite", W, "4k", 128, 4, false),
    test("randwrite", "randwrite", W, "4k", 128, 1, false),
    test("write", "write", W, "4M", 16, 1, false),
    test("randread_fsync", "randread", R, "4k", 1, 1, true),
    test("randread_jobs4", "randread", R, "4k", 128, 4, false),
    test("randread", "randread", R, "4k", 128, 1, false),
    test("read", "read", R, "4M", 16, 1, false),
];

/// Names of the standard tests, for `--tests` validation and help.
pub const NAMES: [&str; 8] = {
    let mut names = [""; 8];
    let mut i = 0;
    while i < STANDARD.len() {
        names[i] = STANDARD[i].name;
        i += 1;
    }
    names
};

/// The standard tests named in `names` (all of them when empty), in standard order.
pub fn select(names: &[String]) -> anyhow::Result<Vec<TestDef>> {
    if let Some(unknown) = names.iter().find(|n| !NAMES.contains(&n.as_str())) {
        anyhow::bail!(
            "unknown test {unknown:?}; the tests are {}",
            NAMES.join(", ")
        );
    }
    Ok(STANDARD
        .iter()
        .filter(|t| names.is_empty() || names.iter().any(|n| n == t.name))
        .copied()
        .collect())
}

/// The standard test called `name`.
pub fn by_name(name: &str) -> Option<&'static TestDef> {
    STANDARD.iter().find(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_and_metrics_follow_rw_and_block_size() {
        for t in STANDARD {
            let reads = t.rw.contains("read");
            assert_eq!(t.direction == Direction::Read, reads, "{}", t.name);
            let sequential = !t.rw.starts_with("rand");
            assert_eq!(
                t.ratio_metric() == RatioMetric::Bandwidth,
                sequential,
                "{}",
                t.name
            );
        }
        assert_eq!(NAMES[0], "randwrite_fsync");
        assert_eq!(NAMES[7], "read");
    }

    #[test]
    fn select_keeps_standard_order_and_rejects_unknown() -> anyhow::Result<()> {
        let picked = select(&["read".into(), "randwrite_fsync".into(), "read".into()])?;
        let names: Vec<_> = picked.iter().map(|t| t.name).collect();
        assert_eq!(names, ["randwrite_fsync", "read"]);
        assert_eq!(select(&[])?.len(), 8);
        let err = select(&["randwrit".into()]).expect_err("typo must fail");
        assert!(err.to_string().contains("randwrite_jobs4"), "{err}");
        Ok(())
    }
}
