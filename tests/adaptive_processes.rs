//! Adaptive compaction against real processes: `ec-batch` folds Remote
//! while its memory nodes are idle; a memory node made busy by fault
//! injection (threads spinning in its process) measures its own CPU going
//! up, and compaction switches to Local; once the fault is cleared it
//! switches back. Every object is compared with what was last written.
//! Needs the binary built with `--features fault-injection`.

mod common;

use std::time::Duration;

use common::*;
use remora_proto::Fault;
use remora_runtime::{Runtime, scheme};

/// 16 MiB of 2 KiB objects under a 2 MiB budget: most of them far. Each
/// round rewrites a run of 8 objects (about a span) in every 4: their
/// spans come back dirty and leave holes in their spansets to fold.
fn objects(rt: &Runtime) -> Churn<254> {
    Churn::new(rt, 8192, 8, Duration::from_secs(20))
}

/// Churning waits up to a minute for what it waits for (the cores are
/// shared with other tests).
const PATIENCE: Duration = Duration::from_secs(60);

#[test]
fn ec_batch_switches_to_local_compaction_while_a_memory_node_is_busy() {
    let c = cluster(7, 64 << 20, 8 << 20);
    let mut cfg = runtime_config(&c, "adaptive-test", 2 << 20);
    let opts = scheme::SchemeOptions {
        // Fold whenever there is a fold: each round makes few holes.
        compaction_trigger: 0.0,
        ..scheme::SchemeOptions::default()
    };
    cfg.scheme = scheme::make("ec-batch", &opts).unwrap();
    cfg.patience = Duration::from_secs(20);
    let rt = Runtime::connect(cfg).unwrap();
    let mut objs = objects(&rt);

    let idle = objs.until(&rt, "remote folds", PATIENCE, |s| s.scheme.compactions_remote >= 4);
    assert_eq!(idle.scheme.compaction_mode, Some("remote"), "{idle:?}");
    assert_eq!(idle.scheme.compactions_local, 0, "idle nodes: {idle:?}");
    // Remote folds send the compute node no delta: only small requests.
    assert_eq!(
        idle.traffic.txn_bytes, 0,
        "deltas crossed the compute node in Remote mode: {idle:?}"
    );
    let idle_cpu = c
        .status()
        .unwrap()
        .memory_nodes
        .iter()
        .map(|m| m.load.cpu_permille)
        .max();
    eprintln!("idle: busiest memory node at {idle_cpu:?}‰ of a core; {idle:?}");

    // A node holding our far data spins four threads: its own CPU use
    // goes up for real (its fair share of the two cores, whatever else runs).
    let addr = rt.regions()[0].1.addr.clone();
    let busy_node = c.memnodes().iter().position(|m| m.addr == addr).unwrap();
    c.fault(
        busy_node,
        Fault::Busy {
            threads: 4,
            millis: 120_000,
        },
    )
    .unwrap();
    let busy = objs.until(&rt, "switch to local", PATIENCE, |s| {
        s.scheme.compaction_mode == Some("local") && s.scheme.compactions_local >= 4
    });
    assert!(busy.scheme.compaction_switches >= 1, "{busy:?}");
    assert!(busy.scheme.memnode_cpu_permille >= 500, "{busy:?}");
    // Local folds bring the deltas to the compute node.
    assert!(
        busy.traffic.txn_bytes > 0,
        "no delta reached the compute node in Local mode: {busy:?}"
    );
    // The manager sees it too, from the node's heartbeats.
    let st = c
        .wait_until(
            Duration::from_secs(10),
            "the busy node's heartbeat shows its load",
            |s| {
                s.memory_nodes
                    .iter()
                    .any(|m| m.addr == addr && m.load.cpu_permille >= 500)
            },
        )
        .unwrap();
    eprintln!(
        "busy: {:?}; memory nodes' CPU ‰: {:?}",
        busy,
        st.memory_nodes.iter().map(|m| m.load.cpu_permille).collect::<Vec<_>>()
    );
    let more = objs.until(&rt, "more local folds", PATIENCE, |s| {
        s.scheme.compactions_local >= busy.scheme.compactions_local + 4
    });
    assert!(more.scheme.compactions_local > busy.scheme.compactions_local);
    assert_eq!(
        more.scheme.compactions,
        more.scheme.compactions_local + more.scheme.compactions_remote,
        "every fold ran in one mode: {more:?}"
    );
    objs.verify(&rt, "while busy");

    // Cleared: once the node calms down, Remote again.
    c.fault(busy_node, Fault::Resume).unwrap();
    let calm = objs.until(&rt, "switch back to remote", PATIENCE, |s| {
        s.scheme.compaction_mode == Some("remote") && s.scheme.compactions_remote > more.scheme.compactions_remote
    });
    assert!(calm.scheme.compaction_switches >= 2, "{calm:?}");
    objs.verify(&rt, "after the fault");
    assert_eq!(rt.stats().scheme.compactions_aborted, 0, "no fold failed: {calm:?}");
}
