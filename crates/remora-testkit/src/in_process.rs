//! A runtime on in-process memory nodes (`remora_memnode::InProcessCluster`),
//! where tests inject faults at exact steps.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use remora_memnode::InProcessCluster;
use remora_runtime::scheme::{self, SchemeOptions};
use remora_runtime::{Runtime, RuntimeConfig};

/// Logs to the test's output, filtered by `RUST_LOG` (`RUST_LOG=debug`
/// shows what the runtime did around a failure). Idempotent.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A configuration with scheme `name` made with `opts`, a local budget of
/// `budget` bytes and 5 s of patience; no manager address (the backend
/// comes from [`runtime`]).
pub fn config(name: &str, opts: &SchemeOptions, budget: usize) -> RuntimeConfig {
    let mut cfg = RuntimeConfig::new("unused:0", budget);
    cfg.scheme = scheme::make(name, opts).expect("known scheme");
    cfg.patience = Duration::from_secs(5);
    cfg
}

/// A runtime with `cfg` on the nodes of `c`.
pub fn runtime(c: &InProcessCluster, cfg: RuntimeConfig) -> Runtime {
    init_tracing();
    Runtime::with_backend(cfg, c.backend()).expect("runtime starts")
}

/// Runs the tests of a file one at a time: timing-dependent figures (clean
/// re-evictions, kept copies) need the cores the tests would otherwise
/// share among themselves on a 2-core machine.
pub fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}
