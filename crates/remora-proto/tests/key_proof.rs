//! The cluster-key proof on real sockets: a server with a key serves only
//! clients that prove it, and tells the others nothing but "unauthorized".

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::frame::{FrameKind, HEADER_LEN, hello, write_frame};
use remora_proto::msg::{MemRequest, MemResponse, RemoteError, decode, encode};
use remora_proto::server::{ConnGuard, Listener, serve_requests};
use remora_proto::{ClusterKey, ConnOptions, RpcConn, RpcError, Stream};

/// A ping server that counts the requests it serves.
fn start(key: Option<ClusterKey>) -> (Listener, Arc<AtomicU64>) {
    let served = Arc::new(AtomicU64::new(0));
    let s2 = Arc::clone(&served);
    let sock = TcpListener::bind("127.0.0.1:0").unwrap();
    let l = Listener::start(sock, "ping", key, move |sock: Stream, _g: ConnGuard| {
        serve_requests(sock, Duration::from_secs(5), |out, req| {
            assert_eq!(decode::<MemRequest>(&req.head).unwrap(), MemRequest::Ping);
            s2.fetch_add(1, Ordering::Relaxed);
            out.ok(req.header.id, &MemResponse::Pong, &[]).is_ok()
        });
    })
    .unwrap();
    (l, served)
}

fn opts(key: Option<ClusterKey>) -> ConnOptions {
    ConnOptions {
        connect_timeout: Duration::from_secs(2),
        call_timeout: Duration::from_secs(5),
        stall_limit: Duration::from_secs(5),
        cluster_key: key,
        tls: None,
    }
}

/// The listener counts a refusal once the refused peer has gone.
fn await_refused(l: &Listener, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while l.auth_refused() < n && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    l.auth_refused()
}

fn ping(conn: &RpcConn) -> Result<MemResponse, RpcError> {
    conn.call::<_, MemResponse>(&MemRequest::Ping, &[], None)
        .map(|(r, _)| r)
}

#[test]
fn only_holders_of_the_key_are_served() {
    let key = ClusterKey::generate();
    let (l, served) = start(Some(key));
    let addr = l.local_addr().to_string();

    let good = RpcConn::connect(&addr, opts(Some(key))).unwrap();
    assert_eq!(ping(&good).unwrap(), MemResponse::Pong);
    assert_eq!(served.load(Ordering::Relaxed), 1);

    match RpcConn::connect(&addr, opts(Some(ClusterKey::generate()))) {
        Err(RpcError::Auth { reason, .. }) => assert!(reason.contains("proof"), "{reason}"),
        Err(e) => panic!("a wrong key failed otherwise: {e:?}"),
        Ok(_) => panic!("a wrong key connected"),
    }
    // Without a key the connection opens (nothing to prove), but its first
    // request is answered with Unauthorized and nothing else.
    let keyless = RpcConn::connect(&addr, opts(None)).unwrap();
    match ping(&keyless) {
        Err(RpcError::Remote(RemoteError::Unauthorized)) => {}
        other => panic!("a keyless request was answered: {other:?}"),
    }
    assert!(ping(&keyless).is_err(), "the connection is closed after the refusal");
    assert_eq!(served.load(Ordering::Relaxed), 1, "no unauthenticated request served");
    drop(keyless);
    assert_eq!(await_refused(&l, 2), 2);
    // The good connection is unaffected.
    assert_eq!(ping(&good).unwrap(), MemResponse::Pong);
}

#[test]
fn a_keyed_client_refuses_a_server_without_the_key() {
    let (l, served) = start(None);
    let err = RpcConn::connect(&l.local_addr().to_string(), opts(Some(ClusterKey::generate())))
        .err()
        .expect("an unauthenticated server accepted");
    // The keyless server takes the challenge for a bad frame and hangs up.
    match &err {
        RpcError::Connect { reason, .. } => assert!(reason.contains("without a cluster key"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(served.load(Ordering::Relaxed), 0);
}

#[test]
fn a_replayed_client_handshake_is_refused() {
    let key = ClusterKey::generate();
    let (l, served) = start(Some(key));
    let addr = l.local_addr().to_string();
    // A recording proxy in front of the server keeps what the client sends.
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = proxy.local_addr().unwrap().to_string();
    let target = addr.clone();
    let recorder = thread::spawn(move || {
        let (mut c, _) = proxy.accept().unwrap();
        let mut s = TcpStream::connect(&target).unwrap();
        let mut s2 = s.try_clone().unwrap();
        let mut c2 = c.try_clone().unwrap();
        let back = thread::spawn(move || {
            let _ = std::io::copy(&mut s2, &mut c2);
        });
        let mut recorded = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            match c.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    recorded.extend_from_slice(&b[..n]);
                    if s.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = s.shutdown(std::net::Shutdown::Both);
        let _ = back.join();
        recorded
    });
    let good = RpcConn::connect(&paddr, opts(Some(key))).unwrap();
    assert_eq!(ping(&good).unwrap(), MemResponse::Pong);
    drop(good);
    let recorded = recorder.join().unwrap();
    assert!(recorded.len() > HEADER_LEN + 72, "recorded {} bytes", recorded.len());
    assert_eq!(served.load(Ordering::Relaxed), 1);

    // Replay everything the client sent (hello, challenge, proof, the ping)
    // on a fresh connection: the server's nonce differs, so the proof fails.
    let mut replay = TcpStream::connect(&addr).unwrap();
    replay.write_all(&recorded).unwrap();
    replay.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let start = Instant::now();
    let _ = replay.read_to_end(&mut got);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the server did not close the replay"
    );
    // The server's hello and its answer (a fresh nonce and its proof), then nothing.
    assert_eq!(got.len(), HEADER_LEN + 68, "got {got:02x?}");
    assert_eq!(&got[..HEADER_LEN], &hello());
    assert_eq!(served.load(Ordering::Relaxed), 1, "the replayed ping was not served");
    drop(replay);
    assert_eq!(await_refused(&l, 1), 1);
}

#[test]
fn a_keyless_request_gets_only_unauthorized() {
    let (l, served) = start(Some(ClusterKey::generate()));
    let mut s = TcpStream::connect(l.local_addr()).unwrap();
    s.write_all(&hello()).unwrap();
    write_frame(&mut s, FrameKind::Request, 42, &encode(&MemRequest::Ping), &[]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(&got[..HEADER_LEN], &hello());
    let frames = remora_proto::frame::parse_frames(&got[HEADER_LEN..]).unwrap();
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].0.kind, FrameKind::Error);
    assert_eq!(frames[0].0.id, 42);
    assert_eq!(decode::<RemoteError>(&frames[0].1).unwrap(), RemoteError::Unauthorized);
    assert_eq!(served.load(Ordering::Relaxed), 0);
}
