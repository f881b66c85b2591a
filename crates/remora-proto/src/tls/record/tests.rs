//! The record layer against what a peer or the network may do to it: keys
//! that change under traffic, records forged, flipped or cut on the wire.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use proptest::prelude::*;

use super::super::stream::{client_handshake, pair_for_test, server_handshake};
use super::super::tests::{certs, pattern};
use super::super::{Stream, TlsConfig, TlsMode};

/// Both sides change their sending keys every few records while 2 MiB go
/// each way: every byte arrives, and the keys really changed many times.
#[test]
fn keys_change_before_their_limit_on_both_sides() {
    const LEN: usize = 2 << 20;
    let t = certs("rekey", TlsMode::Data);
    let (c, s) = pair_for_test(t.client_config(), &t.server).unwrap();
    c.update_keys_every_for_test(4);
    s.update_keys_every_for_test(3);
    let echo = thread::spawn(move || {
        let mut buf = vec![0u8; 70_000];
        let mut total = 0;
        while total < LEN {
            let n = (&s).read(&mut buf).unwrap();
            assert!(n > 0, "closed early");
            (&s).write_all(&buf[..n]).unwrap();
            total += n;
        }
        s
    });
    let rd = c.try_clone().unwrap();
    let reader = thread::spawn(move || {
        let mut back = vec![0u8; LEN];
        (&rd).read_exact(&mut back).unwrap();
        back
    });
    let sent = pattern(LEN, 5);
    for chunk in sent.chunks(100_003) {
        (&c).write_all(chunk).unwrap();
    }
    let back = reader.join().unwrap();
    let s = echo.join().unwrap();
    assert!(back == sent, "echoed bytes differ");
    // 2 MiB is 128 full records each way, in more when the echo's reads
    // are short.
    assert!(
        c.key_updates_for_test() >= 128 / 4,
        "client: {} updates",
        c.key_updates_for_test()
    );
    assert!(
        s.key_updates_for_test() >= 128 / 3,
        "server: {} updates",
        s.key_updates_for_test()
    );
}

/// Reads on `s` after the good bytes: the error each gives, `None` for the end.
fn reads_after(s: &Stream, good: &[u8]) -> [Option<ErrorKind>; 2] {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = vec![0u8; good.len()];
    (&*s).read_exact(&mut got).unwrap();
    assert!(got == good, "the bytes before the forgery differ");
    let mut b = [0u8; 64];
    [0, 1].map(|_| match (&*s).read(&mut b) {
        Ok(0) => None,
        Ok(n) => panic!("read {n} bytes that no one sealed"),
        Err(e) => Some(e.kind()),
    })
}

/// Records a peer never sealed are refused with `InvalidData`, however they
/// are wrong, and every later read is refused too: the bytes after them
/// cannot be trusted to be the peer's.
#[test]
fn forged_records_are_refused_and_stay_refused() {
    let t = certs("forged", TlsMode::Data);
    let mut body = vec![0x17, 3, 3, 0, 100];
    body.extend(pattern(100, 9));
    let cases: [(&str, Vec<u8>); 5] = [
        ("random ciphertext", body),
        ("a plaintext handshake record", vec![0x16, 3, 3, 0, 4, 24, 0, 0, 1]),
        ("a plaintext alert", vec![0x15, 3, 3, 0, 2, 2, 0]),
        (
            "a record longer than TLS allows",
            [vec![0x17, 3, 3, 0x48, 0x00], vec![0; 20]].concat(),
        ),
        ("a record shorter than its tag", vec![0x17, 3, 3, 0, 5, 1, 2, 3, 4, 5]),
    ];
    for (what, forged) in cases {
        let (c, s) = pair_for_test(t.client_config(), &t.server).unwrap();
        (&c).write_all(b"sealed").unwrap();
        (&c.tcp().try_clone().unwrap()).write_all(&forged).unwrap();
        (&c).write_all(b"sealed after").unwrap();
        assert_eq!(reads_after(&s, b"sealed"), [Some(ErrorKind::InvalidData); 2], "{what}");
    }
}

