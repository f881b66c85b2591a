//! The protocol hello at connection setup: peers of another protocol version
//! are refused with a typed error on both sides, and the server keeps serving
//! everyone else.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use remora_proto::frame::{FrameError, FrameHeader, FrameKind, HEADER_LEN, VERSION, hello, write_frame};
use remora_proto::msg::{MemRequest, MemResponse, decode, encode};
use remora_proto::server::{ConnGuard, HelloError, Listener, answer_hello, serve_requests};
use remora_proto::{ConnOptions, RpcConn, RpcError, Stream};

/// Answers `Ping` with `Pong` until the peer hangs up.
fn ping_server(sock: Stream, _guard: ConnGuard) {
    serve_requests(sock, Duration::from_secs(5), |out, req| {
        assert_eq!(decode::<MemRequest>(&req.head).unwrap(), MemRequest::Ping);
        out.ok(req.header.id, &MemResponse::Pong, &[]).is_ok()
    });
}

fn start_ping_server() -> Listener {
    let sock = TcpListener::bind("127.0.0.1:0").unwrap();
    Listener::start(sock, "ping", None, ping_server).unwrap()
}

fn opts() -> ConnOptions {
    ConnOptions {
        connect_timeout: Duration::from_secs(5),
        call_timeout: Duration::from_secs(5),
        stall_limit: Duration::from_secs(5),
        cluster_key: None,
        tls: None,
    }
}

fn ping(conn: &RpcConn) {
    let (r, _) = conn.call::<_, MemResponse>(&MemRequest::Ping, &[], None).unwrap();
    assert_eq!(r, MemResponse::Pong);
}

/// Reads until the peer closes, with a deadline; returns what it sent.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("connection not closed: {e} (got {got:?})"),
        }
    }
}

fn hello_of(version: u8) -> [u8; HEADER_LEN] {
    let mut h = hello();
    h[2] = version;
    h
}

#[test]
fn same_version_connects_and_serves() {
    let l = start_ping_server();
    let conn = RpcConn::connect(&l.local_addr().to_string(), opts()).unwrap();
    ping(&conn);
    ping(&conn);
}

#[test]
fn server_refuses_other_versions_and_keeps_serving() {
    let l = start_ping_server();
    let addr = l.local_addr().to_string();
    let before = RpcConn::connect(&addr, opts()).unwrap();
    // A newer build: a hello with another version (and fields this build
    // would not accept) is answered with our hello, then closed.
    let mut newer = TcpStream::connect(&addr).unwrap();
    let mut h = hello_of(VERSION + 1);
    h[8] = 0x55;
    newer.write_all(&h).unwrap();
    assert_eq!(
        read_to_close(&mut newer),
        hello().to_vec(),
        "newer peer gets our hello, then the end"
    );
    // A version-1 build has no hello: it starts with a request. It gets our
    // hello too; its header decoder reports version VERSION as unsupported.
    let mut older = TcpStream::connect(&addr).unwrap();
    let mut req = Vec::new();
    write_frame(&mut req, FrameKind::Request, 1, &encode(&MemRequest::Ping), &[]).unwrap();
    req[2] = 1;
    older.write_all(&req).unwrap();
    let got = read_to_close(&mut older);
    assert_eq!(got, hello().to_vec(), "older peer gets our hello, then the end");
    assert_eq!(got[2], VERSION);
    // Everyone else is still served, old connections and new.
    ping(&before);
    let after = RpcConn::connect(&addr, opts()).unwrap();
    ping(&after);
}

#[test]
fn garbage_and_missing_hello_are_refused_without_reply() {
    let l = start_ping_server();
    let addr = l.local_addr().to_string();
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_to_close(&mut garbage), Vec::<u8>::new(), "garbage gets no answer");
    // This version's request without the hello first: a broken client.
    let mut no_hello = TcpStream::connect(&addr).unwrap();
    let mut req = Vec::new();
    write_frame(&mut req, FrameKind::Request, 1, &encode(&MemRequest::Ping), &[]).unwrap();
    no_hello.write_all(&req).unwrap();
    assert_eq!(
        read_to_close(&mut no_hello),
        Vec::<u8>::new(),
        "a request before the hello gets no answer"
    );
    // A hello, then a hello again: after the hello, kind 4 is no frame kind.
    let mut twice = TcpStream::connect(&addr).unwrap();
    twice.write_all(&hello()).unwrap();
    twice.write_all(&hello()).unwrap();
    assert_eq!(
        read_to_close(&mut twice),
        hello().to_vec(),
        "one hello answered, the second closes"
    );
    let conn = RpcConn::connect(&addr, opts()).unwrap();
    ping(&conn);
}

/// A one-connection fake server: reads the client's hello, then does `reply`.
fn fake_server(reply: impl FnOnce(&mut TcpStream) + Send + 'static) -> (String, thread::JoinHandle<[u8; HEADER_LEN]>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = [0u8; HEADER_LEN];
        s.read_exact(&mut got).unwrap();
        reply(&mut s);
        got
    });
    (addr, t)
}

