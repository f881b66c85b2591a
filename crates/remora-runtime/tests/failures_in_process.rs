//! Several memory nodes failing, on in-process nodes (faults at exact
//! steps): two positions of one stripe group lost at once, a node dying in
//! the middle of another's rebuild, a rebuild that cannot find a
//! replacement for a long time, more failures than parity covers, and a
//! node draining while its groups have no parity to spare. Every
//! object read back is compared with what was written. (Real processes:
//! the workspace's `tests/failures_processes.rs`.)

use std::collections::HashMap;
use std::time::Duration;

use remora_memnode::InProcessCluster;
use remora_proto::NodeId;
use remora_runtime::scheme::SchemeOptions;
use remora_runtime::scheme::SpanAddr;
use remora_runtime::{LossCause, RemBox, Runtime, RuntimeError};
use remora_testkit::in_process::{self, serial};
use remora_testkit::{KIB, MIB, Node, Obj, obj, recovered, verify, wait_stats};

fn runtime(c: &InProcessCluster, patience: Duration) -> Runtime {
    runtime_of("ec-batch", c, patience)
}

fn runtime_of(scheme: &str, c: &InProcessCluster, patience: Duration) -> Runtime {
    let mut cfg = in_process::config(scheme, &SchemeOptions::default(), MIB);
    cfg.patience = patience;
    in_process::runtime(c, cfg)
}

fn fill(rt: &Runtime, n: u64) -> Vec<RemBox<Obj>> {
    let objs: Vec<RemBox<Obj>> = (0..n).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(20)).unwrap();
    objs
}

/// Reads every object back and compares each byte.
fn check_all(rt: &Runtime, objs: &[RemBox<Obj>]) {
    verify(rt, objs, |_| 0, "verify");
}

/// A cluster of k+m = 6 nodes, so every stripe group the fill takes spans
/// all of them, and `fill` objects; then `spares` more nodes to rebuild on.
/// Returns the first six nodes (each in every group).
fn six_then(spares: usize, patience: Duration) -> (InProcessCluster, Runtime, Vec<RemBox<Obj>>, Vec<NodeId>) {
    six_then_of("ec-batch", spares, patience)
}

fn six_then_of(
    scheme: &str,
    spares: usize,
    patience: Duration,
) -> (InProcessCluster, Runtime, Vec<RemBox<Obj>>, Vec<NodeId>) {
    let c = InProcessCluster::new(6, 16, 2 * MIB as u64);
    let rt = runtime_of(scheme, &c, patience);
    let objs = fill(&rt, 8 * KIB as u64);
    let six = c.nodes().iter().map(|n| n.id()).collect();
    for _ in 0..spares {
        c.add_node();
    }
    (c, rt, objs, six)
}

/// After recovery nothing is read around any more: a full pass of reads
/// takes no degraded read.
fn assert_not_degraded(rt: &Runtime, objs: &[RemBox<Obj>]) {
    let before = rt.stats().scheme.degraded_reads;
    check_all(rt, objs);
    check_all(rt, objs);
    let st = rt.stats();
    assert_eq!(
        st.scheme.degraded_reads, before,
        "reads still go around a failure: {st:?}"
    );
}

/// Two members of the same stripe group die (m = 2): every object is still
/// read right while both are gone and undeclared, then the manager declares
/// both dead at once and both positions are rebuilt.
#[test]
fn two_positions_of_one_group_are_read_around_and_both_rebuilt() {
    let _one_at_a_time = serial();
    let (c, rt, objs, group) = six_then(4, Duration::from_secs(5));
    let (a, b) = (c.node(group[0]).unwrap(), c.node(group[1]).unwrap());
    a.kill(false);
    b.kill(false);
    // Half the objects, read around both: the other half stays where it
    // was written (a swap-in re-evicts away from the dead nodes), so the
    // rebuild has work to do.
    check_all(&rt, &objs[..objs.len() / 2]);
    assert!(rt.stats().scheme.degraded_reads > 0, "{:?}", rt.stats());
    a.declare_dead();
    b.declare_dead();
    let st = wait_stats(&rt, "both rebuilt", Duration::from_secs(60), |st| recovered(st, 2));
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    assert!(st.scheme.reconstructed_bytes > 0, "{st:?}");
    check_all(&rt, &objs);
    assert_not_degraded(&rt, &objs);
}

