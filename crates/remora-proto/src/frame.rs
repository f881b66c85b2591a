//! Frame layout and the incremental frame reader.
//!
//! Every message on a remora connection is one frame: a fixed 24-byte header, a
//! `head` (the postcard-encoded message, small) and an optional raw `payload`
//! (span bytes, never serialized). All integers are little-endian.
//!
//! ```text
//!  0       2    3    4         6         8                 16         20         24
//!  +-------+----+----+---------+---------+-----------------+----------+----------+
//!  | magic |ver |kind| flags=0 | rsvd=0  |   request id    | head len | payld len|
//!  | "Rm"  |VERS|    |  (u16)  |  (u16)  |      (u64)      |  (u32)   |  (u32)   |
//!  +-------+----+----+---------+---------+-----------------+----------+----------+
//!  | head: head-len bytes of postcard  | payload: payload-len raw bytes           |
//! ```
//!
//! `VERS` is [`VERSION`]. `kind` is 1 for a request, 2 for a successful response and 3 for an error
//! response whose head is a [`crate::RemoteError`]. A response carries the id of
//! the request it answers; responses may come in any order, so a client keeps
//! many requests in flight on one connection.
//!
//! **Hello.** Before any other frame, the connecting side sends a *hello*
//! ([`hello`]): a bare header of kind 4 whose `ver` byte is its protocol
//! version and whose other fields are zero. The accepting side answers with
//! its own hello, then serves requests if the versions match, or logs the
//! mismatch and closes the connection if they differ; the connecting side
//! reports a mismatch as a typed error. Magic and version sit at the same
//! offsets in every version's frames (including version 1, which had no
//! hello), so either side can name the other's version whatever it runs;
//! that layout must never change. After the hello, kind 4 is invalid.
//!
//! Decoding never trusts the peer: the header is validated (magic, version,
//! kind, reserved bits, length limits) before a single byte of the body is
//! read or allocated, so a corrupt frame costs at most 24 bytes of work and
//! closes only its own connection.

use std::io::{self, ErrorKind, IoSlice, Read, Write};
use std::time::{Duration, Instant};

use crate::tls::Stream;

/// Magic bytes at the start of every frame ("Rm" read as little-endian u16).
pub const MAGIC: u16 = u16::from_le_bytes(*b"Rm");
/// The protocol version this build speaks. Any change to the frame layout,
/// the hello or the encoding of a message ([`crate::msg`]) needs a new one.
///
/// History: 1, the first; 2, adds the hello at connection setup; 3, memory
/// nodes report their peer traffic in heartbeats and status; 4, transactions
/// on spanset members (prepare, commit, abort), member generations and the
/// apply-delta right; 5, memory nodes report their CPU use (`Load`, in
/// heartbeats and status) and the `Busy` fault; 6, region epochs (in
/// capabilities, `Grant`, `Revoke` and the `StaleEpoch` refusal) and the
/// `Stats` request; 7, compute nodes report suspected memory nodes to the
/// manager (`Suspect`, `Verdict`); 8, `Stats` answers carry the node's peer
/// traffic, and `PrepareMany`; 9, the manager group: `Alloc` and `Free`
/// carry a request number, `Raft`, `Member` and `Isolate` requests, the
/// `NotLeader` refusal, and `managers` in the cluster status; 10,
/// registrations carry a request number too; 11, the `Busy` refusal (a
/// server at its connection or request limits).
pub const VERSION: u8 = 11;
/// The `kind` byte of a hello frame (see the module docs).
pub const HELLO_KIND: u8 = 4;
/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 24;
/// Largest accepted head (the serialized message), 1 MiB.
pub const MAX_HEAD_LEN: u32 = 1 << 20;
/// Largest accepted raw payload in one frame, 256 MiB.
pub const MAX_PAYLOAD_LEN: u32 = 256 << 20;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A request; the peer answers with a response carrying the same id.
    Request = 1,
    /// A successful response.
    Response = 2,
    /// A failed response; the head is a [`crate::RemoteError`].
    Error = 3,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Request),
            2 => Some(Self::Response),
            3 => Some(Self::Error),
            _ => None,
        }
    }
}

