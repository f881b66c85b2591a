//! The scheme's start and stop hooks: start before any swap-out, stop once
//! after every other call (and also when start fails, so nothing leaks).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use remora_memnode::InProcessCluster;
use remora_runtime::scheme::{CopyRead, FarMemory, NonFt, Scheme, SpanAddr};
use remora_runtime::{Runtime, RuntimeConfig, RuntimeError};
use remora_testkit::Obj;

/// Records the order of hook calls around a real scheme.
struct Hooked {
    inner: NonFt,
    log: Arc<Log>,
    fail_start: bool,
}

#[derive(Default)]
struct Log {
    starts: AtomicU32,
    stops: AtomicU32,
    swap_outs_before_start: AtomicU64,
    calls_after_stop: AtomicU64,
}

impl Hooked {
    fn check(&self) {
        if self.log.starts.load(Ordering::SeqCst) == 0 {
            self.log.swap_outs_before_start.fetch_add(1, Ordering::SeqCst);
        }
        if self.log.stops.load(Ordering::SeqCst) > 0 {
            self.log.calls_after_stop.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Scheme for Hooked {
    fn name(&self) -> &'static str {
        "hooked"
    }
    fn start(&self, _far: &Arc<FarMemory>) -> Result<(), RuntimeError> {
        self.log.starts.fetch_add(1, Ordering::SeqCst);
        if self.fail_start {
            return Err(RuntimeError::Config("refused to start".into()));
        }
        Ok(())
    }
    fn stop(&self) {
        self.log.stops.fetch_add(1, Ordering::SeqCst);
    }
    fn swap_out(&self, far: &FarMemory, spans: &[&[u8]], sums: &[u64]) -> Result<Vec<SpanAddr>, RuntimeError> {
        self.check();
        self.inner.swap_out(far, spans, sums)
    }
    fn read_copy(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<CopyRead, RuntimeError> {
        self.check();
        self.inner.read_copy(far, at, dest)
    }
    fn release(&self, far: &FarMemory, at: SpanAddr, pages: u32) {
        self.check();
        self.inner.release(far, at, pages)
    }
}

fn runtime(c: &InProcessCluster, fail_start: bool) -> (Result<Runtime, RuntimeError>, Arc<Log>) {
    let log = Arc::new(Log::default());
    let mut cfg = RuntimeConfig::new("unused:0", 1 << 20);
    cfg.scheme = Box::new(Hooked {
        inner: NonFt::default(),
        log: Arc::clone(&log),
        fail_start,
    });
    (Runtime::with_backend(cfg, c.backend()), log)
}

#[test]
fn start_comes_first_and_stop_last() {
    let c = InProcessCluster::new(3, 16, 2 << 20);
    let (rt, log) = runtime(&c, false);
    let rt = rt.unwrap();
    let objs: Vec<_> = (0..4096u64).map(|i| rt.alloc(Obj::new(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    assert!(rt.stats().traffic.swap_outs > 0);
    {
        let scope = rt.scope();
        for (i, o) in objs.iter().enumerate() {
            o.deref(&scope).unwrap().check(i as u64, 0);
        }
    }
    assert_eq!(log.starts.load(Ordering::SeqCst), 1);
    assert_eq!(log.stops.load(Ordering::SeqCst), 0);
    drop(objs);
    drop(rt);
    assert_eq!(log.stops.load(Ordering::SeqCst), 1, "stop once, at shutdown");
    assert_eq!(log.swap_outs_before_start.load(Ordering::SeqCst), 0);
    assert_eq!(log.calls_after_stop.load(Ordering::SeqCst), 0);
}

#[test]
fn a_failed_start_fails_the_runtime_and_still_stops() {
    let c = InProcessCluster::new(3, 16, 2 << 20);
    let (rt, log) = runtime(&c, true);
    assert!(
        matches!(rt, Err(RuntimeError::Config(ref m)) if m.contains("refused")),
        "{:?}",
        rt.err()
    );
    assert_eq!(log.starts.load(Ordering::SeqCst), 1);
    assert_eq!(log.stops.load(Ordering::SeqCst), 1);
}
