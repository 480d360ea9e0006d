//! `hawser bench`: runs the standard 8-test fio comparison against block targets and prints
//! each target's ratio to the baseline.

/// Arguments of `hawser bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("hawser bench is not implemented yet")
}
