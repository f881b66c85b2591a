//! The data path: one thread per connection reads request frames and answers
//! them in order. A malformed frame closes that connection only.
//!
//! Reads are written to the socket straight from region memory and writes
//! are read from the socket straight into it (no intermediate copy), under
//! the region's lock. Only the region's owner (or its delegates) can hold that
//! lock through a capability, so a slow client can only delay itself.

use remora_proto::Stream;
use std::sync::Arc;
use std::time::Duration;

use remora_proto::frame::{FrameKind, FrameReader, MAX_PAYLOAD_LEN, ReadError, write_frame};
use remora_proto::msg::{Fault, MemRequest, MemResponse, Range, decode, encode};
use remora_proto::server::{ConnGuard, Responder};
use remora_proto::{AdminKey, MemTransport, RemoteError};

use crate::txn::TxnCtx;

use crate::Shared;

const STALL_LIMIT: Duration = Duration::from_secs(30);
/// Bytes read ahead when looking for the next request header.
const REQUEST_PREFETCH: usize = 1024;

/// Serves one connection until it closes or misbehaves.
pub(crate) fn handle(shared: &Arc<Shared>, sock: Stream, guard: ConnGuard) {
    let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let responder = match sock.try_clone().and_then(|s| Responder::new(s, STALL_LIMIT)) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("connection from {peer}: {e}");
            return;
        }
    };
    let mut rd = FrameReader::new(sock, STALL_LIMIT);
    let mut conn = Conn {
        shared,
        rd: &mut rd,
        out: &responder,
        guard: &guard,
    };
    match conn.serve() {
        Ok(()) => tracing::debug!("connection from {peer} closed"),
        Err(e) => tracing::warn!("closing connection from {peer}: {e}"),
    }
}

struct Conn<'a> {
    shared: &'a Shared,
    rd: &'a mut FrameReader,
    out: &'a Responder,
    guard: &'a ConnGuard,
}

/// What ends a connection.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(String),
}

