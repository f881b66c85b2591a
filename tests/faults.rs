//! Fault injection against real memory-node processes: pause, delay, dropped
//! replies, dropped connections and corrupted bytes. Needs the binary built
//! with `--features fault-injection`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use remora_proto::{
    ComputeSession, EventKind, Fault, MemNodeClient, MemTransport, NodeState, RegionGrant, RemoteError, RpcError,
    SessionEvent,
};

const MIB: u64 = 1 << 20;

/// A region of `s` on memory node 0 (of two, taken on distinct nodes) and
/// a client to that node.
fn region_on_node0(c: &remora_cluster::LocalCluster, s: &ComputeSession) -> (RegionGrant, MemNodeClient) {
    let g = s
        .alloc(2, true, &[])
        .unwrap()
        .into_iter()
        .find(|g| g.addr == c.memnodes()[0].addr)
        .unwrap();
    let cl = MemNodeClient::connect(&g.addr, quick_opts(c)).unwrap();
    (g, cl)
}

/// A paused node times clients out, is declared dead, and when it resumes it
/// is fenced: it wipes what it held and joins again as a new node.
#[test]
fn paused_node_is_fenced_when_it_comes_back() {
    let c = quick_cluster(2, 128 * MIB, 64 * MIB);
    let s = session(&c, "p");
    let ev = s.take_events().unwrap();
    let (g, cl) = region_on_node0(&c, &s);
    cl.write(g.cap, 0, &pattern(5, 0, 4096)).unwrap();
    let old_id = g.node;
    c.fault(0, Fault::Pause).unwrap();
    let mut buf = vec![0u8; 4096];
    match cl.read(g.cap, 0, &mut buf) {
        Err(e @ RpcError::Timeout { .. }) => assert!(e.is_transport()),
        other => panic!("read from a paused node: {other:?}"),
    }
    let notice = loop {
        match ev.recv_timeout(Duration::from_secs(5)).expect("dead-node notice") {
            SessionEvent::Manager(e) => break e,
            _ => continue,
        }
    };
    assert!(matches!(notice.kind, EventKind::NodeDead { node, .. } if node == old_id));
    c.fault(0, Fault::Resume).unwrap();
    let st = c
        .wait_until(Duration::from_secs(5), "the node re-registers under a new id", |st| {
            st.memory_nodes
                .iter()
                .any(|m| m.addr == g.addr && m.state == NodeState::Alive && m.id != old_id)
        })
        .unwrap();
    assert_eq!(
        st.memory_nodes.iter().find(|m| m.id == old_id).unwrap().state,
        NodeState::Dead
    );
    // The stale region is gone: the old capability opens nothing, so the
    // fenced node can never serve stale data.
    let fresh = MemNodeClient::connect(&g.addr, quick_opts(&c)).unwrap();
    match fresh.read(g.cap, 0, &mut buf) {
        Err(RpcError::Remote(RemoteError::NoSuchRegion { .. })) => {}
        other => panic!("fenced node served a stale region: {other:?}"),
    }
}

/// A node that cannot renew its lease (no heartbeat acknowledged for four
/// intervals) answers data requests `Unavailable`, though the manager has
/// not given up on it, and serves again once a heartbeat renews the lease.
#[test]
fn lapsed_lease_serves_nothing_until_renewed() {
    // Heartbeats every 1 s (the cap), so the lease is 4 s and the manager
    // waits 12 s: a 5 s pause lapses the lease and nothing else.
    let c = cluster_with_timeout(2, 128 * MIB, 64 * MIB, Duration::from_secs(12));
    let s = session(&c, "lease");
    let (g, cl) = region_on_node0(&c, &s);
    let want = pattern(9, 0, 4096);
    cl.write(g.cap, 0, &want).unwrap();
    c.fault(0, Fault::Pause).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    // Sent while paused, served after Resume: the lease has lapsed by then.
    let t = cl.send_read(g.cap, 0, 4096).unwrap();
    c.fault(0, Fault::Resume).unwrap();
    let mut buf = vec![0u8; 4096];
    match cl.wait_read(t, &mut buf) {
        Err(RpcError::Remote(RemoteError::Unavailable)) => {}
        other => panic!("a node with a lapsed lease answered {other:?}"),
    }
    assert!(
        RpcError::Remote(RemoteError::Unavailable).is_node_down(),
        "readers read around it"
    );
    // The next heartbeat renews it: the same region, the same bytes.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match cl.read(g.cap, 0, &mut buf) {
            Ok(()) => break,
            Err(RpcError::Remote(RemoteError::Unavailable)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("after the lease was renewed: {other:?}"),
        }
    }
    assert_bytes_eq(&buf, &want, "the region after the lease came back");
    let st = c.status().unwrap();
    assert!(
        st.memory_nodes
            .iter()
            .any(|m| m.id == g.node && m.state == NodeState::Alive),
        "the manager never gave up on it: {st:?}"
    );
}

