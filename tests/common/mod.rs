//! Shared helpers of the integration tests: a real cluster of child
//! processes on loopback, and data patterns to verify byte for byte.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use remora_cluster::{ClusterConfig, LocalCluster};
use remora_proto::{ComputeSession, ConnOptions};

/// `bench micro`'s small array: 2000 objects of 4 KiB, a quarter of them
/// local, so eviction, swap-ins and filtering all run within a short test.
pub const SMALL_ARRAY: &[&str] = &["--objects", "2000", "--object-size", "4KiB", "--local-ratio", "0.25"];

/// Starts a cluster of `memnodes` memory nodes of `capacity` bytes each,
/// with the manager's default 3 s heartbeat timeout: tests run many busy
/// clusters at once on few cores, and a shorter timeout would declare
/// starved-but-healthy nodes dead.
pub fn cluster(memnodes: usize, capacity: u64, region_size: u64) -> LocalCluster {
    cluster_with_timeout(memnodes, capacity, region_size, Duration::from_secs(3))
}

/// A cluster whose manager declares nodes dead after 1 s, for tests that
/// measure failure detection (and keep their own load light).
pub fn quick_cluster(memnodes: usize, capacity: u64, region_size: u64) -> LocalCluster {
    cluster_with_timeout(memnodes, capacity, region_size, Duration::from_secs(1))
}

/// A cluster whose manager declares nodes dead after `timeout`.
pub fn cluster_with_timeout(memnodes: usize, capacity: u64, region_size: u64, timeout: Duration) -> LocalCluster {
    let mut cfg = ClusterConfig::new(env!("CARGO_BIN_EXE_remora"));
    cfg.memnodes = memnodes;
    cfg.capacity = capacity;
    cfg.region_size = region_size;
    cfg.heartbeat_timeout = timeout;
    cfg.log_level = "debug".into();
    LocalCluster::start(cfg).expect("cluster starts")
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

/// Opens a compute session on the cluster's manager.
pub fn session(c: &LocalCluster, name: &str) -> ComputeSession {
    ComputeSession::open(c.manager_addr(), name, c.conn_options()).expect("session opens")
}

/// Fills `buf` with bytes that depend on `seed` and on each byte's position,
/// so a misplaced, stale or corrupted chunk never compares equal.
pub fn fill_pattern(seed: u64, offset: u64, buf: &mut [u8]) {
    debug_assert_eq!(offset % 8, 0);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let word = (offset / 8 + i as u64) ^ seed.rotate_left(32);
        let v = word.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
        chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
    }
}

/// A fresh pattern buffer.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(seed, offset, &mut v);
    v
}

/// Asserts equality with a short message instead of dumping megabytes.
#[track_caller]
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        );
    }
}

/// A runtime on `c` with a local budget of `budget` bytes and one filtering
/// thread running a round every millisecond (tests that watch filtering
/// decisions want them made promptly).
pub fn fast_filtering_runtime(c: &LocalCluster, name: &str, budget: usize) -> remora_runtime::Runtime {
    remora_runtime::Runtime::connect(fast_filtering_config(c, name, budget)).expect("runtime connects")
}

/// The configuration [`fast_filtering_runtime`] connects with.
pub fn fast_filtering_config(c: &LocalCluster, name: &str, budget: usize) -> remora_runtime::RuntimeConfig {
    let mut cfg = remora_runtime::RuntimeConfig::new(c.manager_addr(), budget);
    cfg.conn = c.conn_options();
    cfg.name = name.into();
    cfg.filtering_threads = 1;
    cfg.filter_interval = Duration::from_millis(1);
    cfg
}

/// A 2 KiB remotable object (with the runtime's header, one 2304-byte slot):
/// id, version, and words derived from both, so a stale, misplaced or
/// corrupt copy never compares equal.
#[derive(Clone, Copy)]
pub struct Obj {
    pub id: u64,
    pub version: u64,
    pub words: [u64; 254],
}
// SAFETY: integers only.
unsafe impl remora_runtime::Remotable for Obj {}

