//! Foundation tests against real processes: a manager and memory nodes
//! started from the `remora` binary, spoken to over loopback TCP.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use common::*;
use remora_cluster::ClusterEvent;
use remora_proto::frame::{FrameHeader, FrameKind, HEADER_LEN, VERSION, hello, write_frame};
use remora_proto::msg::ComputeState;
use remora_proto::msg::MemRequest;
use remora_proto::{
    Cap, EventKind, MemNodeClient, MemTransport, NodeState, RegionId, RemoteError, Rights, RpcError, SessionEvent,
    Token,
};

const MIB: u64 = 1 << 20;

/// (a) 1 GiB of patterned data over regions on 3 memory nodes, read back and
/// compared byte for byte.
#[test]
fn one_gib_round_trip_across_three_nodes() {
    let c = cluster(3, 512 * MIB, 64 * MIB);
    let s = session(&c, "gib");
    let regions = s.alloc(16, false, &[]).expect("16 regions");
    let nodes: std::collections::BTreeSet<_> = regions.iter().map(|g| g.node).collect();
    assert_eq!(nodes.len(), 3, "allocation spreads over all memory nodes");
    let clients: Vec<MemNodeClient> = c
        .memnodes()
        .iter()
        .map(|m| MemNodeClient::connect(&m.addr, c.conn_options()).unwrap())
        .collect();
    let client_for = |addr: &str| clients.iter().find(|cl| cl.conn().peer() == addr).unwrap();
    const CHUNK: usize = 4 << 20;
    let mut total = 0u64;
    // Write with several chunks in flight per node.
    let mut buf = vec![0u8; CHUNK];
    for g in &regions {
        let cl = client_for(&g.addr);
        let mut tickets = Vec::new();
        let mut off = 0;
        while off < g.size {
            fill_pattern(g.cap.region.0, off, &mut buf);
            tickets.push(cl.send_write(g.cap, off, &buf).unwrap());
            off += CHUNK as u64;
            total += CHUNK as u64;
        }
        for t in tickets {
            cl.wait_write(t).unwrap();
        }
    }
    assert_eq!(total, 1 << 30);
    let mut got = vec![0u8; CHUNK];
    for g in &regions {
        let cl = client_for(&g.addr);
        let mut off = 0;
        while off < g.size {
            cl.read(g.cap, off, &mut got).unwrap();
            fill_pattern(g.cap.region.0, off, &mut buf);
            assert_bytes_eq(&got, &buf, &format!("{} at {off}", g.cap.region));
            off += CHUNK as u64;
        }
    }
    // Vectored forms: scattered small ranges across two regions in one request each.
    let (a, b) = (
        &regions[0],
        regions
            .iter()
            .find(|g| g.addr == regions[0].addr && g.cap != regions[0].cap)
            .unwrap(),
    );
    let cl = client_for(&a.addr);
    let ranges = [
        remora_proto::Range {
            cap: a.cap,
            offset: 4096,
            len: 100,
        },
        remora_proto::Range {
            cap: b.cap,
            offset: 8 * MIB,
            len: 5000,
        },
    ];
    let mut v = vec![0u8; 5100];
    cl.read_v(&ranges, &mut v).unwrap();
    assert_bytes_eq(&v[..100], &pattern(a.cap.region.0, 4096, 100), "readv range 0");
    assert_bytes_eq(&v[100..], &pattern(b.cap.region.0, 8 * MIB, 5000), "readv range 1");
    let (x, y) = (vec![0xAB; 100], vec![0xCD; 5000]);
    cl.write_v(&ranges, &[&x, &y]).unwrap();
    cl.read_v(&ranges, &mut v).unwrap();
    assert!(v[..100].iter().all(|&b| b == 0xAB) && v[100..].iter().all(|&b| b == 0xCD));
}

/// Resident memory of process `pid` in bytes (`VmRSS`).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the memory node's /proc status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("a VmRSS line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in kB");
    kib << 10
}

