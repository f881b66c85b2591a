//! A degraded cluster keeps its data: the manager killed (`kill -9`) in the
//! middle of a workload and restarted 10 s later, and a memory node killed
//! while the manager is down, against real processes. Far memory pauses
//! while the memory nodes' leases have lapsed; no operation fails, nothing
//! is reported lost, and every object reads back at its latest version.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use common::*;
use remora_runtime::{RemBox, Runtime, scheme};

/// Counts the WARN (and worse) events logged in this process.
#[derive(Clone, Default)]
struct Warnings(Arc<AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *e.metadata().level() <= tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn count_warnings() -> Warnings {
    use tracing_subscriber::layer::SubscriberExt;
    let w = Warnings::default();
    let sub = tracing_subscriber::registry()
        .with(w.clone())
        .with(tracing_subscriber::fmt::layer().with_test_writer());
    tracing::subscriber::set_global_default(sub).expect("one subscriber per test binary");
    w
}

/// The shared state of [`uniform_worker`]s.
struct Load<'a> {
    rt: &'a Runtime,
    objs: &'a [RwLock<RemBox<Obj>>],
    versions: &'a [AtomicU64],
    stop: AtomicBool,
    errors: Mutex<Vec<String>>,
    /// Operations done in each 100 ms window since `start`.
    windows: Vec<AtomicU64>,
    start: Instant,
}

impl Load<'_> {
    fn window(&self, at: Duration) -> usize {
        (at.as_millis() / 100) as usize
    }

    fn ops_between(&self, from: Duration, to: Duration) -> u64 {
        let (a, b) = (self.window(from), self.window(to).min(self.windows.len()));
        self.windows[a..b].iter().map(|w| w.load(Ordering::Relaxed)).sum()
    }
}

/// Reads (and one time in five writes) objects chosen uniformly, so most
/// operations need far memory; every read is checked.
fn uniform_worker(t: u64, w: &Load<'_>) {
    let n = w.objs.len() as u64;
    let mut x = (t + 1).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    while !w.stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x >> 8) % n;
        let scope = w.rt.scope();
        let fail = |m: String| w.errors.lock().unwrap().push(m);
        if x % 5 == 0 {
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
                Ok(o) if o.is(i, v) => {}
                Ok(o) => fail(format!("read {i}: got id {} v{}", o.id, o.version)),
                Err(e) => fail(format!("read {i}: {e}")),
            }
        }
        let slot = w.window(w.start.elapsed()).min(w.windows.len() - 1);
        w.windows[slot].fetch_add(1, Ordering::Relaxed);
    }
}

fn verify_all(rt: &Runtime, objs: &[RwLock<RemBox<Obj>>], versions: &[AtomicU64]) {
    let mut scope = rt.scope();
    for (i, o) in objs.iter().enumerate() {
        let v = versions[i].load(Ordering::Relaxed);
        let g = o.read().unwrap();
        let got = g.deref(&scope).unwrap_or_else(|e| panic!("object {i}: {e}"));
        assert!(
            got.is(i as u64, v),
            "object {i}: got id {} v{}, want v{v}",
            got.id,
            got.version
        );
        if i % 64 == 0 {
            scope.renew();
        }
    }
}

/// The manager is killed mid-workload and restarted 10 s later; a memory
/// node holding data is killed while it is down (its rebuild starts once
/// the manager is back). No operation fails, far memory is working again
/// within 2 s of the restart, the outage is logged in a few lines, and
/// every object verifies.
#[test]
fn a_manager_outage_pauses_far_memory_and_loses_nothing() {
    let warnings = count_warnings();
    // 3 s heartbeat timeout: the memory nodes' leases lapse 2 s into the outage.
    let mut c = cluster(7, 64 << 20, 4 << 20);
    let mut cfg = runtime_config(&c, "manager-outage", 2 << 20);
    cfg.scheme = scheme::by_name("ec-batch").unwrap();
    let rt = Runtime::connect(cfg).unwrap();
    let n = 8192u64; // 8 MiB of 1 KiB objects: 4x the budget
    let objs: Vec<RwLock<RemBox<Obj>>> = (0..n).map(|i| RwLock::new(rt.alloc(obj(i, 0)).unwrap())).collect();
    let versions: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    let w = Load {
        rt: &rt,
        objs: &objs,
        versions: &versions,
        stop: AtomicBool::new(false),
        errors: Mutex::new(Vec::new()),
        windows: (0..400).map(|_| AtomicU64::new(0)).collect(),
        start: Instant::now(),
    };
    let kill_at = Duration::from_secs(3);
    let outage = Duration::from_secs(10);
    let (warn_before, warn_during, swap_ins_at_restart, swap_ins_after) = std::thread::scope(|s| {
        for t in 0..2 {
            let w = &w;
            s.spawn(move || uniform_worker(t, w));
        }
        std::thread::sleep(kill_at);
        let warn_before = warnings.0.load(Ordering::Relaxed);
        c.kill_manager();
        // A memory node holding data dies while nobody can declare it dead.
        std::thread::sleep(Duration::from_secs(4));
        c.kill_memnode(0).unwrap();
        std::thread::sleep(outage - Duration::from_secs(4));
        let warn_during = warnings.0.load(Ordering::Relaxed) - warn_before;
        c.start_manager_again().unwrap();
        let swap_ins_at_restart = rt.stats().swap_ins;
        std::thread::sleep(Duration::from_secs(2));
        let swap_ins_after = rt.stats().swap_ins;
        std::thread::sleep(Duration::from_secs(3));
        w.stop.store(true, Ordering::Relaxed);
        (warn_before, warn_during, swap_ins_at_restart, swap_ins_after)
    });
    let errors = w.errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    let restart = kill_at + outage;
    let per_second: Vec<u64> = (0..20)
        .map(|i| w.ops_between(Duration::from_secs(i), Duration::from_secs(i + 1)))
        .collect();
    eprintln!("ops per second: {per_second:?}");
    let before = w.ops_between(kill_at - Duration::from_secs(2), kill_at);
    let after = w.ops_between(restart + Duration::from_secs(2), restart + Duration::from_secs(4));
    eprintln!(
        "ops: 2 s before the kill {before}, 2-4 s after the restart {after}; swap-ins in the 2 s after the \
         restart {}; WARN lines: {warn_before} before, {warn_during} during the outage; {:?}",
        swap_ins_after - swap_ins_at_restart,
        rt.stats()
    );
    assert!(
        swap_ins_after > swap_ins_at_restart,
        "far memory still paused 2 s after the manager returned"
    );
    assert!(warn_during <= 20, "{warn_during} WARN lines in a 10 s outage");
    // The dead memory node's members are rebuilt once the manager is back.
    let deadline = Instant::now() + Duration::from_secs(60);
    while rt.stats().recoveries == 0 || rt.stats().recovering > 0 {
        assert!(
            Instant::now() < deadline,
            "no rebuild after the restart: {:?}",
            rt.stats()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    verify_all(&rt, &objs, &versions);
    assert_eq!(rt.stats().lost_positions, 0, "nothing may be lost: {:?}", rt.stats());
}
