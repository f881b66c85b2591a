//! The TCP data path: one thread per connection reads request frames and
//! answers them in order through the node's [`Service`]. A malformed frame
//! closes that connection only.
//!
//! Reads are copied out of region memory under the region's lock and sent
//! after it is released; writes are read off the socket into a buffer and
//! copied in under the lock. No lock is held across socket I/O, so a peer
//! that stops reading its replies (or sending its payload) holds up only
//! its own connection: the region's other readers and writers go on. Each
//! connection thus holds at most one request's payload or reply at a time
//! (up to the frame limit).

use remora_proto::Stream;
use std::sync::Arc;

use remora_proto::frame::{FrameKind, FrameReader, ReadError};
use remora_proto::msg::{Fault, MemRequest, MemResponse, NodeLoad, decode};
use remora_proto::server::{ConnGuard, Responder};
use remora_proto::{MemTransport, RemoteError};

use crate::Shared;
use crate::service::{ConnError, Env, Service, Wire};

/// Bytes read ahead when looking for the next request header.
const REQUEST_PREFETCH: usize = 1024;

/// Serves one connection until it closes or misbehaves.
pub(crate) fn handle(shared: &Arc<Shared>, sock: Stream, guard: ConnGuard) {
    let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    // A request must arrive whole, and its reply leave, within the
    // deadline; between requests a connection may idle.
    let deadline = guard.request_deadline();
    let responder = match sock.try_clone().and_then(|s| Responder::new(s, deadline)) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("connection from {peer}: {e}");
            return;
        }
    };
    let mut rd = FrameReader::new(sock, deadline);
    let service = shared.service(Daemon { shared, guard: &guard });
    match serve(&service, &mut rd, &responder, &shared.faults) {
        Ok(()) => tracing::debug!("connection from {peer} closed"),
        Err(e) => tracing::warn!("closing connection from {peer}: {e}"),
    }
}

fn serve(
    service: &Service<'_, Daemon<'_>>,
    rd: &mut FrameReader,
    out: &Responder,
    faults: &crate::fault::Faults,
) -> Result<(), ConnError> {
    loop {
        // Requests have small heads; bounding the read keeps a write's
        // payload in the socket until it can go straight into the region.
        let hdr = match rd.next_header_within(REQUEST_PREFETCH) {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(ReadError::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if hdr.kind != FrameKind::Request {
            return Err(ConnError::Protocol(format!("expected a request, got {:?}", hdr.kind)));
        }
        let head = rd.read_vec(hdr.head_len as usize)?;
        let req: MemRequest = decode(&head).map_err(|e| ConnError::Protocol(e.to_string()))?;
        let mut wire = Tcp {
            rd: &mut *rd,
            out: Some(out),
            faults,
            id: hdr.id,
            payload_len: hdr.payload_len as usize,
            unread: hdr.payload_len as usize,
        };
        service.handle(&mut wire, &req)?;
    }
}

/// One request on a TCP connection: its payload is still in the socket.
struct Tcp<'a> {
    rd: &'a mut FrameReader,
    /// `None` once an injected fault said to drop the reply.
    out: Option<&'a Responder>,
    faults: &'a crate::fault::Faults,
    id: u64,
    payload_len: usize,
    /// Payload bytes still in the socket.
    unread: usize,
}

impl Wire for Tcp<'_> {
    fn payload_len(&self) -> usize {
        self.payload_len
    }

    fn read_payload(&mut self, dst: &mut [u8]) -> Result<(), ConnError> {
        if dst.len() > self.unread {
            return Err(ConnError::Protocol("payload shorter than the request says".into()));
        }
        self.rd.read_exact_into(dst)?;
        self.unread -= dst.len();
        Ok(())
    }

    fn with_payload<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<R, ConnError> {
        let payload = self.rd.read_vec(self.unread)?;
        self.unread = 0;
        Ok(f(&payload))
    }

    fn skip_payload(&mut self) -> Result<(), ConnError> {
        self.rd.skip(self.unread)?;
        self.unread = 0;
        Ok(())
    }

    fn before_data(&mut self, req: &MemRequest) {
        if !self.faults.before_data() {
            if matches!(req, MemRequest::Write { .. } | MemRequest::WriteV { .. }) {
                self.faults.unanswered_write();
            }
            self.out = None;
        }
    }

    fn ok(&mut self, resp: MemResponse, payload: &[&[u8]]) -> Result<bool, ConnError> {
        match self.out {
            Some(o) => {
                o.ok(self.id, &resp, payload)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn err(&mut self, e: &RemoteError) -> Result<(), ConnError> {
        if let Some(o) = self.out {
            o.err(self.id, e)?;
        }
        Ok(())
    }
}

/// The daemon's side of a connection: peers over TCP, the measured CPU
/// load, and the fault switches a `Fault` request flips.
pub(crate) struct Daemon<'a> {
    shared: &'a Shared,
    /// This connection, which `DropConnections` spares so its reply arrives.
    guard: &'a ConnGuard,
}

impl Env for Daemon<'_> {
    fn peer(&self, addr: &str) -> Result<Arc<dyn MemTransport>, RemoteError> {
        crate::rebuild::tcp_peer(self.shared, addr)
    }

    fn load(&self) -> NodeLoad {
        self.shared.cpu.load()
    }

    fn unanswered_writes(&self) -> u64 {
        self.shared.faults.unanswered_writes()
    }

    #[cfg(feature = "fault-injection")]
    fn fault(&self, fault: Fault) -> Result<(), RemoteError> {
        let f = &self.shared.faults;
        tracing::warn!("fault injection: {fault:?}");
        match fault {
            Fault::Pause => f.set_paused(true),
            Fault::Resume => f.clear(),
            Fault::Busy { threads, millis } => f.busy(threads, millis)?,
            Fault::Delay { micros } => f.set_delay(micros),
            Fault::DropReplies => f.set_drop_replies(true),
            Fault::DropConnections => {
                let conns = self.shared.conns.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(c) = conns {
                    c.close_all(Some(self.guard.id()));
                }
            }
            Fault::Corrupt { region, offset, len } => {
                let r = self.shared.regions.get(region)?;
                let mut g = r.write();
                let end = offset
                    .checked_add(len as u64)
                    .filter(|&e| e <= g.mem.len() as u64)
                    .ok_or(RemoteError::OutOfBounds {
                        region,
                        offset,
                        len: len as u64,
                        size: g.mem.len() as u64,
                    })?;
                for b in &mut g.mem[offset as usize..end as usize] {
                    *b = !*b;
                }
            }
        }
        Ok(())
    }

    #[cfg(not(feature = "fault-injection"))]
    fn fault(&self, _fault: Fault) -> Result<(), RemoteError> {
        let _ = self.guard;
        Err(RemoteError::Unsupported(
            "fault injection (build with the fault-injection feature)".into(),
        ))
    }
}
