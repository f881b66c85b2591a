//! Server-side plumbing shared by the memory node and the manager: an accept
//! loop with a thread per connection that answers the protocol hello before
//! anything else ([`Listener`]), within limits on connections and deadlines
//! ([`Limits`]), a registry of open connections (to close them on shutdown
//! or on a fault-injection command) and a reply writer that several threads
//! may share (replies can be sent out of order).

mod gate;
mod listener;

pub use gate::{Limits, Refusals};
pub use listener::{IDLE_TICK, Listener};

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::auth::{AuthError, ClusterKey, TAG_LEN, server_handshake};
use crate::frame::{
    FrameError, FrameHeader, FrameKind, FrameReader, HEADER_LEN, VERSION, check_hello, hello, write_frame,
};
use crate::msg::{RemoteError, encode};
use crate::tls::{ServerTls, Stream, TLS_HANDSHAKE, refuse_plain, refuse_tls};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long one read of the handshake may wait (the whole handshake has
/// its own deadline, [`Limits::handshake_deadline`]).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a refused peer of another version gets to read our hello before
/// the connection is closed.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Why an accepted connection was closed before serving any request.
#[derive(Debug, thiserror::Error)]
pub enum HelloError {
    /// The peer hung up before sending a byte (a port probe, or a server
    /// waking its own accept loop).
    #[error("closed before its protocol hello")]
    Closed,
    /// The peer runs a remora build that speaks another protocol version. It
    /// was sent this build's hello, so it can report the mismatch too.
    #[error(
        "peer speaks remora protocol version {theirs}, this build speaks version {ours}: \
         run the same remora version on every node"
    )]
    VersionMismatch {
        /// The version this build speaks ([`VERSION`]).
        ours: u8,
        /// The version the peer announced.
        theirs: u8,
    },
    /// Not a remora peer, or one that did not start with the hello.
    #[error(transparent)]
    Frame(FrameError),
    /// A socket error, an incomplete hello or none within the time limit.
    #[error("protocol hello failed: {0}")]
    Io(#[from] io::Error),
    /// The peer did not prove the cluster key ([`crate::auth`]).
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A plain client on a server that requires TLS; it was answered with
    /// a TLS alert, which it reports.
    #[error("plain TCP client on a server that requires TLS (the client needs --tls and --tls-dir)")]
    TlsRequired,
    /// A TLS client on a server without TLS; it was answered with a TLS
    /// alert, which it reports.
    #[error("TLS client on a server run without --tls")]
    TlsNotServed,
    /// The TLS handshake failed: a certificate not signed by the cluster
    /// CA, none at all, or no handshake within the time limit.
    #[error("TLS handshake failed: {0}")]
    TlsHandshake(io::Error),
}

/// Tells TLS clients from plain ones by their first byte and runs the TLS
/// handshake with the former ([`crate::tls`]); a client of a kind the
/// server does not serve is answered with a TLS alert and closed.
pub(crate) fn accept_stream(sock: TcpStream, tls: Option<&ServerTls>) -> Result<Stream, HelloError> {
    sock.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let mut first = [0u8; 1];
    let n = loop {
        match sock.peek(&mut first) {
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            other => break other?,
        }
    };
    if n == 0 {
        return Err(HelloError::Closed);
    }
    let stream = match (tls, first[0] == TLS_HANDSHAKE) {
        (Some(t), true) => {
            crate::tls::server_handshake(sock, &t.config, HELLO_TIMEOUT).map_err(HelloError::TlsHandshake)?
        }
        (Some(t), false) if t.required => {
            refuse_plain(&sock);
            linger(&sock);
            return Err(HelloError::TlsRequired);
        }
        (None, true) => {
            refuse_tls(&sock);
            linger(&sock);
            return Err(HelloError::TlsNotServed);
        }
        (_, false) => Stream::Plain(sock),
    };
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(stream)
}