/// A memory node maps a granted region in behind the grant, before any
/// write lands there (so eviction writes take no page faults): its resident
/// memory grows by the regions while nobody writes, and they read as zeros.
#[test]
fn a_memory_node_maps_granted_regions_in_before_they_are_written() {
    let c = cluster(1, 256 * MIB, 64 * MIB);
    let pid = c.memnodes()[0].pid;
    let before = resident_bytes(pid);
    let s = session(&c, "populate");
    let regions = s.alloc(2, false, &[]).expect("2 regions");
    let want = before + 2 * 64 * MIB;
    let deadline = Instant::now() + Duration::from_secs(30);
    while resident_bytes(pid) < want {
        assert!(
            Instant::now() < deadline,
            "memory node resident {} MiB, want {} MiB",
            resident_bytes(pid) / MIB,
            want / MIB
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let cl = MemNodeClient::connect(&c.memnodes()[0].addr, c.conn_options()).unwrap();
    let mut got = vec![0xFFu8; 1 << 20];
    for g in &regions {
        for off in [0, g.size / 2, g.size - got.len() as u64] {
            cl.read(g.cap, off, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == 0), "{} at {off} reads as zeros", g.cap.region);
        }
    }
}

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
    let out = Command::new(env!("CARGO_BIN_EXE_remora"))
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
    let table = Command::new(env!("CARGO_BIN_EXE_remora"))
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

/// (d) Requests with a wrong, missing, foreign or read-only capability are refused.
#[test]
fn capabilities_are_enforced() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    let a = session(&c, "a");
    let b = session(&c, "b");
    let ga = a.alloc(1, false, &[]).unwrap().remove(0);
    let gb = b.alloc(1, false, &[]).unwrap().remove(0);
    let cl = MemNodeClient::connect(&ga.addr, c.conn_options()).unwrap();
    let data = pattern(1, 0, 8192);
    cl.write(ga.cap, 0, &data).unwrap();
    let refused = |r: Result<(), RpcError>, what: &str| match r {
        Err(RpcError::Remote(RemoteError::BadCapability { .. })) => {}
        other => panic!("{what}: expected refusal, got {other:?}"),
    };
    let mut buf = vec![0u8; 8192];
    let wrong = Cap {
        token: Token::random(),
        ..ga.cap
    };
    refused(cl.read(wrong, 0, &mut buf), "wrong token read");
    refused(cl.write(wrong, 0, &[1; 64]), "wrong token write");
    let missing = Cap {
        token: Token::ZERO,
        ..ga.cap
    };
    refused(cl.read(missing, 0, &mut buf), "missing token read");
    // B's valid token does not open A's region.
    let foreign = Cap {
        region: ga.cap.region,
        ..gb.cap
    };
    refused(cl.read(foreign, 0, &mut buf), "foreign token read");
    refused(cl.write(foreign, 0, &[1; 64]), "foreign token write");
    // A read-only delegate can read but not write; a forged read-only token fails.
    let ro = ga.cap.read_only();
    cl.read(ro, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &data, "delegated read");
    refused(cl.write(ro, 0, &[1; 64]), "read-only write");
    let forged = Cap {
        rights: Rights::ReadOnly,
        ..ga.cap
    };
    refused(cl.read(forged, 0, &mut buf), "owner token presented as read-only");
    // Bounds and unknown regions are typed errors too.
    match cl.read(ga.cap, ga.size - 10, &mut buf) {
        Err(RpcError::Remote(RemoteError::OutOfBounds { .. })) => {}
        other => panic!("out of bounds read: {other:?}"),
    }
    match cl.read(
        Cap {
            region: RegionId(9999),
            ..ga.cap
        },
        0,
        &mut buf,
    ) {
        Err(RpcError::Remote(RemoteError::NoSuchRegion { .. })) => {}
        other => panic!("unknown region: {other:?}"),
    }
    // B cannot free A's region; admin requests need the admin key.
    match b.free(ga.cap.region) {
        Err(RpcError::Remote(RemoteError::BadCapability { .. })) => {}
        other => panic!("foreign free: {other:?}"),
    }
    match cl.revoke(Token::random(), ga.cap.region, ga.cap.epoch + 1) {
        Err(RpcError::Remote(RemoteError::Unauthorized)) => {}
        other => panic!("revoke without the admin key: {other:?}"),
    }
    // None of the refused writes changed a byte, and the connection still serves.
    cl.read(ga.cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &data, "after refused writes");
}

fn expect_closed(mut s: TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: connection not closed: {other:?}"),
    }
}

/// Connects, exchanges hellos and proves the cluster's key by hand, as
/// `RpcConn::connect` does.
fn raw_after_hello(c: &remora_cluster::LocalCluster, target: &str) -> TcpStream {
    let mut raw = TcpStream::connect(target).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(&hello()).unwrap();
    let mut reply = [0u8; HEADER_LEN];
    raw.read_exact(&mut reply).unwrap();
    assert_eq!(reply, hello(), "{target} answers the hello with its own");
    remora_proto::auth::client_handshake(&mut raw, &c.cluster_key()).unwrap();
    raw
}