/// A malformed frame header or body. The connection that produced it is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first two bytes were not [`MAGIC`].
    #[error("bad magic {0:#06x} (not a remora peer?)")]
    BadMagic(u16),
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {0} (this build speaks {VERSION})")]
    BadVersion(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// Flags or reserved bits were set.
    #[error("reserved header bits set ({0:#x})")]
    Reserved(u32),
    /// The head length exceeds [`MAX_HEAD_LEN`].
    #[error("head of {0} bytes exceeds the limit of {MAX_HEAD_LEN}")]
    HeadTooLong(u32),
    /// The payload length exceeds [`MAX_PAYLOAD_LEN`].
    #[error("payload of {0} bytes exceeds the limit of {MAX_PAYLOAD_LEN}")]
    PayloadTooLong(u32),
    /// The head did not decode as the expected message.
    #[error("undecodable message head: {0}")]
    BadHead(String),
    /// The first frame of a connection, from a peer of this very version,
    /// was not a hello.
    #[error("the connection did not start with a protocol hello")]
    BadHello,
}

/// The validated fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Request, response or error.
    pub kind: FrameKind,
    /// Request id chosen by the requester, echoed by the response.
    pub id: u64,
    /// Length of the postcard-encoded head.
    pub head_len: u32,
    /// Length of the raw payload after the head.
    pub payload_len: u32,
}

impl FrameHeader {
    /// Encodes the header into its 24-byte wire form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.kind as u8;
        // bytes 4..8: flags and reserved, zero.
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.head_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Validates and decodes a header from untrusted bytes.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, FrameError> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[2] != VERSION {
            return Err(FrameError::BadVersion(b[2]));
        }
        let kind = FrameKind::from_u8(b[3]).ok_or(FrameError::BadKind(b[3]))?;
        let reserved = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if reserved != 0 {
            return Err(FrameError::Reserved(reserved));
        }
        let id = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        let head_len = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
        let payload_len = u32::from_le_bytes(b[20..24].try_into().expect("4 bytes"));
        if head_len > MAX_HEAD_LEN {
            return Err(FrameError::HeadTooLong(head_len));
        }
        if payload_len > MAX_PAYLOAD_LEN {
            return Err(FrameError::PayloadTooLong(payload_len));
        }
        Ok(Self {
            kind,
            id,
            head_len,
            payload_len,
        })
    }
}

/// The hello this build sends first on every connection, and answers with.
pub fn hello() -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    b[2] = VERSION;
    b[3] = HELLO_KIND;
    b
}

/// Checks the first 24 bytes a peer sent (or answered) on a connection.
///
/// A peer of another version fails with [`FrameError::BadVersion`] naming
/// its version, whatever the rest of its bytes hold: an older or newer build
/// may send a different hello or none at all, but every version puts the
/// magic and the version byte first.
pub fn check_hello(b: &[u8; HEADER_LEN]) -> Result<(), FrameError> {
    let magic = u16::from_le_bytes([b[0], b[1]]);
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if b[2] != VERSION {
        return Err(FrameError::BadVersion(b[2]));
    }
    if *b != hello() {
        return Err(FrameError::BadHello);
    }
    Ok(())
}

/// A parsed frame: header, head bytes and payload bytes.
pub type ParsedFrame = (FrameHeader, Vec<u8>, Vec<u8>);

/// Parses as many complete frames as `bytes` holds, as a server would after
/// the hello, and returns them or the first error. Used by tests and fuzzing
/// to show that no byte string makes decoding panic.
pub fn parse_frames(mut bytes: &[u8]) -> Result<Vec<ParsedFrame>, FrameError> {
    let mut out = Vec::new();
    while bytes.len() >= HEADER_LEN {
        let hdr = FrameHeader::decode(bytes[..HEADER_LEN].try_into().expect("24 bytes"))?;
        let body = HEADER_LEN + hdr.head_len as usize + hdr.payload_len as usize;
        if bytes.len() < body {
            break;
        }
        let head = bytes[HEADER_LEN..HEADER_LEN + hdr.head_len as usize].to_vec();
        let payload = bytes[HEADER_LEN + hdr.head_len as usize..body].to_vec();
        out.push((hdr, head, payload));
        bytes = &bytes[body..];
    }
    Ok(out)
}

