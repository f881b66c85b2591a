//! The manager against real processes: a killed memory node declared dead
//! and its owner told, a silent compute node's regions revoked and wiped,
//! assignments kept across a restart, and a planned departure (`remora
//! drain`, SIGTERM).

use std::process::Command;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use remora_cluster::ClusterEvent;
use remora_proto::msg::ComputeState;
use remora_proto::{EventKind, MemNodeClient, MemTransport, NodeState, RemoteError, RpcError, SessionEvent};

use crate::MIB;
use crate::common::*;

/// (b) kill -9 a memory node: declared dead within the timeout, the owner is
/// told, and `remora status` shows it.
#[test]
fn killed_memory_node_is_declared_dead_and_owner_notified() {
    let c = quick_cluster(3, 128 * MIB, 64 * MIB);
    let events = c.events().unwrap();
    let s = session(&c, "owner");
    let ev = s.take_events().unwrap();
    let regions = s.alloc(3, true, &[]).expect("3 regions on distinct nodes");
    let victim_addr = c.memnodes()[1].addr.clone();
    let victim = regions
        .iter()
        .find(|g| g.addr == victim_addr)
        .expect("one region on each node");
    let killed_at = Instant::now();
    c.kill_memnode(1).unwrap();
    let notice = loop {
        match ev.recv_timeout(Duration::from_secs(5)) {
            Ok(SessionEvent::Manager(e)) => break e,
            Ok(_) => continue,
            Err(e) => panic!("no notice of the dead node: {e:?}"),
        }
    };
    let waited = killed_at.elapsed();
    match notice.kind {
        EventKind::NodeDead { node, addr, regions } => {
            assert_eq!(node, victim.node);
            assert_eq!(addr, victim_addr);
            assert_eq!(regions, vec![victim.cap.region]);
        }
        other => panic!("unexpected event {other:?}"),
    }
    assert!(
        waited < Duration::from_millis(2500),
        "detected after {waited:?} with a 1 s timeout"
    );
    let out = Command::new(BIN)
        .args(["status", "--manager", c.manager_addr(), "--json", "--cluster-key-file"])
        .arg(c.key_file())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes = v["memory_nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    for n in nodes {
        let want = if n["addr"] == victim_addr.as_str() {
            "dead"
        } else {
            "alive"
        };
        assert_eq!(n["state"], want, "{n}");
        for key in ["id", "regions_total", "regions_free", "capacity_bytes"] {
            assert!(n[key].is_u64(), "{key} in {n}");
        }
    }
    let comp = &v["compute_nodes"][0];
    assert_eq!(comp["state"], "alive");
    assert_eq!(comp["regions"], 2, "the dead node's region left the owner");
    let table = Command::new(BIN)
        .args(["status", "--manager", c.manager_addr()])
        .env("REMORA_CLUSTER_KEY_FILE", c.key_file())
        .output()
        .unwrap();
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.lines().any(|l| l.contains(&victim_addr) && l.contains("dead")),
        "{text}"
    );
    // The cluster reported the kill as an expected exit and kept running.
    match events.recv_timeout(Duration::from_secs(2)) {
        Ok(ClusterEvent::Exited { name, expected, .. }) => {
            assert_eq!(name, "memnode#1");
            assert!(expected);
        }
        other => panic!("no exit event: {other:?}"),
    }
    assert!(
        c.status()
            .unwrap()
            .memory_nodes
            .iter()
            .filter(|m| m.state == NodeState::Alive)
            .count()
            == 2
    );
}

