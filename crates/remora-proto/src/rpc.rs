//! A blocking, multiplexed request/response connection.
//!
//! Many threads share one [`RpcConn`]; each request gets an id and replies may
//! arrive in any order. There is no dedicated reader thread: whichever waiting
//! caller finds nobody reading becomes the *leader* and reads frames off the
//! socket, handing other callers' replies to them and waking them, until its
//! own reply arrives; then it passes leadership on to a waiting caller. An
//! uncontended call therefore costs one kernel wake-up, like a plain
//! blocking ping-pong, and the leader reads its own reply payload straight
//! into the caller's buffer without a copy.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::auth::{AuthError, ClusterKey, client_handshake};
use crate::frame::{
    FrameError, FrameKind, FrameReader, HEADER_LEN, ReadError, VERSION, check_hello, hello, write_frame,
};
use crate::msg::{RemoteError, decode, encode};
use crate::tls::{Plane, Stream, TlsConfig};

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// Could not connect.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// Where.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The connection broke (closed, reset, malformed frame from the peer);
    /// every call in flight on it fails with this.
    #[error("connection to {addr} broken: {reason}")]
    Broken {
        /// Peer.
        addr: String,
        /// Why.
        reason: String,
    },
    /// No reply before the deadline.
    #[error("no reply from {addr} within {after:?}")]
    Timeout {
        /// Peer.
        addr: String,
        /// How long we waited.
        after: Duration,
    },
    /// The peer answered with a typed error.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The reply did not fit the request (wrong message or payload length).
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    /// The peer runs a remora build that speaks another protocol version
    /// (found by the hello at connect time).
    #[error(
        "{addr} speaks remora protocol version {theirs}, this build speaks version {ours}: \
         run the same remora version on every node"
    )]
    VersionMismatch {
        /// Peer.
        addr: String,
        /// The version this build speaks ([`crate::frame::VERSION`]).
        ours: u8,
        /// The version the peer announced.
        theirs: u8,
    },
    /// The peer's proof of the cluster key is wrong or malformed
    /// ([`crate::auth`]). A handshake cut short by a timeout or a close is
    /// [`RpcError::Connect`] instead, like a hello cut short.
    #[error("{addr}: {reason}")]
    Auth {
        /// Peer.
        addr: String,
        /// Why.
        reason: String,
    },
    /// TLS could not be set up: the peer requires it and this side was
    /// not given `--tls`, or the reverse, or a certificate was refused
    /// ([`crate::tls`]).
    #[error("TLS with {addr}: {reason}")]
    Tls {
        /// Peer.
        addr: String,
        /// Why.
        reason: String,
    },
}

impl RpcError {
    /// True if the peer is unreachable or unresponsive (as opposed to having
    /// answered with an error): the signal a failure detector wants.
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::Connect { .. } | Self::Broken { .. } | Self::Timeout { .. })
    }

    /// True if the node cannot serve data now: unreachable, or it said so
    /// itself (its lease with the manager lapsed, it is paused, or it serves
    /// as many connections as it may). Readers read around such a node; its
    /// data is not lost.
    pub fn is_node_down(&self) -> bool {
        self.is_transport() || matches!(self, Self::Remote(RemoteError::Unavailable | RemoteError::Busy(_)))
    }

    /// True if the node answered but no longer holds the region for the
    /// caller: the capability is refused (`BadCapability`), names an
    /// earlier assignment (`StaleEpoch`), or the region is not there
    /// (`NoSuchRegion`). This is what a memory node restarted at the same
    /// address, or wiped after it was fenced, answers before the caller has
    /// heard that its old incarnation is dead: that copy is gone, and a
    /// reader with redundancy reads around it.
    pub fn is_region_gone(&self) -> bool {
        matches!(
            self,
            Self::Remote(
                RemoteError::BadCapability { .. } | RemoteError::StaleEpoch { .. } | RemoteError::NoSuchRegion { .. }
            )
        )
    }
}

/// Tunables of a connection, and the cluster key it proves.
#[derive(Debug, Clone)]
pub struct ConnOptions {
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Default deadline of a call.
    pub call_timeout: Duration,
    /// A peer that stalls inside a frame (or a blocked write) for longer than
    /// this breaks the connection.
    pub stall_limit: Duration,
    /// The cluster key proved at connect time ([`crate::auth`]); `None`
    /// talks only to servers run with `--insecure-no-auth`.
    pub cluster_key: Option<ClusterKey>,
    /// TLS ([`crate::tls`]): which connections are encrypted and the
    /// certificates they present; `None` is plain TCP everywhere.
    pub tls: Option<TlsConfig>,
}

