//! [`Stream`]: one connection's bytes, plain TCP or TLS, shareable between
//! a reading thread and writing threads like a `TcpStream` and its clones.
//!
//! A rustls connection is one state machine for both directions, but a
//! remora connection is read by one thread (a client's leader, a server's
//! connection thread) while others write (callers, reply threads). So the
//! clones of a TLS stream keep their own socket handles and share the
//! rustls state behind a mutex that no one holds across a socket call that
//! can block:
//!
//! - a writer takes the write lock, then the rustls state to seal its
//!   bytes, and sends the sealed records straight from rustls's buffer with
//!   a send that never blocks (`MSG_DONTWAIT`); whatever the socket does
//!   not take at once is copied out, the rustls state released, and the
//!   rest written blocking, still under the write lock, so records reach
//!   the socket in the order they were sealed. A whole frame is sealed in
//!   one go ([`SEAL_LIMIT`]), so a reply is one send, not one per 64 KiB;
//! - the reader reads ciphertext from its socket into a buffer of its own
//!   (a read timeout, such as a client leader's poll, comes back as it does
//!   on plain TCP, and no bytes are lost), then takes the rustls state to
//!   decrypt it, and copies the plaintext out, as much as the ciphertext
//!   read allows in one hold of the state. Any TLS message the reader must
//!   answer (a key update) is flushed under the write lock, like a writer's
//!   records.
//!
//! Why rustls's buffered API and not its unbuffered one (checked against
//! rustls 0.23.46): the unbuffered `ReadTraffic` still copies each decrypted
//! record into a `Vec` before handing it out, and `WriteTraffic::encrypt`
//! seals into a `Vec` and copies that into the caller's buffer, so it would
//! save only the feed copy on the read side. It would also have a writer
//! reach `WriteTraffic` through `process_tls_records`, which wants the
//! reader's unprocessed ciphertext (a handshake message split over records
//! lives there) while the reader may be waiting on the socket with it.
//!
//! Plain TCP is the other arm of the same enum: a read or write is one
//! `match` away from the socket call.

use std::io::{self, ErrorKind, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

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

/// Plaintext a writer seals per round (rustls's send buffer limit). rustls's
/// default, 64 KiB, split a 64 KiB read reply (frame header + payload) into
/// two rounds and two sends; this takes a frame of up to 256 KiB whole.
const SEAL_LIMIT: usize = 256 * 1024;

/// Times a writer found the socket's send buffer full and fell back to a
/// blocking write (tests check that they exercise that path).
#[cfg(test)]
pub(crate) static SEND_BUFFER_FULL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every holder leaves the state consistent between calls into rustls;
    // a panic inside rustls would leave a state that reports its own error.
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
    /// The rustls state; held only while encrypting or decrypting.
    tls: Mutex<Connection>,
    /// Held across a whole write, socket call included; its buffer holds
    /// the ciphertext on its way out.
    write: Mutex<Vec<u8>>,
    /// The reader's ciphertext not yet given to rustls.
    read: Mutex<ReadBuf>,
}

struct ReadBuf {
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    eof: bool,
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
    fn new(sock: TcpStream, mut conn: Connection) -> Self {
        conn.set_buffer_limit(Some(SEAL_LIMIT));
        Self {
            sock,
            shared: Arc::new(Shared {
                tls: Mutex::new(conn),
                write: Mutex::new(Vec::with_capacity(CIPHERTEXT_BUF)),
                read: Mutex::new(ReadBuf {
                    buf: vec![0u8; CIPHERTEXT_BUF].into_boxed_slice(),
                    pos: 0,
                    end: 0,
                    eof: false,
                }),
            }),
        }
    }