/// (c) A compute node that stops heartbeating has its regions freed on the
/// memory nodes: its tokens stop working and the next owner sees zeros.
#[test]
fn silent_compute_node_loses_its_regions() {
    let c = quick_cluster(2, 128 * MIB, 64 * MIB);
    let s = session(&c, "silent");
    let regions = s.alloc(2, true, &[]).unwrap();
    let data = pattern(7, 0, 64 * 1024);
    for g in &regions {
        let cl = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
        cl.write(g.cap, 0, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        cl.read(g.cap, 0, &mut back).unwrap();
        assert_bytes_eq(&back, &data, "before going silent");
    }
    s.suspend_heartbeats();
    let st = c
        .wait_until(
            Duration::from_secs(5),
            "compute node declared dead and regions free",
            |st| {
                st.compute_nodes
                    .iter()
                    .any(|cn| cn.state == ComputeState::Dead && cn.regions == 0)
                    && st.memory_nodes.iter().all(|m| m.regions_free == m.regions_total)
            },
        )
        .unwrap();
    assert_eq!(st.compute_nodes.len(), 1);
    for g in &regions {
        let cl = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
        let mut back = vec![0u8; 16];
        // The revoke moved the region to a new epoch: the old capability is
        // refused as stale before its token is even looked at.
        match cl.read(g.cap, 0, &mut back) {
            Err(RpcError::Remote(RemoteError::StaleEpoch {
                region,
                presented,
                current,
            })) => {
                assert_eq!(region, g.cap.region);
                assert_eq!(presented, g.cap.epoch);
                assert!(
                    current > presented,
                    "epoch {current} after a revoke of epoch {presented}"
                );
            }
            other => panic!("revoked capability still works: {other:?}"),
        }
    }
    // A new owner gets the same regions back, wiped.
    let s2 = session(&c, "next");
    let again = s2.alloc(4, false, &[]).unwrap();
    for g in &again {
        let cl = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
        let mut back = vec![0xFFu8; data.len()];
        cl.read(g.cap, 0, &mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "{} leaked a previous owner's bytes",
            g.cap.region
        );
    }
}

/// (f) A manager restart keeps every region assignment; sessions, tokens and
/// data carry on.
#[test]
fn manager_restart_keeps_assignments() {
    let c = cluster(2, 256 * MIB, 64 * MIB);
    let s = session(&c, "survivor");
    let ev = s.take_events().unwrap();
    let first = s.alloc(3, false, &[]).unwrap();
    let before = s.my_regions().unwrap();
    assert_eq!(before.len(), 3);
    for g in &first {
        let cl = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
        cl.write(g.cap, MIB, &pattern(g.cap.region.0, MIB, 4096)).unwrap();
    }
    let status_before = c.status().unwrap();
    c.restart_manager().unwrap();
    let after = s.my_regions().unwrap();
    assert_eq!(after, before, "same regions, same capabilities");
    // The session is still alive well past the timeout, and has nothing to
    // re-read: its events are in the replicated state, which the restart kept.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        match ev.recv_timeout(Duration::from_millis(100)) {
            Ok(other) => panic!("unexpected event {other:?}"),
            Err(RecvTimeoutError::Timeout) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let st = c.status().unwrap();
    assert_eq!(st.compute_nodes, status_before.compute_nodes);
    // Load is a live figure (and the manager learns it only from heartbeats):
    // everything else must be as before.
    let without_load = |v: &[remora_proto::msg::MemNodeStatus]| {
        v.iter()
            .map(|m| remora_proto::msg::MemNodeStatus {
                load: Default::default(),
                ..m.clone()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        without_load(&st.memory_nodes),
        without_load(&status_before.memory_nodes),
        "memory nodes kept heartbeating"
    );
    for g in &after {
        let cl = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
        let mut back = vec![0u8; 4096];
        cl.read(g.cap, MIB, &mut back).unwrap();
        assert_bytes_eq(&back, &pattern(g.cap.region.0, MIB, 4096), "data after manager restart");
    }
    // New allocations never hand out an assigned region again.
    let more = s.alloc(5, false, &[]).unwrap();
    for g in &more {
        assert!(
            !after.iter().any(|a| a.cap.region == g.cap.region),
            "{} handed out twice",
            g.cap.region
        );
    }
    match s.alloc(1, false, &[]) {
        Err(RpcError::Remote(RemoteError::NoCapacity {
            wanted: 1,
            available: 0,
        })) => {}
        other => panic!("expected NoCapacity, got {other:?}"),
    }
}

/// Planned departure: `remora drain` and SIGTERM mark a node draining, tell
/// its owners, keep new allocations off it, and the node leaves once its
/// regions are released.
#[test]
fn drain_marks_node_and_sigterm_leaves_after_release() {
    let c = cluster(3, 128 * MIB, 64 * MIB);
    let s = session(&c, "drainer");
    let ev = s.take_events().unwrap();
    let regions = s.alloc(3, true, &[]).unwrap();
    let n0 = c.memnodes()[0].addr.clone();
    let out = Command::new(BIN)
        .args([
            "drain",
            "--manager",
            c.manager_addr(),
            "--node",
            &n0,
            "--cluster-key-file",
        ])
        .arg(c.key_file())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let e = ev.recv_timeout(Duration::from_secs(3)).expect("draining notice");
    let SessionEvent::Manager(e) = e else { panic!("{e:?}") };
    let mine = regions.iter().find(|g| g.addr == n0).unwrap();
    assert!(
        matches!(&e.kind, EventKind::NodeDraining { addr, regions, .. } if *addr == n0 && *regions == vec![mine.cap.region])
    );
    // A draining node still serves reads of existing data but gets no new allocations.
    let cl = MemNodeClient::connect(&n0, c.conn_options()).unwrap();
    cl.write(mine.cap, 0, b"still here").unwrap();
    let more = s.alloc(2, false, &[]).unwrap();
    assert!(more.iter().all(|g| g.addr != n0));
    match s.alloc(1, false, &[]) {
        Err(RpcError::Remote(RemoteError::NoCapacity { .. })) => {}
        other => panic!("the draining node's free region was offered: {other:?}"),
    }
    // Unknown nodes are a clear error.
    let out = Command::new(BIN)
        .args(["drain", "--manager", c.manager_addr(), "--node", "127.0.0.1:1"])
        .env("REMORA_CLUSTER_KEY_FILE", c.key_file())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no live memory node"));
    // SIGTERM on node 1, which holds a region: it drains and waits.
    let n1 = c.memnodes()[1].addr.clone();
    c.terminate_memnode(1).unwrap();
    c.wait_until(Duration::from_secs(3), "node 1 draining", |st| {
        st.memory_nodes
            .iter()
            .any(|m| m.addr == n1 && m.state == NodeState::Draining)
    })
    .unwrap();
    assert!(
        c.wait_memnode_exit(1, Duration::from_millis(500)).is_err(),
        "left while holding data"
    );
    for g in regions.iter().chain(&more).filter(|g| g.addr == n1) {
        s.free(g.cap.region).unwrap();
    }
    let status = c
        .wait_memnode_exit(1, Duration::from_secs(5))
        .expect("leaves once released");
    assert!(status.success(), "clean exit: {status}");
    let st = c.status().unwrap();
    assert_eq!(
        st.memory_nodes.iter().find(|m| m.addr == n1).unwrap().state,
        NodeState::Dead
    );
}
