//! The baseline: plain blocking TCP on loopback, measured in the same run.
//!
//! A server thread in the bench process serves a region-sized buffer the way
//! a minimal memory node would, with no framing beyond a fixed request:
//!
//! ```text
//!  0    1         4          8                 16                32
//!  +----+---------+----------+-----------------+-----------------+
//!  | op | zero    | len (u32)|  offset (u64)   |  zero           |
//!  +----+---------+----------+-----------------+-----------------+
//! ```
//!
//! `op` 1 (read) is answered with the `len` bytes at `offset`, nothing else;
//! `op` 2 (write) is followed by `len` payload bytes, stored at `offset` and
//! answered with the 8 bytes [`ACK`]. Integers are little-endian. Each
//! connection gets its own thread doing one blocking `read`/`write` at a time,
//! with `TCP_NODELAY` on both ends; the buffer sits behind a lock per request,
//! as a memory node's region does.

use std::io::{self, BufRead, BufReader, ErrorKind, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::thread;

use anyhow::{Context, bail};

use super::pin::pin_current;

const REQ_LEN: usize = 32;
const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
/// The reply to a write.
const ACK: [u8; 8] = *b"rawack\0\0";

fn request(op: u8, offset: u64, len: usize) -> io::Result<[u8; REQ_LEN]> {
    let len = u32::try_from(len).map_err(|_| io::Error::new(ErrorKind::InvalidInput, "request too large"))?;
    let mut r = [0u8; REQ_LEN];
    r[0] = op;
    r[4..8].copy_from_slice(&len.to_le_bytes());
    r[8..16].copy_from_slice(&offset.to_le_bytes());
    Ok(r)
}

/// The baseline server; stops (and closes its connections) when dropped.
pub(super) struct RawServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<thread::JoinHandle<()>>,
}

impl RawServer {
    /// Listens on an ephemeral loopback port and serves `store`, on `cpu` if given.
    pub(super) fn start(store: Vec<u8>, cpu: Option<usize>) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let store = Arc::new(RwLock::new(store));
        let (pinned_tx, pinned_rx) = mpsc::channel();
        let accept = {
            let (stop, open) = (Arc::clone(&stop), Arc::clone(&open));
            thread::Builder::new().name("raw-accept".into()).spawn(move || {
                // Connection threads inherit the accept thread's pinning.
                let pinned = cpu.map_or(Ok(()), pin_current);
                let ok = pinned.is_ok();
                let _ = pinned_tx.send(pinned);
                if ok {
                    accept_loop(&listener, &stop, &open, &store);
                }
            })?
        };
        let pinned = pinned_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("raw baseline accept thread died")));
        if let Err(e) = pinned {
            let _ = accept.join();
            return Err(e);
        }
        Ok(Self {
            addr,
            stop,
            open,
            accept: Some(accept),
        })
    }

    /// Where it listens.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in self.open.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: &TcpListener, stop: &AtomicBool, open: &Mutex<Vec<TcpStream>>, store: &Arc<RwLock<Vec<u8>>>) {
    for sock in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(sock) = sock else { continue };
        if sock.set_nodelay(true).is_err() {
            continue;
        }
        if let Ok(c) = sock.try_clone() {
            open.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        }
        let store = Arc::clone(store);
        let spawned = thread::Builder::new().name("raw-conn".into()).spawn(move || {
            if let Err(e) = serve(sock, &store) {
                tracing::debug!("raw baseline connection: {e}");
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("raw baseline: cannot start a connection thread: {e}");
        }
    }
}