impl<'a> Conn<'a> {
    fn serve(&mut self) -> Result<(), ConnError> {
        loop {
            // Requests have small heads; bounding the read keeps a write's
            // payload in the socket until it can go straight into the region.
            let hdr = match self.rd.next_header_within(REQUEST_PREFETCH) {
                Ok(Some(h)) => h,
                Ok(None) => continue,
                Err(ReadError::Closed) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            if hdr.kind != FrameKind::Request {
                return Err(ConnError::Protocol(format!("expected a request, got {:?}", hdr.kind)));
            }
            let head = self.rd.read_vec(hdr.head_len as usize)?;
            let req: MemRequest = decode(&head).map_err(|e| ConnError::Protocol(e.to_string()))?;
            self.dispatch(hdr.id, req, hdr.payload_len as usize)?;
        }
    }

    fn dispatch(&mut self, id: u64, req: MemRequest, payload_len: usize) -> Result<(), ConnError> {
        let is_data = matches!(
            req,
            MemRequest::Read { .. }
                | MemRequest::Write { .. }
                | MemRequest::ReadV { .. }
                | MemRequest::WriteV { .. }
                | MemRequest::Prepare { .. }
                | MemRequest::PrepareMany { .. }
                | MemRequest::Commit { .. }
                | MemRequest::Abort { .. }
                | MemRequest::ReadMember { .. }
                | MemRequest::Load
        );
        let takes_payload = matches!(
            req,
            MemRequest::Write { .. }
                | MemRequest::WriteV { .. }
                | MemRequest::Prepare { .. }
                | MemRequest::PrepareMany { .. }
                | MemRequest::Read { .. }
                | MemRequest::ReadV { .. }
        );
        if !takes_payload && payload_len != 0 {
            return Err(ConnError::Protocol("payload on a request that takes none".into()));
        }
        let send_reply = if is_data {
            self.shared.faults.before_data()
        } else {
            true
        };
        if !send_reply && matches!(req, MemRequest::Write { .. } | MemRequest::WriteV { .. }) {
            self.shared.faults.unanswered_write();
        }
        let out = if send_reply { Some(self.out) } else { None };
        // Checked after any injected pause: a node that was stopped comes
        // back with its lease lapsed and must not answer from data the
        // manager may have handed elsewhere meanwhile.
        if (is_data || matches!(req, MemRequest::Rebuild { .. })) && !self.shared.lease.valid() {
            self.rd.skip(payload_len)?;
            return reply_err(out, id, &RemoteError::Unavailable);
        }
        match req {
            MemRequest::Read { cap, offset, len } => {
                if payload_len != 0 {
                    return Err(ConnError::Protocol("payload on a read".into()));
                }
                let region = match self.shared.regions.get(cap.region) {
                    Ok(r) => r,
                    Err(e) => return reply_err(out, id, &e),
                };
                let g = region.read();
                match g.check(&region, &cap, false, offset, len as u64) {
                    Ok(range) => {
                        if let Some(o) = out {
                            let head = encode(&MemResponse::Data);
                            o.with_socket(|s| write_frame(s, FrameKind::Response, id, &head, &[&g.mem[range]]))?;
                            self.shared.peer.served_read(cap.rights, len as u64);
                        }
                        Ok(())
                    }
                    Err(e) => {
                        drop(g);
                        reply_err(out, id, &e)
                    }
                }
            }
            MemRequest::Write { cap, offset } => {
                let region = match self.shared.regions.get(cap.region) {
                    Ok(r) => r,
                    Err(e) => {
                        self.rd.skip(payload_len)?;
                        return reply_err(out, id, &e);
                    }
                };
                let mut g = region.write();
                match g.check(&region, &cap, true, offset, payload_len as u64) {
                    Ok(range) => {
                        // Read the payload straight into region memory while locked.
                        self.rd.read_exact_into(&mut g.mem[range.clone()])?;
                        g.wrote(&range);
                        drop(g);
                        reply_ok(out, id, MemResponse::Written)
                    }
                    Err(e) => {
                        drop(g);
                        self.rd.skip(payload_len)?;
                        reply_err(out, id, &e)
                    }
                }
            }
            MemRequest::ReadV { ranges } => {
                if payload_len != 0 {
                    return Err(ConnError::Protocol("payload on a read".into()));
                }
                if let Some(first) = ranges
                    .first()
                    .filter(|f| ranges.iter().all(|r| r.cap.region == f.cap.region))
                {
                    // One region (the common case: a peer reading a shard's
                    // rows): send straight from region memory under one lock.
                    let region = match self.shared.regions.get(first.cap.region) {
                        Ok(r) => r,
                        Err(e) => return reply_err(out, id, &e),
                    };
                    let g = region.read();
                    let total: u64 = ranges.iter().map(|r| r.len as u64).sum();
                    let checked: Result<Vec<std::ops::Range<usize>>, RemoteError> = if total > MAX_PAYLOAD_LEN as u64 {
                        Err(RemoteError::BadRequest("vectored read exceeds the frame limit".into()))
                    } else {
                        ranges
                            .iter()
                            .map(|r| g.check(&region, &r.cap, false, r.offset, r.len as u64))
                            .collect()
                    };
                    match checked {
                        Ok(rs) => {
                            if let Some(o) = out {
                                let head = encode(&MemResponse::Data);
                                let slices: Vec<&[u8]> = rs.into_iter().map(|r| &g.mem[r]).collect();
                                o.with_socket(|s| write_frame(s, FrameKind::Response, id, &head, &slices))?;
                                self.shared.peer.served_read(first.cap.rights, total);
                            }
                            Ok(())
                        }
                        Err(e) => {
                            drop(g);
                            reply_err(out, id, &e)
                        }
                    }
                } else {
                    match self.gather(&ranges) {
                        Ok(buf) => {
                            if let Some(o) = out {
                                o.ok(id, &MemResponse::Data, &[&buf])?;
                                self.shared.peer.served_read_v(&ranges, buf.len() as u64);
                            }
                            Ok(())
                        }
                        Err(e) => reply_err(out, id, &e),
                    }
                }
            }
            MemRequest::WriteV { ranges } => self.scatter(id, &ranges, payload_len, out),
            MemRequest::Ping => reply_ok(out, id, MemResponse::Pong),
            MemRequest::Load => reply_ok(out, id, MemResponse::Load(self.shared.cpu.load())),
            MemRequest::Rebuild {
                cap,
                k,
                m,
                want,
                sources,
                rows,
            } => match crate::rebuild::rebuild(
                &self.shared.regions,
                &|addr| crate::rebuild::tcp_peer(self.shared, addr),
                cap,
                k,
                m,
                want,
                &sources,
                &rows,
            ) {
                Ok((bytes, checksums)) => reply_ok(out, id, MemResponse::Rebuilt { bytes, checksums }),
                Err(e) => reply_err(out, id, &e),
            },
            MemRequest::Grant {
                admin,
                region,
                owner,
                token,
                epoch,
            } => {
                let r = self
                    .admin(admin)
                    .and_then(|()| self.shared.regions.grant(region, owner, token, epoch));
                match r {
                    Ok(()) => {
                        tracing::debug!("granted {region} to {owner} in epoch {epoch}");
                        reply_ok(out, id, MemResponse::Done)
                    }
                    Err(e) => reply_err(out, id, &e),
                }
            }
            MemRequest::Stats => {
                let stats = remora_proto::MemNodeStats {
                    unanswered_writes: self.shared.faults.unanswered_writes(),
                    deltas_in_flight: self.shared.peer.deltas_in_flight(),
                    peer: self.shared.peer.snapshot(),
                    ..self.shared.regions.stats()
                };
                reply_ok(out, id, MemResponse::Stats(stats))
            }
            MemRequest::Revoke { admin, region, epoch } => {
                let r = self
                    .admin(admin)
                    .and_then(|()| self.shared.regions.revoke(region, epoch));
                match r {
                    Ok(owner) => {
                        match owner {
                            Some(owner) => tracing::debug!("revoked {region} from {owner}"),
                            None => tracing::debug!("revoke of unowned {region}"),
                        }
                        reply_ok(out, id, MemResponse::Done)
                    }
                    Err(e) => reply_err(out, id, &e),
                }
            }
            MemRequest::Prepare { txn, op } => {
                let payload = self.rd.read_vec(payload_len)?;
                match self.txn_ctx().prepare(txn, &op, &payload) {
                    Ok(Some(delta)) => {
                        if let Some(o) = out {
                            o.ok(id, &MemResponse::Prepared, &[&delta])?;
                        }
                        Ok(())
                    }
                    Ok(None) => reply_ok(out, id, MemResponse::Prepared),
                    Err(e) => reply_err(out, id, &e),
                }
            }
            MemRequest::PrepareMany { txn, ops } => {
                let payload = self.rd.read_vec(payload_len)?;
                match self.txn_ctx().prepare_many(txn, &ops, &payload) {
                    Ok(deltas) => {
                        if let Some(o) = out {
                            o.ok(id, &MemResponse::Prepared, &[&deltas])?;
                        }
                        Ok(())
                    }
                    Err(e) => reply_err(out, id, &e),
                }
            }
            MemRequest::Commit { cap, txn } => match self.txn_ctx().commit(&cap, txn) {
                Ok(()) => reply_ok(out, id, MemResponse::Committed),
                Err(e) => reply_err(out, id, &e),
            },
            MemRequest::Abort { cap, txn } => match self.txn_ctx().abort(&cap, txn) {
                Ok(()) => reply_ok(out, id, MemResponse::Aborted),
                Err(e) => reply_err(out, id, &e),
            },
            MemRequest::ReadMember { cap, offset, len } => match self.txn_ctx().read_member(&cap, offset, len) {
                Ok((generation, bytes)) => {
                    if let Some(o) = out {
                        o.ok(id, &MemResponse::Member { generation }, &[&bytes])?;
                        self.shared.peer.served_read(cap.rights, u64::from(len));
                    }
                    Ok(())
                }
                Err(e) => reply_err(out, id, &e),
            },
            MemRequest::Fault { admin, fault } => match self.admin(admin).and_then(|()| self.fault(fault)) {
                Ok(()) => reply_ok(out, id, MemResponse::Done),
                Err(e) => reply_err(out, id, &e),
            },
        }
    }

    /// What a transaction request works with; peers are reached over TCP.
    fn txn_ctx(&self) -> TxnCtx<'a, impl Fn(&str) -> Result<Arc<dyn MemTransport>, RemoteError> + 'a> {
        let shared: &'a Shared = self.shared;
        TxnCtx {
            regions: &shared.regions,
            peer: move |addr: &str| crate::rebuild::tcp_peer(shared, addr),
            counters: &shared.peer,
        }
    }

    fn admin(&self, key: AdminKey) -> Result<(), RemoteError> {
        if key.ct_eq(&self.shared.admin) {
            Ok(())
        } else {
            Err(RemoteError::Unauthorized)
        }
    }

    /// Copies several ranges into one buffer, one region lock at a time (so
    /// two vectored requests can never deadlock on each other's locks).
    fn gather(&self, ranges: &[Range]) -> Result<Vec<u8>, RemoteError> {
        let total: u64 = ranges.iter().map(|r| r.len as u64).sum();
        if total > MAX_PAYLOAD_LEN as u64 {
            return Err(RemoteError::BadRequest("vectored read exceeds the frame limit".into()));
        }
        let mut buf = Vec::with_capacity(total as usize);
        for r in ranges {
            let region = self.shared.regions.get(r.cap.region)?;
            let g = region.read();
            let range = g.check(&region, &r.cap, false, r.offset, r.len as u64)?;
            buf.extend_from_slice(&g.mem[range]);
        }
        Ok(buf)
    }

    /// Checks every range first, then reads each part of the payload into place.
    fn scatter(
        &mut self,
        id: u64,
        ranges: &[Range],
        payload_len: usize,
        out: Option<&Responder>,
    ) -> Result<(), ConnError> {
        let total: u64 = ranges.iter().map(|r| r.len as u64).sum();
        let check = || -> Result<(), RemoteError> {
            if total != payload_len as u64 {
                return Err(RemoteError::BadRequest(format!(
                    "ranges total {total} bytes but the payload has {payload_len}"
                )));
            }
            for r in ranges {
                let region = self.shared.regions.get(r.cap.region)?;
                region.read().check(&region, &r.cap, true, r.offset, r.len as u64)?;
            }
            Ok(())
        };
        if let Err(e) = check() {
            self.rd.skip(payload_len)?;
            return reply_err(out, id, &e);
        }
        for r in ranges {
            let region = match self.shared.regions.get(r.cap.region) {
                Ok(reg) => reg,
                Err(e) => return Err(ConnError::Protocol(e.to_string())),
            };
            let mut g = region.write();
            // Re-checked under the write lock: a revoke may have raced the first pass.
            match g.check(&region, &r.cap, true, r.offset, r.len as u64) {
                Ok(range) => {
                    self.rd.read_exact_into(&mut g.mem[range.clone()])?;
                    g.wrote(&range);
                }
                Err(e) => {
                    return Err(ConnError::Protocol(format!(
                        "region changed during a vectored write: {e}"
                    )));
                }
            }
        }
        reply_ok(out, id, MemResponse::Written)
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

fn reply_ok(out: Option<&Responder>, id: u64, r: MemResponse) -> Result<(), ConnError> {
    if let Some(o) = out {
        o.ok(id, &r, &[])?;
    }
    Ok(())
}

fn reply_err(out: Option<&Responder>, id: u64, e: &RemoteError) -> Result<(), ConnError> {
    if let Some(o) = out {
        o.err(id, e)?;
    }
    Ok(())
}
