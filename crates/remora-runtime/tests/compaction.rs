//! Remote compaction (`ec-batch-local`, `ec-batch-remote`) on in-process
//! memory nodes: folds give far memory back, every object keeps its bytes,
//! and parity updated by deltas still decodes every span once a node is
//! gone. (Real processes: `tests/compaction.rs` of the workspace.)

use std::time::{Duration, Instant};

use remora_memnode::InProcessCluster;
use remora_runtime::scheme::SchemeOptions;
use remora_runtime::{RemBox, Runtime, Stats};
use remora_testkit::in_process;
use remora_testkit::{KIB, MIB, Obj, obj};

fn runtime(c: &InProcessCluster, name: &str, threads: usize) -> Runtime {
    let opts = SchemeOptions {
        compaction_threads: threads,
        // Fold whenever there is a fold: the test makes few holes.
        compaction_trigger: 0.0,
        ..SchemeOptions::default()
    };
    in_process::runtime(c, in_process::config(name, &opts, MIB))
}

/// Fills 8 MiB of objects under a 1 MiB budget, then rewrites three in
/// four runs of 16 objects (about a span each): their spans come back dirty
/// and leave spansets with about one live span and three holes.
fn holey(rt: &Runtime) -> Vec<RemBox<Obj>> {
    let n = 8 * KIB as u64;
    let mut objs: Vec<RemBox<Obj>> = (0..n).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    for (i, o) in objs.iter_mut().enumerate().filter(|(i, _)| version(*i) == 1) {
        let scope = rt.scope();
        *o.deref_mut(&scope).unwrap() = obj(i as u64, 1);
    }
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    objs
}

fn version(i: usize) -> u64 {
    u64::from((i / 16) % 4 != 0)
}

fn verify(rt: &Runtime, objs: &[RemBox<Obj>]) {
    remora_testkit::verify(rt, objs, version, "verify");
}

/// Waits until compaction has run and found nothing more to fold for a while.
fn settle(rt: &Runtime) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = rt.stats();
    let mut quiet_since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let st = rt.stats();
        if st.scheme.compactions != last.scheme.compactions {
            quiet_since = Instant::now();
        }
        last = st;
        if last.scheme.compactions > 0 && quiet_since.elapsed() > Duration::from_millis(500) {
            return last;
        }
        assert!(Instant::now() < deadline, "compaction never settled: {last:?}");
    }
}

fn far_per_live(st: &Stats) -> f64 {
    st.far.bytes_used as f64 / st.far.live_bytes.max(1) as f64
}

fn gives_back_far_memory(name: &str) {
    // Without compaction, as a yardstick from the same workload.
    let c0 = InProcessCluster::new(7, 32, 2 * MIB as u64);
    let rt0 = runtime(&c0, name, 0);
    let objs0 = holey(&rt0);
    std::thread::sleep(Duration::from_millis(300));
    let without = rt0.stats();
    assert_eq!(without.scheme.compactions, 0);
    drop(objs0);
    drop(rt0);

    let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
    let rt = runtime(&c, name, 2);
    let objs = holey(&rt);
    let st = settle(&rt);
    assert!(
        st.scheme.compacted_bytes_freed > 0 && st.scheme.compacted_dead_bytes > 0,
        "{name}: nothing given back: {st:?}"
    );
    // What compaction removes is holes; far memory per live byte follows
    // (how much depends on how many holes the workload happened to leave).
    assert!(
        st.far.hole_bytes < without.far.hole_bytes,
        "{name}: {} hole bytes with compaction, {} without",
        st.far.hole_bytes,
        without.far.hole_bytes
    );
    assert!(
        far_per_live(&st) < far_per_live(&without) * 1.02,
        "{name}: far memory per live byte {:.2} with compaction, {:.2} without",
        far_per_live(&st),
        far_per_live(&without)
    );
    assert!(
        st.traffic.txn_requests > 0,
        "{name}: transactions are counted at the transport: {st:?}"
    );
    // Parity changed by deltas must decode: lose a node of the folded
    // spansets (without the manager's notice, so nothing is rebuilt) and
    // read everything, spans on it by decoding.
    let victim = rt.regions()[0].1.node;
    c.node(victim).unwrap().kill(false);
    verify(&rt, &objs);
    let after = rt.stats();
    assert!(
        after.scheme.degraded_reads > 0,
        "{name}: no read went around the dead node: {after:?}"
    );
}

