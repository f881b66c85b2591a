//! [`Stream`]: one connection's bytes, plain TCP or TLS, shareable between
//! a reading thread and writing threads like a `TcpStream` and its clones.
//!
//! A TLS stream's two directions are independent once the handshake is
//! done (the record layer, [`super::record`], keeps a key per direction), so
//! the clones of a TLS stream keep their own socket handles and share two
//! halves, each behind its own lock, as a `TcpStream`'s clones share the
//! socket:
//!
//! - a writer takes the sending half for a whole write, seals its frame
//!   into records there and sends them, blocking if the socket is full, so
//!   records reach the socket in the order they were sealed;
//! - the reader takes the receiving half, reads ciphertext into its buffer
//!   (a read timeout comes back as it does on plain TCP, and no bytes are
//!   lost), opens the records in place and copies the plaintext out, as
//!   much as the ciphertext read allows. A peer's request for new keys is
//!   left for the next write, which sends ours first, so the reader never
//!   waits for a writer.
//!
//! Plain TCP is the other arm of the same enum: a read or write is one
//! `match` away from the socket call.

use std::io::{self, ErrorKind, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustix::net::RecvFlags;
use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use rustls::server::UnbufferedServerConnection;
use rustls::{ClientConfig, ServerConfig};

use super::handshake::{self, Established, Unbuffered};
use super::record::{Kernel, Keys, Rx, Tx};

/// The first byte of a TLS handshake record (a ClientHello).
pub(crate) const TLS_HANDSHAKE: u8 = 0x16;
/// The first byte of a TLS alert record.
pub(crate) const TLS_ALERT: u8 = 0x15;
/// A fatal `protocol_version` alert in a TLS 1.2-framed record: what a
/// server answers a client that speaks TLS where it does not, or plain TCP
/// where it requires TLS. rustls reports it as a received alert; a plain
/// client recognises [`TLS_ALERT`] where it expects a hello.
const REFUSAL_ALERT: [u8; 7] = [TLS_ALERT, 0x03, 0x03, 0x00, 0x02, 0x02, 70];

/// Ciphertext read from the socket per read call: with requests pipelined,
/// several 64 KiB replies are often waiting, and one read takes them all.
const CIPHERTEXT_BUF: usize = 256 * 1024;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every holder leaves its half consistent between records; a write
    // that fails part-way marks its half broken.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection's byte stream: plain TCP or TLS. Clones made with
/// [`Stream::try_clone`] share one connection, like `TcpStream` clones; one
/// of them reads, any may write.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(TlsStream),
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Self {
        Self::Plain(s)
    }
}

/// The TLS arm of [`Stream`]: a socket handle and the shared TLS state.
pub struct TlsStream {
    sock: TcpStream,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsStream({:?})", self.sock)
    }
}

struct Shared {
    /// Held across a whole write, socket call included.
    tx: Mutex<Tx>,
    /// Held by the reader, socket call included.
    rx: Mutex<Rx>,
    /// rustls's key schedule, for key updates (held briefly, inside either
    /// half's lock).
    kernel: Mutex<Kernel>,
    /// The peer asked for new keys: the next write sends ours first.
    answer_update: AtomicBool,
}

impl Stream {
    /// The TCP socket underneath (for addresses and shutdown; writing to it
    /// directly would corrupt a TLS stream).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Tls(t) => &t.sock,
        }
    }

    /// True for a TLS stream.
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// Another handle on the same connection.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Self::Plain(s) => Self::Plain(s.try_clone()?),
            Self::Tls(t) => Self::Tls(TlsStream {
                sock: t.sock.try_clone()?,
                shared: Arc::clone(&t.shared),
            }),
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().local_addr()
    }

    /// As [`TcpStream::set_read_timeout`]: a read that waits longer fails
    /// with `WouldBlock` or `TimedOut`, on TLS too, losing no bytes.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp().set_read_timeout(t)
    }

    /// As [`TcpStream::set_write_timeout`].
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp().set_write_timeout(t)
    }

    /// As [`TcpStream::read_timeout`].
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        self.tcp().read_timeout()
    }

    /// As [`TcpStream::write_timeout`].
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        self.tcp().write_timeout()
    }

    /// As [`TcpStream::set_nodelay`].
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.tcp().set_nodelay(on)
    }

    /// Whether a read would return without waiting: bytes already taken
    /// off the socket and not yet read (ciphertext or plaintext, on TLS),
    /// or bytes, the end or an error waiting in the socket. Never blocks.
    pub fn has_input(&self) -> bool {
        if let Self::Tls(t) = self {
            if t.has_buffered() {
                return true;
            }
        }
        let mut probe = [0u8; 1];
        match rustix::net::recv(self.tcp(), &mut probe[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok(_) => true,
            Err(e) => e != rustix::io::Errno::AGAIN && e != rustix::io::Errno::INTR,
        }
    }

    /// Shuts the socket down. A TLS stream sends no close_notify: frames
    /// are self-delimiting, so a peer tells a cut frame from a clean end
    /// without it, and shutting down must not wait for a blocked writer.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.tcp().shutdown(how)
    }
}