/// A second node dies while the first one's positions are being rebuilt
/// from it: the interrupted rebuild is retried from other survivors (not
/// abandoned), and once the second death is declared its positions are
/// rebuilt too.
#[test]
fn a_node_dying_mid_rebuild_does_not_stop_either_recovery() {
    let _one_at_a_time = serial();
    let (c, rt, objs, group) = six_then(4, Duration::from_secs(5));
    // Another member of every group dies at the next data request it
    // serves: a read of a rebuild of the first one's positions.
    let (a, b) = (c.node(group[0]).unwrap(), c.node(group[1]).unwrap());
    b.die_after(0);
    a.kill(true);
    let st = wait_stats(&rt, "first recovery", Duration::from_secs(60), |st| recovered(st, 1));
    assert!(b.is_dead(), "the second node died during the rebuild");
    assert!(
        st.scheme.rebuild_retries > 0,
        "the interrupted rebuild was retried: {st:?}"
    );
    b.declare_dead();
    let st = wait_stats(&rt, "second recovery", Duration::from_secs(60), |st| recovered(st, 2));
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    check_all(&rt, &objs);
    assert_not_degraded(&rt, &objs);
}

/// With no node to rebuild on, a rebuild of a scheme whose spansets cannot
/// be short (`ec-2pc` fills unwritten members in place) fails again and
/// again (more than the 5 tries it used to get): it is never abandoned, and
/// once a node joins the periodic retry rebuilds the position.
#[test]
fn a_failing_rebuild_is_retried_until_a_replacement_exists() {
    let _one_at_a_time = serial();
    // Exactly k+m nodes: no spare for a replacement.
    let (c, rt, objs, group) = six_then_of("ec-2pc", 0, Duration::from_millis(300));
    c.node(group[0]).unwrap().kill(true);
    let st = wait_stats(&rt, "many failed tries", Duration::from_secs(90), |st| {
        st.scheme.rebuild_retries > 6
    });
    assert_eq!(st.scheme.recovering, 1, "still under way, not given up: {st:?}");
    c.add_node();
    let st = wait_stats(&rt, "rebuilt on the new node", Duration::from_secs(60), |st| {
        recovered(st, 1)
    });
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    check_all(&rt, &objs);
    assert_not_degraded(&rt, &objs);
}

/// A node drains while `deaths` members of every stripe group are dead
/// and there is no node to rebuild them on. A failed position is not read,
/// so the draining node's positions are failed only where the group keeps a
/// parity member to spare afterwards (m − 1 = 1 failed at most): with one
/// death a member dying mid-move would leave fewer than k, with two there
/// would be fewer than k at once. Either way they stay on the node, which
/// keeps serving them, and nothing is reported lost. Once nodes join and
/// the dead members are rebuilt, the runtime asks again and moves them,
/// giving back every region the node lent.
fn drain_waits_for_spare_parity(deaths: usize) {
    let _one_at_a_time = serial();
    let (c, rt, objs, group) = six_then_of("ec-2pc", 0, Duration::from_millis(300));
    for &n in &group[..deaths] {
        c.node(n).unwrap().kill(true);
    }
    wait_stats(
        &rt,
        "rebuilds failing for want of a node",
        Duration::from_secs(60),
        |st| st.scheme.rebuild_retries > 0,
    );
    let d = c.node(group[deaths]).unwrap();
    d.drain();
    // Past the runtime's once-a-second second look.
    std::thread::sleep(Duration::from_millis(1500));
    check_all(&rt, &objs);
    let st = rt.stats();
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    assert_eq!(
        st.scheme.recovering, deaths as u64,
        "only the deaths are being recovered: {st:?}"
    );
    assert!(d.regions_lent() > 0, "the draining node's positions stayed on it");
    for _ in 0..=deaths {
        c.add_node();
    }
    // The deaths and the drain, each settled; the node lends nothing.
    let st = wait_stats(
        &rt,
        "the deaths and the drain recovered",
        Duration::from_secs(90),
        |st| recovered(st, deaths as u64 + 1) && d.regions_lent() == 0,
    );
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    check_all(&rt, &objs);
    assert_not_degraded(&rt, &objs);
}

