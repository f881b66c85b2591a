//! Filtering threads against a real cluster (manager and memory nodes as
//! child processes on loopback): objects are moved between local spans so
//! that spans hold only hot or only cold objects, and every byte of every
//! object is checked afterwards.
//!
//! ```text
//! cargo test --test filtering -- --nocapture
//! ```

mod common;

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{MIB, Obj, Words, cluster, fast_filtering_runtime, runtime_config};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remora_runtime::{RemBox, Runtime, Stats};

fn runtime(c: &remora_cluster::LocalCluster, name: &str, budget: usize, filtering: usize) -> Runtime {
    let mut cfg = runtime_config(c, name, budget);
    cfg.tuning.filtering_threads = filtering;
    Runtime::connect(cfg).expect("runtime connects")
}

/// Reads every hot object once (checking it), as the workload's hot set does.
fn touch(rt: &Runtime, objs: &[RemBox<Obj>], hot: impl Fn(usize) -> bool) {
    let mut scope = rt.scope();
    for (i, o) in objs.iter().enumerate().filter(|(i, _)| hot(*i)) {
        o.deref(&scope).expect("deref").check(i as u64, 0);
        if i % 256 == 0 {
            scope.renew();
        }
    }
}

/// Sets the flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What one run of the hot/cold workload measured.
#[derive(Debug)]
struct Outcome {
    /// Hot objects local after eviction caught up, out of all hot objects.
    hot_local: f64,
    /// Swap-ins while reading the hot set once afterwards (its misses).
    hot_pass_swap_ins: u64,
    /// Swap-ins while the hot set was read under pressure (2 s).
    pressure_swap_ins: u64,
    stats: Stats,
}

/// Allocates `n` objects with every 4th one hot (so every span mixes hot
/// and cold objects), reads the hot ones repeatedly, then halves the local
/// budget while still reading them. Measures how many hot objects stay
/// local and how many swap-ins one more pass over the hot set costs, then
/// checks every object's bytes.
fn hot_cold_run(c: &remora_cluster::LocalCluster, filtering: usize) -> Outcome {
    const N: usize = 6000;
    let budget = 8 * MIB;
    let hot = |i: usize| i % 4 == 0;
    let rt = runtime(c, &format!("filtering-{filtering}"), budget, filtering);
    // 6000 x 16 KiB / 14 is about 6.7 MiB: below the high watermark.
    let objs: Vec<RemBox<Obj>> = (0..N)
        .map(|i| rt.alloc(Obj::new(i as u64, 0)).expect("alloc"))
        .collect();
    assert_eq!(
        rt.stats().traffic.swap_outs,
        0,
        "nothing should be evicted yet: {:?}",
        rt.stats()
    );

    // Warm-up: the hot set is read over and over while the filter (if any)
    // sorts spans. With filtering, go on until it has stopped moving
    // objects for a while; without, for a fixed time.
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        touch(&rt, &objs, hot);
        std::thread::sleep(Duration::from_millis(2));
        let moved = rt.stats().local.objects_moved;
        if moved != last.0 {
            last = (moved, Instant::now());
        }
        let quiet = last.1.elapsed() > Duration::from_millis(500);
        let elapsed = start.elapsed();
        if (filtering == 0 && elapsed > Duration::from_secs(2))
            || (filtering > 0 && moved > 0 && quiet)
            || elapsed > Duration::from_secs(30)
        {
            break;
        }
    }
    let warm = rt.stats();
    eprintln!("filtering {filtering}: warm-up took {:?}: {warm:?}", start.elapsed());

    // Pressure: half the budget (low watermark 85 % of 4 MiB, 3.4 MiB: room
    // for the 1.7 MiB of hot objects once they share spans), while a thread
    // keeps reading the hot set.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (rt, objs, stop) = (&rt, &objs, &stop);
        // Stops the reader however this closure ends (a panic included).
        let _stop = StopOnDrop(stop);
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                touch(rt, objs, hot);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        rt.set_local_budget(budget / 2);
        // (Not `wait_for_eviction` here: without filtering, the reader
        // swaps evicted hot objects back in as fast as they leave.)
        std::thread::sleep(Duration::from_secs(2));
    });
    // Let a round under way finish. (Usage may rest between the low and
    // the high watermark, where no eviction starts, so `wait_for_eviction`
    // could wait for nothing.)
    std::thread::sleep(Duration::from_millis(200));
    let pressed = rt.stats();
    let pressure_swap_ins = pressed.traffic.swap_ins - warm.traffic.swap_ins;
    assert!(
        pressed.local.bytes <= budget as u64 / 2,
        "eviction kept local memory under the budget: {pressed:?}"
    );
    let hot_total = (0..N).filter(|&i| hot(i)).count();
    let hot_local = objs.iter().enumerate().filter(|(i, o)| hot(*i) && o.is_local()).count();
    let before = rt.stats().traffic.swap_ins;
    touch(&rt, &objs, hot);
    let hot_pass_swap_ins = rt.stats().traffic.swap_ins - before;

    // Every object, hot and cold, byte for byte.
    {
        let mut scope = rt.scope();
        for (i, o) in objs.iter().enumerate() {
            o.deref(&scope).expect("deref").check(i as u64, 0);
            if i % 64 == 0 {
                scope.renew();
            }
        }
    }
    let stats = rt.stats();
    drop(objs);
    rt.wait_for_eviction(Duration::from_secs(20)).expect("eviction settles");
    let end = rt.stats();
    assert_eq!(end.local.objects, 0, "objects leaked: {end:?}");
    assert_eq!(end.far.bytes_used, 0, "far memory leaked: {end:?}");
    Outcome {
        hot_local: hot_local as f64 / hot_total as f64,
        hot_pass_swap_ins,
        pressure_swap_ins,
        stats,
    }
}