impl Default for ConnOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_secs(10),
            stall_limit: Duration::from_secs(10),
            cluster_key: None,
            tls: None,
        }
    }
}

/// A received reply: its head and, unless it went to the caller's buffer, its payload.
#[derive(Debug)]
pub struct Reply {
    /// The postcard head.
    pub head: Vec<u8>,
    /// The payload, if it was not placed in the caller's buffer.
    pub payload: Vec<u8>,
}

struct Slot {
    waiter: Option<Thread>,
    done: Option<Result<(FrameKind, Reply), RpcError>>,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Slot>,
    leader: bool,
    broken: Option<RpcError>,
}

/// Shared state of a connection; see the module docs.
pub struct RpcConn {
    peer: String,
    opts: ConnOptions,
    writer: Mutex<Stream>,
    reader: Mutex<FrameReader>,
    state: Mutex<State>,
    next_id: AtomicU64,
}

/// A request sent but not yet waited for.
#[derive(Debug)]
#[must_use = "a ticket must be waited for, or its reply is dropped"]
pub struct Ticket(u64);

impl Ticket {
    /// A ticket for request `id`: for transports other than [`RpcConn`],
    /// which number their own requests.
    pub fn from_raw(id: u64) -> Self {
        Self(id)
    }

    /// The request id.
    pub fn raw(&self) -> u64 {
        self.0
    }
}

/// Replies at least this large are read into the caller's buffer directly.
const DIRECT_READ_MIN: usize = 16 * 1024;
/// Room for a reply head when reading a header before a direct payload read.
const SMALL_HEAD: usize = 64;