/// (e) Malformed frames close only their own connection, before the hello
/// and after it.
#[test]
fn malformed_frames_close_only_their_connection() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    let s = session(&c, "good");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    let good = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
    let data = pattern(3, 0, 16384);
    good.write(g.cap, 0, &data).unwrap();
    // (what, sent after a good hello, bytes)
    let mut bad_frames: Vec<(&str, bool, Vec<u8>)> = vec![
        (
            "garbage",
            false,
            b"GET / HTTP/1.1\r\n\r\nxxxxxxxxxxxxxxxxxxxxxx".to_vec(),
        ),
        (
            "garbage after the hello",
            true,
            b"GET / HTTP/1.1\r\n\r\nxxxxxxxxxxxxxxxxxxxxxx".to_vec(),
        ),
        ("a second hello", true, hello().to_vec()),
    ];
    let mut v = Vec::new();
    write_frame(
        &mut v,
        FrameKind::Request,
        1,
        &remora_proto::msg::encode(&MemRequest::Ping),
        &[],
    )
    .unwrap();
    bad_frames.push(("a request without the hello", false, v));
    let mut v = FrameHeader {
        kind: FrameKind::Request,
        id: 1,
        head_len: 4,
        payload_len: 0,
    }
    .encode()
    .to_vec();
    v.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
    bad_frames.push(("undecodable head", true, v));
    let mut v = FrameHeader {
        kind: FrameKind::Request,
        id: 1,
        head_len: 0,
        payload_len: 0,
    }
    .encode()
    .to_vec();
    v[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    bad_frames.push(("oversized payload", true, v));
    let mut v = FrameHeader {
        kind: FrameKind::Response,
        id: 1,
        head_len: 0,
        payload_len: 0,
    }
    .encode()
    .to_vec();
    v[2] = 99;
    bad_frames.push(("wrong version after the hello", true, v));
    let mut v = Vec::new();
    write_frame(&mut v, FrameKind::Response, 5, &[], &[]).unwrap();
    bad_frames.push(("response sent as request", true, v));
    for target in [g.addr.as_str(), c.manager_addr()] {
        for (what, after_hello, bytes) in &bad_frames {
            let mut raw = if *after_hello {
                raw_after_hello(&c, target)
            } else {
                TcpStream::connect(target).unwrap()
            };
            raw.write_all(bytes).unwrap();
            expect_closed(raw, &format!("{what} to {target}"));
        }
        // Half a header, then silence, then hang up: nothing breaks.
        let mut raw = TcpStream::connect(target).unwrap();
        raw.write_all(&[b'R', b'm', VERSION]).unwrap();
        drop(raw);
        let mut raw = raw_after_hello(&c, target);
        raw.write_all(&[b'R', b'm', VERSION]).unwrap();
        drop(raw);
    }
    // The well-behaved connection and the manager still serve.
    let mut back = vec![0u8; data.len()];
    good.read(g.cap, 0, &mut back).unwrap();
    assert_bytes_eq(&back, &data, "good client after bad frames");
    assert_eq!(c.status().unwrap().memory_nodes.len(), 1);
    assert_eq!(HEADER_LEN, 24);
}