/// A 16 KiB object: its spans hold fewer than four, so filtering leaves
/// them alone (moving one would move a quarter of the span or more and
/// make its far copy dirty; CLOCK's large-object rule handles them).
type Big = Words<2046>;

#[test]
fn spans_of_few_large_objects_are_not_filtered() {
    let c = cluster(2, 256 << 20, 16 << 20);
    let rt = fast_filtering_runtime(&c, "filter-large", 64 * MIB);
    let objs: Vec<RemBox<Big>> = (0..128).map(|i| rt.alloc(Big::new(i, 7)).unwrap()).collect();
    // Every span mixes touched and untouched objects, round after round.
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        let scope = rt.scope();
        for (i, o) in objs.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            o.deref(&scope).expect("deref").check(i as u64, 7);
        }
        drop(scope);
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = rt.stats();
    assert_eq!(st.local.objects_moved, 0, "large objects were moved: {st:?}");
    let scope = rt.scope();
    for (i, o) in objs.iter().enumerate() {
        o.deref(&scope).expect("deref").check(i as u64, 7);
    }
}

/// With every 4th object hot, each span mixes hot and cold objects, so
/// span-granular eviction without filtering evicts hot objects along with
/// cold ones. Filtering sorts them into hot and cold spans first: after the
/// same pressure, the hot set stays local and reading it costs (almost) no
/// swap-ins.
#[test]
fn filtering_keeps_hot_objects_local() {
    let c = cluster(2, 256 << 20, 16 << 20);
    let with = hot_cold_run(&c, 1);
    let without = hot_cold_run(&c, 0);
    eprintln!("with filtering:    {with:?}");
    eprintln!("without filtering: {without:?}");
    eprintln!(
        "hot objects local: {:.1} % with filtering, {:.1} % without; swap-ins for one pass over the hot set: {} with, {} without; \
         swap-ins while reading the hot set for 2 s under pressure: {} with, {} without",
        with.hot_local * 100.0,
        without.hot_local * 100.0,
        with.hot_pass_swap_ins,
        without.hot_pass_swap_ins,
        with.pressure_swap_ins,
        without.pressure_swap_ins
    );
    assert!(
        with.stats.local.objects_moved > 0,
        "nothing was moved: {:?}",
        with.stats
    );
    // Every span mixes hot and cold objects, so hot objects move out into
    // hot spans (the hot quarter is the minority of each).
    assert!(
        with.stats.local.objects_moved_hot > 0 && with.stats.local.objects_moved_hot <= with.stats.local.objects_moved,
        "moves into hot spans: {:?}",
        with.stats
    );
    assert!(
        with.stats.local.spans_filtered > 0,
        "no span was emptied: {:?}",
        with.stats
    );
    assert_eq!(without.stats.local.objects_moved, 0, "filtering was off");
    assert!(
        with.stats.traffic.swap_outs > 0 && without.stats.traffic.swap_outs > 0,
        "both runs evicted"
    );
    assert!(
        with.hot_local >= 0.9,
        "with filtering only {:.1} % of hot objects stayed local",
        with.hot_local * 100.0
    );
    assert!(
        with.hot_local >= without.hot_local + 0.2,
        "filtering should keep far more hot objects local: {:.1} % vs {:.1} %",
        with.hot_local * 100.0,
        without.hot_local * 100.0
    );
    assert!(
        with.hot_pass_swap_ins * 2 <= without.hot_pass_swap_ins,
        "filtering should at least halve the hot set's misses: {} vs {}",
        with.hot_pass_swap_ins,
        without.hot_pass_swap_ins
    );
}

