//! Adaptive compaction (`ec-batch`) on in-process memory nodes whose load
//! the test sets: folds run Remote while the nodes are idle, Local once one
//! is busy (no Remote fold after the switch), Remote again once they calm
//! down, and every object keeps its bytes throughout. (Real processes made
//! busy by fault injection: `tests/adaptive_processes.rs` of the workspace.)

use std::time::Duration;

use remora_memnode::InProcessCluster;
use remora_runtime::scheme::SchemeOptions;
use remora_testkit::in_process::{config, runtime};
use remora_testkit::{Churn, KIB, MIB};

/// Folds whenever there is a fold: each round makes few holes.
fn eager() -> SchemeOptions {
    SchemeOptions {
        compaction_trigger: 0.0,
        ..SchemeOptions::default()
    }
}

/// 8 MiB of 1 KiB objects under a 1 MiB budget: most of them far. Each
/// round rewrites a run of 16 objects (about a span) in every 4: their
/// spans come back dirty and leave holes in their spansets to fold.
fn objects(rt: &remora_runtime::Runtime) -> Churn<126> {
    Churn::new(rt, 8 * KIB, 16, Duration::from_secs(10))
}

/// Churning waits up to 30 s for what it waits for.
const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn ec_batch_folds_remote_while_memory_nodes_are_idle_and_local_while_one_is_busy() {
    let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
    let rt = runtime(&c, config("ec-batch", &eager(), MIB));
    let mut objs = objects(&rt);

    let idle = objs.until(&rt, "remote folds", PATIENCE, |s| s.scheme.compactions_remote >= 4);
    assert_eq!(idle.scheme.compaction_mode, Some("remote"), "{idle:?}");
    assert_eq!(
        (idle.scheme.compactions_local, idle.scheme.compaction_switches),
        (0, 0),
        "idle nodes: {idle:?}"
    );

    // One busy node is enough: every fold of its groups waits for it.
    let busy_node = rt.regions()[0].1.node;
    c.node(busy_node).unwrap().set_cpu_permille(900);
    let busy = objs.until(&rt, "switch to local", PATIENCE, |s| {
        s.scheme.compaction_mode == Some("local") && s.scheme.compactions_local >= 4
    });
    assert_eq!(busy.scheme.compaction_switches, 1, "{busy:?}");
    assert_eq!(busy.scheme.memnode_cpu_permille, 900, "{busy:?}");
    // The switch drained the Remote folds in flight: none runs after it.
    let remote_at_switch = busy.scheme.compactions_remote;
    assert!(remote_at_switch >= idle.scheme.compactions_remote);
    let still = objs.until(&rt, "more local folds", PATIENCE, |s| {
        s.scheme.compactions_local >= busy.scheme.compactions_local + 4
    });
    assert_eq!(
        still.scheme.compactions_remote, remote_at_switch,
        "a Remote fold ran while a node was busy"
    );
    assert_eq!(still.scheme.compaction_switches, 1, "{still:?}");
    assert_eq!(
        still.scheme.compactions,
        still.scheme.compactions_local + still.scheme.compactions_remote,
        "every fold runs in one mode: {still:?}"
    );
    objs.verify(&rt, "while busy");

    // Calm again: after a few calm polls, back to Remote.
    c.node(busy_node).unwrap().set_cpu_permille(100);
    let calm = objs.until(&rt, "switch back to remote", PATIENCE, |s| {
        s.scheme.compaction_mode == Some("remote") && s.scheme.compactions_remote >= remote_at_switch + 4
    });
    assert_eq!(calm.scheme.compaction_switches, 2, "{calm:?}");
    assert_eq!(calm.scheme.memnode_cpu_permille, 100, "{calm:?}");
    objs.verify(&rt, "after the calm");
}

/// Fixed modes never switch, whatever the nodes say.
#[test]
fn fixed_modes_ignore_memory_node_load() {
    for (name, mode) in [("ec-batch-local", "local"), ("ec-batch-remote", "remote")] {
        let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
        for n in c.nodes() {
            n.set_cpu_permille(if mode == "remote" { 2000 } else { 0 });
        }
        let rt = runtime(&c, config(name, &eager(), MIB));
        let mut objs = objects(&rt);
        let st = objs.until(&rt, name, PATIENCE, |s| s.scheme.compactions >= 4);
        assert_eq!(st.scheme.compaction_mode, Some(mode), "{name}: {st:?}");
        assert_eq!(st.scheme.compaction_switches, 0, "{name}: {st:?}");
        let in_mode = if mode == "local" {
            st.scheme.compactions_local
        } else {
            st.scheme.compactions_remote
        };
        assert_eq!(in_mode, st.scheme.compactions, "{name}: {st:?}");
        objs.verify(&rt, name);
    }
}