#[test]
fn local_compaction_gives_back_far_memory() {
    gives_back_far_memory("ec-batch-local");
}

#[test]
fn remote_compaction_gives_back_far_memory() {
    gives_back_far_memory("ec-batch-remote");
}

#[test]
fn remote_compaction_counts_deltas_between_memory_nodes() {
    let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
    let rt = runtime(&c, "ec-batch-remote", 2);
    let objs = holey(&rt);
    let st = settle(&rt);
    let peer = remora_proto::msg::PeerTraffic::sum(c.nodes().iter().map(|n| n.peer_traffic()));
    assert!(
        peer.delta_bytes > 0 && peer.delta_applies >= st.scheme.compactions,
        "deltas crossed between memory nodes: {peer:?} for {st:?}"
    );
    verify(&rt, &objs);
}

#[test]
fn failed_prepares_abort_folds_and_lose_nothing() {
    let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
    let rt = runtime(&c, "ec-batch-local", 2);
    // The first stripe group is placed by the first eviction.
    let first: Vec<RemBox<Obj>> = (0..2 * KIB as u64).map(|i| rt.alloc(obj(i, 9)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    drop(first);
    // Its parity node, which every fold there involves, dies at the first
    // prepare it is sent: that fold aborts, and no later one starts in the
    // group (a position is unusable).
    let parity_node = rt.regions()[4].1.node;
    c.node(parity_node).unwrap().die_at_txn(0, false);
    let objs = holey(&rt);
    let st = quiesce(&rt);
    assert!(
        st.scheme.compactions_aborted > 0,
        "no fold met the failing node: {st:?}"
    );
    verify(&rt, &objs);
}

/// Waits (up to 4 s) until folds have run or been aborted and nothing has
/// changed for half a second; unlike `settle`, a run where the failure
/// stopped every fold is fine.
fn quiesce(rt: &Runtime) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(4);
    let tried = |s: &Stats| s.scheme.compactions + s.scheme.compactions_aborted;
    let mut last = rt.stats();
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let st = rt.stats();
        if tried(&st) != tried(&last) {
            quiet_since = Instant::now();
        }
        last = st;
        if tried(&last) > 0 && quiet_since.elapsed() > Duration::from_millis(500) {
            break;
        }
    }
    last
}

/// A memory node dies at every step of the folds it takes part in (each
/// of its first transaction requests, before applying it or after applying
/// it with the reply lost), as a data node and as a parity node, in both
/// modes: every object still reads back right, from survivors of one
/// generation.
#[test]
fn a_node_dying_at_any_step_of_a_fold_loses_nothing() {
    for name in ["ec-batch-local", "ec-batch-remote"] {
        // Region indices of the first stripe group: data positions 0-3,
        // parity 4-5. Folds move spans at only some data positions (and
        // the folds of a group share one commit per node), so a position
        // may see fewer transaction requests than the step: the next one
        // is tried. Each case must kill a node at that step somewhere.
        for (role, regions) in [("data", &[1usize, 0, 2, 3][..]), ("parity", &[4, 5][..])] {
            for step in 0..3u64 {
                for after_applying in [false, true] {
                    let what = format!("{name}, {role} node dies at step {step} (after applying: {after_applying})");
                    let died = regions
                        .iter()
                        .any(|&region| dies_and_loses_nothing(name, region, step, after_applying, &what));
                    assert!(died, "{what}: no {role} node saw that many transaction requests");
                }
            }
        }
    }
}

/// One case of the test above: the node of `region` dies at `step` of the
/// transaction requests it is sent; every object must still read back
/// right. Returns whether the node reached that step (and died).
fn dies_and_loses_nothing(name: &str, region: usize, step: u64, after_applying: bool, what: &str) -> bool {
    let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
    let rt = runtime(&c, name, 2);
    let objs = holey(&rt);
    let node = rt.regions()[region].1.node;
    c.node(node).unwrap().die_at_txn(step, after_applying);
    let st = quiesce(&rt);
    assert!(
        st.scheme.compactions + st.scheme.compactions_aborted > 0,
        "{what}: no fold was tried"
    );
    let mut scope = rt.scope();
    for (i, o) in objs.iter().enumerate() {
        let got = o
            .deref(&scope)
            .unwrap_or_else(|e| panic!("{what} (region {region}): object {i}: {e}; {st:?}"));
        assert!(Obj::is(got, i as u64, version(i)), "{what}: object {i}: wrong bytes");
        if i % 64 == 0 {
            scope.renew();
        }
    }
    c.node(node).unwrap().is_dead()
}