/// How often a reading leader wakes to check its own deadline.
const LEADER_POLL: Duration = Duration::from_millis(20);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves no broken invariant
    // that a later caller could observe (state is replaced wholesale), so
    // poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RpcConn {
    /// Connects to `addr`, exchanges hellos with it (one round trip) and, with
    /// `opts.cluster_key`, proves the key both ways (one more), within
    /// `opts.connect_timeout`; a peer of another protocol version is refused
    /// with [`RpcError::VersionMismatch`], one without the key with
    /// [`RpcError::Auth`].
    ///
    /// The connection is a control-plane one: encrypted if `opts.tls` is
    /// set at all. [`RpcConn::connect_on`] chooses the plane.
    pub fn connect(addr: &str, opts: ConnOptions) -> Result<Arc<Self>, RpcError> {
        Self::connect_on(addr, opts, Plane::Control)
    }

    /// As [`RpcConn::connect`], encrypted if `opts.tls` encrypts `plane`:
    /// the TLS handshake comes first, and the hello and key proof run inside it.
    pub fn connect_on(addr: &str, opts: ConnOptions, plane: Plane) -> Result<Arc<Self>, RpcError> {
        let fail = |reason: String| RpcError::Connect {
            addr: addr.to_string(),
            reason,
        };
        let sa: SocketAddr = addr
            .to_socket_addrs()
            .map_err(|e| fail(e.to_string()))?
            .next()
            .ok_or_else(|| fail("address resolves to nothing".into()))?;
        let sock = TcpStream::connect_timeout(&sa, opts.connect_timeout).map_err(|e| fail(e.to_string()))?;
        // The key proof's last message and the first request go out back to
        // back: Nagle's algorithm would hold the request for an ACK.
        sock.set_nodelay(true).map_err(|e| fail(e.to_string()))?;
        let mut sock = match opts.tls.as_ref().filter(|t| t.encrypts(plane)) {
            Some(tls) => crate::tls::client_handshake(sock, tls.client_config(), addr, opts.connect_timeout)
                .map_err(|e| tls_failed(addr, opts.connect_timeout, e))?,
            None => Stream::Plain(sock),
        };
        exchange_hello(&mut sock, addr, opts.connect_timeout)?;
        if let Some(key) = &opts.cluster_key {
            client_handshake(&mut sock, key).map_err(|e| auth_failed(addr, opts.connect_timeout, e))?;
        }
        Self::from_stream(sock, addr.to_string(), opts).map_err(|e| fail(e.to_string()))
    }

    fn from_stream(sock: Stream, peer: String, opts: ConnOptions) -> io::Result<Arc<Self>> {
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(LEADER_POLL))?;
        sock.set_write_timeout(Some(opts.stall_limit))?;
        let rd = sock.try_clone()?;
        let stall_limit = opts.stall_limit;
        Ok(Arc::new(Self {
            peer,
            opts,
            writer: Mutex::new(sock),
            reader: Mutex::new(FrameReader::new(rd, stall_limit)),
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
        }))
    }

    /// The peer's address as given to `connect`.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The connection's options.
    pub fn options(&self) -> &ConnOptions {
        &self.opts
    }

    /// True once the connection has failed; every later call fails at once.
    pub fn is_broken(&self) -> bool {
        lock(&self.state).broken.is_some()
    }

    /// Sends a request without waiting for its reply.
    pub fn send<M: Serialize>(&self, msg: &M, payload: &[&[u8]]) -> Result<Ticket, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = lock(&self.state);
            if let Some(e) = &st.broken {
                return Err(e.clone());
            }
            st.pending.insert(
                id,
                Slot {
                    waiter: None,
                    done: None,
                },
            );
        }
        let head = encode(msg);
        let res = {
            let mut w = lock(&self.writer);
            write_frame(&mut *w, FrameKind::Request, id, &head, payload)
        };
        if let Err(e) = res {
            let err = self.break_conn(format!("send failed: {e}"));
            lock(&self.state).pending.remove(&id);
            return Err(err);
        }
        Ok(Ticket(id))
    }

    /// Waits for the reply to `ticket`. If `dest` is given, the reply payload
    /// must be exactly `dest.len()` bytes and lands there (the returned
    /// [`Reply::payload`] is then empty). A reply that has already arrived
    /// is taken even when `timeout` is zero: the socket is read once more
    /// after the deadline, without waiting.
    pub fn wait(&self, ticket: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<Reply, RpcError> {
        self.wait_for(ticket, dest, timeout, false)
    }

    /// As [`RpcConn::wait`], but a timeout leaves the request pending: a
    /// later wait on the same ticket still gets its reply. For a caller
    /// that stops waiting for a slow request but must learn its outcome.
    pub fn wait_keeping(&self, ticket: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<Reply, RpcError> {
        self.wait_for(ticket, dest, timeout, true)
    }

    fn wait_for(
        &self,
        ticket: Ticket,
        mut dest: Option<&mut [u8]>,
        timeout: Duration,
        keep: bool,
    ) -> Result<Reply, RpcError> {
        let id = ticket.0;
        let deadline = Instant::now() + timeout;
        // Whether we read the socket once after the deadline (see below).
        let mut looked = false;
        loop {
            let mut st = lock(&self.state);
            let done = st.pending.get_mut(&id).and_then(|s| s.done.take());
            if let Some(res) = done {
                st.pending.remove(&id);
                drop(st);
                return finish(res, dest);
            }
            if let Some(e) = &st.broken {
                let e = e.clone();
                st.pending.remove(&id);
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline && !st.leader && !looked {
                // The reply may already sit in the socket, unread because
                // the wait began late (a caller that spent its time budget
                // elsewhere, or was descheduled): take it rather than time
                // out a request that was answered. `lead` reads only what
                // has arrived once the deadline has passed.
                looked = true;
                st.leader = true;
                drop(st);
                if let Some(res) = self.lead(id, dest.as_deref_mut(), deadline) {
                    return res;
                }
                continue;
            }
            if now >= deadline {
                if !keep {
                    st.pending.remove(&id);
                }
                return Err(RpcError::Timeout {
                    addr: self.peer.clone(),
                    after: timeout,
                });
            }
            if !st.leader {
                st.leader = true;
                drop(st);
                if let Some(res) = self.lead(id, dest.as_deref_mut(), deadline) {
                    return res;
                }
            } else {
                if let Some(slot) = st.pending.get_mut(&id) {
                    slot.waiter = Some(thread::current());
                }
                drop(st);
                thread::park_timeout(deadline - now);
            }
        }
    }

    /// Sends and waits: the common case.
    pub fn call<M: Serialize, R: DeserializeOwned>(
        &self,
        msg: &M,
        payload: &[&[u8]],
        dest: Option<&mut [u8]>,
    ) -> Result<(R, Vec<u8>), RpcError> {
        let t = self.send(msg, payload)?;
        let reply = self.wait(t, dest, self.opts.call_timeout)?;
        let r = decode(&reply.head).map_err(|e| RpcError::Unexpected(e.to_string()))?;
        Ok((r, reply.payload))
    }

    /// Reads frames as leader until our own reply arrives (`Some`) or our
    /// deadline passes between frames (`None`: the caller re-checks). Past
    /// the deadline it still reads frames that have arrived, but never waits
    /// for one.
    fn lead(&self, my_id: u64, mut dest: Option<&mut [u8]>, deadline: Instant) -> Option<Result<Reply, RpcError>> {
        let mut rd = lock(&self.reader);
        // A large reply payload is read straight into the caller's buffer:
        // fetch only the header and head first.
        let limit = match dest.as_deref() {
            Some(d) if d.len() >= DIRECT_READ_MIN => crate::frame::HEADER_LEN + SMALL_HEAD,
            _ => usize::MAX,
        };
        loop {
            if Instant::now() >= deadline && !rd.has_input() {
                drop(rd);
                self.resign();
                return None;
            }
            let hdr = match rd.next_header_within(limit) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    if Instant::now() >= deadline {
                        drop(rd);
                        self.resign();
                        return None;
                    }
                    continue;
                }
                Err(e) => {
                    drop(rd);
                    let reason = match e {
                        ReadError::Closed => "closed by peer".to_string(),
                        other => other.to_string(),
                    };
                    let err = self.break_conn(reason);
                    self.resign();
                    lock(&self.state).pending.remove(&my_id);
                    return Some(Err(err));
                }
            };
            if hdr.kind == FrameKind::Request {
                drop(rd);
                let err = self.break_conn("peer sent a request on a client connection".into());
                self.resign();
                return Some(Err(err));
            }
            let mine = hdr.id == my_id;
            let res = (|| -> io::Result<(Vec<u8>, Vec<u8>, bool)> {
                let head = rd.read_vec(hdr.head_len as usize)?;
                let plen = hdr.payload_len as usize;
                if mine && hdr.kind == FrameKind::Response {
                    if let Some(d) = dest.as_deref_mut() {
                        if d.len() == plen {
                            rd.read_exact_into(d)?;
                            return Ok((head, Vec::new(), true));
                        }
                    }
                }
                Ok((head, rd.read_vec(plen)?, false))
            })();
            let (head, payload, placed) = match res {
                Ok(v) => v,
                Err(e) => {
                    drop(rd);
                    let err = self.break_conn(e.to_string());
                    self.resign();
                    lock(&self.state).pending.remove(&my_id);
                    return Some(Err(err));
                }
            };
            let reply = Reply { head, payload };
            if mine {
                drop(rd);
                self.resign();
                lock(&self.state).pending.remove(&my_id);
                if placed {
                    return Some(Ok(reply));
                }
                return Some(finish(Ok((hdr.kind, reply)), dest));
            }
            let mut st = lock(&self.state);
            if let Some(slot) = st.pending.get_mut(&hdr.id) {
                slot.done = Some(Ok((hdr.kind, reply)));
                if let Some(t) = slot.waiter.take() {
                    t.unpark();
                }
            }
            // else: the caller gave up (timeout); the late reply is dropped.
        }
    }

    /// Gives up leadership and wakes one waiter to take it.
    fn resign(&self) {
        let mut st = lock(&self.state);
        st.leader = false;
        if let Some(t) = st
            .pending
            .values_mut()
            .find(|s| s.done.is_none() && s.waiter.is_some())
            .and_then(|s| s.waiter.take())
        {
            t.unpark();
        }
    }

    /// Marks the connection broken and wakes every waiter.
    fn break_conn(&self, reason: String) -> RpcError {
        let mut st = lock(&self.state);
        let err = st
            .broken
            .get_or_insert_with(|| RpcError::Broken {
                addr: self.peer.clone(),
                reason,
            })
            .clone();
        for s in st.pending.values_mut() {
            if let Some(t) = s.waiter.take() {
                t.unpark();
            }
        }
        drop(st);
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
        err
    }

    /// Closes the connection; calls in flight fail.
    pub fn close(&self) {
        self.break_conn("closed locally".into());
    }
}