/// Object `id` at `version`.
pub fn obj(id: u64, version: u64) -> Obj {
    Obj {
        id,
        version,
        words: std::array::from_fn(|i| (id << 20 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version),
    }
}

/// Whether `o` is object `id` at `version`, every word.
pub fn matches(o: &Obj, id: u64, version: u64) -> bool {
    o.id == id && o.version == version && o.words == obj(id, version).words
}

/// The manager's id for the cluster's `i`-th memory node.
pub fn node_id(c: &LocalCluster, i: usize) -> remora_proto::NodeId {
    let addr = &c.memnodes()[i].addr;
    c.status()
        .expect("status")
        .memory_nodes
        .iter()
        .find(|m| &m.addr == addr)
        .expect("the node is registered")
        .id
}

/// Runs the `remora` binary with `envs` and without key or TLS settings
/// from the environment; one still running after 30 s is killed and fails
/// the test.
pub fn run_remora(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(args)
        .env_remove("REMORA_CLUSTER_KEY_FILE")
        .env_remove("REMORA_TLS")
        .env_remove("REMORA_TLS_DIR")
        .envs(envs.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("remora {args:?} still running after 30 s: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A command's standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Shared state of [`skewed_worker`]s: the objects, the version each was
/// last written at, the stop flag, what went wrong and the operations done.
pub struct Skewed<'a> {
    pub rt: &'a remora_runtime::Runtime,
    pub objs: &'a [std::sync::RwLock<remora_runtime::RemBox<Obj>>],
    pub versions: &'a [std::sync::atomic::AtomicU64],
    pub stop: std::sync::atomic::AtomicBool,
    pub errors: std::sync::Mutex<Vec<String>>,
    pub ops: std::sync::atomic::AtomicU64,
}

impl<'a> Skewed<'a> {
    pub fn new(
        rt: &'a remora_runtime::Runtime,
        objs: &'a [std::sync::RwLock<remora_runtime::RemBox<Obj>>],
        versions: &'a [std::sync::atomic::AtomicU64],
    ) -> Self {
        Self {
            rt,
            objs,
            versions,
            stop: Default::default(),
            errors: Default::default(),
            ops: Default::default(),
        }
    }
}

/// Thread `t` of the workload the failure tests run while nodes die, until
/// `w.stop`. Thread 0 sweeps every object in turn, `sweep_pause` apart, so
/// cold spans come back from far memory (some from or around dead nodes);
/// the others mostly hit a hot 1/32 of the objects, and a quarter of their
/// accesses write. Every read is checked against the version last written.
pub fn skewed_worker(t: u64, w: &Skewed<'_>, sweep_pause: Duration) {
    use std::sync::atomic::Ordering;
    let n = w.objs.len() as u64;
    let mut x = t.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut sweep = 0u64;
    let fail = |m: String| w.errors.lock().unwrap().push(m);
    while !w.stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = if t == 0 {
            std::thread::sleep(sweep_pause);
            sweep += 1;
            sweep % n
        } else {
            (x >> 8) % (n / 32)
        };
        let scope = w.rt.scope();
        if t != 0 && x % 4 == 0 {
            let mut g = w.objs[i as usize].write().unwrap();
            let v = w.versions[i as usize].load(Ordering::Relaxed) + 1;
            match g.deref_mut(&scope) {
                Ok(o) => {
                    *o = obj(i, v);
                    w.versions[i as usize].store(v, Ordering::Relaxed);
                }
                Err(e) => fail(format!("write {i}: {e}")),
            }
        } else {
            let g = w.objs[i as usize].read().unwrap();
            let v = w.versions[i as usize].load(Ordering::Relaxed);
            match g.deref(&scope) {
                Ok(o) if matches(o, i, v) => {}
                Ok(o) => fail(format!("read {i}: got id {} v{}", o.id, o.version)),
                Err(e) => fail(format!("read {i}: {e}")),
            }
        }
        w.ops.fetch_add(1, Ordering::Relaxed);
    }
}
