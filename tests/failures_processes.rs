//! Several memory nodes killed with SIGKILL, against real processes: two at
//! once during a multi-threaded workload with writes, one while another's
//! rebuild is running, and three members of the same stripe groups (more
//! than RS(4,2) covers). Every object read back is compared with what was
//! written. (In-process faults at exact steps: the runtime crate's
//! `tests/failures_in_process.rs`.)

mod common;

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use remora_runtime::scheme::SpanAddr;
use remora_runtime::{LossCause, RemBox, Runtime, RuntimeError, Stats, scheme};

fn ec_runtime(c: &remora_cluster::LocalCluster) -> Runtime {
    let mut cfg = runtime_config(c, "failures-test", 2 << 20);
    cfg.scheme = scheme::by_name("ec-batch").unwrap();
    cfg.patience = Duration::from_secs(20);
    Runtime::connect(cfg).unwrap()
}

/// Two members of one stripe group are killed during a workload that reads
/// and writes from 4 threads: at once (`staggered` false), or the second as
/// soon as the first one's recovery has started. Both are rebuilt, no
/// operation fails, every object verifies at its latest version, and
/// afterwards nothing is read around any more.
fn kill_two(staggered: bool) {
    // Six nodes while the objects are written, so every stripe group spans
    // all of them (any two are two members of every group); then three
    // spares to rebuild on.
    let mut c = quick_cluster(6, 64 << 20, 8 << 20);
    let rt = ec_runtime(&c);
    let n = 8192u64; // 16 MiB of 2 KiB objects: 8x the budget
    let objs: Vec<RwLock<RemBox<Obj2K>>> = (0..n).map(|i| RwLock::new(rt.alloc(obj(i, 0)).unwrap())).collect();
    for _ in 0..3 {
        c.add_memnode().unwrap();
    }
    let c = c;
    let versions: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let w = Skewed::new(&rt, &objs, &versions);
    let outcome = std::thread::scope(|s| {
        for t in 0..4u64 {
            let w = &w;
            s.spawn(move || skewed_worker(t, w, Duration::from_micros(300)));
        }
        // Any failure below stops the workers first, so nothing waits on them forever.
        let run = || -> Result<Stats, String> {
            std::thread::sleep(Duration::from_millis(500));
            c.kill_memnode(0).map_err(|e| e.to_string())?;
            let start = Instant::now();
            if staggered {
                // The manager's notice has arrived: the first rebuild runs.
                while rt.stats().scheme.recovering == 0 && rt.stats().scheme.recoveries == 0 {
                    if start.elapsed() > Duration::from_secs(60) {
                        return Err(format!("no recovery started: {:?}", rt.stats()));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                eprintln!("second kill with the first recovery at {:?}", rt.stats());
            }
            c.kill_memnode(1).map_err(|e| e.to_string())?;
            loop {
                let st = rt.stats();
                if recovered(&st, 2) {
                    return Ok(st);
                }
                if start.elapsed() > Duration::from_secs(120) {
                    return Err(format!("recovery did not finish: {st:?}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let outcome = run();
        std::thread::sleep(Duration::from_millis(300));
        w.stop.store(true, Ordering::Relaxed);
        outcome
    });
    let st = outcome.unwrap_or_else(|e| panic!("{e}"));
    w.assert_no_errors();
    eprintln!("after two failures: {st:?}");
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    assert!(st.scheme.reconstructed_bytes > 0, "{st:?}");
    // Every object at its latest version; the second pass takes no
    // degraded read: both nodes' positions were rebuilt.
    let mut degraded = 0;
    for pass in 0..2 {
        let before = rt.stats().scheme.degraded_reads;
        let mut scope = rt.scope();
        for (i, o) in objs.iter().enumerate() {
            let g = o.read().unwrap();
            let v = versions[i].load(Ordering::Relaxed);
            let got = g.deref(&scope).unwrap_or_else(|e| panic!("object {i}: {e}"));
            assert!(Words::is(got, i as u64, v), "object {i} v{v} wrong after recovery");
            drop(g);
            if i % 64 == 0 {
                scope.renew();
            }
        }
        if pass == 1 {
            degraded = rt.stats().scheme.degraded_reads - before;
        }
    }
    assert_eq!(degraded, 0, "reads still go around a failure: {:?}", rt.stats());
}

#[test]
fn two_nodes_killed_at_once_during_a_workload_are_both_rebuilt() {
    kill_two(false);
}

#[test]
fn a_node_killed_during_another_nodes_rebuild_is_rebuilt_too() {
    kill_two(true);
}

/// Three members of every stripe group are killed (m = 2): exactly the
/// objects whose spans sat on them return a typed `DataLost` naming span
/// and object, everything else verifies, dropping the lost objects works,
/// and the application goes on once nodes join.
#[test]
fn three_dead_members_lose_exactly_their_objects() {
    // Six nodes at first: every stripe group spans all of them.
    let mut c = quick_cluster(6, 64 << 20, 8 << 20);
    let rt = ec_runtime(&c);
    let n = 4096u64;
    let objs: Vec<RemBox<Obj2K>> = (0..n).map(|i| rt.alloc(obj(i, 1)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(20)).unwrap();
    let killed: Vec<String> = c.memnodes()[..3].iter().map(|m| m.addr.clone()).collect();
    for i in 0..3 {
        c.kill_memnode(i).unwrap();
    }
    let start = Instant::now();
    let st = loop {
        let st = rt.stats();
        if recovered(&st, 3) {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "failures not settled: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(st.scheme.lost_positions >= 3, "{st:?}");
    // No group can form on 3 nodes: every far object is in a broken group,
    // lost exactly when its own span sat on a dead node.
    let addr_of: HashMap<u16, String> = rt.regions().into_iter().map(|(i, g)| (i, g.addr)).collect();
    let expect: Vec<Option<(SpanAddr, u16)>> = objs
        .iter()
        .map(|o| o.far_span().filter(|(s, _)| killed.contains(&addr_of[&s.region])))
        .collect();
    let doomed = expect.iter().flatten().count();
    assert!(doomed > 0 && doomed < objs.len(), "{doomed} of {n}");
    for _ in 0..3 {
        c.add_memnode().unwrap();
    }
    let mut scope = rt.scope();
    for (i, o) in objs.iter().enumerate() {
        match (o.deref(&scope), expect[i]) {
            (Ok(got), None) => assert!(Words::is(got, i as u64, 1), "object {i}: wrong bytes"),
            (
                Err(RuntimeError::DataLost {
                    span,
                    object,
                    cause: LossCause::TooFewSurvivors { .. },
                }),
                Some(at),
            ) => assert_eq!((span, object), (Some(at.0), Some(at.1)), "object {i}: named"),
            (Ok(_), Some(at)) => panic!("object {i} at {at:?} on a dead node was read"),
            (Err(e), at) => panic!("object {i} at {at:?}: {e}"),
        }
        if i % 64 == 0 {
            scope.renew();
        }
    }
    drop(scope);
    // The application drops what it lost and goes on.
    let before = rt.stats().local.objects;
    let kept: Vec<(usize, RemBox<Obj2K>)> = objs
        .into_iter()
        .enumerate()
        .filter(|(i, _)| expect[*i].is_none())
        .collect();
    assert_eq!(rt.stats().local.objects + doomed as u64, before, "lost objects freed");
    let more: Vec<RemBox<Obj2K>> = (0..2048u64).map(|i| rt.alloc(obj(n + i, 2)).unwrap()).collect();
    let mut scope = rt.scope();
    for (i, o) in &kept {
        assert!(Words::is(o.deref(&scope).unwrap(), *i as u64, 1), "object {i}");
        scope.renew();
    }
    for (i, o) in more.iter().enumerate() {
        assert!(Words::is(o.deref(&scope).unwrap(), n + i as u64, 2), "new object {i}");
        scope.renew();
    }
}

/// A memory node holding far data is killed and restarted at
/// its address at once, as a supervisor would: the new incarnation serves
/// there, empty, while the manager counts the old one dead. Reads running
/// all along (before, across and after the restart, while the old
/// positions are rebuilt) never fail; every object verifies; nothing is
/// lost. (The exact step where the new incarnation refuses a read before
/// the manager's word arrives: the runtime crate's
/// `tests/outage_in_process.rs`.)
#[test]
fn a_node_restarted_at_its_address_loses_nothing() {
    in_process::init_tracing();
    let mut c = quick_cluster(7, 64 << 20, 8 << 20);
    let rt = ec_runtime(&c);
    let n = 4096u64; // 8 MiB of 2 KiB objects: 4x the budget
    let objs: Vec<RemBox<Obj2K>> = (0..n).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    let victim = memnode_holding_data(&c, &rt);
    let check = |what: &str| {
        let mut scope = rt.scope();
        for (i, o) in objs.iter().enumerate() {
            let got = o
                .deref(&scope)
                .unwrap_or_else(|e| panic!("{what}: object {i}: {e}: {:?}", rt.stats()));
            assert!(Words::is(got, i as u64, 0), "{what}: object {i} has wrong bytes");
            if i % 64 == 0 {
                scope.renew();
            }
        }
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let st = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut passes = 0u32;
            while !stop.load(Ordering::Relaxed) || passes == 0 {
                check("while the node restarts");
                passes += 1;
            }
            passes
        });
        std::thread::sleep(Duration::from_millis(50));
        let restarted = c.restart_memnode(victim);
        let st = restarted.map(|()| {
            wait_stats(&rt, "the old incarnation's rebuild", Duration::from_secs(120), |s| {
                recovered(s, 1)
            })
        });
        stop.store(true, Ordering::Relaxed);
        let passes = reader.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        eprintln!("{passes} passes over every object while the node restarted");
        st.unwrap()
    });
    check("after the rebuild");
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    assert!(st.scheme.reconstructed_bytes > 0, "nothing was rebuilt: {st:?}");
}
