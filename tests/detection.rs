//! Fast, careful failure detection against real processes: the compute node
//! reads around a node on its own evidence (a read overdue, a connection
//! refused) without waiting out its 10 s call timeout, and the manager,
//! asked to rule, declares a dead node dead long before its heartbeat
//! timeout, but never a node that was only stalled for less than its lease.
//! Every object read back is compared with what was written.

mod common;

use std::time::{Duration, Instant};

use common::*;
use remora_cluster::LocalCluster;
use remora_proto::{NodeId, NodeState};
use remora_runtime::{RemBox, Runtime, Stats, scheme};

/// Long enough that the manager's own heartbeat rule cannot be what
/// declares a node dead in these tests (its lease is 4 s: 4 heartbeat
/// intervals of 1 s).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

fn setup() -> (LocalCluster, Runtime, Vec<RemBox<Obj2K>>) {
    // Six nodes for RS(4,2), then a spare to rebuild on.
    let mut c = cluster_with_timeout(6, 64 << 20, 8 << 20, HEARTBEAT_TIMEOUT);
    let mut cfg = runtime_config(&c, "detection-test", 2 << 20);
    cfg.scheme = scheme::by_name("ec-batch").unwrap();
    cfg.patience = Duration::from_secs(30);
    let rt = Runtime::connect(cfg).unwrap();
    let objs: Vec<RemBox<Obj2K>> = (0..4096u64).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(60)).unwrap();
    c.add_memnode().unwrap();
    (c, rt, objs)
}

fn state(c: &LocalCluster, id: NodeId) -> NodeState {
    c.status()
        .unwrap()
        .memory_nodes
        .iter()
        .find(|m| m.id == id)
        .expect("listed")
        .state
}

/// Reads every object back and compares it; returns the stats after.
fn verify_all(rt: &Runtime, objs: &[RemBox<Obj2K>]) -> Stats {
    for (i, b) in objs.iter().enumerate() {
        let s = rt.scope();
        let o = b.deref(&s).unwrap_or_else(|e| panic!("object {i}: {e}"));
        assert!(Words::is(o, i as u64, 0), "object {i}: got id {} v{}", o.id, o.version);
    }
    rt.stats()
}

/// A paused node (SIGSTOP: its connections stay open, nothing answers) is
/// suspected by the first read left overdue and read around from then on;
/// asked by the compute node, the manager declares it dead once its lease
/// has lapsed, far sooner than the 30 s heartbeat timeout, and the rebuild
/// that follows makes every object readable without it.
#[test]
fn a_paused_node_is_read_around_at_once_and_confirmed_dead_after_its_lease() {
    let (c, rt, objs) = setup();
    let victim = node_id(&c, 0);
    let before = rt.stats();
    c.pause_memnode(0).unwrap();
    let paused = Instant::now();
    let st = verify_all(&rt, &objs);
    assert!(
        st.detection.overdue_reads > before.detection.overdue_reads,
        "a read from the paused node was given up as overdue: {st:?}"
    );
    assert!(
        st.detection.suspicions > before.detection.suspicions,
        "the node became a suspect: {st:?}"
    );
    assert!(
        st.scheme.degraded_reads > before.scheme.degraded_reads,
        "its spans were decoded: {st:?}"
    );
    // The manager rules after the node's 4 s lease; its own rule would take 30 s.
    wait_until(
        "the manager declaring the paused node dead",
        Duration::from_secs(20),
        || state(&c, victim) == NodeState::Dead,
    );
    eprintln!("declared dead {:?} after the pause", paused.elapsed());
    wait_until("the rebuild", Duration::from_secs(60), || {
        let s = rt.stats();
        s.scheme.recoveries >= 1 && s.scheme.recovering == 0
    });
    let st = verify_all(&rt, &objs);
    assert_eq!(
        st.detection.suspicions_cleared, 0,
        "the manager never found it alive: {st:?}"
    );
    c.resume_memnode(0).unwrap();
}

/// A node stalled for less than its lease (a scheduling hiccup, here a
/// SIGSTOP of half a second) is suspected by an overdue read, but the
/// manager's probe finds it alive once it runs again: the suspicion is
/// lifted, nothing is declared dead and nothing is rebuilt.
#[test]
fn a_short_stall_is_suspected_but_never_fenced() {
    let (c, rt, objs) = setup();
    let victim = node_id(&c, 0);
    let before = rt.stats();
    c.pause_memnode(0).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            c.resume_memnode(0).unwrap();
        });
        verify_all(&rt, &objs);
    });
    wait_until("the manager's alive verdict", Duration::from_secs(20), || {
        rt.stats().detection.suspicions_cleared > before.detection.suspicions_cleared
    });
    let st = verify_all(&rt, &objs);
    assert!(
        st.detection.suspicions > before.detection.suspicions,
        "the stall raised a suspicion: {st:?}"
    );
    assert_eq!(
        state(&c, victim),
        NodeState::Alive,
        "a stalled node is never declared dead"
    );
    assert_eq!(
        st.scheme.recoveries + st.scheme.recovering,
        0,
        "nothing rebuilt: {st:?}"
    );
}

/// A killed node refuses connections: the manager, asked by the compute
/// node, declares it dead at once instead of after its heartbeat timeout.
#[test]
fn a_killed_node_is_confirmed_dead_without_waiting_for_heartbeats() {
    let (c, rt, objs) = setup();
    let victim = node_id(&c, 0);
    c.kill_memnode(0).unwrap();
    let killed = Instant::now();
    let st = verify_all(&rt, &objs);
    assert!(st.detection.suspicions >= 1 && st.scheme.degraded_reads >= 1, "{st:?}");
    wait_until(
        "the manager declaring the killed node dead",
        Duration::from_secs(20),
        || state(&c, victim) == NodeState::Dead,
    );
    eprintln!("declared dead {:?} after the kill", killed.elapsed());
    wait_until("the rebuild", Duration::from_secs(60), || {
        let s = rt.stats();
        s.scheme.recoveries >= 1 && s.scheme.recovering == 0
    });
    verify_all(&rt, &objs);
}