/// The accepting side of the hello (see [`crate::frame`]): reads the peer's
/// hello and answers with this build's, also to a peer of another version so
/// that it learns why it is refused.
pub fn answer_hello(s: &mut (impl Read + Write)) -> Result<(), HelloError> {
    let mut b = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        match s.read(&mut b[filled..]) {
            Ok(0) if filled == 0 => return Err(HelloError::Closed),
            Ok(0) => return Err(io::Error::new(ErrorKind::UnexpectedEof, "closed in the middle of its hello").into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    match check_hello(&b) {
        Ok(()) => {
            s.write_all(&hello())?;
            Ok(())
        }
        Err(FrameError::BadVersion(theirs)) => {
            // Best effort: the peer may already be gone. A build of version 1
            // (no hello) reads this as a header of version VERSION and
            // reports that version as unsupported.
            let _ = s.write_all(&hello());
            Err(HelloError::VersionMismatch { ours: VERSION, theirs })
        }
        Err(e) => Err(HelloError::Frame(e)),
    }
}

/// [`answer_hello`] on an accepted socket, then the proof of the cluster key
/// if the server has one, all within one time limit. On a version mismatch
/// the socket is closed gracefully, so that the peer reads our hello before
/// it sees the connection end.
pub(crate) fn accept_hello(sock: &Stream, key: Option<&ClusterKey>) -> Result<(), HelloError> {
    let (read_timeout, write_timeout) = (sock.read_timeout()?, sock.write_timeout()?);
    sock.set_read_timeout(Some(HELLO_TIMEOUT))?;
    sock.set_write_timeout(Some(HELLO_TIMEOUT))?;
    let res = answer_hello(&mut &*sock);
    if let Err(HelloError::VersionMismatch { .. }) = res {
        linger(sock.tcp());
        return res;
    }
    res?;
    if let Some(key) = key {
        if let Err(e) = server_handshake(&mut &*sock, key) {
            if let AuthError::NoChallenge { got } = &e {
                answer_first_request(sock, got, &RemoteError::Unauthorized);
            }
            // What the peer already sent stays unread: close gracefully, so
            // that no reset destroys the refusal on its way.
            linger(sock.tcp());
            return Err(e.into());
        }
    }
    sock.set_read_timeout(read_timeout)?;
    sock.set_write_timeout(write_timeout)?;
    Ok(())
}

/// Answers a connection's first request with `e` (and nothing else), so
/// that it fails with a reason rather than a broken connection: a client
/// without the key that sent a request where the key challenge belongs
/// (`start` holds what was read of it), or one over the connection cap.
pub(crate) fn answer_first_request(sock: &Stream, start: &[u8], e: &RemoteError) {
    let mut h = [0u8; HEADER_LEN];
    let start = &start[..start.len().min(TAG_LEN)];
    h[..start.len()].copy_from_slice(start);
    if sock.set_read_timeout(Some(REFUSAL_LINGER)).is_err() || (&*sock).read_exact(&mut h[start.len()..]).is_err() {
        return;
    }
    if let Ok(hdr) = FrameHeader::decode(&h) {
        if hdr.kind == FrameKind::Request {
            let head = encode(e);
            let _ = write_frame(&mut &*sock, FrameKind::Error, hdr.id, &head, &[]);
        }
    }
}

/// Closing a socket with unread input resets it, and a reset can destroy
/// the reply still on its way; so stop writing, then read until the peer
/// hangs up or the linger time runs out.
pub(crate) fn linger(sock: &TcpStream) {
    if sock.shutdown(Shutdown::Write).is_err() || sock.set_read_timeout(Some(REFUSAL_LINGER)).is_err() {
        return;
    }
    let start = Instant::now();
    let mut scratch = [0u8; 4096];
    while start.elapsed() < REFUSAL_LINGER {
        match (&*sock).read(&mut scratch) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The open connections of a server.
#[derive(Debug, Default)]
pub struct Conns {
    next: AtomicU64,
    open: Mutex<HashMap<u64, TcpStream>>,
}

/// Removes its connection from the registry when dropped.
#[derive(Debug)]
pub struct ConnGuard {
    conns: Arc<Conns>,
    id: u64,
    request_deadline: Duration,
}

impl ConnGuard {
    /// The connection's id in the registry.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The time a request may take to arrive once its first byte has
    /// ([`Limits::request_deadline`]): the stall limit for the handler's
    /// [`crate::frame::FrameReader`] and [`Responder`].
    pub fn request_deadline(&self) -> Duration {
        self.request_deadline
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        lock(&self.conns.open).remove(&self.id);
    }
}

impl Conns {
    /// Records a connection so that [`Conns::close_all`] can reach it.
    pub fn register(self: &Arc<Self>, sock: &TcpStream, request_deadline: Duration) -> io::Result<ConnGuard> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.open).insert(id, sock.try_clone()?);
        Ok(ConnGuard {
            conns: Arc::clone(self),
            id,
            request_deadline,
        })
    }

    /// Shuts down every open connection except `except`; their threads see
    /// end-of-stream and exit.
    pub fn close_all(&self, except: Option<u64>) -> usize {
        let open = lock(&self.open);
        let mut n = 0;
        for (id, s) in open.iter() {
            if Some(*id) != except {
                let _ = s.shutdown(Shutdown::Both);
                n += 1;
            }
        }
        n
    }

    /// Number of open connections.
    pub fn len(&self) -> usize {
        lock(&self.open).len()
    }

    /// True if no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request as [`serve_requests`] hands it over.
#[derive(Debug)]
pub struct Request {
    /// Its frame header (the id to answer under).
    pub header: FrameHeader,
    /// The postcard head.
    pub head: Vec<u8>,
    /// The payload.
    pub payload: Vec<u8>,
}

/// The smallest server loop: reads requests from `sock` and hands each to
/// `handle` with a reply writer, until the peer hangs up, sends a malformed
/// frame or stalls past `stall_limit` inside one, or `handle` returns false.
/// For test and benchmark servers (ping, echo); the memory node and the
/// manager have their own loops, with dispatch and accounting.
pub fn serve_requests(sock: Stream, stall_limit: Duration, mut handle: impl FnMut(&Responder, Request) -> bool) {
    let Ok(out) = sock.try_clone().and_then(|s| Responder::new(s, stall_limit)) else {
        return;
    };
    let mut rd = FrameReader::new(sock, stall_limit);
    loop {
        let header = match rd.next_header() {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(_) => return,
        };
        let (Ok(head), Ok(payload)) = (
            rd.read_vec(header.head_len as usize),
            rd.read_vec(header.payload_len as usize),
        ) else {
            return;
        };
        if !handle(&out, Request { header, head, payload }) {
            return;
        }
    }
}

/// Writes replies on one connection; cheap to clone and share.
#[derive(Debug, Clone)]
pub struct Responder {
    sock: Arc<Mutex<Stream>>,
}

impl Responder {
    /// Wraps the write side of a connection.
    pub fn new(sock: impl Into<Stream>, stall_limit: Duration) -> io::Result<Self> {
        let sock = sock.into();
        sock.set_nodelay(true)?;
        sock.set_write_timeout(Some(stall_limit))?;
        Ok(Self {
            sock: Arc::new(Mutex::new(sock)),
        })
    }

    /// Sends a successful reply.
    pub fn ok<M: Serialize>(&self, id: u64, msg: &M, payload: &[&[u8]]) -> io::Result<()> {
        let head = encode(msg);
        write_frame(&mut *lock(&self.sock), FrameKind::Response, id, &head, payload)
    }

    /// Sends a typed error reply.
    pub fn err(&self, id: u64, e: &RemoteError) -> io::Result<()> {
        let head = encode(e);
        write_frame(&mut *lock(&self.sock), FrameKind::Error, id, &head, &[])
    }

    /// Runs `f` with the socket locked, for replies whose payload is borrowed
    /// from memory that must stay locked while it is written.
    pub fn with_socket<R>(&self, f: impl FnOnce(&mut Stream) -> R) -> R {
        f(&mut lock(&self.sock))
    }
}
