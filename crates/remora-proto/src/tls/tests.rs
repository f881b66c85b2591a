use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::certs::{CertsError, write_certs};
use super::record::SEND_BUFFER_FULL;
use super::stream::pair_for_test;
use super::*;
use crate::msg::{MemRequest, MemResponse};
use crate::rpc::Ticket;
use crate::server::{ConnGuard, Listener, serve_requests};
use crate::{ConnOptions, RpcConn, RpcError};

/// A directory removed when the test ends, named after the test.
fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("remora-tls-{tag}-"))
        .tempdir()
        .unwrap()
}

/// Fresh certificates (read into memory; their directory is gone after).
pub(super) fn certs(tag: &str, mode: TlsMode) -> TlsConfig {
    let d = temp_dir(tag);
    write_certs(d.path(), &[], false).unwrap();
    TlsConfig::load(mode, d.path()).unwrap()
}

pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn certs_are_written_once_with_a_private_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("write");
    let d = dir.path();
    let files = write_certs(d, &["node-a.example".into()], false).unwrap();
    assert_eq!(files.names, ["localhost", "127.0.0.1", "node-a.example"]);
    let mode = std::fs::metadata(&files.key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let before = std::fs::read(&files.ca).unwrap();
    match write_certs(d, &[], false) {
        Err(CertsError::Exists { path }) => assert!(path.starts_with(d)),
        other => panic!("overwrote existing certificates: {other:?}"),
    }
    assert_eq!(
        std::fs::read(&files.ca).unwrap(),
        before,
        "a refused write changes nothing"
    );
    write_certs(d, &[], true).unwrap();
    assert_ne!(std::fs::read(&files.ca).unwrap(), before, "--force makes a new CA");
    TlsConfig::load(TlsMode::Data, d).unwrap();
}

#[test]
fn missing_or_bad_files_name_the_file_and_the_fix() {
    let dir = temp_dir("missing");
    let d = dir.path();
    let e = TlsConfig::load(TlsMode::Control, d).unwrap_err().to_string();
    assert!(e.contains("ca.pem") && e.contains("remora certs --out"), "{e}");
    write_certs(d, &[], false).unwrap();
    std::fs::write(d.join(KEY_FILE), "not a key").unwrap();
    let e = TlsConfig::load(TlsMode::Control, d).unwrap_err().to_string();
    assert!(e.contains("node.key") && e.contains("remora certs"), "{e}");
    let e = TlsConfig::from_flags(TlsMode::Data, None).unwrap_err().to_string();
    assert!(e.contains("--tls-dir"), "{e}");
    assert!(TlsConfig::from_flags(TlsMode::Off, None).unwrap().is_none());
    assert!("bogus".parse::<TlsMode>().is_err());
    assert_eq!("data".parse::<TlsMode>().unwrap(), TlsMode::Data);
}

/// One side writes a large stream in odd-sized pieces while the other reads
/// it with a short read timeout (as a client's leader polls): every
/// timeout comes back as `WouldBlock`/`TimedOut` and no byte is lost.
#[test]
fn large_stream_survives_read_timeouts() {
    let t = certs("large", TlsMode::Data);
    let (c, s) = pair_for_test(t.client_config(), &t.server).unwrap();
    let data = Arc::new(pattern(8 << 20, 7));
    let d2 = Arc::clone(&data);
    // Timeouts the reader has seen: now and then the writer waits for one
    // more before going on, so timeouts happen mid-stream however the two
    // sides are scheduled (pauses alone missed on a loaded machine).
    let timeouts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&timeouts);
    let w = thread::spawn(move || {
        let mut c = c;
        for (i, chunk) in d2.chunks(100_003).enumerate() {
            c.write_all(chunk).unwrap();
            if i % 8 == 0 {
                let before = seen.load(Ordering::Acquire);
                let deadline = Instant::now() + Duration::from_secs(10);
                while seen.load(Ordering::Acquire) == before && Instant::now() < deadline {
                    thread::sleep(Duration::from_micros(200));
                }
            }
        }
        c
    });
    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let mut got = vec![0u8; data.len()];
    let mut filled = 0;
    while filled < got.len() {
        match (&s).read(&mut got[filled..]) {
            Ok(0) => panic!("closed early"),
            Ok(n) => filled += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                timeouts.fetch_add(1, Ordering::AcqRel);
            }
            Err(e) => panic!("{e}"),
        }
    }
    let _c = w.join().unwrap();
    assert!(got == *data, "bytes differ");
    // Every eighth chunk waited for a timeout (or 10 s).
    assert!(
        timeouts.load(Ordering::Acquire) >= 8,
        "the test should exercise read timeouts"
    );
}

