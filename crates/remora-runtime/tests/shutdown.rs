//! Dropping a runtime is prompt whatever its background threads are
//! retrying: eviction waiting for regions a cluster short of m+1 nodes
//! cannot grant, a rebuild waiting for a replacement region, a rebuild
//! backing off between failed tries, a stripe group being re-striped,
//! swap-outs failing against memory nodes whose leases lapsed. Each waits far longer (its patience, 60 s
//! here) than the bound a drop is held to.

use std::time::{Duration, Instant};

use remora_memnode::InProcessCluster;
use remora_runtime::scheme::SchemeOptions;
use remora_runtime::{RemBox, Runtime, Stats};
use remora_testkit::in_process::{self, serial};
use remora_testkit::{KIB, MIB, Obj, obj, wait_stats};

/// Generous for a loaded 2-core machine, far below any patience here.
const DROP_WITHIN: Duration = Duration::from_secs(1);

/// Longer than any test may take: a wait that ignores shutdown shows.
const PATIENCE: Duration = Duration::from_secs(60);

fn runtime(c: &InProcessCluster, budget: usize, patience: Duration) -> Runtime {
    runtime_of("ec-batch", c, budget, patience)
}

fn runtime_of(scheme: &str, c: &InProcessCluster, budget: usize, patience: Duration) -> Runtime {
    let mut cfg = in_process::config(scheme, &SchemeOptions::default(), budget);
    cfg.patience = patience;
    in_process::runtime(c, cfg)
}

/// Drops `rt` and fails the test unless that took under [`DROP_WITHIN`].
fn assert_prompt_drop(rt: Runtime, what: &str) {
    let start = Instant::now();
    drop(rt);
    let took = start.elapsed();
    assert!(took < DROP_WITHIN, "dropping a runtime {what} took {took:?}");
}

/// `n` objects allocated without eviction (the budget is large), then the
/// budget cut to a quarter of them, so the eviction threads start writing.
fn fill_then_squeeze(rt: &Runtime, n: u64) -> Vec<RemBox<Obj>> {
    let objs: Vec<RemBox<Obj>> = (0..n).map(|i| rt.alloc(obj(i, 0)).expect("alloc")).collect();
    rt.set_local_budget((n as usize * KIB) / 4);
    objs
}

/// Two nodes for ec-batch's six positions (fewer than the m+1 even a
/// short spanset needs): the manager never has a stripe group to give,
/// and eviction waits for one (up to its patience).
#[test]
fn drop_while_eviction_waits_for_a_stripe_group() {
    let _one = serial();
    let c = InProcessCluster::new(2, 16, 2 * MIB as u64);
    let rt = runtime(&c, 8 * MIB, PATIENCE);
    let objs = fill_then_squeeze(&rt, 1024);
    // Long enough for an eviction thread to be inside the wait.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rt.stats().traffic.swap_outs, 0, "no stripe group, so nothing went out");
    assert_prompt_drop(rt, "whose eviction waits for regions");
    drop(objs);
}

/// k+m nodes, one of which dies: the rebuild needs a replacement region
/// on a node its group does not use, and there is none, so it waits (up
/// to its patience) inside `Placement::replacement`. (`ec-2pc`: `ec-batch`
/// would re-stripe the group onto the five live nodes instead.)
#[test]
fn drop_while_a_rebuild_waits_for_a_replacement() {
    let _one = serial();
    let (c, rt, objs) = six_nodes_filled("ec-2pc", PATIENCE);
    c.nodes()[0].kill(true);
    wait_stats(&rt, "a recovery under way", Duration::from_secs(20), |st| {
        st.scheme.recovering > 0
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rt.stats().scheme.recoveries, 0, "nowhere to rebuild, so nothing was");
    assert_prompt_drop(rt, "whose rebuild waits for a replacement");
    drop(objs);
}

/// As above with little patience: each try fails at once and the worker
/// backs off between tries (up to a second), then tries again.
#[test]
fn drop_while_a_rebuild_backs_off_between_tries() {
    let _one = serial();
    let (c, rt, objs) = six_nodes_filled("ec-2pc", Duration::from_millis(50));
    c.nodes()[0].kill(true);
    // Several retries: the back-off has grown to its longest.
    wait_stats(&rt, "failed rebuild tries", Duration::from_secs(30), |st: &Stats| {
        st.scheme.rebuild_retries >= 4
    });
    assert_prompt_drop(rt, "whose rebuild backs off");
    drop(objs);
}

/// `ec-batch` on k+m nodes, one of which dies: no node is left outside
/// the group to rebuild on, so the group is re-striped (its spans come
/// back a batch at a time and go out again as 3+2 spansets); the runtime
/// is dropped as soon as that has begun.
#[test]
fn drop_while_a_group_is_restriped() {
    let _one = serial();
    let (c, rt, objs) = six_nodes_filled("ec-batch", PATIENCE);
    c.nodes()[0].kill(true);
    wait_stats(&rt, "re-striping under way", Duration::from_secs(20), |st| {
        st.scheme.restriped_spans > 0
    });
    assert_prompt_drop(rt, "that re-stripes a stripe group");
    drop(objs);
}

/// Every node's lease lapsed (the manager gone): no swap-out can write,
/// and eviction keeps trying.
#[test]
fn drop_while_swap_outs_fail_against_lapsed_leases() {
    let _one = serial();
    let c = InProcessCluster::new(6, 16, 2 * MIB as u64);
    let rt = runtime(&c, 8 * MIB, PATIENCE);
    for n in c.nodes() {
        n.lapse_lease();
    }
    let objs = fill_then_squeeze(&rt, 1024);
    std::thread::sleep(Duration::from_millis(500));
    assert_prompt_drop(rt, "whose swap-outs fail");
    drop(objs);
}

/// Exactly k+m nodes and objects evicted to every one of them.
fn six_nodes_filled(scheme: &str, patience: Duration) -> (InProcessCluster, Runtime, Vec<RemBox<Obj>>) {
    let c = InProcessCluster::new(6, 16, 2 * MIB as u64);
    let rt = runtime_of(scheme, &c, MIB, patience);
    let objs: Vec<RemBox<Obj>> = (0..4 * KIB as u64)
        .map(|i| rt.alloc(obj(i, 0)).expect("alloc"))
        .collect();
    rt.wait_for_eviction(Duration::from_secs(20)).expect("evicted");
    assert!(rt.stats().traffic.swap_outs > 0);
    (c, rt, objs)
}
