//! The wire protocol against real memory nodes and the manager: data
//! round trips (plain and vectored), regions mapped in before they are
//! written, capabilities enforced, malformed frames and other protocol
//! versions refused without harm to anyone else.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use remora_proto::frame::{FrameHeader, FrameKind, HEADER_LEN, VERSION, hello, write_frame};
use remora_proto::msg::MemRequest;
use remora_proto::{Cap, MemNodeClient, MemTransport, RegionId, RemoteError, Rights, RpcError, Token};

use crate::MIB;
use crate::common::*;

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