impl TlsStream {
    fn new(sock: TcpStream, est: Established) -> io::Result<Self> {
        let Established {
            secrets,
            kernel,
            ciphertext,
            early,
        } = est;
        let tx = Tx::new(Keys::new(secrets.tx.0, &secrets.tx.1)?, kernel.update_at());
        let rx = Rx::new(
            Keys::new(secrets.rx.0, &secrets.rx.1)?,
            CIPHERTEXT_BUF,
            &ciphertext,
            early,
        );
        Ok(Self {
            sock,
            shared: Arc::new(Shared {
                tx: Mutex::new(tx),
                rx: Mutex::new(rx),
                kernel: Mutex::new(kernel),
                answer_update: AtomicBool::new(false),
            }),
        })
    }

    /// Seals all of `bufs` and writes it, record by record in order.
    fn write_all_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut tx = lock(&self.shared.tx);
        // A plain load first: a write need not take the flag's cache line
        // for writing unless the peer really asked.
        let update = self.shared.answer_update.load(Ordering::Acquire)
            && self.shared.answer_update.swap(false, Ordering::AcqRel);
        tx.write(&self.sock, &self.shared.kernel, update, bufs)?;
        Ok(total)
    }

    /// Whether bytes taken off the socket wait to be read: plaintext, or a
    /// record that cannot be opened (the next read reports it at once).
    fn has_buffered(&self) -> bool {
        let mut answer = false;
        let ready = lock(&self.shared.rx).ready(&self.shared.kernel, &mut answer);
        self.note_answer(answer);
        ready
    }

    fn note_answer(&self, answer: bool) {
        if answer {
            self.shared.answer_update.store(true, Ordering::Release);
        }
    }

    fn read_plain(&self, dst: &mut [u8]) -> io::Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        let mut answer = false;
        let res = lock(&self.shared.rx).read(&self.sock, &self.shared.kernel, &mut answer, dst);
        self.note_answer(answer);
        res
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => (&*s).read(buf),
            Stream::Tls(t) => t.read_plain(buf),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => (&*s).write(buf),
            Stream::Tls(t) => t.write_all_vectored(&[IoSlice::new(buf)]),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => (&*s).write_vectored(bufs),
            Stream::Tls(t) => t.write_all_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The host part of `addr` (`host:port`, `[v6]:port`) as a TLS server name.
fn server_name(addr: &str) -> io::Result<ServerName<'static>> {
    let host = match addr.rsplit_once(':') {
        Some((h, _)) => h,
        None => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            ErrorKind::InvalidInput,
            format!("{host:?} is not a TLS server name: {e}"),
        )
    })
}

/// The client's TLS handshake on a connected socket, within `timeout`.
pub(crate) fn client_handshake(
    sock: TcpStream,
    config: &Arc<ClientConfig>,
    addr: &str,
    timeout: Duration,
) -> io::Result<Stream> {
    let conn = UnbufferedClientConnection::new(Arc::clone(config), server_name(addr)?).map_err(io::Error::other)?;
    established(sock, conn, timeout)
}

/// The server's TLS handshake on an accepted socket, within `timeout`.
pub(crate) fn server_handshake(sock: TcpStream, config: &Arc<ServerConfig>, timeout: Duration) -> io::Result<Stream> {
    let conn = UnbufferedServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
    established(sock, conn, timeout)
}

fn established(mut sock: TcpStream, conn: impl Unbuffered, timeout: Duration) -> io::Result<Stream> {
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    let est = handshake::run(&mut sock, conn)?;
    Ok(Stream::Tls(TlsStream::new(sock, est)?))
}

/// Answers a plain client of a server that requires TLS: a TLS alert,
/// which the client recognises where it expects a hello.
pub(crate) fn refuse_plain(sock: &TcpStream) {
    let _ = (&*sock).write_all(&REFUSAL_ALERT);
}

/// Answers a TLS ClientHello on a server without TLS: a
/// `protocol_version` alert, which rustls reports to the client.
pub(crate) fn refuse_tls(sock: &TcpStream) {
    let _ = (&*sock).write_all(&REFUSAL_ALERT);
}

#[cfg(test)]
pub(crate) fn pair_for_test(client: &Arc<ClientConfig>, server: &Arc<ServerConfig>) -> io::Result<(Stream, Stream)> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let server = Arc::clone(server);
    let t = std::thread::spawn(move || -> io::Result<Stream> {
        let (s, _) = l.accept()?;
        server_handshake(s, &server, Duration::from_secs(5))
    });
    let c = TcpStream::connect(addr)?;
    let c = client_handshake(c, client, &addr.to_string(), Duration::from_secs(5))?;
    let s = t.join().map_err(|_| io::Error::other("server thread panicked"))??;
    Ok((c, s))
}

/// The alert's first byte, for clients that check what a server answered.
pub(crate) fn is_tls_alert(first: u8) -> bool {
    first == TLS_ALERT
}

#[cfg(test)]
impl Stream {
    /// Sends a TLS 1.3 key update that asks the peer to update its keys too.
    pub(crate) fn refresh_keys_for_test(&self) -> io::Result<()> {
        if let Self::Tls(t) = self {
            lock(&t.shared.tx).refresh(&t.sock, &t.shared.kernel)?;
        }
        Ok(())
    }

    /// Makes this side change its sending keys every `records` records.
    pub(crate) fn update_keys_every_for_test(&self, records: u64) {
        if let Self::Tls(t) = self {
            lock(&t.shared.tx).set_update_at(records);
        }
    }

    /// Key updates this side has sent.
    pub(crate) fn key_updates_for_test(&self) -> u64 {
        match self {
            Self::Tls(t) => lock(&t.shared.tx).updates(),
            Self::Plain(_) => 0,
        }
    }
}