#[test]
fn a_draining_node_waits_while_a_member_of_its_groups_is_down() {
    drain_waits_for_spare_parity(1);
}

#[test]
fn a_draining_node_waits_while_its_groups_have_no_parity_to_spare() {
    drain_waits_for_spare_parity(2);
}

/// `ec-batch` with one of exactly k+m nodes dead: no node is left outside
/// the stripe group to rebuild on, so the group is re-striped (its spans
/// brought back and written again as 3+2 spansets on the five live nodes)
/// instead of staying below full tolerance; when a sixth node joins, new
/// spansets are 4+2 again. Every object verifies throughout.
#[test]
fn a_group_with_no_node_to_rebuild_on_is_restriped_onto_the_live_nodes() {
    let _one_at_a_time = serial();
    let (c, rt, objs, group) = six_then(0, Duration::from_millis(300));
    let far_spans = rt.stats().scheme.spansets_written;
    c.node(group[0]).unwrap().kill(true);
    let st = wait_stats(&rt, "re-striped", Duration::from_secs(60), |st| {
        recovered(st, 1) && st.scheme.spansets_below_tolerance == 0
    });
    assert!(st.scheme.restriped_spans > 0, "{st:?}");
    assert!(st.scheme.short_spansets > 0, "written again as 3+2 spansets: {st:?}");
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    assert_eq!(st.scheme.reconstructed_bytes, 0, "nothing rebuilt in place: {st:?}");
    assert!(far_spans > 0);
    check_all(&rt, &objs);
    assert_not_degraded(&rt, &objs);
    // A sixth node: full spansets again for what is evicted from now on.
    c.add_node();
    std::thread::sleep(Duration::from_millis(1100));
    let before = rt.stats();
    check_all(&rt, &objs);
    rt.wait_for_eviction(Duration::from_secs(20)).unwrap();
    let after = rt.stats();
    assert!(
        after.scheme.spansets_written - before.scheme.spansets_written
            > after.scheme.partial_spansets - before.scheme.partial_spansets,
        "full 4+2 spansets once six nodes live: {after:?}"
    );
    check_all(&rt, &objs);
}

/// Two of seven nodes die at once: five live nodes cannot hold a 4+2
/// spanset, so every group that lost a position with no node left outside
/// it is re-striped, and new spansets are 3+2. Nothing is lost and every
/// spanset tolerates two losses again.
#[test]
fn two_of_seven_nodes_dying_at_once_are_restriped_to_full_tolerance() {
    let _one_at_a_time = serial();
    let c = InProcessCluster::new(7, 16, 2 * MIB as u64);
    let rt = runtime(&c, Duration::from_secs(5));
    let objs = fill(&rt, 8 * KIB as u64);
    let two: Vec<NodeId> = c.nodes().iter().take(2).map(|n| n.id()).collect();
    for n in &two {
        c.node(*n).unwrap().kill(true);
    }
    let st = wait_stats(&rt, "tolerance restored", Duration::from_secs(60), |st| {
        recovered(st, 2) && st.scheme.spansets_below_tolerance == 0
    });
    assert!(st.scheme.restriped_spans > 0, "{st:?}");
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    check_all(&rt, &objs);
    assert_not_degraded(&rt, &objs);
    assert!(rt.stats().scheme.short_spansets > 0, "{:?}", rt.stats());
}