impl Drop for RpcConn {
    fn drop(&mut self) {
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }
}

/// The client's half of the hello (see [`crate::frame`]): one round trip,
/// within `timeout`, before the connection carries any request.
fn exchange_hello(sock: &mut Stream, addr: &str, timeout: Duration) -> Result<(), RpcError> {
    let fail = |reason: String| RpcError::Connect {
        addr: addr.to_string(),
        reason,
    };
    let io_fail = |e: io::Error| {
        fail(match e.kind() {
            // Builds before protocol version 2 close on a hello they cannot parse.
            io::ErrorKind::UnexpectedEof => format!(
                "closed during the protocol hello (by a remora build older than protocol version 2, \
                 which has no hello, or by one shutting down): {e}"
            ),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                format!("no answer to the protocol hello within {timeout:?}")
            }
            _ => format!("protocol hello failed: {e}"),
        })
    };
    sock.set_write_timeout(Some(timeout)).map_err(io_fail)?;
    sock.set_read_timeout(Some(timeout)).map_err(io_fail)?;
    sock.write_all(&hello()).map_err(io_fail)?;
    let mut reply = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        match sock.read(&mut reply[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_fail(e)),
        }
    }
    if filled > 0 && !sock.is_tls() && crate::tls::is_tls_alert(reply[0]) {
        // A server that requires TLS answers a plain hello with a TLS alert.
        return Err(RpcError::Tls {
            addr: addr.to_string(),
            reason: "the server requires TLS: run this side with --tls (control or data) and --tls-dir DIR \
                     (certificates made by `remora certs --out DIR`)"
                .into(),
        });
    }
    if filled < HEADER_LEN {
        return Err(io_fail(io::ErrorKind::UnexpectedEof.into()));
    }
    match check_hello(&reply) {
        Ok(()) => Ok(()),
        Err(FrameError::BadVersion(theirs)) => Err(RpcError::VersionMismatch {
            addr: addr.to_string(),
            ours: VERSION,
            theirs,
        }),
        Err(e) => Err(fail(format!("bad protocol hello: {e}"))),
    }
}