/// An object shared by the stress threads and the version it holds.
struct Shared {
    obj: Option<RemBox<Obj>>,
    id: u64,
    version: u64,
}

/// Several threads read, write, free and reallocate objects with a skewed
/// (hot/cold) access pattern over about twice the local budget, while a
/// fast filtering thread moves objects and eviction runs. Every read checks
/// the object's bytes; at the end every object is checked, and nothing may
/// be left locally or far once all are dropped.
#[test]
fn stress_filtering_with_eviction_and_frees() {
    const THREADS: usize = 6;
    const N: u64 = 4000;
    let budget = 2 * MIB;
    let c = cluster(2, 256 << 20, 16 << 20);
    let mut cfg = runtime_config(&c, "filtering-stress", budget);
    // Two filtering threads with short pauses: many rounds, so moves race
    // accesses, frees, evictions and each other as often as possible.
    cfg.tuning.filtering_threads = 2;
    cfg.tuning.filter_interval = Duration::from_millis(1);
    let rt = Runtime::connect(cfg).expect("runtime connects");
    let next_id = AtomicU64::new(N);
    let objs: Vec<RwLock<Shared>> = (0..N)
        .map(|id| {
            RwLock::new(Shared {
                obj: Some(rt.alloc(Obj::new(id, 0)).expect("alloc")),
                id,
                version: 0,
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let ops = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (rt, objs, next_id, ops) = (&rt, &objs, &next_id, &ops);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(0xf117_0000 + t as u64);
                let mut n = 0u64;
                while Instant::now() < deadline && n < 30_000 {
                    n += 1;
                    // 80 % of the operations go to the first eighth of the
                    // objects, spread over every span (index * 8).
                    let k = if rng.random_bool(0.8) {
                        rng.random_range(0..N / 8) * 8
                    } else {
                        rng.random_range(0..N)
                    };
                    let cell = &objs[k as usize];
                    let roll = rng.random_range(0..100);
                    if roll < 60 {
                        let g = cell.read().unwrap();
                        if let Some(o) = &g.obj {
                            let scope = rt.scope();
                            o.deref(&scope).expect("deref").check(g.id, g.version);
                        }
                    } else if roll < 90 {
                        let mut g = cell.write().unwrap();
                        let (id, v) = (g.id, g.version);
                        if let Some(o) = g.obj.as_mut() {
                            let scope = rt.scope();
                            let r = o.deref_mut(&scope).expect("deref_mut");
                            r.check(id, v);
                            *r = Obj::new(id, v + 1);
                            drop(scope);
                            g.version = v + 1;
                        }
                    } else {
                        // Free (checking first) and put a new object in its place.
                        let mut g = cell.write().unwrap();
                        if let Some(o) = g.obj.take() {
                            let scope = rt.scope();
                            o.deref(&scope).expect("deref").check(g.id, g.version);
                            drop(scope);
                            drop(o);
                        }
                        let id = next_id.fetch_add(1, Ordering::Relaxed);
                        g.obj = Some(rt.alloc(Obj::new(id, 0)).expect("alloc"));
                        g.id = id;
                        g.version = 0;
                    }
                }
                ops.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    let st = rt.stats();
    eprintln!("{} ops: {st:?}", ops.load(Ordering::Relaxed));
    assert!(st.local.objects_moved > 0, "nothing was moved: {st:?}");
    assert!(
        st.traffic.swap_outs > 0 && st.traffic.swap_ins > 0,
        "eviction did not run both ways: {st:?}"
    );
    {
        let mut scope = rt.scope();
        for (k, cell) in objs.iter().enumerate() {
            {
                let g = cell.read().unwrap();
                let o = g.obj.as_ref().expect("every cell holds an object");
                o.deref(&scope).expect("deref").check(g.id, g.version);
            }
            if k % 64 == 0 {
                scope.renew();
            }
        }
    }
    drop(objs);
    rt.wait_for_eviction(Duration::from_secs(20)).expect("eviction settles");
    let end = rt.stats();
    assert_eq!(end.local.objects, 0, "objects leaked: {end:?}");
    assert_eq!(end.far.bytes_used, 0, "far memory leaked: {end:?}");
}
