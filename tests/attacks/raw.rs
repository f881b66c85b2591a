//! Raw connections for attacks: a peer that speaks just enough of the
//! protocol to get where it wants to misbehave, and floods of connections
//! from another loopback address.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::ClusterKey;
use remora_proto::frame::{FrameHeader, FrameKind, HEADER_LEN, hello};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// Where floods come from: another address of the loopback interface, as
/// an attacker on another machine would.
pub(crate) const ATTACKER: [u8; 4] = [127, 0, 0, 2];

/// A connection that has exchanged hellos and, with a key, proved it.
pub(crate) fn authenticated(addr: &str, key: Option<&ClusterKey>) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&hello()).unwrap();
    let mut theirs = [0u8; HEADER_LEN];
    s.read_exact(&mut theirs).expect("the server's hello");
    if let Some(k) = key {
        remora_proto::auth::client_handshake(&mut s, k).expect("the key proof");
    }
    s
}

/// Sends a request header and head whose payload is `payload_len` long,
/// but none of the payload.
pub(crate) fn send_head_only(s: &mut TcpStream, id: u64, head: &[u8], payload_len: u32) {
    let h = FrameHeader {
        kind: FrameKind::Request,
        id,
        head_len: head.len() as u32,
        payload_len,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(head).unwrap();
}

/// Waits up to `within` for the server to close `s` (end of stream or a
/// reset); returns how long it took, `None` if it stayed open.
pub(crate) fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut b = [0u8; 256];
    while start.elapsed() < within {
        match s.read(&mut b) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

/// Taken by each test that floods: one flood at a time in this process,
/// so that two floods never eat the descriptors the other tests need.
static FLOODING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Raises this process's limit on open files as far as it may go, waits
/// for any other flood of this process to end, and says how many of
/// `wanted` connections a flood may open (a thousand descriptors are left
/// for everything else).
pub(crate) fn prepare_flood(wanted: usize) -> (std::sync::MutexGuard<'static, ()>, usize) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    let _ = setrlimit(Resource::Nofile, l);
    let fds = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let n = wanted.min(fds.saturating_sub(1_000) as usize);
    if n < wanted {
        eprintln!("only {fds} file descriptors allowed: flooding with {n} connections, not {wanted}");
    }
    (FLOODING.lock().unwrap_or_else(|p| p.into_inner()), n)
}

/// Opens a TCP connection from `from` to `to` without waiting for it to be
/// established (or accepted).
fn open(from: IpAddr, to: SocketAddr) -> Option<OwnedFd> {
    let fd = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .ok()?;
    // Closed with a reset, not into TIME_WAIT: a second run within a
    // minute finds the attacker's ports free.
    rustix::net::sockopt::set_socket_linger(&fd, Some(Duration::ZERO)).ok()?;
    rustix::net::bind(&fd, &SocketAddr::new(from, 0)).ok()?;
    match rustix::net::connect(&fd, &to) {
        Ok(()) | Err(Errno::INPROGRESS) => Some(fd),
        Err(_) => None,
    }
}

/// Whether the server has closed the connection (or refused it).
fn is_closed(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    match rustix::net::recv(fd, &mut b[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
        Ok((0, _)) => true,
        Ok(_) => false,
        Err(e) => e != Errno::AGAIN && e != Errno::INTR,
    }
}

/// What a flood did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FloodStats {
    /// Connections opened, reopenings included.
    pub(crate) opened: u64,
    /// Connections the server closed.
    pub(crate) closed_by_server: u64,
    /// Bytes trickled.
    pub(crate) trickled: u64,
}

/// A flood of connections: `n` of them, half idle (they never send a
/// byte) and half trickling a protocol hello a byte every 2 s; each one
/// the server closes is opened again, at most `reopen_per_sec` a second.
pub(crate) struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<FloodStats>>,
}

impl Flood {
    /// Starts the flood against `to` from [`ATTACKER`].
    pub(crate) fn start(to: SocketAddr, n: usize, reopen_per_sec: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let thread = thread::spawn(move || run(to, n, reopen_per_sec, &st));
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Ends the flood, closing its connections.
    pub(crate) fn stop(mut self) -> FloodStats {
        self.stop.store(true, Ordering::Release);
        self.thread.take().expect("running").join().expect("the flood thread")
    }
}

struct Sock {
    fd: Option<OwnedFd>,
    trickles: bool,
    sent: usize,
    last: Instant,
}

fn run(to: SocketAddr, n: usize, reopen_per_sec: u32, stop: &AtomicBool) -> FloodStats {
    let from = IpAddr::from(ATTACKER);
    let mut stats = FloodStats::default();
    let hello = hello();
    let now = Instant::now();
    let mut socks: Vec<Sock> = (0..n)
        .map(|i| Sock {
            fd: None,
            trickles: i % 2 == 1,
            sent: 0,
            last: now,
        })
        .collect();
    for s in &mut socks {
        s.fd = open(from, to);
        stats.opened += s.fd.is_some() as u64;
    }
    // Rounds of 100 ms, each looking at a tenth of the connections: a
    // scan costs the attacker (on this machine, the node's neighbour) a
    // system call per connection, and reopenings spread over the second.
    let round = Duration::from_millis(100);
    let per_round = (reopen_per_sec as usize / 10).max(1);
    let mut turn = 0usize;
    while !stop.load(Ordering::Acquire) {
        let started = Instant::now();
        let mut reopened = 0;
        for s in socks.iter_mut().skip(turn % 10).step_by(10) {
            match &s.fd {
                Some(fd) if is_closed(fd) => {
                    s.fd = None;
                    stats.closed_by_server += 1;
                }
                Some(fd) if s.trickles && s.last.elapsed() >= Duration::from_secs(2) => {
                    let byte = [hello[s.sent % HEADER_LEN]];
                    if rustix::net::send(fd, &byte, SendFlags::DONTWAIT).is_ok() {
                        s.sent += 1;
                        stats.trickled += 1;
                    }
                    s.last = Instant::now();
                }
                Some(_) => {}
                None if reopened < per_round => {
                    s.fd = open(from, to);
                    s.sent = 0;
                    s.last = Instant::now();
                    reopened += 1;
                    stats.opened += s.fd.is_some() as u64;
                }
                None => {}
            }
        }
        turn += 1;
        thread::sleep(round.saturating_sub(started.elapsed()));
    }
    stats
}