/// A refused certificate or a peer without TLS is final
/// ([`RpcError::Tls`]); a handshake cut short by a timeout is a transport
/// failure, like a hello cut short.
fn tls_failed(addr: &str, timeout: Duration, e: io::Error) -> RpcError {
    let addr = addr.to_string();
    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        return RpcError::Connect {
            addr,
            reason: format!("no answer in the TLS handshake within {timeout:?}"),
        };
    }
    let reason = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::AlertReceived(rustls::AlertDescription::ProtocolVersion)) => {
            "the server does not run with --tls (or runs a remora build without TLS)".to_string()
        }
        Some(rustls::Error::AlertReceived(a)) => format!(
            "the server refused this side's certificate (TLS alert {a:?}): it must be signed by the \
             same cluster CA (`remora certs`)"
        ),
        Some(rustls::Error::InvalidCertificate(c)) => format!(
            "the server's certificate is not valid here ({c:?}): it must be signed by this side's \
             cluster CA and name the address connected to (`remora certs --name HOST`)"
        ),
        Some(other) => format!("handshake failed: {other}"),
        None if e.kind() == io::ErrorKind::UnexpectedEof => {
            "the server closed the connection in the TLS handshake (does it run with --tls?)".to_string()
        }
        None => {
            return RpcError::Connect {
                addr,
                reason: format!("TLS handshake failed: {e}"),
            };
        }
    };
    RpcError::Tls { addr, reason }
}

/// A wrong proof is final; a handshake cut short is a transport failure
/// (the peer may be overloaded or restarting), which callers retry.
fn auth_failed(addr: &str, timeout: Duration, e: AuthError) -> RpcError {
    let addr = addr.to_string();
    match e {
        AuthError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
            RpcError::Connect {
                addr,
                reason: format!("no answer in the cluster-key handshake within {timeout:?}"),
            }
        }
        e @ (AuthError::Io(_) | AuthError::Closed) => RpcError::Connect {
            addr,
            reason: e.to_string(),
        },
        e => RpcError::Auth {
            addr,
            reason: e.to_string(),
        },
    }
}

fn finish(res: Result<(FrameKind, Reply), RpcError>, dest: Option<&mut [u8]>) -> Result<Reply, RpcError> {
    let (kind, mut reply) = res?;
    if kind == FrameKind::Error {
        let e: RemoteError = decode(&reply.head).map_err(|e| RpcError::Unexpected(e.to_string()))?;
        return Err(RpcError::Remote(e));
    }
    if let Some(d) = dest {
        if d.len() != reply.payload.len() {
            return Err(RpcError::Unexpected(format!(
                "payload of {} bytes for a buffer of {}",
                reply.payload.len(),
                d.len()
            )));
        }
        d.copy_from_slice(&reply.payload);
        reply.payload = Vec::new();
    }
    Ok(reply)
}
