//! A real cluster on loopback: a manager and memory nodes started as child
//! processes from the `remora` binary at `bin` (in the root package's tests,
//! `env!("CARGO_BIN_EXE_remora")`), and sessions and runtimes on it.

use std::path::Path;
use std::time::Duration;

use remora_cluster::{ClusterConfig, LocalCluster};
use remora_proto::{ComputeSession, ConnOptions, NodeId};
use remora_runtime::{Runtime, RuntimeConfig};

/// The configuration of a cluster of `memnodes` memory nodes of `capacity`
/// bytes each, handing out regions of `region_size`, whose manager declares
/// nodes dead after `timeout`, logging at debug level.
pub fn config(bin: &Path, memnodes: usize, capacity: u64, region_size: u64, timeout: Duration) -> ClusterConfig {
    let mut cfg = ClusterConfig::new(bin);
    cfg.memnodes = memnodes;
    cfg.capacity = capacity;
    cfg.region_size = region_size;
    cfg.heartbeat_timeout = timeout;
    cfg.log_level = "debug".into();
    cfg
}

/// Starts a cluster ([`config`]) whose manager declares nodes dead after `timeout`.
pub fn start_with_timeout(
    bin: &Path,
    memnodes: usize,
    capacity: u64,
    region_size: u64,
    timeout: Duration,
) -> LocalCluster {
    LocalCluster::start(config(bin, memnodes, capacity, region_size, timeout)).expect("cluster starts")
}

/// Starts a cluster with the manager's default 3 s heartbeat timeout: tests
/// run many busy clusters at once on few cores, and a shorter timeout would
/// declare starved-but-healthy nodes dead.
pub fn start(bin: &Path, memnodes: usize, capacity: u64, region_size: u64) -> LocalCluster {
    start_with_timeout(bin, memnodes, capacity, region_size, Duration::from_secs(3))
}

/// Starts a cluster whose manager declares nodes dead after 1 s, for tests
/// that measure failure detection (and keep their own load light).
pub fn start_quick(bin: &Path, memnodes: usize, capacity: u64, region_size: u64) -> LocalCluster {
    start_with_timeout(bin, memnodes, capacity, region_size, Duration::from_secs(1))
}

/// Connection options of cluster `c` with a short call timeout, so a test
/// against a misbehaving node fails fast instead of hanging.
pub fn quick_opts(c: &LocalCluster) -> ConnOptions {
    ConnOptions {
        connect_timeout: Duration::from_secs(1),
        call_timeout: Duration::from_secs(2),
        stall_limit: Duration::from_secs(5),
        ..c.conn_options()
    }
}

/// Opens a compute session named `name` on the cluster's manager.
pub fn session(c: &LocalCluster, name: &str) -> ComputeSession {
    ComputeSession::open(c.manager_addr(), name, c.conn_options()).expect("session opens")
}

/// The index in `c.memnodes()` of the first memory node holding some of
/// `rt`'s far data ([`Runtime::regions_with_data`]): the victim of a test
/// that kills, pauses or corrupts a node whose loss must be recovered from.
/// Fails the test if no node holds any.
#[track_caller]
pub fn memnode_holding_data(c: &LocalCluster, rt: &Runtime) -> usize {
    let held: Vec<String> = rt.regions_with_data().into_iter().map(|(_, g)| g.addr).collect();
    c.memnodes()
        .iter()
        .position(|m| held.contains(&m.addr))
        .expect("a memory node holds some of the runtime's far data")
}

/// The manager's id for the cluster's `i`-th memory node.
pub fn node_id(c: &LocalCluster, i: usize) -> NodeId {
    let addr = &c.memnodes()[i].addr;
    c.status()
        .expect("status")
        .memory_nodes
        .iter()
        .find(|m| &m.addr == addr)
        .expect("the node is registered")
        .id
}

/// A runtime configuration on cluster `c`: its manager, its key (and TLS
/// settings), the compute node's `name`, a local budget of `budget` bytes,
/// and otherwise the defaults.
pub fn runtime_config(c: &LocalCluster, name: &str, budget: usize) -> RuntimeConfig {
    let mut cfg = RuntimeConfig::new(c.manager_addr(), budget);
    cfg.conn = c.conn_options();
    cfg.name = name.into();
    cfg
}

/// [`runtime_config`] with one filtering thread running a round every
/// millisecond (tests that watch filtering decisions want them made promptly).
pub fn fast_filtering_config(c: &LocalCluster, name: &str, budget: usize) -> RuntimeConfig {
    let mut cfg = runtime_config(c, name, budget);
    cfg.tuning.filtering_threads = 1;
    cfg.tuning.filter_interval = Duration::from_millis(1);
    cfg
}

/// A runtime connected with [`fast_filtering_config`].
pub fn fast_filtering_runtime(c: &LocalCluster, name: &str, budget: usize) -> Runtime {
    Runtime::connect(fast_filtering_config(c, name, budget)).expect("runtime connects")
}

/// How many connections the daemon logging to `log` (`manager.log`,
/// `memnode0.log`, ... in the cluster's directory) has refused so far.
pub fn refusals(c: &LocalCluster, log: &str) -> usize {
    std::fs::read_to_string(c.dir().join(log))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("refusing connection from"))
        .count()
}

/// Waits (up to 10 s: logging is asynchronous to us) until `log` holds at
/// least `n` refusals, and returns how many it holds.
pub fn await_refusals(c: &LocalCluster, log: &str, n: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = refusals(c, log);
        if got >= n || std::time::Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