fn serve(mut sock: TcpStream, store: &RwLock<Vec<u8>>) -> io::Result<()> {
    let mut req = [0u8; REQ_LEN];
    loop {
        match sock.read_exact(&mut req) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u32::from_le_bytes(req[4..8].try_into().expect("4 bytes")) as usize;
        let offset = u64::from_le_bytes(req[8..16].try_into().expect("8 bytes"));
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let bad = || io::Error::new(ErrorKind::InvalidInput, "request out of bounds");
        match req[0] {
            OP_READ => {
                let g = store.read().unwrap_or_else(|p| p.into_inner());
                let data = start
                    .checked_add(len)
                    .and_then(|end| g.get(start..end))
                    .ok_or_else(bad)?;
                sock.write_all(data)?;
            }
            OP_WRITE => {
                let mut g = store.write().unwrap_or_else(|p| p.into_inner());
                let dst = start
                    .checked_add(len)
                    .and_then(|end| g.get_mut(start..end))
                    .ok_or_else(bad)?;
                sock.read_exact(dst)?;
                drop(g);
                sock.write_all(&ACK)?;
            }
            op => return Err(io::Error::new(ErrorKind::InvalidData, format!("unknown op {op}"))),
        }
    }
}

/// A client of [`RawServer`]: one connection, requests answered in order.
pub(super) struct RawClient {
    sock: TcpStream,
}

impl RawClient {
    /// Connects with `TCP_NODELAY`.
    pub(super) fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let sock = TcpStream::connect(addr).with_context(|| format!("connecting to the raw TCP baseline at {addr}"))?;
        sock.set_nodelay(true)?;
        Ok(Self { sock })
    }

    /// Asks for `len` bytes at `offset`; the reply is taken by [`RawClient::recv_read`].
    pub(super) fn send_read(&mut self, offset: u64, len: usize) -> anyhow::Result<()> {
        self.sock.write_all(&request(OP_READ, offset, len)?)?;
        Ok(())
    }

    /// Receives the oldest outstanding read's bytes.
    pub(super) fn recv_read(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        self.sock.read_exact(buf).context("raw baseline read")?;
        Ok(())
    }

    /// Sends a write of `data` at `offset` (request and payload in one `writev`).
    pub(super) fn send_write(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        let req = request(OP_WRITE, offset, data.len())?;
        let mut slices = [IoSlice::new(&req), IoSlice::new(data)];
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            match self.sock.write_vectored(slices) {
                Ok(0) => bail!("raw baseline connection closed"),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Receives the oldest outstanding write's acknowledgement.
    pub(super) fn recv_ack(&mut self) -> anyhow::Result<()> {
        let mut a = [0u8; ACK.len()];
        self.sock.read_exact(&mut a).context("raw baseline write")?;
        if a != ACK {
            bail!("raw baseline: bad acknowledgement {a:?}");
        }
        Ok(())
    }
}

/// The baseline server in a child process (`remora bench net --serve-raw`),
/// to see what the process boundary alone costs. The child exits when its
/// standard input closes, i.e. when this handle is dropped or this process dies.
pub(super) struct RawChild {
    child: Child,
    addr: SocketAddr,
}

/// The line a `--serve-raw` child prints once it listens.
const READY: &str = "raw baseline listening on ";

impl RawChild {
    /// Starts `binary bench net --serve-raw --region-size <region>` and waits for its address.
    pub(super) fn spawn(binary: &Path, region: u64) -> anyhow::Result<Self> {
        let mut child = Command::new(binary)
            .args(["bench", "net", "--serve-raw", "--region-size", &region.to_string()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} bench net --serve-raw", binary.display()))?;
        let mut line = String::new();
        let read = child.stdout.take().map(|out| BufReader::new(out).read_line(&mut line));
        let addr = match (read, line.trim().strip_prefix(READY).map(str::parse::<SocketAddr>)) {
            (Some(Ok(_)), Some(Ok(a))) => a,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the raw baseline child did not report its address (got {line:?})");
            }
        };
        Ok(Self { child, addr })
    }

    /// Where it listens.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process id.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RawChild {
    fn drop(&mut self) {
        // Closing its stdin asks it to exit; kill in case it does not.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of a `--serve-raw` child: serve `store`, announce the address on
/// stdout, exit when stdin closes.
pub(super) fn serve_until_stdin_closes(store: Vec<u8>) -> anyhow::Result<()> {
    let server = RawServer::start(store, None).context("starting the raw TCP baseline")?;
    let mut out = io::stdout();
    writeln!(out, "{READY}{}", server.addr())?;
    out.flush()?;
    let mut buf = [0u8; 64];
    let mut stdin = io::stdin();
    while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
    drop(server);
    Ok(())
}