/// Waits until every thread of process `pid` is stopped (state `T`).
fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process exists");
        let all = tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised name.
            stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
        });
        if all {
            return;
        }
        assert!(Instant::now() < deadline, "process {pid} did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A zombie: a node stopped (SIGSTOP) past the manager's timeout is declared
/// dead; when it continues, a request it had queued is refused, never
/// answered with the region's bytes, and it re-registers as a new node.
#[test]
fn stopped_node_never_serves_after_it_was_declared_dead() {
    let c = quick_cluster(2, 128 * MIB, 64 * MIB);
    let s = session(&c, "zombie");
    let ev = s.take_events().unwrap();
    let (g, cl) = region_on_node0(&c, &s);
    cl.write(g.cap, 0, &pattern(10, 0, 4096)).unwrap();
    c.pause_memnode(0).unwrap();
    // Send only once every thread of it has stopped: a read it took in
    // before the stop was served by a live node.
    wait_stopped(c.memnodes()[0].pid);
    let t = cl.send_read(g.cap, 0, 4096).unwrap();
    loop {
        match ev.recv_timeout(Duration::from_secs(10)).expect("dead-node notice") {
            SessionEvent::Manager(e) if matches!(e.kind, EventKind::NodeDead { node, .. } if node == g.node) => break,
            _ => continue,
        }
    }
    c.resume_memnode(0).unwrap();
    let mut buf = vec![0u8; 4096];
    // The queued read is answered only after the stop: refused (its lease
    // long gone, or its regions wiped and re-registered), or the connection
    // is cut; never with the bytes.
    match cl.wait_read(t, &mut buf) {
        Err(RpcError::Remote(
            RemoteError::Unavailable | RemoteError::NoSuchRegion { .. } | RemoteError::BadCapability { .. },
        )) => {}
        Err(e) if e.is_transport() => {}
        Ok(()) => panic!("a node declared dead served the region's bytes"),
        Err(e) => panic!("unexpected answer {e:?}"),
    }
    c.wait_until(
        Duration::from_secs(10),
        "the zombie re-registers under a new id",
        |st| {
            st.memory_nodes
                .iter()
                .any(|m| m.addr == g.addr && m.state == NodeState::Alive && m.id != g.node)
        },
    )
    .unwrap();
}

/// Delayed replies still carry the right bytes; Resume restores speed.
#[test]
fn delayed_replies_are_correct() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    let s = session(&c, "d");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    let cl = MemNodeClient::connect(&g.addr, quick_opts(&c)).unwrap();
    let data = pattern(9, 0, 16384);
    cl.write(g.cap, 0, &data).unwrap();
    c.fault(0, Fault::Delay { micros: 300_000 }).unwrap();
    let t = Instant::now();
    let mut buf = vec![0u8; data.len()];
    cl.read(g.cap, 0, &mut buf).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
    assert_bytes_eq(&buf, &data, "delayed read");
    c.fault(0, Fault::Resume).unwrap();
    let t = Instant::now();
    cl.read(g.cap, 0, &mut buf).unwrap();
    assert!(t.elapsed() < Duration::from_millis(300));
    assert_bytes_eq(&buf, &data, "read after resume");
}

/// Dropped replies time the caller out without breaking the connection.
#[test]
fn dropped_replies_time_out() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    let s = session(&c, "r");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    let cl = MemNodeClient::connect(&g.addr, quick_opts(&c)).unwrap();
    let data = pattern(11, 0, 8192);
    cl.write(g.cap, 0, &data).unwrap();
    c.fault(0, Fault::DropReplies).unwrap();
    let mut buf = vec![0u8; data.len()];
    assert!(matches!(cl.read(g.cap, 0, &mut buf), Err(RpcError::Timeout { .. })));
    c.fault(0, Fault::Resume).unwrap();
    cl.read(g.cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &data, "after replies resume");
}

