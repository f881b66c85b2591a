//! Data-path benchmark (being written).

/// Flags of `remora bench net`.
#[derive(Debug, Clone, clap::Args)]
pub struct NetArgs {}

/// Runs the benchmark.
pub fn run(_args: &NetArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