/// An object that owns another (so freeing it has drop glue to run).
type Holder = Node<Obj>;

/// Three members of one stripe group die (m = 2): exactly the objects whose
/// spans sat on the dead members return a typed `DataLost` naming their
/// span and object; all others read right, including those in the broken
/// group's surviving members; dropping the lost objects works (with and
/// without drop glue) and the application carries on.
#[test]
fn more_failures_than_parity_lose_exactly_the_dead_members_objects() {
    let _one_at_a_time = serial();
    // Six nodes at first: every stripe group spans all of them.
    let c = InProcessCluster::new(6, 16, 2 * MIB as u64);
    let rt = runtime(&c, Duration::from_secs(5));
    let mut objs = fill(&rt, 6 * KIB as u64);
    let holders: Vec<RemBox<Holder>> = (0..2 * KIB as u64)
        .map(|i| {
            let h = Holder {
                value: obj(1 << 40 | i, 0),
                next: None,
            };
            rt.alloc(h).unwrap()
        })
        .collect();
    rt.wait_for_eviction(Duration::from_secs(20)).unwrap();
    let killed: Vec<NodeId> = c.nodes().iter().take(3).map(|n| n.id()).collect();
    for n in &killed {
        c.node(*n).unwrap().kill(true);
    }
    // Every failure settles: nothing can be rebuilt, and the driver stops.
    let st = wait_stats(&rt, "failures settled", Duration::from_secs(60), |st| recovered(st, 3));
    assert!(st.scheme.lost_positions >= 3, "{st:?}");
    // Only 3 nodes are left, so no stripe group can be formed: every far
    // object is in a group that lost 3 members, and it is lost exactly when
    // its own span sat on one of them.
    let node_of: HashMap<u16, NodeId> = rt.regions().into_iter().map(|(i, g)| (i, g.node)).collect();
    let on_dead = |at: Option<(SpanAddr, u16)>| at.filter(|(s, _)| killed.contains(&node_of[&s.region]));
    let expect: Vec<Option<(SpanAddr, u16)>> = objs.iter().map(|o| on_dead(o.far_span())).collect();
    let expect_h: Vec<Option<(SpanAddr, u16)>> = holders.iter().map(|o| on_dead(o.far_span())).collect();
    let doomed = expect.iter().flatten().count();
    assert!(
        doomed > 0 && doomed < objs.len(),
        "{doomed} of {} on dead members",
        objs.len()
    );
    // Spares, so k+m nodes are alive again and eviction goes on.
    for _ in 0..4 {
        c.add_node();
    }
    let check_lost = |i: usize, e: RuntimeError, want: (SpanAddr, u16)| match e {
        RuntimeError::DataLost {
            span,
            object,
            cause: LossCause::TooFewSurvivors { survivors, needed, .. },
        } => {
            assert_eq!((span, object), (Some(want.0), Some(want.1)), "object {i}: named");
            assert!(survivors < needed, "object {i}: {survivors} of {needed}");
        }
        other => panic!("object {i}: {other}"),
    };
    let mut lost = Vec::new();
    for _ in 0..2 {
        // Twice: a loss stays a clean error, and never turns into bytes.
        lost.clear();
        let mut scope = rt.scope();
        for (i, o) in objs.iter().enumerate() {
            match (o.deref(&scope), expect[i]) {
                (Ok(got), None) => assert!(Obj::is(got, i as u64, 0), "object {i}: wrong bytes"),
                (Ok(_), Some(at)) => panic!("object {i} at {at:?} on a dead member was read"),
                (Err(e), Some(at)) => {
                    check_lost(i, e, at);
                    lost.push(i);
                }
                (Err(e), None) => panic!("object {i}: {e}"),
            }
            if i % 64 == 0 {
                scope.renew();
            }
        }
        for (i, h) in holders.iter().enumerate() {
            match (h.deref(&scope), expect_h[i]) {
                (Ok(got), None) => assert!(Obj::is(&got.value, 1 << 40 | i as u64, 0), "holder {i}"),
                (Err(e), Some(at)) => check_lost(i, e, at),
                (r, at) => panic!("holder {i} at {at:?}: {:?}", r.err()),
            }
            if i % 64 == 0 {
                scope.renew();
            }
        }
    }
    assert_eq!(lost.len(), doomed);
    // Dropping the lost objects works without reading them; the rest go on.
    let before = rt.stats().local.objects;
    let lost_holders = expect_h.iter().flatten().count();
    let mut kept = Vec::new();
    for (i, o) in objs.drain(..).enumerate() {
        if expect[i].is_none() {
            kept.push((i, o));
        }
    }
    let holders: Vec<RemBox<Holder>> = holders
        .into_iter()
        .enumerate()
        .filter_map(|(i, h)| expect_h[i].is_none().then_some(h))
        .collect();
    let st = rt.stats();
    assert_eq!(
        st.local.objects + (doomed + lost_holders) as u64,
        before,
        "every lost object was freed: {st:?}"
    );
    let more: Vec<RemBox<Obj>> = (0..4 * KIB as u64)
        .map(|i| rt.alloc(obj(1 << 30 | i, 0)).unwrap())
        .collect();
    rt.wait_for_eviction(Duration::from_secs(20)).unwrap();
    let mut scope = rt.scope();
    for (i, o) in &kept {
        assert!(Obj::is(o.deref(&scope).unwrap(), *i as u64, 0), "object {i}");
        scope.renew();
    }
    for (i, o) in more.iter().enumerate() {
        assert!(
            Obj::is(o.deref(&scope).unwrap(), 1 << 30 | i as u64, 0),
            "new object {i}"
        );
        scope.renew();
    }
    drop(scope);
    drop(holders);
}

