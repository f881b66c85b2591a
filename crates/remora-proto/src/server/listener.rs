//! The accept loop: admits each connection to the handshake pool
//! ([`super::gate`]) and queues it for a handshake worker; once it is
//! authenticated and there is room, the worker hands it to the server's
//! handler on a thread of its own.
//!
//! Handshake workers are kept, not spawned per connection: a flood of
//! connections that never authenticate then costs no thread creation and
//! teardown (whose stack unmapping interrupts every thread of the process
//! with a TLB shootdown), only the handshake itself.

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::gate::{Gate, Limits, Refusals};
use super::{ConnGuard, Conns, HelloError, accept_hello, accept_stream, answer_first_request, linger};
use crate::auth::ClusterKey;
use crate::msg::RemoteError;
use crate::tls::{ServerTls, Stream};

/// How often an idle authenticated connection's read comes back, so that a
/// request that stalls after its first byte is noticed at its deadline.
pub const IDLE_TICK: Duration = Duration::from_secs(1);

/// The longest pause of the accept loop when the process is out of file
/// descriptors: it backs off rather than spin on the failing `accept`.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// A listening server: accepts connections and runs `handle` on a thread per
/// connection, within its [`Limits`], until [`Listener::stop`].
#[derive(Debug)]
pub struct Listener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Conns>,
    gate: Arc<Gate>,
    refused: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Listener {
    /// Starts accepting on `listener`, calling `handle(stream, guard)` for
    /// each connection once it has exchanged hellos ([`super::answer_hello`])
    /// and, with a `key`, once the peer has proved it holds that key
    /// ([`crate::auth`]). A connection of another protocol version, one that
    /// does not start with a hello, or one without the proof is logged and
    /// closed unhandled. `key: None` serves anyone who can connect
    /// (`--insecure-no-auth`). Default [`Limits`].
    pub fn start<F>(listener: TcpListener, name: &str, key: Option<ClusterKey>, handle: F) -> io::Result<Self>
    where
        F: Fn(Stream, ConnGuard) + Send + Sync + 'static,
    {
        Self::start_with(listener, name, key, None, Limits::default(), handle)
    }

    /// As [`Listener::start`], with TLS ([`crate::tls`]: the handshake
    /// comes before the hello; `tls: None` serves plain TCP only) and
    /// within `limits`. The handler gets the
    /// stream with a read timeout of [`IDLE_TICK`] and a write timeout of
    /// the request deadline, which [`ConnGuard::request_deadline`] tells it.
    pub fn start_with<F>(
        listener: TcpListener,
        name: &str,
        key: Option<ClusterKey>,
        tls: Option<ServerTls>,
        limits: Limits,
        handle: F,
    ) -> io::Result<Self>
    where
        F: Fn(Stream, ConnGuard) + Send + Sync + 'static,
    {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Conns::default());
        let refused = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Gate::new(name, limits));
        let g = Arc::clone(&gate);
        let reaper = thread::Builder::new()
            .name(format!("{name}-reaper"))
            .spawn(move || g.reap())?;
        let accept = Accept {
            name: name.to_string(),
            stop: Arc::clone(&stop),
            conns: Arc::clone(&conns),
            gate: Arc::clone(&gate),
            refused: Arc::clone(&refused),
            key,
            tls,
            handle: Arc::new(handle),
        };
        let accepter = thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || accept.run(listener));
        let accepter = match accepter {
            Ok(t) => t,
            Err(e) => {
                gate.stop();
                return Err(e);
            }
        };
        Ok(Self {
            addr,
            stop,
            conns,
            gate,
            refused,
            threads: vec![accepter, reaper],
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections closed unserved because they did not prove the cluster
    /// key, or failed TLS (no certificate of the cluster CA, or TLS on one
    /// side only).
    pub fn auth_refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed or refused to stay within the [`Limits`].
    pub fn refusals(&self) -> Refusals {
        self.gate.refusals()
    }

    /// Connections in their handshake, and authenticated ones, right now.
    pub fn occupancy(&self) -> (usize, usize) {
        self.gate.occupancy()
    }

    /// The open connections.
    pub fn conns(&self) -> &Arc<Conns> {
        &self.conns
    }

    /// Stops accepting and closes every open connection.
    pub fn stop(&mut self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        self.gate.stop();
        // Wake the blocking accept with a throwaway connection.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.conns.close_all(None);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}

type Handler = dyn Fn(Stream, ConnGuard) + Send + Sync;

/// The accept thread's state.
struct Accept {
    name: String,
    stop: Arc<AtomicBool>,
    conns: Arc<Conns>,
    gate: Arc<Gate>,
    refused: Arc<AtomicU64>,
    key: Option<ClusterKey>,
    tls: Option<ServerTls>,
    handle: Arc<Handler>,
}

/// The process (or system) is out of file descriptors or socket memory.
fn out_of_descriptors(e: &io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        Errno::from_io_error(e),
        Some(Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM)
    )
}

impl Accept {
    fn run(self, listener: TcpListener) {
        let mut workers = Workers::new(Conn {
            server: self.name.clone(),
            gate: Arc::clone(&self.gate),
            refused: Arc::clone(&self.refused),
            key: self.key,
            tls: self.tls.clone(),
            handle: Arc::clone(&self.handle),
        });
        let mut backoff = Duration::ZERO;
        loop {
            let accepted = listener.accept();
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            // Accepting takes three descriptors (the socket, and a handle
            // each for the handshake pool and the registry).
            let admitted = accepted.and_then(|(sock, _)| {
                let Some(ticket) = self.gate.admit(&sock)? else {
                    return Ok(None);
                };
                let guard = self.conns.register(&sock, self.gate.limits().request_deadline)?;
                Ok(Some(Job { sock, ticket, guard }))
            });
            match admitted {
                Ok(Some(job)) => {
                    backoff = Duration::ZERO;
                    workers.hand_over(job);
                }
                Ok(None) => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors, `accept` fails at once for as long
                    // as the connection waits in the backlog: back off, and
                    // free a descriptor by dropping the oldest handshake.
                    if out_of_descriptors(&e) {
                        self.gate.shed();
                        backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_ACCEPT_BACKOFF);
                    } else {
                        backoff = Duration::from_millis(10);
                    }
                    self.gate.refused(format_args!("accept failed: {e}"));
                    thread::sleep(backoff);
                }
            }
        }
    }
}

