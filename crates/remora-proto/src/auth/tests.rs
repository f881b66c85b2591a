use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;

use proptest::prelude::*;

use super::*;

/// A peer whose input is fixed in advance; what it is sent is kept.
struct Scripted {
    input: io::Cursor<Vec<u8>>,
    sent: Vec<u8>,
}

impl Scripted {
    fn new(input: Vec<u8>) -> Self {
        Self {
            input: io::Cursor::new(input),
            sent: Vec::new(),
        }
    }
}

impl Read for Scripted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Scripted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sent.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Passes everything through and keeps a copy of what was written.
struct Recorder<S> {
    inner: S,
    written: Vec<u8>,
}

impl<S: Read> Read for Recorder<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<S: Write> Write for Recorder<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Each side's result, then the bytes the client and the server wrote.
type Outcome = (Result<(), AuthError>, Result<(), AuthError>, Vec<u8>, Vec<u8>);

/// Runs both sides over a socket pair.
fn run(client_key: ClusterKey, server_key: ClusterKey) -> Outcome {
    let (c, s) = UnixStream::pair().unwrap();
    let server = thread::spawn(move || {
        let mut s = Recorder {
            inner: s,
            written: Vec::new(),
        };
        let res = server_handshake(&mut s, &server_key);
        // Closing without a welcome is how a refusal looks to the client.
        drop(s.inner);
        (res, s.written)
    });
    let mut c = Recorder {
        inner: c,
        written: Vec::new(),
    };
    let cres = client_handshake(&mut c, &client_key);
    drop(c.inner);
    let (sres, swritten) = server.join().unwrap();
    (cres, sres, c.written, swritten)
}

#[test]
fn key_hex_round_trips_and_debug_hides_it() {
    let k = ClusterKey::generate();
    let hex = k.to_hex();
    assert_eq!(hex.len(), 64);
    assert_eq!(ClusterKey::from_hex(&format!("  {hex}\n")).unwrap().to_hex(), hex);
    let dbg = format!("{k:?}");
    assert!(!dbg.contains(&hex[..8]), "Debug shows key bytes: {dbg}");
    assert!(dbg.contains(&k.id()), "Debug names the key by its id: {dbg}");
    assert_ne!(ClusterKey::generate().to_hex(), hex, "two fresh keys differ");
    assert_ne!(ClusterKey::generate().id(), k.id());
    assert_eq!(ClusterKey::from_hex(&hex).unwrap().id(), k.id());
    for bad in [
        "",
        &hex[..62],
        &format!("{hex}00"),
        &format!("zz{}", &hex[2..]),
        &"é".repeat(32),
        &format!("+f{}", &hex[2..]),
    ] {
        assert!(ClusterKey::from_hex(bad).is_none(), "{bad:?} accepted");
    }
}

