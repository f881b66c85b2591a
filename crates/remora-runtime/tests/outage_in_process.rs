//! Far memory that is unreachable but not lost, on in-process nodes: every
//! memory node's lease lapses at once (as when the manager is down). A read
//! waits it out and succeeds once the leases are renewed; past the outage
//! deadline it fails with `Unavailable`, never `DataLost`, and the data is
//! intact afterwards. A memory node that comes back empty at the same
//! address before the manager's word about it arrives refuses the old
//! capabilities: its copies are read around, not reported as errors.
//! (Real processes: the workspace's `tests/degraded_cluster.rs`.)

use std::time::{Duration, Instant};

use remora_memnode::InProcessCluster;
use remora_runtime::scheme::SchemeOptions;
use remora_runtime::{LossCause, RemBox, Runtime, RuntimeError};
use remora_testkit::in_process::{self, serial};
use remora_testkit::{KIB, MIB, Obj, obj, verify};

/// Every scheme: each must tell an outage from a loss.
const SCHEMES: [&str; 6] = [
    "non-ft",
    "replication",
    "ec-split",
    "ec-2pc",
    "ec-batch-local",
    "ec-batch-remote",
];

/// Seven in-process nodes and a runtime of scheme `name` on them, with a
/// 1 MiB budget, holding 4 MiB of objects: most of them far.
fn filled(name: &str, outage_deadline: Duration) -> (InProcessCluster, Runtime, Vec<RemBox<Obj>>) {
    let c = InProcessCluster::new(7, 16, 2 * MIB as u64);
    let mut cfg = in_process::config(name, &SchemeOptions::default(), MIB);
    cfg.outage_deadline = outage_deadline;
    let rt = in_process::runtime(&c, cfg);
    let objs: Vec<RemBox<Obj>> = (0..4 * KIB as u64).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(20)).unwrap();
    (c, rt, objs)
}

/// The first object whose span is far now.
fn a_far_object(objs: &[RemBox<Obj>]) -> usize {
    objs.iter().position(|o| !o.is_local()).expect("some object is far")
}

fn set_leases(c: &InProcessCluster, hold: bool) {
    for n in c.nodes() {
        if hold {
            n.renew_lease();
        } else {
            n.lapse_lease();
        }
    }
}

/// Past the outage deadline a read of a far object is `Unavailable` (after
/// waiting the deadline out), not `DataLost`; once the leases hold again
/// every object reads back right.
#[test]
fn an_outage_longer_than_the_deadline_is_unavailable_not_lost() {
    let _one = serial();
    for name in SCHEMES {
        let deadline = Duration::from_millis(300);
        let (c, rt, objs) = filled(name, deadline);
        let i = a_far_object(&objs);
        set_leases(&c, false);
        let start = Instant::now();
        let got = objs[i].deref(&rt.scope()).map(|o| o.is(i as u64, 0));
        let took = start.elapsed();
        match got {
            Err(RuntimeError::Unavailable {
                span: Some(_), waited, ..
            }) => {
                assert!(waited >= deadline, "{name}: gave up after {waited:?}");
            }
            other => panic!("{name}: object {i} during the outage: {other:?}"),
        }
        assert!(took < deadline * 20, "{name}: the read took {took:?}");
        set_leases(&c, true);
        verify(&rt, &objs, |_| 0, name);
        assert_eq!(rt.stats().scheme.lost_positions, 0, "{name}");
    }
}

/// An outage shorter than the deadline is waited out: the read that met it
/// returns the right bytes once the leases are renewed.
#[test]
fn an_outage_shorter_than_the_deadline_is_waited_out() {
    let _one = serial();
    for name in SCHEMES {
        let (c, rt, objs) = filled(name, Duration::from_secs(30));
        let i = a_far_object(&objs);
        set_leases(&c, false);
        let outage = Duration::from_millis(400);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(outage);
                set_leases(&c, true);
            });
            let start = Instant::now();
            let scope = rt.scope();
            let o = objs[i]
                .deref(&scope)
                .unwrap_or_else(|e| panic!("{name}: object {i}: {e}"));
            assert!(o.is(i as u64, 0), "{name}: object {i}: wrong bytes");
            assert!(
                start.elapsed() >= outage / 2,
                "{name}: the read did not wait for the outage"
            );
        });
        verify(&rt, &objs, |_| 0, name);
    }
}

/// The memory node holding the most far data restarts empty at its address
/// and nobody says so yet: it serves again but refuses every capability of
/// its old regions. Each redundant scheme reads around the refused copies
/// and every object reads back right, with nothing counted lost; non-ft,
/// with no other copy, waits for the manager's word (`Unavailable`, not a
/// refusal passed up), which then makes the span lost, naming why.
#[test]
fn a_node_restarted_empty_is_read_around_before_the_manager_says_so() {
    let _one = serial();
    for name in SCHEMES {
        let deadline = Duration::from_millis(300);
        let (c, rt, objs) = filled(name, deadline);
        let (_, fullest) = rt.regions_with_data().into_iter().next().expect("far data");
        let node = c.node(fullest.node).expect("the node is in the cluster");
        node.restart_empty();
        if name == "non-ft" {
            let (i, err) = objs
                .iter()
                .enumerate()
                .find_map(|(i, o)| o.deref(&rt.scope()).err().map(|e| (i, e)))
                .expect("some object was on the node that restarted");
            assert!(
                matches!(err, RuntimeError::Unavailable { waited, .. } if waited >= deadline),
                "{name}: object {i} on the restarted node: {err:?}"
            );
            node.declare_dead();
            match objs[i].deref(&rt.scope()).map(|_| ()) {
                Err(RuntimeError::DataLost {
                    cause: LossCause::NoRedundancy { .. },
                    ..
                }) => {}
                other => panic!("{name}: object {i} after the manager's word: {other:?}"),
            }
            continue;
        }
        let before = rt.stats();
        verify(&rt, &objs, |_| 0, name);
        let st = rt.stats().since(&before);
        assert!(
            st.scheme.degraded_reads > 0,
            "{name}: no read went around the refused copies: {st:?}"
        );
        assert_eq!(st.scheme.lost_positions, 0, "{name}");
        // The manager's word comes: the old incarnation's positions are
        // rebuilt, and everything still reads back right.
        node.declare_dead();
        remora_testkit::wait_stats(&rt, name, Duration::from_secs(60), |s| remora_testkit::recovered(s, 1));
        verify(&rt, &objs, |_| 0, name);
    }
}