    /// Encrypts all of `bufs` and writes it, record by record in order.
    fn write_all_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut out = lock(&self.shared.write);
        let mut owned: Vec<IoSlice<'_>> = bufs.iter().filter(|b| !b.is_empty()).copied().collect();
        let mut slices = &mut owned[..];
        loop {
            out.clear();
            let n = {
                let mut tls = lock(&self.shared.tls);
                // rustls seals at most its buffer limit per call; what it
                // took is sent before the next part is sealed.
                let n = if slices.is_empty() {
                    0
                } else {
                    tls.writer().write_vectored(slices)?
                };
                // Straight from rustls's buffer, without the copy into
                // `out`: a send that cannot block may run under the state
                // lock (the reader waits for it no longer than the kernel
                // takes to copy the records).
                while tls.wants_write() {
                    match tls.write_tls(&mut SendNow(&self.sock)) {
                        Ok(_) => {}
                        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                            #[cfg(test)]
                            SEND_BUFFER_FULL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
                while tls.wants_write() {
                    tls.write_tls(&mut *out)?;
                }
                n
            };
            if !out.is_empty() {
                (&self.sock).write_all(&out)?;
            }
            if n == 0 {
                return if slices.is_empty() {
                    Ok(total)
                } else {
                    Err(ErrorKind::WriteZero.into())
                };
            }
            IoSlice::advance_slices(&mut slices, n);
            if slices.is_empty() {
                return Ok(total);
            }
        }
    }

    /// Whether bytes taken off the socket wait to be read: ciphertext not
    /// yet given to rustls, or plaintext rustls holds. A record rustls
    /// cannot open counts too: the next read reports it at once.
    fn has_buffered(&self) -> bool {
        {
            let rb = lock(&self.shared.read);
            if rb.pos < rb.end {
                return true;
            }
        }
        let (plain, answer) = {
            let mut tls = lock(&self.shared.tls);
            match tls.process_new_packets() {
                Ok(st) => (st.plaintext_bytes_to_read() > 0, tls.wants_write()),
                Err(_) => return true,
            }
        };
        // Records rustls processed here may want an answer (a key update),
        // as in `read_plain`.
        if answer {
            let _ = self.flush_queued();
        }
        plain
    }

    /// Sends whatever rustls has queued (an answer the reader produced).
    fn flush_queued(&self) -> io::Result<()> {
        self.write_all_vectored(&[]).map(|_| ())
    }

    fn read_plain(&self, dst: &mut [u8]) -> io::Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        let mut rb = lock(&self.shared.read);
        loop {
            let (filled, answer) = {
                let mut tls = lock(&self.shared.tls);
                // One hold of the state fills as much of `dst` as the
                // ciphertext already read allows (rustls keeps at most
                // ~16 KiB of plaintext, so a 64 KiB payload used to take
                // four calls and eight lock round trips).
                let mut filled = 0;
                let mut answer = false;
                loop {
                    match tls.reader().read(&mut dst[filled..]) {
                        Ok(0) => return Ok(filled),
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        // The peer closed without close_notify: frames are
                        // self-delimiting, so the frame layer tells a clean
                        // end (between frames) from a cut one.
                        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(filled),
                        Err(e) => return Err(e),
                    }
                    if filled == dst.len() || rb.pos == rb.end {
                        break;
                    }
                    let ReadBuf { buf, pos, end, .. } = &mut *rb;
                    let took = tls.read_tls(&mut &buf[*pos..*end])?;
                    *pos += took;
                    if let Err(e) = tls.process_new_packets() {
                        // rustls queued an alert for the peer; best effort.
                        drop(tls);
                        let _ = self.flush_queued();
                        return Err(io::Error::new(ErrorKind::InvalidData, e));
                    }
                    answer |= tls.wants_write();
                }
                (filled, answer)
            };
            if answer {
                self.flush_queued()?;
            }
            if filled > 0 {
                return Ok(filled);
            }
            let ReadBuf { buf, pos, end, eof } = &mut *rb;
            if *eof {
                return Ok(0);
            }
            match (&self.sock).read(buf) {
                Ok(0) => *eof = true,
                Ok(n) => {
                    *pos = 0;
                    *end = n;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The socket as a writer whose sends never block (`MSG_DONTWAIT`, per call,
/// so the socket's other handles stay blocking): a full send buffer comes
/// back as `WouldBlock` with nothing lost. `MSG_NOSIGNAL` as std's own sends.
struct SendNow<'a>(&'a TcpStream);

impl SendNow<'_> {
    const FLAGS: SendFlags = SendFlags::DONTWAIT.union(SendFlags::NOSIGNAL);
}

impl Write for SendNow<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(rustix::net::send(self.0, buf, Self::FLAGS)?)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Ok(rustix::net::sendmsg(
            self.0,
            bufs,
            &mut SendAncillaryBuffer::default(),
            Self::FLAGS,
        )?)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

/// Runs a handshake to its end on a blocking socket whose timeouts bound it.
fn handshake(sock: &mut TcpStream, conn: &mut Connection) -> io::Result<()> {
    while conn.is_handshaking() {
        conn.complete_io(sock)?;
    }
    // TLS 1.3: the client's last flight may still be queued.
    while conn.wants_write() {
        conn.write_tls(sock)?;
    }
    Ok(())
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
    mut sock: TcpStream,
    config: &Arc<ClientConfig>,
    addr: &str,
    timeout: Duration,
) -> io::Result<Stream> {
    let conn = ClientConnection::new(Arc::clone(config), server_name(addr)?).map_err(io::Error::other)?;
    let mut conn = Connection::Client(conn);
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    handshake(&mut sock, &mut conn)?;
    Ok(Stream::Tls(TlsStream::new(sock, conn)))
}

/// The server's TLS handshake on an accepted socket, within `timeout`.
pub(crate) fn server_handshake(
    mut sock: TcpStream,
    config: &Arc<ServerConfig>,
    timeout: Duration,
) -> io::Result<Stream> {
    let conn = ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
    let mut conn = Connection::Server(conn);
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    handshake(&mut sock, &mut conn)?;
    Ok(Stream::Tls(TlsStream::new(sock, conn)))
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
            lock(&t.shared.tls).refresh_traffic_keys().map_err(io::Error::other)?;
            t.flush_queued()?;
        }
        Ok(())
    }
}
