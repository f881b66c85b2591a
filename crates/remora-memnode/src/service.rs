//! The memory node's request handling, once: the lease, capability and
//! admin checks and every request kind. The TCP daemon (`serve`) and the
//! in-process node (`in_process`) both answer through [`Service::handle`],
//! so what a test proves against the in-process node holds for the daemon.
//! They differ only in how a request's payload arrives and its reply leaves
//! ([`Wire`]) and in what the node lives in ([`Env`]: how it reaches its
//! peers, what load it reports, which injected faults it takes).

use std::sync::Arc;

use remora_proto::frame::{MAX_PAYLOAD_LEN, ReadError};
use remora_proto::msg::{Fault, MAX_PREPARE_MANY, MemRequest, MemResponse, NodeLoad, Range};
use remora_proto::{AdminKey, MemTransport, RemoteError, TxnOp};

use crate::lease::Lease;
use crate::peer_traffic::PeerCounters;
use crate::region::RegionTable;
use crate::txn::TxnCtx;

/// What ends a connection: the daemon closes it, an in-process connection
/// breaks. Refusals of well-formed requests are replies, not these.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(String),
}

/// How one request's payload arrives and its reply leaves: the daemon's
/// socket, or an in-process caller's buffers. No region lock is held while
/// either is used (payloads and replies are staged in buffers), so a peer
/// that stops reading or writing holds up only its own connection.
pub(crate) trait Wire {
    /// The length of the payload the request came with.
    fn payload_len(&self) -> usize;
    /// Fills `dst` with the payload's next bytes.
    fn read_payload(&mut self, dst: &mut [u8]) -> Result<(), ConnError>;
    /// Runs `f` on the rest of the payload, whole (transactions stage from
    /// all of it at once).
    fn with_payload<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<R, ConnError>;
    /// Discards the rest of the payload (a refused request's).
    fn skip_payload(&mut self) -> Result<(), ConnError>;
    /// Called before a data request is served, after its framing is
    /// checked and before the lease is: an injected pause ends with the
    /// lease lapsed, and the request must then see that.
    fn before_data(&mut self, req: &MemRequest);
    /// Sends a successful reply. Returns whether it was sent: a reply an
    /// injected fault dropped did not serve anyone, so it is not counted.
    fn ok(&mut self, resp: MemResponse, payload: &[&[u8]]) -> Result<bool, ConnError>;
    /// Sends a refusal.
    fn err(&mut self, e: &RemoteError) -> Result<(), ConnError>;
}

/// What differs with where the node runs: the daemon's process, or an
/// in-process cluster that stands in for the manager.
pub(crate) trait Env {
    /// A connection to peer `addr` (rebuild sources, parity-delta targets).
    fn peer(&self, addr: &str) -> Result<Arc<dyn MemTransport>, RemoteError>;
    /// What `Load` answers.
    fn load(&self) -> NodeLoad;
    /// Writes whose reply an injected fault dropped, for `Stats`.
    fn unanswered_writes(&self) -> u64;
    /// Carries out an injected fault; the admin key is already checked.
    fn fault(&self, fault: Fault) -> Result<(), RemoteError>;
}

/// One memory node's request handling.
pub(crate) struct Service<'a, E> {
    pub(crate) regions: &'a RegionTable,
    /// Data is served only while it is valid.
    pub(crate) lease: &'a Lease,
    /// What grants, revokes and faults must present.
    pub(crate) admin: &'a AdminKey,
    pub(crate) peer: &'a PeerCounters,
    pub(crate) env: E,
}

/// Requests on region data, and `Load` (so that a paused node does not
/// answer it): they pass the data path's injected faults and are served
/// only under a valid lease.
fn is_data(req: &MemRequest) -> bool {
    matches!(
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
    )
}

fn takes_payload(req: &MemRequest) -> bool {
    matches!(
        req,
        MemRequest::Write { .. }
            | MemRequest::WriteV { .. }
            | MemRequest::Prepare { .. }
            | MemRequest::PrepareMany { .. }
            | MemRequest::Read { .. }
            | MemRequest::ReadV { .. }
    )
}

