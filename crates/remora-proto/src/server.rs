//! Server-side plumbing shared by the memory node and the manager: an accept
//! loop with a thread per connection, a registry of open connections (to close
//! them on shutdown or on a fault-injection command) and a reply writer that
//! several threads may share (replies can be sent out of order).

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use serde::Serialize;

use crate::frame::{FrameKind, write_frame};
use crate::msg::{RemoteError, encode};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
}

impl ConnGuard {
    /// The connection's id in the registry.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        lock(&self.conns.open).remove(&self.id);
    }
}

impl Conns {
    /// Records a connection so that [`Conns::close_all`] can reach it.
    pub fn register(self: &Arc<Self>, sock: &TcpStream) -> io::Result<ConnGuard> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.open).insert(id, sock.try_clone()?);
        Ok(ConnGuard {
            conns: Arc::clone(self),
            id,
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

/// Writes replies on one connection; cheap to clone and share.
#[derive(Debug, Clone)]
pub struct Responder {
    sock: Arc<Mutex<TcpStream>>,
}

impl Responder {
    /// Wraps the write side of a connection.
    pub fn new(sock: TcpStream, stall_limit: Duration) -> io::Result<Self> {
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
    pub fn with_socket<R>(&self, f: impl FnOnce(&mut TcpStream) -> R) -> R {
        f(&mut lock(&self.sock))
    }
}

/// A listening server: accepts connections and runs `handle` on a thread per
/// connection until [`Listener::stop`].
#[derive(Debug)]
pub struct Listener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Conns>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Listener {
    /// Starts accepting on `listener`, calling `handle(stream, guard)` on a
    /// new thread for each connection.
    pub fn start<F>(listener: TcpListener, name: &str, handle: F) -> io::Result<Self>
    where
        F: Fn(TcpStream, ConnGuard) + Send + Sync + 'static,
    {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Conns::default());
        let handle = Arc::new(handle);
        let (stop2, conns2, name2) = (Arc::clone(&stop), Arc::clone(&conns), name.to_string());
        let thread = thread::Builder::new().name(format!("{name}-accept")).spawn(move || {
            for s in listener.incoming() {
                if stop2.load(Ordering::Acquire) {
                    break;
                }
                let s = match s {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                let guard = match conns2.register(&s) {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::warn!("cannot register connection: {e}");
                        continue;
                    }
                };
                let h = Arc::clone(&handle);
                let spawned = thread::Builder::new()
                    .name(format!("{name2}-conn"))
                    .spawn(move || h(s, guard));
                if let Err(e) = spawned {
                    tracing::error!("cannot spawn connection thread: {e}");
                }
            }
        })?;
        Ok(Self {
            addr,
            stop,
            conns,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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
        // Wake the blocking accept with a throwaway connection.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
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