/// Dropped connections fail the calls on them; a new connection finds the data intact.
#[test]
fn dropped_connections_break_only_the_transport() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    let s = session(&c, "x");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    let cl = MemNodeClient::connect(&g.addr, quick_opts(&c)).unwrap();
    let data = pattern(13, 0, 8192);
    cl.write(g.cap, 0, &data).unwrap();
    c.fault(0, Fault::DropConnections).unwrap();
    let mut buf = vec![0u8; data.len()];
    match cl.read(g.cap, 0, &mut buf) {
        Err(RpcError::Broken { .. }) => {}
        other => panic!("read on a dropped connection: {other:?}"),
    }
    assert!(cl.conn().is_broken());
    let again = MemNodeClient::connect(&g.addr, quick_opts(&c)).unwrap();
    again.read(g.cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &data, "after reconnect");
}

/// Corruption flips exactly the bytes asked for; a reader comparing content sees it.
#[test]
fn corruption_flips_the_named_range() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    let s = session(&c, "c");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    let cl = MemNodeClient::connect(&g.addr, quick_opts(&c)).unwrap();
    let data = pattern(17, 0, 8192);
    cl.write(g.cap, 0, &data).unwrap();
    c.fault(
        0,
        Fault::Corrupt {
            region: g.cap.region,
            offset: 100,
            len: 50,
        },
    )
    .unwrap();
    let mut buf = vec![0u8; data.len()];
    cl.read(g.cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf[..100], &data[..100], "before the range");
    assert!(buf[100..150].iter().zip(&data[100..150]).all(|(a, b)| *a == !*b));
    assert_bytes_eq(&buf[150..], &data[150..], "after the range");
    match c.fault(
        0,
        Fault::Corrupt {
            region: g.cap.region,
            offset: g.size,
            len: 1,
        },
    ) {
        Err(remora_cluster::ClusterError::Rpc(RpcError::Remote(RemoteError::OutOfBounds { .. }))) => {}
        other => panic!("{other:?}"),
    }
}

/// A busy node measures its own CPU going up, answers `Load` with it, tells
/// the manager in its heartbeat, keeps serving data meanwhile, and calms
/// down at `Resume`.
#[test]
fn busy_node_reports_its_cpu_use() {
    let c = cluster(1, 64 * MIB, 64 * MIB);
    let cl = c.memnode_client(0).unwrap();
    let load = || cl.load(Duration::from_secs(2)).unwrap();
    assert!(load().cores >= 1);
    c.fault(
        0,
        Fault::Busy {
            threads: 2,
            millis: 20_000,
        },
    )
    .unwrap();
    // Two spinning threads on a machine shared with other tests: at least
    // a third of a core shows within a few windows.
    let start = Instant::now();
    let busy = loop {
        let l = load();
        if l.cpu_permille >= 330 {
            break l;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never looked busy: {l:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    c.wait_until(Duration::from_secs(10), "the heartbeat carries the load", |st| {
        st.memory_nodes[0].load.cpu_permille >= 330
    })
    .unwrap();
    // The data path still answers.
    let s = session(&c, "busy");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    let data = pattern(9, 0, 8192);
    let dc = MemNodeClient::connect(&g.addr, quick_opts(&c)).unwrap();
    dc.write(g.cap, 0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    dc.read(g.cap, 0, &mut back).unwrap();
    assert_bytes_eq(&back, &data, "written while busy");
    c.fault(0, Fault::Resume).unwrap();
    let start = Instant::now();
    loop {
        let l = load();
        if l.cpu_permille < busy.cpu_permille / 2 && l.cpu_permille < 200 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still busy after Resume: {l:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        c.fault(
            0,
            Fault::Busy {
                threads: Fault::MAX_BUSY_THREADS + 1,
                millis: 1
            }
        )
        .map_err(|e| e.to_string())
        .err()
        .map(|e| e.contains("at most")),
        Some(true)
    );
}