fn payload_on_a_read() -> ConnError {
    ConnError::Protocol("payload on a read".into())
}

impl<E: Env> Service<'_, E> {
    /// Answers `req`. An error means the connection must end (a malformed
    /// request, or the wire failed); every refusal is a reply.
    pub(crate) fn handle(&self, w: &mut impl Wire, req: &MemRequest) -> Result<(), ConnError> {
        let data = is_data(req);
        if !takes_payload(req) && w.payload_len() != 0 {
            return Err(ConnError::Protocol("payload on a request that takes none".into()));
        }
        if data {
            w.before_data(req);
        }
        // A node whose lease lapsed (paused, partitioned, fenced) must not
        // answer from data the manager may have handed elsewhere meanwhile.
        if (data || matches!(req, MemRequest::Rebuild { .. })) && !self.lease.valid() {
            w.skip_payload()?;
            return w.err(&RemoteError::Unavailable);
        }
        match req {
            MemRequest::Read { cap, offset, len } => {
                if w.payload_len() != 0 {
                    return Err(payload_on_a_read());
                }
                let range = Range {
                    cap: *cap,
                    offset: *offset,
                    len: *len,
                };
                match self.gather(std::slice::from_ref(&range)) {
                    Ok(buf) => {
                        if w.ok(MemResponse::Data, &[&buf])? {
                            self.peer.served_read(cap.rights, u64::from(*len));
                        }
                        Ok(())
                    }
                    Err(e) => w.err(&e),
                }
            }
            MemRequest::Write { cap, offset } => {
                let range = Range {
                    cap: *cap,
                    offset: *offset,
                    len: u32::try_from(w.payload_len()).unwrap_or(u32::MAX),
                };
                self.scatter(w, std::slice::from_ref(&range))
            }
            MemRequest::ReadV { ranges } => {
                if w.payload_len() != 0 {
                    return Err(payload_on_a_read());
                }
                self.read_v(w, ranges)
            }
            MemRequest::WriteV { ranges } => self.scatter(w, ranges),
            MemRequest::Ping => w.ok(MemResponse::Pong, &[]).map(drop),
            MemRequest::Load => w.ok(MemResponse::Load(self.env.load()), &[]).map(drop),
            MemRequest::Rebuild {
                cap,
                k,
                m,
                want,
                sources,
                rows,
            } => match crate::rebuild::rebuild(
                self.regions,
                &|addr| self.env.peer(addr),
                *cap,
                *k,
                *m,
                *want,
                sources,
                rows,
            ) {
                Ok((bytes, checksums)) => w.ok(MemResponse::Rebuilt { bytes, checksums }, &[]).map(drop),
                Err(e) => w.err(&e),
            },
            MemRequest::Grant {
                admin,
                region,
                owner,
                token,
                epoch,
            } => {
                let r = self
                    .check_admin(admin)
                    .and_then(|()| self.regions.grant(*region, *owner, *token, *epoch));
                match r {
                    Ok(()) => {
                        tracing::debug!("granted {region} to {owner} in epoch {epoch}");
                        w.ok(MemResponse::Done, &[]).map(drop)
                    }
                    Err(e) => w.err(&e),
                }
            }
            MemRequest::Revoke { admin, region, epoch } => {
                let r = self
                    .check_admin(admin)
                    .and_then(|()| self.regions.revoke(*region, *epoch));
                match r {
                    Ok(owner) => {
                        match owner {
                            Some(owner) => tracing::debug!("revoked {region} from {owner}"),
                            None => tracing::debug!("revoke of unowned {region}"),
                        }
                        w.ok(MemResponse::Done, &[]).map(drop)
                    }
                    Err(e) => w.err(&e),
                }
            }
            MemRequest::Stats => {
                let stats = remora_proto::MemNodeStats {
                    unanswered_writes: self.env.unanswered_writes(),
                    deltas_in_flight: self.peer.deltas_in_flight(),
                    peer: self.peer.snapshot(),
                    ..self.regions.stats()
                };
                w.ok(MemResponse::Stats(stats), &[]).map(drop)
            }
            MemRequest::Prepare { txn, op } => {
                if let Err(e) = self.check_txn(std::slice::from_ref(op), w.payload_len()) {
                    w.skip_payload()?;
                    return w.err(&e);
                }
                match w.with_payload(|p| self.txn_ctx().prepare(*txn, op, p))? {
                    Ok(Some(delta)) => w.ok(MemResponse::Prepared, &[&delta]).map(drop),
                    Ok(None) => w.ok(MemResponse::Prepared, &[]).map(drop),
                    Err(e) => w.err(&e),
                }
            }
            MemRequest::PrepareMany { txn, ops } => {
                if let Err(e) = self.check_txn(ops, w.payload_len()) {
                    w.skip_payload()?;
                    return w.err(&e);
                }
                match w.with_payload(|p| self.txn_ctx().prepare_many(*txn, ops, p))? {
                    Ok(deltas) => w.ok(MemResponse::Prepared, &[&deltas]).map(drop),
                    Err(e) => w.err(&e),
                }
            }
            MemRequest::Commit { cap, txn } => match self.txn_ctx().commit(cap, *txn) {
                Ok(()) => w.ok(MemResponse::Committed, &[]).map(drop),
                Err(e) => w.err(&e),
            },
            MemRequest::Abort { cap, txn } => match self.txn_ctx().abort(cap, *txn) {
                Ok(()) => w.ok(MemResponse::Aborted, &[]).map(drop),
                Err(e) => w.err(&e),
            },
            MemRequest::ReadMember { cap, offset, len } => match self.txn_ctx().read_member(cap, *offset, *len) {
                Ok((generation, bytes)) => {
                    if w.ok(MemResponse::Member { generation }, &[&bytes])? {
                        self.peer.served_read(cap.rights, u64::from(*len));
                    }
                    Ok(())
                }
                Err(e) => w.err(&e),
            },
            MemRequest::Fault { admin, fault } => {
                match self.check_admin(admin).and_then(|()| self.env.fault(fault.clone())) {
                    Ok(()) => w.ok(MemResponse::Done, &[]).map(drop),
                    Err(e) => w.err(&e),
                }
            }
        }
    }

    /// What a transaction request works with.
    fn txn_ctx(&self) -> TxnCtx<'_, impl Fn(&str) -> Result<Arc<dyn MemTransport>, RemoteError> + '_> {
        TxnCtx {
            regions: self.regions,
            peer: move |addr: &str| self.env.peer(addr),
            counters: self.peer,
        }
    }

    fn check_admin(&self, key: &AdminKey) -> Result<(), RemoteError> {
        if key.ct_eq(self.admin) {
            Ok(())
        } else {
            Err(RemoteError::Unauthorized)
        }
    }

    /// A transaction's ops checked before their payload is read (so a
    /// request no capability opens never has its payload held in memory):
    /// as many ops as one request may carry, the bytes they carry adding up
    /// to the payload, and every member they stage one its capability opens,
    /// within its region. Staging checks each again under the region's lock.
    fn check_txn(&self, ops: &[TxnOp], payload_len: usize) -> Result<(), RemoteError> {
        if ops.is_empty() || ops.len() > MAX_PREPARE_MANY {
            return Err(RemoteError::BadRequest(format!(
                "{} ops in one request (1 to {MAX_PREPARE_MANY})",
                ops.len()
            )));
        }
        let carried: u64 = ops.iter().map(|op| u64::from(crate::txn::carried(op))).sum();
        if carried != payload_len as u64 {
            return Err(RemoteError::BadRequest(format!(
                "ops carrying {carried} bytes with a payload of {payload_len}"
            )));
        }
        for op in ops {
            let (to, apply) = match op {
                TxnOp::Apply { to } => (to, true),
                TxnOp::Put { to, .. } | TxnOp::Move { to, .. } => (to, false),
            };
            let region = self.regions.get(to.cap.region)?;
            let g = region.read();
            if apply {
                g.check_apply(&region, &to.cap, to.offset, u64::from(to.len))?;
            } else {
                g.check(&region, &to.cap, true, to.offset, u64::from(to.len))?;
            }
        }
        Ok(())
    }

    fn read_v(&self, w: &mut impl Wire, ranges: &[Range]) -> Result<(), ConnError> {
        match self.gather(ranges) {
            Ok(buf) => {
                if w.ok(MemResponse::Data, &[&buf])? {
                    self.peer.served_read_v(ranges, buf.len() as u64);
                }
                Ok(())
            }
            Err(e) => w.err(&e),
        }
    }

    /// Copies the ranges into one buffer, each run of ranges in one region
    /// under one lock (a consistent view of it), one region at a time (so
    /// two vectored requests can never deadlock on each other's locks).
    /// The reply is sent from the copy, with no lock held: a reader that
    /// stops reading stalls its own connection, not the region's writers.
    ///
    /// Every range's bounds and capability are checked before the reply's
    /// buffer is reserved, so a request no capability opens costs nothing.
    fn gather(&self, ranges: &[Range]) -> Result<Vec<u8>, RemoteError> {
        let total: u64 = ranges.iter().map(|r| u64::from(r.len)).sum();
        if total > u64::from(MAX_PAYLOAD_LEN) {
            return Err(RemoteError::BadRequest("vectored read exceeds the frame limit".into()));
        }
        for r in ranges {
            let region = self.regions.get(r.cap.region)?;
            region
                .read()
                .check(&region, &r.cap, false, r.offset, u64::from(r.len))?;
        }
        let mut buf = Vec::with_capacity(total as usize);
        for run in ranges.chunk_by(|a, b| a.cap.region == b.cap.region) {
            let region = self.regions.get(run[0].cap.region)?;
            let g = region.read();
            for r in run {
                let range = g.check(&region, &r.cap, false, r.offset, u64::from(r.len))?;
                buf.extend_from_slice(&g.mem[range]);
            }
        }
        Ok(buf)
    }

    /// Checks every range (before any of the payload is read), reads the
    /// payload into a buffer with no lock held, then copies each part into
    /// place under its region's lock: a writer that stalls mid-payload
    /// stalls its own connection, not the region's other users.
    fn scatter(&self, w: &mut impl Wire, ranges: &[Range]) -> Result<(), ConnError> {
        let payload_len = w.payload_len();
        let total: u64 = ranges.iter().map(|r| u64::from(r.len)).sum();
        let check = || -> Result<(), RemoteError> {
            if total != payload_len as u64 {
                return Err(RemoteError::BadRequest(format!(
                    "ranges total {total} bytes but the payload has {payload_len}"
                )));
            }
            for r in ranges {
                let region = self.regions.get(r.cap.region)?;
                region.read().check(&region, &r.cap, true, r.offset, u64::from(r.len))?;
            }
            Ok(())
        };
        if let Err(e) = check() {
            w.skip_payload()?;
            return w.err(&e);
        }
        let mut payload = vec![0u8; payload_len];
        w.read_payload(&mut payload)?;
        // Re-checked under each write lock: a revoke may have raced the
        // first pass (or the payload's arrival). A refusal before anything
        // was copied is an honest reply; after part of it, there is none,
        // and the connection ends.
        let mut rest = payload.as_slice();
        for (i, r) in ranges.iter().enumerate() {
            let (part, tail) = rest.split_at(r.len as usize);
            rest = tail;
            let placed = self.regions.get(r.cap.region).and_then(|region| {
                let mut g = region.write();
                let range = g.check(&region, &r.cap, true, r.offset, u64::from(r.len))?;
                g.mem[range.clone()].copy_from_slice(part);
                g.wrote(&range);
                Ok(())
            });
            match placed {
                Ok(()) => {}
                Err(e) if i == 0 => return w.err(&e),
                Err(e) => {
                    return Err(ConnError::Protocol(format!(
                        "region changed during a vectored write: {e}"
                    )));
                }
            }
        }
        w.ok(MemResponse::Written, &[]).map(drop)
    }
}