#[test]
fn client_reports_a_server_of_another_version() {
    let (addr, t) = fake_server(|s| s.write_all(&hello_of(VERSION + 7)).unwrap());
    let err = RpcConn::connect(&addr, opts()).err().expect("connect must fail");
    assert_eq!(t.join().unwrap(), hello(), "the client starts with its hello");
    match &err {
        RpcError::VersionMismatch { addr: a, ours, theirs } => {
            assert_eq!(a, &addr);
            assert_eq!(*ours, VERSION);
            assert_eq!(*theirs, VERSION + 7);
        }
        other => panic!("expected a version mismatch, got {other:?}"),
    }
    assert!(!err.is_transport(), "a version mismatch is not a liveness signal");
    let msg = err.to_string();
    assert!(msg.contains("run the same remora version"), "{msg}");
    assert!(msg.contains(&format!("version {}", VERSION + 7)), "{msg}");
}

#[test]
fn client_reports_an_old_server_that_hangs_up() {
    // What a version-1 server does with a hello: BadVersion, close.
    let (addr, t) = fake_server(|_| {});
    let err = RpcConn::connect(&addr, opts()).err().expect("connect must fail");
    t.join().unwrap();
    match &err {
        RpcError::Connect { reason, .. } => assert!(reason.contains("older than protocol version 2"), "{reason}"),
        other => panic!("expected a connect error, got {other:?}"),
    }
    assert!(
        err.is_transport(),
        "a hang-up may also be a server shutting down: retryable"
    );
}

#[test]
fn client_refuses_a_non_remora_server() {
    let (addr, t) = fake_server(|s| s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap());
    let err = RpcConn::connect(&addr, opts()).err().expect("connect must fail");
    t.join().unwrap();
    match &err {
        RpcError::Connect { reason, .. } => assert!(reason.contains("bad magic"), "{reason}"),
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[test]
fn client_gives_up_on_a_silent_server() {
    let (addr, t) = fake_server(|s| {
        // Hold the connection open past the client's timeout.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.read(&mut [0u8; 1]);
    });
    let quick = ConnOptions {
        connect_timeout: Duration::from_millis(200),
        ..opts()
    };
    let start = Instant::now();
    let err = RpcConn::connect(&addr, quick).err().expect("connect must fail");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "gave up after {:?}",
        start.elapsed()
    );
    match &err {
        RpcError::Connect { reason, .. } => assert!(reason.contains("no answer to the protocol hello"), "{reason}"),
        other => panic!("expected a connect error, got {other:?}"),
    }
    t.join().unwrap();
}

/// An in-memory connection: reads from `input`, records what is written.
struct Mock<'a> {
    input: &'a [u8],
    output: Vec<u8>,
}

impl Read for Mock<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Mock<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn answer_hello_outcomes() {
    let mut m = Mock {
        input: &hello(),
        output: Vec::new(),
    };
    answer_hello(&mut m).unwrap();
    assert_eq!(m.output, hello());
    let mut m = Mock {
        input: &[],
        output: Vec::new(),
    };
    assert!(matches!(answer_hello(&mut m), Err(HelloError::Closed)));
    let mut m = Mock {
        input: &hello()[..10],
        output: Vec::new(),
    };
    assert!(matches!(answer_hello(&mut m), Err(HelloError::Io(_))));
    assert!(m.output.is_empty());
    let mut m = Mock {
        input: &hello_of(0),
        output: Vec::new(),
    };
    assert!(matches!(
        answer_hello(&mut m),
        Err(HelloError::VersionMismatch {
            ours: VERSION,
            theirs: 0
        })
    ));
    assert_eq!(m.output, hello());
    let hdr = FrameHeader {
        kind: FrameKind::Request,
        id: 0,
        head_len: 0,
        payload_len: 0,
    }
    .encode();
    let mut m = Mock {
        input: &hdr,
        output: Vec::new(),
    };
    assert!(matches!(
        answer_hello(&mut m),
        Err(HelloError::Frame(FrameError::BadHello))
    ));
    assert!(m.output.is_empty());
}

proptest! {
    /// Whatever a peer sends first, the server's hello never panics, answers
    /// nothing or exactly its hello, and accepts only the exact hello.
    #[test]
    fn answer_hello_never_panics(input in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut m = Mock { input: &input, output: Vec::new() };
        let res = answer_hello(&mut m);
        prop_assert!(m.output.is_empty() || m.output == hello());
        prop_assert_eq!(res.is_ok(), input.len() >= HEADER_LEN && input[..HEADER_LEN] == hello());
        if let Err(HelloError::VersionMismatch { theirs, .. }) = res {
            prop_assert_eq!(theirs, input[2]);
            prop_assert_eq!(&m.output[..], &hello()[..]);
        }
    }
}
