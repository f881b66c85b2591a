//! The test kit (`remora_testkit`) with this package's `remora` binary
//! bound in: `env!("CARGO_BIN_EXE_remora")` exists only here, so the kit's
//! helpers that start the binary take its path, and these pass it.

// Each test binary uses a different part of it.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use remora_cluster::{ClusterConfig, LocalCluster};
pub use remora_testkit::cli::{SMALL_ARRAY, read_json, spawn_daemon, stderr, stdout, succeeded};
pub use remora_testkit::cluster::{
    await_refusals, fast_filtering_config, fast_filtering_runtime, memnode_holding_data, node_id, quick_opts, refusals,
    runtime_config, session,
};
pub use remora_testkit::*;

/// The `remora` binary this package builds.
pub const BIN: &str = env!("CARGO_BIN_EXE_remora");

/// [`BIN`] as a path.
pub fn bin() -> &'static Path {
    Path::new(BIN)
}

/// `remora_testkit::cluster::start` of [`BIN`]: 3 s heartbeat timeout.
pub fn cluster(memnodes: usize, capacity: u64, region_size: u64) -> LocalCluster {
    remora_testkit::cluster::start(bin(), memnodes, capacity, region_size)
}

/// `remora_testkit::cluster::start_quick` of [`BIN`]: 1 s heartbeat timeout.
pub fn quick_cluster(memnodes: usize, capacity: u64, region_size: u64) -> LocalCluster {
    remora_testkit::cluster::start_quick(bin(), memnodes, capacity, region_size)
}

/// `remora_testkit::cluster::start_with_timeout` of [`BIN`].
pub fn cluster_with_timeout(memnodes: usize, capacity: u64, region_size: u64, timeout: Duration) -> LocalCluster {
    remora_testkit::cluster::start_with_timeout(bin(), memnodes, capacity, region_size, timeout)
}

/// `remora_testkit::cluster::config` of [`BIN`], to adjust before starting.
pub fn cluster_config(memnodes: usize, capacity: u64, region_size: u64, timeout: Duration) -> ClusterConfig {
    remora_testkit::cluster::config(bin(), memnodes, capacity, region_size, timeout)
}

/// `remora_testkit::cli::run` of [`BIN`]: no key or TLS settings from the
/// environment, killed (failing the test) after 30 s.
pub fn run_remora(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    remora_testkit::cli::run(bin(), args, envs)
}

/// `remora_testkit::cli::command` of [`BIN`] with `RUST_LOG=rust_log`.
pub fn remora_command(rust_log: &str) -> Command {
    remora_testkit::cli::command(bin(), rust_log)
}

/// `remora_testkit::cli::output` of [`BIN`]: `args`, `RUST_LOG=warn`.
pub fn remora(args: &[&str]) -> Output {
    remora_testkit::cli::output(bin(), args)
}

/// `remora_testkit::cli::output_ok` of [`BIN`]: stdout and stderr of a run that succeeded.
pub fn remora_ok(args: &[&str]) -> (String, String) {
    remora_testkit::cli::output_ok(bin(), args)
}