/// A proxy in front of `server`: the server's bytes go back unchanged, the
/// client's pass through `forward(from_client, to_server)`.
fn proxy(server: SocketAddr, forward: impl FnOnce(TcpStream, TcpStream) + Send + 'static) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        let (from_client, _) = l.accept().unwrap();
        let to_server = TcpStream::connect(server).unwrap();
        let (mut a, mut b) = (from_client.try_clone().unwrap(), to_server.try_clone().unwrap());
        thread::spawn(move || {
            let _ = std::io::copy(&mut b, &mut a);
        });
        let end = to_server.try_clone().unwrap();
        forward(from_client, to_server);
        let _ = end.shutdown(Shutdown::Write);
    });
    addr
}

/// A TLS pair whose client's bytes pass through `forward` on their way:
/// the client, and the server still finishing its handshake.
fn pair_through(
    t: &TlsConfig,
    forward: impl FnOnce(TcpStream, TcpStream) + Send + 'static,
) -> (Stream, thread::JoinHandle<Stream>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = proxy(l.local_addr().unwrap(), forward);
    let server = Arc::clone(&t.server);
    let accept = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        server_handshake(s, &server, Duration::from_secs(5)).unwrap()
    });
    let c = client_handshake(
        TcpStream::connect(proxy).unwrap(),
        t.client_config(),
        &proxy.to_string(),
        Duration::from_secs(5),
    )
    .unwrap();
    (c, accept)
}

/// Copies the client's bytes and flips one bit in them once `armed`.
fn flip_once_armed(armed: Arc<AtomicBool>) -> impl FnOnce(TcpStream, TcpStream) + Send + 'static {
    move |mut rd, mut wr| {
        let mut buf = vec![0u8; 64 << 10];
        let mut flipped = false;
        loop {
            let n = match rd.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !flipped && armed.load(Ordering::Acquire) && n > 200 {
                buf[200] ^= 0x10;
                flipped = true;
            }
            if wr.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    }
}

/// One bit flipped on the wire in the middle of a stream: the reader gets
/// every byte before the damaged record exactly, then an error, never a
/// byte the sender did not send.
#[test]
fn a_flipped_bit_on_the_wire_is_an_error_not_wrong_bytes() {
    let t = certs("flip", TlsMode::Data);
    let armed = Arc::new(AtomicBool::new(false));
    let (c, s) = pair_through(&t, flip_once_armed(Arc::clone(&armed)));
    let s = s.join().unwrap();
    armed.store(true, Ordering::Release);
    let sent = pattern(1 << 20, 77);
    let writer = thread::spawn(move || {
        // The reader stops at the flipped record, so a write may fail.
        for chunk in sent.chunks(64 << 10) {
            if (&c).write_all(chunk).is_err() {
                break;
            }
        }
        c
    });
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let expect = pattern(1 << 20, 77);
    let mut got = vec![0u8; expect.len()];
    let mut filled = 0;
    let err = loop {
        match (&s).read(&mut got[filled..]) {
            Ok(0) => panic!("the stream ended without an error after {filled} bytes"),
            Ok(n) => filled += n,
            Err(e) => break e,
        }
        assert!(filled < expect.len(), "every byte arrived despite the flipped bit");
    };
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(got[..filled] == expect[..filled], "bytes before the damage differ");
    s.shutdown(Shutdown::Both).unwrap();
    drop(writer.join().unwrap());
}

