//! The paper's KV store (`remora_apps::kv`) against a real cluster under
//! `ec-batch`, with the local budget a quarter of the data: TPC-A transfers
//! from four threads and the trimmer beside them while a memory node holding
//! data is killed with SIGKILL. No transfer may fail, and at the end the
//! audit reads every row's newest version back, verifies its bytes, and
//! checks Σ accounts = Σ tellers = Σ branches = initial + Σ history with a
//! history record per committed transfer.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use rand::SeedableRng;
use remora_apps::kv::tpca::{Bank, Shape};
use remora_apps::kv::{KvBank, ROW_BYTES};
use remora_collections::{RemBTreeMap, RemVec};
use remora_runtime::{Runtime, scheme};

fn runtime(c: &remora_cluster::LocalCluster, name: &str, budget: usize) -> Runtime {
    let mut cfg = runtime_config(c, "kv", budget);
    cfg.scheme = scheme::by_name(name).unwrap();
    cfg.patience = Duration::from_secs(20);
    Runtime::connect(cfg).unwrap()
}

#[test]
fn tpc_a_on_the_kv_store_survives_a_killed_node_under_ec_batch() {
    remora_testkit::in_process::init_tracing();
    let shape = Shape {
        branches: 16,
        accounts_per_branch: 128,
    };
    // 2 224 rows of 4 KiB (8.7 MiB) at up to 3 versions: a budget of a
    // quarter of one version keeps most rows far.
    let data = shape.rows() as usize * ROW_BYTES;
    let c = quick_cluster(7, 128 << 20, 8 << 20);
    let rt = runtime(&c, "ec-batch", data / 4);
    let bank = KvBank::load(RemBTreeMap::new(&rt), RemVec::new(&rt), shape, 2).unwrap();
    let committed = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| bank.store().run_trimmer(&stop));
        for t in 0..4u64 {
            let (bank, committed, stop, failures) = (&bank, &committed, &stop, &failures);
            s.spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                while !stop.load(Ordering::Relaxed) {
                    match bank.transfer(&shape.draw(&mut rng)) {
                        Ok(()) => {
                            committed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => failures.lock().unwrap().push(e.to_string()),
                    }
                }
            });
        }
        let guard = StopOnDrop(&stop);
        std::thread::sleep(Duration::from_millis(1500));
        let before = committed.load(Ordering::Relaxed);
        let victim = memnode_holding_data(&c, &rt);
        c.kill_memnode(victim).unwrap();
        let killed = Instant::now();
        loop {
            let st = rt.stats();
            if st.scheme.recoveries >= 1 && st.scheme.recovering == 0 && st.scheme.spansets_below_tolerance == 0 {
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(60),
                "recovery did not finish: {st:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Transfers go on after the rebuild too.
        let at_rebuild = committed.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1000));
        drop(guard);
        assert!(before > 100, "only {before} transfers before the kill");
        assert!(
            committed.load(Ordering::Relaxed) > at_rebuild + 100,
            "transfers stalled after the rebuild"
        );
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} transfers failed, first: {}",
        failures.len(),
        failures[0]
    );
    bank.store().trim().unwrap();
    let st = rt.stats();
    eprintln!(
        "{} transfers; kv {:?}; runtime {st:?}",
        committed.load(Ordering::Relaxed),
        bank.store().stats()
    );
    assert!(st.scheme.reconstructed_bytes > 0 && st.traffic.swap_ins > 100, "{st:?}");
    assert!(st.far.objects > shape.rows() / 2, "most rows should be far: {st:?}");
    let audit = bank.audit().unwrap();
    audit.check(&shape, committed.load(Ordering::Relaxed)).unwrap();
    assert_eq!(audit.values, shape.rows());
    // Only the newest two versions of each row are left.
    let kv = bank.store().stats();
    assert_eq!(kv.trim_pending, 0);
    for key in shape.keys().step_by(7) {
        let n = bank.store().newest(key).unwrap();
        if n >= 2 {
            assert_eq!(bank.store().get_version_with(key, n - 2, |_| ()).unwrap(), None);
        }
        assert!(bank.store().get_version_with(key, n, |_| ()).unwrap().is_some());
    }
}

/// Stops the workers even when the test panics, so the scope can end.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