/// Both sides refresh their keys in the middle of traffic: the reader must
/// answer the peer's key update (through the write lock) and go on.
#[test]
fn key_updates_are_answered() {
    let t = certs("keyupdate", TlsMode::Data);
    let (c, s) = pair_for_test(t.client_config(), &t.server).unwrap();
    let echo = thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        let mut total = 0;
        while total < 3 * 100_000 {
            let n = (&s).read(&mut buf).unwrap();
            assert!(n > 0);
            (&s).write_all(&buf[..n]).unwrap();
            total += n;
            if total > 150_000 && total - n <= 150_000 {
                s.refresh_keys_for_test().unwrap();
            }
        }
    });
    let mut back = Vec::new();
    let sent: Vec<u8> = pattern(300_000, 3);
    let rd = c.try_clone().unwrap();
    let reader = thread::spawn(move || {
        let mut out = vec![0u8; 300_000];
        (&rd).read_exact(&mut out).unwrap();
        out
    });
    for (i, chunk) in sent.chunks(100_000).enumerate() {
        if i == 1 {
            c.refresh_keys_for_test().unwrap();
        }
        (&c).write_all(chunk).unwrap();
    }
    back.extend(reader.join().unwrap());
    echo.join().unwrap();
    assert!(back == sent, "echoed bytes differ");
}

fn echo_server(tls: Option<ServerTls>) -> Listener {
    let sock = TcpListener::bind("127.0.0.1:0").unwrap();
    Listener::start_with(
        sock,
        "echo",
        None,
        tls,
        Default::default(),
        |sock: Stream, _g: ConnGuard| {
            serve_requests(sock, Duration::from_secs(5), |out, req| {
                let out = out.clone();
                // Replies from other threads, out of order, as a memory node sends them.
                thread::spawn(move || {
                    let _ = out.ok(req.header.id, &MemResponse::Data, &[&req.payload]);
                });
                true
            });
        },
    )
    .unwrap()
}

fn opts(tls: Option<TlsConfig>) -> ConnOptions {
    ConnOptions {
        connect_timeout: Duration::from_secs(2),
        call_timeout: Duration::from_secs(10),
        stall_limit: Duration::from_secs(5),
        cluster_key: None,
        tls,
    }
}