/// Holds what the client sends for a moment and passes it on in one write,
/// so the client's last handshake flight and the first records behind it
/// reach the server together.
fn bunch(mut from_client: TcpStream, mut to_server: TcpStream) {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let mut n = match from_client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        thread::sleep(Duration::from_millis(50));
        from_client.set_nonblocking(true).unwrap();
        while let Ok(m) = from_client.read(&mut buf[n..]) {
            if m == 0 {
                break;
            }
            n += m;
        }
        from_client.set_nonblocking(false).unwrap();
        if to_server.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

/// Records that reach the server together with the client's Finished are
/// opened by rustls before it reports the handshake done: their plaintext
/// is the stream's first bytes, not lost, and the records after them are
/// opened by our layer at the right sequence number.
#[test]
fn data_right_behind_the_handshake_is_kept() {
    let t = certs("early", TlsMode::Data);
    let (c, s) = pair_through(&t, bunch);
    // One small record, opened with the handshake's last read, then more
    // than that read takes: the rest is ciphertext left for our layer.
    let first = [pattern(1_000, 21), pattern(40_000, 23)].concat();
    (&c).write_all(&first[..1_000]).unwrap();
    (&c).write_all(&first[1_000..]).unwrap();
    let s = s.join().unwrap();
    let later = pattern(70_000, 22);
    (&c).write_all(&later).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = vec![0u8; first.len() + later.len()];
    (&s).read_exact(&mut got).unwrap();
    assert!(got[..first.len()] == first[..], "the bytes behind the handshake differ");
    assert!(got[first.len()..] == later[..], "the bytes after them differ");
    assert!(
        super::EARLY_PLAINTEXT.load(Ordering::Relaxed) > 0,
        "the test should have the server's handshake open application data"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Garbage after the handshake never reads as data and never panics:
    /// a read ends in an error, or in the end of the stream when the
    /// garbage is too short to be a record.
    #[test]
    fn garbage_after_the_handshake_never_reads_as_data(
        garbage in proptest::collection::vec(any::<u8>(), 0..3000),
        typ in prop_oneof![Just(0x17u8), any::<u8>()],
    ) {
        let t = certs("garbage", TlsMode::Data);
        let (c, s) = pair_for_test(t.client_config(), &t.server).unwrap();
        let mut bytes = garbage;
        if let Some(first) = bytes.first_mut() {
            *first = typ;
        }
        (&c.tcp().try_clone().unwrap()).write_all(&bytes).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 4096];
        match (&s).read(&mut b) {
            Ok(0) => {
                // Only a record cut short by the end may read as the end.
                let cut = bytes.len() < 5 || bytes[0] == 0x17 && {
                    let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
                    (17..=(1 << 14) + 256).contains(&len) && len > bytes.len() - 5
                };
                prop_assert!(cut, "{} bytes of garbage read as the end", bytes.len());
            }
            Ok(n) => prop_assert!(false, "read {} bytes that no one sealed", n),
            Err(e) => prop_assert!(matches!(e.kind(), ErrorKind::InvalidData | ErrorKind::ConnectionAborted), "{}", e),
        }
    }
}

/// The seal and open timings count whole passes over the plaintext (the
/// open's every record really opens: a failure is an error), run at least
/// as long as asked, and return at once on nothing to time.
#[test]
fn crypto_costs_count_every_pass_they_time() {
    let plaintext = pattern(40_000, 7);
    let timings: [(&str, CostFn); 2] = [("seal", crate::tls::seal_cost), ("open", crate::tls::open_cost)];
    for (what, cost) in timings {
        assert_eq!(cost(&plaintext, Duration::ZERO).unwrap().bytes, 40_000, "{what}");
        let timed = cost(&plaintext, Duration::from_millis(20)).unwrap();
        assert_eq!(timed.bytes % 40_000, 0, "{what}: {timed:?}");
        assert!(timed.bytes > 40_000, "{what}: {timed:?}");
        assert!(timed.secs_per_gb().is_finite(), "{what}: {timed:?}");
        assert_eq!(cost(&[], Duration::from_secs(3600)).unwrap().bytes, 0, "{what}");
    }
    // The seal's time is all its own; the open's is less the copy in,
    // timed apart, so the whole is checked before the subtraction.
    let sealed = crate::tls::seal_cost(&plaintext, Duration::from_millis(20)).unwrap();
    assert!(sealed.elapsed >= Duration::from_millis(20), "{sealed:?}");
    let (bytes, opened, _) = super::open_only(&plaintext, Duration::from_millis(20)).unwrap();
    assert!(opened >= Duration::from_millis(20), "{opened:?} for {bytes} bytes");
}

type CostFn = fn(&[u8], Duration) -> std::io::Result<crate::tls::CryptoCost>;