/// (e') A peer of another protocol version is refused at connect time, with
/// this build's hello as the answer so it can say why, and a log line on the
/// server; everyone else is still served.
#[test]
fn other_protocol_versions_are_refused_at_connect() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    let s = session(&c, "good");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    let good = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
    let data = pattern(4, 0, 4096);
    good.write(g.cap, 0, &data).unwrap();
    let mut newer = hello();
    newer[2] = 99;
    let mut older = Vec::new();
    write_frame(
        &mut older,
        FrameKind::Request,
        1,
        &remora_proto::msg::encode(&MemRequest::Ping),
        &[],
    )
    .unwrap();
    older[2] = 1;
    for (target, log) in [(g.addr.as_str(), "memnode0.log"), (c.manager_addr(), "manager.log")] {
        for (what, bytes, theirs) in [("newer hello", &newer[..], 99), ("version-1 request", &older[..], 1)] {
            let mut raw = TcpStream::connect(target).unwrap();
            raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            raw.write_all(bytes).unwrap();
            let mut got = Vec::new();
            match raw.read_to_end(&mut got) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                Err(e) => panic!("{what} to {target}: connection not closed: {e}"),
            }
            assert_eq!(got, hello().to_vec(), "{what} to {target}: our hello, then the end");
            let want = format!("speaks remora protocol version {theirs}, this build speaks version {VERSION}");
            let path = c.dir().join(log);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text
                    .lines()
                    .any(|l| l.contains("refusing connection") && l.contains(&want))
                {
                    break;
                }
                assert!(Instant::now() < deadline, "{log} never logged {want:?}:\n{text}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let mut back = vec![0u8; data.len()];
    good.read(g.cap, 0, &mut back).unwrap();
    assert_bytes_eq(&back, &data, "good client after refused versions");
    let fresh = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
    fresh.read(g.cap, 0, &mut back).unwrap();
    assert_bytes_eq(&back, &data, "new client after refused versions");
    assert_eq!(c.status().unwrap().memory_nodes.len(), 1);
}

/// (f) A manager restart keeps every region assignment; sessions, tokens and
/// data carry on.
#[test]
fn manager_restart_keeps_assignments() {
    let mut c = cluster(2, 256 * MIB, 64 * MIB);
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
    // The session notices the restart and is still alive well past the timeout.
    let mut resynced = false;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        match ev.recv_timeout(Duration::from_millis(100)) {
            Ok(SessionEvent::Resync) => resynced = true,
            Ok(other) => panic!("unexpected event {other:?}"),
            Err(RecvTimeoutError::Timeout) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(resynced, "the session was told the manager restarted");
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
    let out = Command::new(env!("CARGO_BIN_EXE_remora"))
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
    let out = Command::new(env!("CARGO_BIN_EXE_remora"))
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

/// The launcher leaves no process behind when dropped.
#[test]
fn cluster_drop_kills_every_child() {
    let c = cluster(2, 128 * MIB, 64 * MIB);
    let pids: Vec<u32> = c.memnodes().iter().map(|m| m.pid).collect();
    for p in &pids {
        assert!(std::path::Path::new(&format!("/proc/{p}")).exists());
    }
    drop(c);
    for p in &pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists(),
            "memnode {p} outlived the cluster"
        );
    }
}

/// A memory node that dies on its own is reported, and the cluster goes on.
#[test]
fn unexpected_child_death_is_an_event() {
    let c = cluster(2, 128 * MIB, 64 * MIB);
    let events = c.events().unwrap();
    let pid = c.memnodes()[0].pid;
    let st = Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(st.success());
    match events.recv_timeout(Duration::from_secs(3)) {
        Ok(ClusterEvent::Exited { name, expected, .. }) => {
            assert_eq!(name, "memnode#0");
            assert!(!expected);
        }
        other => panic!("{other:?}"),
    }
    // The rest of the cluster still works.
    let s = session(&c, "after");
    let g = s.alloc(1, false, &[node_id(&c, 1)]).err();
    assert!(g.is_some(), "only node 1 is left and it is excluded");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    assert_eq!(g.addr, c.memnodes()[1].addr);
}

/// Bad flags get a clear message and a non-zero exit, with nothing left running.
#[test]
fn bad_flags_and_busy_ports_are_explained() {
    let bin = env!("CARGO_BIN_EXE_remora");
    let out = Command::new(bin)
        .args([
            "memnode",
            "--manager",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "lots",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid size"));
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin)
        .args([
            "manager",
            "--listen",
            &port,
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--insecure-no-auth",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen") && err.contains(&port), "{err}");
    let out = Command::new(bin)
        .args([
            "memnode",
            "--manager",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "1MiB",
            "--insecure-no-auth",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("smaller than one region"));
}

/// Children of a process that dies abruptly (SIGKILL, which also covers an
/// unhandled Ctrl-C) exit on their own: each watches a lifeline pipe.
#[test]
fn daemons_exit_when_their_launcher_is_killed() {
    // The killed demo cannot remove its cluster's directory: it goes in ours.
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = Command::new(env!("CARGO_BIN_EXE_remora"))
        .env("TMPDIR", tmp.path())
        .args([
            "demo",
            "--objects",
            "2048",
            "--before",
            "30",
            "--after",
            "1",
            "--plot",
            "/dev/null",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let parent = demo.id();
    let children = |ppid: u32| -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| s.rsplit(')').next().map(str::to_string))
                    .and_then(|rest| rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()))
                    == Some(ppid)
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let is_daemon = |k: &u32| {
        let cmd = std::fs::read_to_string(format!("/proc/{k}/cmdline")).unwrap_or_default();
        cmd.contains("manager") || cmd.contains("memnode")
    };
    let kids = loop {
        let k = children(parent);
        // Manager + 7 memory nodes, each past its exec (a child caught
        // between fork and exec still shows the demo's command line).
        if k.len() >= 8 && k.iter().all(is_daemon) {
            break k;
        }
        assert!(Instant::now() < deadline, "the demo did not start its cluster: {k:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    demo.kill().unwrap();
    demo.wait().unwrap();
    // Generous: a memory node's exit joins its heartbeat thread, which may be
    // inside a manager call on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alive: Vec<u32> = kids
            .iter()
            .copied()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
                    .unwrap_or(false)
            })
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "daemons outlived their killed launcher: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