/// A connection waiting for its handshake.
struct Job {
    sock: TcpStream,
    ticket: super::gate::Ticket,
    guard: ConnGuard,
}

/// The handshake workers: at most one per place in the handshake pool,
/// started as the load asks and kept.
struct Workers {
    conn: Arc<Conn>,
    tx: SyncSender<Job>,
    rx: Arc<Mutex<Receiver<Job>>>,
    started: usize,
}

impl Workers {
    fn new(conn: Conn) -> Self {
        // The gate admits no more connections than there may be workers,
        // so the queue never holds more than that either.
        let (tx, rx) = sync_channel(conn.gate.limits().handshakes);
        Self {
            conn: Arc::new(conn),
            tx,
            rx: Arc::new(Mutex::new(rx)),
            started: 0,
        }
    }

    fn hand_over(&mut self, job: Job) {
        // A worker holds one connection's ticket at a time: with as many
        // workers as tickets out (this one's included), every queued
        // connection has a worker free for it, or about to be.
        let tickets = self.conn.gate.occupancy().0;
        while self.started < tickets {
            let (conn, rx) = (Arc::clone(&self.conn), Arc::clone(&self.rx));
            let spawned = thread::Builder::new()
                .name(format!("{}-handshake", conn.server))
                .spawn(move || work(&conn, &rx));
            match spawned {
                Ok(_) => self.started += 1,
                Err(e) => {
                    self.conn
                        .gate
                        .refused(format_args!("cannot spawn a handshake worker: {e}"));
                    break;
                }
            }
        }
        if self.started == 0 {
            return;
        }
        // Never blocks: the queue holds as many as the gate admits.
        let _ = self.tx.send(job);
    }
}

/// A handshake worker's loop: until the accept loop ends.
fn work(conn: &Conn, rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(job) = job else { return };
        conn.run(job.sock, job.ticket, job.guard);
    }
}

/// What a connection's thread needs.
struct Conn {
    server: String,
    gate: Arc<Gate>,
    refused: Arc<AtomicU64>,
    key: Option<ClusterKey>,
    tls: Option<ServerTls>,
    handle: Arc<Handler>,
}

impl Conn {
    /// Runs the handshake and, once it succeeds, starts the handler on a
    /// thread of its own.
    fn run(&self, sock: TcpStream, ticket: super::gate::Ticket, guard: ConnGuard) {
        let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        let res = accept_stream(sock, self.tls.as_ref()).and_then(|s| accept_hello(&s, self.key.as_ref()).map(|()| s));
        let stream = match res {
            Ok(s) => s,
            Err(e) => {
                drop(ticket);
                self.log_refusal(&peer, e);
                return;
            }
        };
        let deadline = self.gate.limits().request_deadline;
        let Some(slot) = self.gate.slot() else {
            // Still counted in the handshake pool while it is told why.
            let busy = RemoteError::Busy(format!(
                "{} already serves {} connections",
                self.server,
                self.gate.limits().connections
            ));
            answer_first_request(&stream, &[], &busy);
            linger(stream.tcp());
            drop(ticket);
            return;
        };
        drop(ticket);
        if stream.set_read_timeout(Some(IDLE_TICK)).is_err() || stream.set_write_timeout(Some(deadline)).is_err() {
            return;
        }
        let handle = Arc::clone(&self.handle);
        let spawned = thread::Builder::new()
            .name(format!("{}-conn", self.server))
            .spawn(move || {
                handle(stream, guard);
                drop(slot);
            });
        if let Err(e) = spawned {
            self.gate.refused(format_args!("cannot spawn a connection thread: {e}"));
        }
    }

    fn log_refusal(&self, peer: &str, e: HelloError) {
        let server = &self.server;
        match e {
            HelloError::TlsRequired | HelloError::TlsNotServed | HelloError::Auth(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.gate.refused(format_args!("refusing connection from {peer}: {e}"));
            }
            HelloError::TlsHandshake(ref io) if !matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.gate.refused(format_args!("refusing connection from {peer}: {e}"));
            }
            HelloError::Closed => tracing::debug!("{server}: connection from {peer}: {e}"),
            HelloError::VersionMismatch { .. } => {
                self.gate.refused(format_args!("refusing connection from {peer}: {e}"))
            }
            e => self.gate.refused(format_args!("closing connection from {peer}: {e}")),
        }
    }
}