/// Bit rot in two members of one stripe group, at two positions and in two
/// different spansets, then a third position dies: no one set of k
/// survivors serves both spansets, so each row that fails its checksum is
/// tried alone from other sets of survivors. The rebuild finishes (before,
/// it failed its checksum on every retry, for ever), and every object
/// reads back right.
#[test]
fn a_rebuild_finds_survivors_row_by_row_around_corrupt_members() {
    let _one_at_a_time = serial();
    let (c, rt, objs, group) = six_then(1, Duration::from_secs(5));
    let regions = rt.regions();
    let (r0, r1) = (&regions[0].1, &regions[1].1);
    let (n0, n1) = (c.node(r0.node).unwrap(), c.node(r1.node).unwrap());
    // Position 0: the group's first spanset (first page). Position 1: a
    // spanset half-way through what the region holds.
    let page = remora_runtime::internals::PAGE_SIZE as u64;
    let used = (0..r1.size / page)
        .filter(|&p| {
            n1.peek(r1.cap.region, p * page, page as usize)
                .is_some_and(|b| b.iter().any(|&x| x != 0))
        })
        .collect::<Vec<u64>>();
    assert!(used.len() > 8, "too little data at position 1");
    assert!(n0.rot(r0.cap.region, 8));
    assert!(n1.rot(r1.cap.region, used[used.len() / 2] * page + 8));
    let dead = c.node(group[3]).unwrap();
    assert_eq!(dead.id(), regions[3].1.node, "position 3 of the first group");
    dead.kill(true);
    let st = wait_stats(
        &rt,
        "rebuilt around the corrupt members",
        Duration::from_secs(30),
        |st| recovered(st, 1),
    );
    assert_eq!(st.scheme.lost_positions, 0, "{st:?}");
    check_all(&rt, &objs);
    let st = rt.stats();
    assert!(st.scheme.checksum_repairs > 0, "no read met a corrupt member: {st:?}");
}