/// Every node of the first stripe group has its lease lapse at the first
/// commit it is sent (as when the manager goes down mid-fold), renewed a
/// second later: the commits are asked again until the nodes take them, so
/// no member is left a fold behind. Nothing is then read around or
/// repaired, and with a data node killed every object still decodes right.
/// (Commits given up on after a few tries left members stale on nodes the
/// manager then found alive; their spans failed their checksums.)
#[test]
fn a_commit_refused_while_a_lease_lapsed_is_retried_until_taken() {
    for name in ["ec-batch-local", "ec-batch-remote"] {
        let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
        let rt = runtime(&c, name, 2);
        let objs = holey(&rt);
        let group: Vec<_> = (0..6).map(|r| c.node(rt.regions()[r].1.node).unwrap()).collect();
        for n in &group {
            n.lapse_lease_at_commit(0);
        }
        let start = Instant::now();
        while group.iter().all(|n| n.is_serving()) && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !group.iter().all(|n| n.is_serving()),
            "{name}: no fold reached a commit: {:?}",
            rt.stats()
        );
        std::thread::sleep(Duration::from_secs(1));
        for n in &group {
            n.renew_lease();
        }
        quiesce(&rt);
        let before = rt.stats();
        verify(&rt, &objs);
        let st = rt.stats();
        assert_eq!(st.scheme.checksum_repairs, 0, "{name}: a stale member was read: {st:?}");
        assert_eq!(
            st.scheme.degraded_reads, before.scheme.degraded_reads,
            "{name}: a member is read around: {st:?}"
        );
        group[0].kill(true);
        verify(&rt, &objs);
    }
}

/// A parity node of the first stripe group (every fold there commits on
/// it) is cut off at the first commit it is sent, for longer than a commit
/// is retried while the others answer: its members of that fold are left
/// in doubt (old bytes or new), and their spansets below full tolerance.
/// They are read around, never folded again meanwhile (a fold would move
/// whichever bytes the node holds), and once the node answers they are
/// rebuilt in place from the members that agree. A data node of the group
/// then dies, and its rebuild reads, for each spanset, only members it can
/// trust. Every object reads back right.
#[test]
fn a_commit_never_acknowledged_is_read_around_then_repaired() {
    for name in ["ec-batch-local", "ec-batch-remote"] {
        let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
        let rt = runtime(&c, name, 2);
        // The first stripe group is placed by the first eviction.
        let first: Vec<RemBox<Obj>> = (0..2 * KIB as u64).map(|i| rt.alloc(obj(i, 9)).unwrap()).collect();
        rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
        drop(first);
        let data: Vec<_> = (0..4).map(|r| c.node(rt.regions()[r].1.node).unwrap()).collect();
        let parity = c.node(rt.regions()[4].1.node).unwrap();
        parity.break_at_commit(0, Duration::from_secs(4));
        let objs = holey(&rt);
        let start = Instant::now();
        while parity.commit_break_pending() && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !parity.commit_break_pending(),
            "{name}: no fold reached a commit: {:?}",
            rt.stats()
        );
        let limit = Duration::from_secs(20);
        // (The cut may have come and gone, and the repair with it.)
        remora_testkit::wait_stats(&rt, "a member in doubt", limit, |s| {
            s.scheme.spansets_below_tolerance > 0 || s.scheme.doubt_repairs > 0
        });
        let st = remora_testkit::wait_stats(&rt, "members in doubt repaired", limit, |s| {
            s.scheme.doubt_repairs > 0 && s.scheme.spansets_below_tolerance == 0
        });
        verify(&rt, &objs);
        // Another data node of the group dies; its rebuild must finish.
        data[1].kill(true);
        let after = remora_testkit::wait_stats(&rt, "the dead node rebuilt", limit, |s| {
            remora_testkit::recovered(s, 1) && s.scheme.spansets_below_tolerance == 0
        });
        verify(&rt, &objs);
        assert_eq!(after.scheme.lost_positions, 0, "{name}: {after:?}");
        eprintln!(
            "{name}: {} doubt repairs, {} folds, {} aborted",
            st.scheme.doubt_repairs, after.scheme.compactions, after.scheme.compactions_aborted
        );
    }
}