/// Writes one frame: header, head, then the payload slices back to back.
pub fn write_frame(w: &mut impl Write, kind: FrameKind, id: u64, head: &[u8], payload: &[&[u8]]) -> io::Result<()> {
    let payload_len: usize = payload.iter().map(|p| p.len()).sum();
    let hdr = FrameHeader {
        kind,
        id,
        head_len: u32::try_from(head.len()).map_err(|_| too_big("head"))?,
        payload_len: u32::try_from(payload_len).map_err(|_| too_big("payload"))?,
    };
    if hdr.head_len > MAX_HEAD_LEN || hdr.payload_len > MAX_PAYLOAD_LEN {
        return Err(too_big("frame"));
    }
    let hb = hdr.encode();
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 + payload.len());
    slices.push(IoSlice::new(&hb));
    slices.push(IoSlice::new(head));
    slices.extend(payload.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)));
    let mut slices = &mut slices[..];
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Parses a whole connection's bytes as a server would: the hello, then as
/// many complete frames as follow. `Ok(None)` means the hello is incomplete.
/// Used by tests and fuzzing, like [`parse_frames`].
pub fn parse_connection(bytes: &[u8]) -> Result<Option<Vec<ParsedFrame>>, FrameError> {
    let Some((first, rest)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    check_hello(first)?;
    parse_frames(rest).map(Some)
}

fn too_big(what: &str) -> io::Error {
    io::Error::new(ErrorKind::InvalidInput, format!("{what} exceeds the frame limits"))
}

/// Why reading the next frame did not produce one.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed by peer")]
    Closed,
    /// The frame was malformed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A socket error, or the peer stalled in the middle of a frame.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Buffered reader of frames from a socket that tolerates read timeouts
/// between frames (a caller can check its own deadline) but treats a frame
/// that has not arrived whole `stall_limit` after its first byte as broken:
/// a peer that stalls inside a frame, or trickles it a byte at a time. The
/// limit is checked whenever a read returns, so the socket needs a read
/// timeout for a silent peer to be caught.
#[derive(Debug)]
pub struct FrameReader {
    sock: Stream,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    stall_limit: Duration,
    /// When the first byte of the frame being read arrived; `None` between
    /// frames.
    frame_start: Option<Instant>,
}

const READ_BUF: usize = 64 * 1024;

impl FrameReader {
    /// Wraps a socket. The socket's read timeout (if any) sets how often
    /// [`FrameReader::next_header`] comes back to let the caller check a deadline.
    pub fn new(sock: impl Into<Stream>, stall_limit: Duration) -> Self {
        Self {
            sock: sock.into(),
            buf: vec![0u8; READ_BUF].into_boxed_slice(),
            pos: 0,
            end: 0,
            stall_limit,
            frame_start: None,
        }
    }

    /// The underlying socket.
    pub fn socket(&self) -> &Stream {
        &self.sock
    }

    /// Reads the next header. Returns `Ok(None)` when the socket's read
    /// timeout expired before the first byte of a frame arrived.
    pub fn next_header(&mut self) -> Result<Option<FrameHeader>, ReadError> {
        self.next_header_within(READ_BUF)
    }

    /// Whether the next read returns without waiting: bytes buffered here
    /// or in the stream, or arrived in the socket. Never blocks.
    pub fn has_input(&self) -> bool {
        self.end > self.pos || self.sock.has_input()
    }

    /// Like [`FrameReader::next_header`], but a read from the socket takes at
    /// most `limit` bytes, so that a large payload after a small head can be
    /// read straight into its destination instead of through this buffer.
    pub fn next_header_within(&mut self, limit: usize) -> Result<Option<FrameHeader>, ReadError> {
        let limit = limit.clamp(HEADER_LEN, READ_BUF);
        self.frame_start = (self.end > self.pos).then(Instant::now);
        if self.end - self.pos < HEADER_LEN {
            if self.pos > 0 {
                self.buf.copy_within(self.pos..self.end, 0);
                self.end -= self.pos;
                self.pos = 0;
            }
            while self.end < HEADER_LEN {
                match self.sock.read(&mut self.buf[self.end..limit]) {
                    Ok(0) if self.end == 0 => return Err(ReadError::Closed),
                    Ok(0) => return Err(eof_mid_frame().into()),
                    Ok(n) => {
                        self.end += n;
                        // The frame starts with its first byte; the clock is
                        // read again only while the header is incomplete.
                        let start = *self.frame_start.get_or_insert_with(Instant::now);
                        if self.end < HEADER_LEN {
                            self.check_stall(start)?;
                        }
                    }
                    Err(e) if is_timeout(&e) && self.end == 0 => return Ok(None),
                    Err(e) if is_retry(&e) => self.check_stall(Instant::now())?,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let hb: [u8; HEADER_LEN] = self.buf[self.pos..self.pos + HEADER_LEN].try_into().expect("24 bytes");
        self.pos += HEADER_LEN;
        Ok(Some(FrameHeader::decode(&hb)?))
    }

    /// Fills `dst` completely from the stream (buffered bytes first).
    pub fn read_exact_into(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let buffered = (self.end - self.pos).min(dst.len());
        dst[..buffered].copy_from_slice(&self.buf[self.pos..self.pos + buffered]);
        self.pos += buffered;
        let mut filled = buffered;
        let started = Instant::now();
        while filled < dst.len() {
            match self.sock.read(&mut dst[filled..]) {
                Ok(0) => return Err(eof_mid_frame()),
                Ok(n) => {
                    filled += n;
                    if filled < dst.len() {
                        self.check_stall(started)?;
                    }
                }
                Err(e) if is_retry(&e) => self.check_stall(started)?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads `len` bytes into a new vector.
    pub fn read_vec(&mut self, len: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read_exact_into(&mut v)?;
        Ok(v)
    }

    /// Discards `len` bytes (the payload of a refused request).
    pub fn skip(&mut self, mut len: usize) -> io::Result<()> {
        let mut scratch = [0u8; 8192];
        while len > 0 {
            let n = len.min(scratch.len());
            self.read_exact_into(&mut scratch[..n])?;
            len -= n;
        }
        Ok(())
    }

    /// Fails once the frame being read (or, outside one, the read that
    /// began at `started`) has taken longer than the stall limit. A frame
    /// starts with its first byte.
    fn check_stall(&self, started: Instant) -> io::Result<()> {
        let start = self.frame_start.unwrap_or(started);
        if start.elapsed() > self.stall_limit {
            Err(io::Error::new(
                ErrorKind::TimedOut,
                "peer stalled in the middle of a frame",
            ))
        } else {
            Ok(())
        }
    }
}

fn eof_mid_frame() -> io::Error {
    io::Error::new(ErrorKind::UnexpectedEof, "connection closed in the middle of a frame")
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

fn is_retry(e: &io::Error) -> bool {
    is_timeout(e) || e.kind() == ErrorKind::Interrupted
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A connected pair of loopback sockets.
    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    /// A frame trickled a byte at a time, each byte well within the read
    /// timeout, still fails at the deadline counted from its first byte;
    /// an idle connection between frames does not.
    #[test]
    fn a_trickled_frame_fails_at_its_deadline_and_idling_does_not() {
        let (mut tx, rx) = pair();
        rx.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut rd = FrameReader::new(rx, Duration::from_millis(400));
        // Idle for longer than the deadline: not an error.
        let idle = Instant::now();
        while idle.elapsed() < Duration::from_millis(600) {
            assert!(matches!(rd.next_header(), Ok(None)));
        }
        let mut frame = Vec::new();
        write_frame(&mut frame, FrameKind::Request, 1, b"head", &[&[7u8; 64]]).unwrap();
        let writer = std::thread::spawn(move || {
            for b in frame {
                if tx.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let start = Instant::now();
        let res = rd.next_header().map_err(|e| e.to_string()).and_then(|h| {
            let h = h.ok_or("no header")?;
            rd.read_vec(h.head_len as usize + h.payload_len as usize)
                .map_err(|e| e.to_string())
        });
        let took = start.elapsed();
        assert!(res.is_err(), "a frame trickled over 1.8 s was read whole");
        assert!(
            took >= Duration::from_millis(350) && took < Duration::from_millis(1500),
            "failed after {took:?}"
        );
        drop(rd);
        writer.join().unwrap();
    }

    #[test]
    fn header_round_trip() {
        let h = FrameHeader {
            kind: FrameKind::Error,
            id: 0x0102_0304_0506_0708,
            head_len: 77,
            payload_len: 65536,
        };
        let b = h.encode();
        assert_eq!(&b[0..2], b"Rm");
        assert_eq!(b[8], 0x08, "request id is little-endian");
        assert_eq!(FrameHeader::decode(&b).unwrap(), h);
    }

    #[test]
    fn header_rejects_each_bad_field() {
        let good = FrameHeader {
            kind: FrameKind::Request,
            id: 1,
            head_len: 1,
            payload_len: 0,
        }
        .encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(FrameHeader::decode(&b), Err(FrameError::BadMagic(_))));
        let mut b = good;
        b[2] = VERSION + 1;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::BadVersion(VERSION + 1)));
        let mut b = good;
        b[3] = 0;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::BadKind(0)));
        let mut b = good;
        b[5] = 1;
        assert!(matches!(FrameHeader::decode(&b), Err(FrameError::Reserved(_))));
        let mut b = good;
        b[16..20].copy_from_slice(&(MAX_HEAD_LEN + 1).to_le_bytes());
        assert!(matches!(FrameHeader::decode(&b), Err(FrameError::HeadTooLong(_))));
        let mut b = good;
        b[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(FrameHeader::decode(&b), Err(FrameError::PayloadTooLong(_))));
    }

    #[test]
    fn write_then_parse() {
        let mut out = Vec::new();
        write_frame(&mut out, FrameKind::Request, 7, b"head", &[b"pay", b"load"]).unwrap();
        write_frame(&mut out, FrameKind::Response, 8, b"", &[]).unwrap();
        let frames = parse_frames(&out).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].0.id, 7);
        assert_eq!(frames[0].1, b"head");
        assert_eq!(frames[0].2, b"payload");
        assert_eq!(frames[1].0.kind, FrameKind::Response);
    }

    #[test]
    fn hello_is_checked_field_by_field() {
        let h = hello();
        assert_eq!(check_hello(&h), Ok(()));
        assert_eq!(&h[0..2], b"Rm");
        assert_eq!(h[2], VERSION);
        assert_eq!(h[3], HELLO_KIND);
        let mut b = h;
        b[1] = b'M';
        assert!(matches!(check_hello(&b), Err(FrameError::BadMagic(_))));
        // Another version is named whatever follows its version byte.
        let mut b = h;
        b[2] = VERSION + 1;
        b[10] = 0xff;
        assert_eq!(check_hello(&b), Err(FrameError::BadVersion(VERSION + 1)));
        // Version 1 had no hello: its first frame is a request.
        let mut old_request = FrameHeader {
            kind: FrameKind::Request,
            id: 1,
            head_len: 1,
            payload_len: 0,
        }
        .encode();
        old_request[2] = 1;
        assert_eq!(check_hello(&old_request), Err(FrameError::BadVersion(1)));
        // This version must start with the hello, not a request.
        let request = FrameHeader {
            kind: FrameKind::Request,
            id: 0,
            head_len: 0,
            payload_len: 0,
        }
        .encode();
        assert_eq!(check_hello(&request), Err(FrameError::BadHello));
        for i in 4..HEADER_LEN {
            let mut b = h;
            b[i] = 1;
            assert_eq!(check_hello(&b), Err(FrameError::BadHello), "byte {i} set");
        }
        // After the hello, its kind is no frame kind.
        assert_eq!(FrameHeader::decode(&h), Err(FrameError::BadKind(HELLO_KIND)));
    }

    #[test]
    fn connection_starts_with_hello() {
        let mut out = hello().to_vec();
        write_frame(&mut out, FrameKind::Request, 7, b"head", &[]).unwrap();
        let frames = parse_connection(&out).unwrap().unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].0.id, 7);
        assert_eq!(parse_connection(&out[..HEADER_LEN - 1]), Ok(None));
        assert_eq!(parse_connection(&out[HEADER_LEN..]), Err(FrameError::BadHello));
    }

    proptest! {
        #[test]
        fn arbitrary_connections_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_connection(&bytes);
        }

        #[test]
        fn arbitrary_hellos_never_panic(bytes in proptest::array::uniform24(any::<u8>())) {
            match check_hello(&bytes) {
                Ok(()) => prop_assert_eq!(bytes, hello()),
                Err(FrameError::BadVersion(v)) => {
                    prop_assert_eq!(&bytes[0..2], b"Rm");
                    prop_assert_eq!(v, bytes[2]);
                    prop_assert_ne!(v, VERSION);
                }
                Err(FrameError::BadMagic(_)) => prop_assert_ne!(&bytes[0..2], b"Rm"),
                Err(FrameError::BadHello) => prop_assert_ne!(bytes, hello()),
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        #[test]
        fn hello_then_garbage(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut out = hello().to_vec();
            out.extend_from_slice(&tail);
            let parsed = parse_connection(&out);
            prop_assert_eq!(parsed.map(|_| ()), parse_frames(&tail).map(|_| ()));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_frames(&bytes);
        }

        #[test]
        fn arbitrary_headers_never_panic(bytes in proptest::array::uniform24(any::<u8>())) {
            if let Ok(h) = FrameHeader::decode(&bytes) {
                prop_assert_eq!(h.encode(), bytes);
            }
        }

        #[test]
        fn valid_prefix_then_garbage(id in any::<u64>(), head in proptest::collection::vec(any::<u8>(), 0..64),
                                     tail in proptest::collection::vec(any::<u8>(), 0..128)) {
            let mut out = Vec::new();
            write_frame(&mut out, FrameKind::Request, id, &head, &[]).unwrap();
            out.extend_from_slice(&tail);
            if let Ok(frames) = parse_frames(&out) {
                prop_assert!(!frames.is_empty());
                prop_assert_eq!(frames[0].0.id, id);
                prop_assert_eq!(&frames[0].1, &head);
            }
        }
    }
}