#[test]
fn key_file_is_private_and_never_overwritten() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile_dir();
    let path = dir.join("cluster.key");
    let k = ClusterKey::generate();
    k.write_new(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(ClusterKey::read_file(&path).unwrap().to_hex(), k.to_hex());
    let again = ClusterKey::generate().write_new(&path);
    assert!(matches!(again, Err(KeyFileError::Write { .. })), "{again:?}");
    assert_eq!(
        ClusterKey::read_file(&path).unwrap().to_hex(),
        k.to_hex(),
        "first key kept"
    );
    // A key others can read is refused, however good it is.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(matches!(
        ClusterKey::read_file(&path),
        Err(KeyFileError::Exposed(crate::secret::Exposed { mode: 0o640, .. }))
    ));
    std::fs::write(dir.join("junk"), "not a key").unwrap();
    std::fs::set_permissions(dir.join("junk"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(matches!(
        ClusterKey::read_file(&dir.join("junk")),
        Err(KeyFileError::Malformed { .. })
    ));
    assert!(matches!(
        ClusterKey::read_file(&dir.join("missing")),
        Err(KeyFileError::Read { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("remora-auth-test-{}", ClusterKey::generate().id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn same_key_is_accepted_on_both_sides() {
    let k = ClusterKey::generate();
    let (c, s, cw, sw) = run(k, k);
    c.unwrap();
    s.unwrap();
    assert_eq!(cw.len(), CHALLENGE_LEN + PROOF_LEN);
    assert_eq!(sw.len(), ANSWER_LEN, "one round trip");
}

#[test]
fn wrong_key_fails_on_both_sides_and_sends_no_client_proof() {
    let (c, s, cw, sw) = run(ClusterKey::generate(), ClusterKey::generate());
    // The client checks the server's proof first and stops there.
    assert!(matches!(c, Err(AuthError::BadProof)), "{c:?}");
    assert!(matches!(s, Err(AuthError::Closed)), "{s:?}");
    assert_eq!(cw.len(), CHALLENGE_LEN, "no proof sent to a server with another key");
    assert_eq!(sw.len(), ANSWER_LEN);
}

#[test]
fn a_client_with_a_wrong_proof_is_refused() {
    let k = ClusterKey::generate();
    let nc = [7u8; NONCE_LEN];
    let mut input = Challenge { nonce: nc }.encode().to_vec();
    input.extend_from_slice(&Proof { mac: [0u8; MAC_LEN] }.encode());
    let mut peer = Scripted::new(input);
    assert!(matches!(server_handshake(&mut peer, &k), Err(AuthError::BadProof)));
    assert_eq!(peer.sent.len(), ANSWER_LEN, "an answer and nothing else");
    // The server's own proof, reflected back as the client's, is refused too.
    let answer = Answer::decode(&peer.sent).unwrap();
    let mut input = Challenge { nonce: nc }.encode().to_vec();
    input.extend_from_slice(&Proof { mac: answer.mac }.encode());
    let mut again = Scripted::new(input);
    assert!(matches!(server_handshake(&mut again, &k), Err(AuthError::BadProof)));
}

#[test]
fn replayed_handshakes_are_refused_both_ways() {
    let k = ClusterKey::generate();
    let (c, s, client_bytes, server_bytes) = run(k, k);
    c.unwrap();
    s.unwrap();
    // A recorded client, replayed to the server: its proof covers the old server nonce.
    let mut server_side = Scripted::new(client_bytes);
    assert!(matches!(
        server_handshake(&mut server_side, &k),
        Err(AuthError::BadProof)
    ));
    assert_eq!(server_side.sent.len(), ANSWER_LEN);
    // A recorded server, replayed to a client: its proof covers the old client nonce.
    let mut client_side = Scripted::new(server_bytes);
    assert!(matches!(
        client_handshake(&mut client_side, &k),
        Err(AuthError::BadProof)
    ));
    assert_eq!(client_side.sent.len(), CHALLENGE_LEN, "no proof sent to an impostor");
}

#[test]
fn a_request_instead_of_a_challenge_is_named() {
    let k = ClusterKey::generate();
    let mut peer = Scripted::new(crate::frame::hello().to_vec());
    match server_handshake(&mut peer, &k) {
        Err(AuthError::NoChallenge { got }) => assert_eq!(&got[..2], b"Rm"),
        other => panic!("{other:?}"),
    }
    assert!(peer.sent.is_empty(), "nothing said to a client without the key");
    let mut silent = Scripted::new(Vec::new());
    assert!(matches!(server_handshake(&mut silent, &k), Err(AuthError::Closed)));
    let mut no_server = Scripted::new(Vec::new());
    assert!(matches!(client_handshake(&mut no_server, &k), Err(AuthError::Closed)));
}

#[test]
fn messages_round_trip_and_tags_are_no_frame_headers() {
    let c = Challenge { nonce: [1; NONCE_LEN] };
    assert_eq!(Challenge::decode(&c.encode()).unwrap(), c);
    let a = Answer {
        nonce: [2; NONCE_LEN],
        mac: [3; MAC_LEN],
    };
    assert_eq!(Answer::decode(&a.encode()).unwrap(), a);
    let p = Proof { mac: [4; MAC_LEN] };
    assert_eq!(Proof::decode(&p.encode()).unwrap(), p);
    assert!(matches!(Answer::decode(&c.encode()), Err(AuthError::BadTag { .. })));
    assert!(Challenge::decode(&c.encode()[..CHALLENGE_LEN - 1]).is_err());
    for tag in [TAG_CHALLENGE, TAG_ANSWER, TAG_PROOF] {
        assert_ne!(tag[2], crate::frame::VERSION);
        let mut h = [0u8; crate::frame::HEADER_LEN];
        h[..TAG_LEN].copy_from_slice(&tag);
        assert!(crate::frame::FrameHeader::decode(&h).is_err());
        assert!(crate::frame::check_hello(&h).is_err());
    }
}

proptest! {
    #[test]
    fn arbitrary_messages_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = Challenge::decode(&bytes);
        let _ = Answer::decode(&bytes);
        let _ = Proof::decode(&bytes);
    }

    #[test]
    fn arbitrary_clients_never_get_in(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
        let k = ClusterKey::generate();
        let mut peer = Scripted::new(bytes);
        prop_assert!(server_handshake(&mut peer, &k).is_err());
        prop_assert!(peer.sent.is_empty() || peer.sent.len() == ANSWER_LEN);
    }

    #[test]
    fn a_challenge_then_garbage_never_gets_in(nc in proptest::array::uniform32(any::<u8>()),
                                              tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let k = ClusterKey::generate();
        let mut input = Challenge { nonce: nc }.encode().to_vec();
        input.extend_from_slice(&tail);
        let mut peer = Scripted::new(input);
        prop_assert!(server_handshake(&mut peer, &k).is_err());
        prop_assert_eq!(peer.sent.len(), ANSWER_LEN);
    }

    #[test]
    fn arbitrary_servers_never_get_a_proof(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
        let k = ClusterKey::generate();
        let mut peer = Scripted::new(bytes);
        prop_assert!(client_handshake(&mut peer, &k).is_err());
        prop_assert_eq!(peer.sent.len(), CHALLENGE_LEN);
    }
}