/// Many callers share one TLS connection, with frames from a few bytes to
/// a few MiB (the large ones read straight into the caller's buffer): every
/// reply carries exactly the bytes sent.
#[test]
fn concurrent_calls_over_one_tls_connection() {
    let t = certs("rpc", TlsMode::Data);
    let l = echo_server(Some(t.server(Plane::Data)));
    let conn = RpcConn::connect_on(&l.local_addr().to_string(), opts(Some(t)), Plane::Data).unwrap();
    let threads: Vec<_> = (0..4u8)
        .map(|k| {
            let conn = Arc::clone(&conn);
            thread::spawn(move || {
                for (i, len) in [0usize, 1, 100, 16 << 10, 70_000, 3 << 20, 24].into_iter().enumerate() {
                    let data = pattern(len, k * 16 + i as u8);
                    let mut back = vec![0u8; len];
                    let (r, _) = conn
                        .call::<_, MemResponse>(&MemRequest::Ping, &[&data], Some(&mut back))
                        .unwrap();
                    assert_eq!(r, MemResponse::Data);
                    assert!(back == data, "thread {k}: {len} bytes differ");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn plain_and_tls_mismatches_fail_quickly_with_a_reason() {
    let t = certs("mismatch", TlsMode::Data);
    let tls_server = echo_server(Some(t.server(Plane::Data)));
    let started = Instant::now();
    match RpcConn::connect(&tls_server.local_addr().to_string(), opts(None)) {
        Err(RpcError::Tls { reason, .. }) => assert!(reason.contains("requires TLS"), "{reason}"),
        other => panic!("plain client on a TLS server: {:?}", other.map(|_| ())),
    }
    let plain_server = echo_server(None);
    match RpcConn::connect(&plain_server.local_addr().to_string(), opts(Some(t.clone()))) {
        Err(RpcError::Tls { reason, .. }) => assert!(reason.contains("does not run with --tls"), "{reason}"),
        other => panic!("TLS client on a plain server: {:?}", other.map(|_| ())),
    }
    let stranger = certs("stranger", TlsMode::Data);
    match RpcConn::connect(&tls_server.local_addr().to_string(), opts(Some(stranger))) {
        Err(RpcError::Tls { .. }) => {}
        other => panic!("client of another CA: {:?}", other.map(|_| ())),
    }
    // A client that trusts the server's CA but whose own certificate
    // another CA signed: its side of the handshake ends before the server
    // has checked it, so the refusal comes as an alert in our record layer.
    let (ours, theirs, mixed) = (temp_dir("ours"), temp_dir("theirs"), temp_dir("mixed"));
    write_certs(ours.path(), &[], false).unwrap();
    write_certs(theirs.path(), &[], false).unwrap();
    for (from, name) in [(&ours, CA_FILE), (&theirs, CERT_FILE), (&theirs, KEY_FILE)] {
        std::fs::copy(from.path().join(name), mixed.path().join(name)).unwrap();
    }
    let server = TlsConfig::load(TlsMode::Data, ours.path()).unwrap();
    let impostor = TlsConfig::load(TlsMode::Data, mixed.path()).unwrap();
    let l = echo_server(Some(server.server(Plane::Data)));
    match RpcConn::connect(&l.local_addr().to_string(), opts(Some(impostor))) {
        Err(e) => assert!(e.to_string().contains("TLS alert"), "{e}"),
        other => panic!("client with a certificate of another CA: {:?}", other.map(|_| ())),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    // A memory node in control mode serves both kinds.
    let both = echo_server(Some(t.server(Plane::Data)).map(|s| ServerTls { required: false, ..s }));
    let addr = both.local_addr().to_string();
    let plain = RpcConn::connect(&addr, opts(None)).unwrap();
    let tls = RpcConn::connect(&addr, opts(Some(t))).unwrap();
    for c in [plain, tls] {
        let mut back = [0u8; 3];
        c.call::<_, MemResponse>(&MemRequest::Ping, &[b"abc"], Some(&mut back))
            .unwrap();
        assert_eq!(&back, b"abc");
    }
}

#[test]
fn small_messages_both_ways() {
    let t = certs("small", TlsMode::Data);
    let (c, s) = pair_for_test(t.client_config(), &t.server).unwrap();
    (&c).write_all(b"hello").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 5];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    (&s).write_all(b"world").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    (&c).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"world");
}

/// Writers on several clones of one stream, each sending frames larger than
/// a sealing round, into a small send buffer that the peer only starts to
/// drain later: what the first send took and the rest, written blocking,
/// must arrive whole, and each writer's frames in order.
#[test]
fn full_send_buffer_loses_and_reorders_nothing() {
    use std::sync::atomic::Ordering;
    const WRITERS: u8 = 3;
    const FRAMES: u32 = 3;
    let t = certs("fullbuf", TlsMode::Data);
    let (c, s) = pair_for_test(t.client_config(), &t.server).unwrap();
    rustix::net::sockopt::set_socket_send_buffer_size(c.tcp(), 64 << 10).unwrap();
    rustix::net::sockopt::set_socket_recv_buffer_size(s.tcp(), 64 << 10).unwrap();
    let full_before = SEND_BUFFER_FULL.load(Ordering::Relaxed);
    // A frame: writer, sequence number, length, then a pattern of both.
    let frame = |w: u8, seq: u32| -> Vec<u8> {
        let len = 300_000 + 7_777 * seq as usize + 1_001 * usize::from(w);
        let mut f = vec![w];
        f.extend_from_slice(&seq.to_le_bytes());
        f.extend_from_slice(&(len as u32).to_le_bytes());
        f.extend(pattern(len, w.wrapping_mul(17).wrapping_add(seq as u8)));
        f
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let c = c.try_clone().unwrap();
            thread::spawn(move || {
                for seq in 0..FRAMES {
                    (&c).write_all(&frame(w, seq)).unwrap();
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let mut next = [0u32; WRITERS as usize];
    for _ in 0..u32::from(WRITERS) * FRAMES {
        let mut head = [0u8; 9];
        (&s).read_exact(&mut head).unwrap();
        let (w, seq) = (head[0], u32::from_le_bytes(head[1..5].try_into().unwrap()));
        let len = u32::from_le_bytes(head[5..9].try_into().unwrap()) as usize;
        assert!(w < WRITERS, "frame from unknown writer {w}");
        assert_eq!(seq, next[w as usize], "writer {w}: frames out of order");
        next[w as usize] += 1;
        let mut body = vec![0u8; len];
        (&s).read_exact(&mut body).unwrap();
        assert!(frame(w, seq)[9..] == body[..], "writer {w} frame {seq}: bytes differ");
    }
    for h in writers {
        h.join().unwrap();
    }
    assert!(
        SEND_BUFFER_FULL.load(Ordering::Relaxed) > full_before,
        "the test should fill the send buffer"
    );
}

/// A read takes as many records as the ciphertext already received holds:
/// one call returns far more than the ~16 KiB of plaintext rustls keeps (one
/// record's worth; the old loop returned no more), small reads in between
/// lose nothing, and a peer's close after the data reads as the end.
#[test]
fn one_read_spans_many_records_and_ends_cleanly() {
    const BIG: usize = 100 << 10;
    let t = certs("spans", TlsMode::Data);
    let (c, s) = pair_for_test(t.client_config(), &t.server).unwrap();
    let data = pattern(3 + BIG + 1_000, 11);
    (&c).write_all(&data).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    // Let it arrive (it fits a loopback receive buffer), so that one socket
    // read takes most of it.
    thread::sleep(Duration::from_millis(200));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = vec![0u8; data.len()];
    let mut small = [0u8; 3];
    (&s).read_exact(&mut small).unwrap();
    got[..3].copy_from_slice(&small);
    let n = (&s).read(&mut got[3..3 + BIG]).unwrap();
    assert!(n >= 48 << 10, "one read should take several records, took {n} bytes");
    (&s).read_exact(&mut got[3 + n..]).unwrap();
    assert!(got == data, "bytes differ");
    assert_eq!(
        (&s).read(&mut small).unwrap(),
        0,
        "the peer's close should read as the end"
    );
}

/// A reply already in the socket is taken by a wait whose time is spent
/// (it began late), on plain TCP and on TLS: it is not a timeout. The wait
/// with no time left is retried until the reply has arrived; a wait that
/// never reads the socket once its deadline passed would never get it.
#[test]
fn a_wait_with_no_time_left_takes_a_reply_that_arrived() {
    let t = certs("late", TlsMode::Data);
    for tls in [false, true] {
        let l = echo_server(tls.then(|| t.server(Plane::Data)));
        let o = opts(tls.then(|| t.clone()));
        let conn = RpcConn::connect_on(&l.local_addr().to_string(), o, Plane::Data).unwrap();
        for (i, len) in [24usize, 8 << 10, 70_000].into_iter().enumerate() {
            let data = pattern(len, i as u8 + 40);
            let ticket = conn.send(&MemRequest::Ping, &[&data]).unwrap();
            let mut back = vec![0u8; len];
            let started = Instant::now();
            let reply = loop {
                match conn.wait_keeping(Ticket::from_raw(ticket.raw()), Some(&mut back), Duration::ZERO) {
                    Ok(r) => break r,
                    Err(RpcError::Timeout { .. }) if started.elapsed() < Duration::from_secs(10) => {
                        thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("tls {tls}, {len} bytes: {e}"),
                }
            };
            assert_eq!(
                crate::msg::decode::<MemResponse>(&reply.head).unwrap(),
                MemResponse::Data
            );
            assert!(back == data, "tls {tls}: {len} bytes differ");
        }
    }
}
