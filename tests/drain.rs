//! A planned departure against real processes: a memory node holding a
//! runtime's far data gets SIGTERM, asks the manager to mark it draining,
//! and leaves by itself once every region it lent is given back. The
//! runtime moves its spans to the other nodes meanwhile (rebuilt from the
//! rest of each stripe, read around the draining node), so the node exits
//! cleanly, every object reads back byte for byte throughout, nothing is
//! lost, and none of the runtime's regions is on the node afterwards.
//! `non-ft` has no other copy to rebuild from: its node waits.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use remora_runtime::{RemBox, Runtime, scheme};

/// How long a node may take to drain 8 MiB of spans on a loaded 2-core machine.
const DRAIN_LIMIT: Duration = Duration::from_secs(90);

fn runtime(c: &remora_cluster::LocalCluster, scheme_name: &str) -> Runtime {
    let mut cfg = runtime_config(c, "drain-test", 2 << 20);
    cfg.scheme = scheme::by_name(scheme_name).unwrap();
    cfg.patience = Duration::from_secs(20);
    Runtime::connect(cfg).unwrap()
}

/// Seven nodes (4+2 stripes and a spare) with 2 MiB regions, 8 MiB of
/// 2 KiB objects under a 2 MiB budget; the node holding the runtime's
/// fullest region drains while a reader checks every object over and over.
fn drains_and_loses_nothing(scheme_name: &str) {
    in_process::init_tracing();
    // 2 MiB regions: the draining node holds positions of several groups.
    let c = quick_cluster(7, 64 << 20, 2 << 20);
    let rt = runtime(&c, scheme_name);
    let n = 4096usize;
    let objs: Vec<RemBox<Obj2K>> = (0..n as u64).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    let victim = memnode_holding_data(&c, &rt);
    let addr = c.memnodes()[victim].addr.clone();
    let stop = AtomicBool::new(false);
    let status = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut passes = 0u32;
            while !stop.load(Ordering::Relaxed) || passes == 0 {
                verify(&rt, &objs, |_| 0, "while the node drains");
                passes += 1;
            }
            passes
        });
        std::thread::sleep(Duration::from_millis(50));
        c.terminate_memnode(victim).unwrap();
        let status = c.wait_memnode_exit(victim, DRAIN_LIMIT);
        stop.store(true, Ordering::Relaxed);
        let passes = reader.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        eprintln!("{scheme_name}: {passes} passes over every object while the node drained");
        status
    });
    let status =
        status.unwrap_or_else(|e| panic!("{scheme_name}: the draining node did not leave: {e}: {:?}", rt.stats()));
    assert!(status.success(), "{scheme_name}: the drained node's exit: {status}");
    verify(&rt, &objs, |_| 0, "after the node left");
    let st = rt.stats();
    assert_eq!(st.scheme.lost_positions, 0, "{scheme_name}: {st:?}");
    assert!(
        st.scheme.reconstructed_bytes > 0,
        "{scheme_name}: nothing was moved: {st:?}"
    );
    assert!(
        rt.regions_with_data().iter().all(|(_, g)| g.addr != addr),
        "{scheme_name}: a region on the departed node is still in use"
    );
    // The departed node is gone for the manager too, and the runtime goes on
    // evicting to the others.
    let gone = c.status().unwrap();
    assert!(
        gone.memory_nodes
            .iter()
            .all(|m| m.addr != addr || m.state == remora_proto::NodeState::Dead),
        "{gone:?}"
    );
    let more: Vec<RemBox<Obj2K>> = (0..n as u64).map(|i| rt.alloc(obj(i, 1)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    verify(&rt, &more, |_| 1, "written after the node left");
    verify(&rt, &objs, |_| 0, "the first objects, at the end");
}

#[test]
fn ec_batch_moves_a_draining_nodes_spans() {
    drains_and_loses_nothing("ec-batch");
}

#[test]
fn replication_moves_a_draining_nodes_spans() {
    drains_and_loses_nothing("replication");
}

#[test]
fn ec_split_moves_a_draining_nodes_spans() {
    drains_and_loses_nothing("ec-split");
}

#[test]
fn ec_2pc_moves_a_draining_nodes_spans() {
    drains_and_loses_nothing("ec-2pc");
}

/// `non-ft` holds the only copy: the draining node keeps serving it and
/// does not leave while the runtime holds regions there.
#[test]
fn non_ft_keeps_serving_a_draining_node_it_cannot_move_from() {
    in_process::init_tracing();
    let c = quick_cluster(3, 64 << 20, 8 << 20);
    let rt = runtime(&c, "non-ft");
    let objs: Vec<RemBox<Obj2K>> = (0..4096u64).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    let victim = memnode_holding_data(&c, &rt);
    c.terminate_memnode(victim).unwrap();
    assert!(
        c.wait_memnode_exit(victim, Duration::from_secs(3)).is_err(),
        "the node left with the only copy of spans"
    );
    verify(&rt, &objs, |_| 0, "while the node waits");
    assert_eq!(rt.stats().scheme.lost_positions, 0);
}
