//! The seam between a compute node and its far memory.
//!
//! - [`MemTransport`]: one connection to one memory node's data path. It
//!   carries the wire's [`MemRequest`]s and answers with [`MemResponse`]s, so
//!   every implementation speaks exactly the protocol: the TCP client
//!   ([`MemNodeClient`]) and an in-process memory node (for unit tests and
//!   injected faults, in `remora-memnode`). The typed calls (read, write,
//!   their vectored and pipelined forms, rebuild) are written once, here, on
//!   top of [`MemTransport::send`] and [`MemTransport::wait`], so a layer that
//!   wraps a transport (the runtime's traffic counters) sees every request.
//! - [`FarBackend`]: where a compute node gets regions and connections: a
//!   manager session over TCP ([`TcpBackend`]) or an in-process cluster.
//!
//! # Lock contract
//!
//! Implementations may block in `send` (a full socket) and in `wait` (up to
//! its timeout), and must not call back into their caller. Callers must not
//! hold a lock that a request's completion needs: a transport completes each
//! request on its own (TCP: the reply arrives; in-process: `send` has
//! already served it). Many threads may use one transport at once; replies
//! are matched by ticket, never by order.

use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use crate::cap::{Cap, ComputeId, NodeId, RegionId};
use crate::client::{ComputeSession, MemNodeClient, SessionEvent};
use crate::msg::{MemRequest, MemResponse, NodeLoad, Range, RebuildRow, RebuildSource, RegionGrant, TxnId, TxnOp};
use crate::rpc::{ConnOptions, RpcError, Ticket};

fn unexpected(r: MemResponse) -> RpcError {
    RpcError::Unexpected(format!("{r:?}"))
}

fn expect(r: MemResponse, want: MemResponse) -> Result<(), RpcError> {
    if r == want { Ok(()) } else { Err(unexpected(r)) }
}

/// One connection to a memory node's data path.
pub trait MemTransport: Send + Sync + std::fmt::Debug {
    /// The memory node's address (for messages and reconnects).
    fn peer(&self) -> &str;

    /// True once the connection failed for good: reconnect to go on.
    fn is_broken(&self) -> bool;

    /// As [`MemTransport::wait`], but a timeout leaves the request in
    /// flight, so a later wait on `t` still learns its outcome. A transport
    /// that cannot keep it answers that later wait with an error.
    fn wait_keeping(&self, t: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<MemResponse, RpcError> {
        self.wait(t, dest, timeout)
    }

    /// Breaks the connection: calls in flight on it fail at once (the node
    /// was declared dead, so waiting out their timeouts would only stall).
    fn close(&self) {}

    /// How long a typed call waits for its reply.
    fn call_timeout(&self) -> Duration;

    /// Sends one request; the payload (write data) follows its head.
    fn send(&self, req: &MemRequest, payload: &[&[u8]]) -> Result<Ticket, RpcError>;

    /// Waits for the reply to `t`. A reply's payload (read data) goes to
    /// `dest`, which must be exactly its length.
    fn wait(&self, t: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<MemResponse, RpcError>;

    /// Reads `buf.len()` bytes at `offset` of the capability's region.
    fn read(&self, cap: Cap, offset: u64, buf: &mut [u8]) -> Result<(), RpcError> {
        let t = self.send_read(cap, offset, buf.len())?;
        self.wait_read(t, buf)
    }

    /// Starts a read; finish it with [`MemTransport::wait_read`].
    fn send_read(&self, cap: Cap, offset: u64, len: usize) -> Result<Ticket, RpcError> {
        let len = u32::try_from(len).map_err(|_| RpcError::Unexpected("read too large".into()))?;
        self.send(&MemRequest::Read { cap, offset, len }, &[])
    }

    /// Waits for a read (plain or vectored) into `buf`.
    fn wait_read(&self, t: Ticket, buf: &mut [u8]) -> Result<(), RpcError> {
        let r = self.wait(t, Some(buf), self.call_timeout())?;
        expect(r, MemResponse::Data)
    }

    /// Writes `data` at `offset`; returns once the node has it in memory.
    fn write(&self, cap: Cap, offset: u64, data: &[u8]) -> Result<(), RpcError> {
        let t = self.send_write(cap, offset, data)?;
        self.wait_write(t)
    }

    /// Starts a write; finish it with [`MemTransport::wait_write`].
    fn send_write(&self, cap: Cap, offset: u64, data: &[u8]) -> Result<Ticket, RpcError> {
        self.send(&MemRequest::Write { cap, offset }, &[data])
    }

    /// Waits for a write (plain or vectored).
    fn wait_write(&self, t: Ticket) -> Result<(), RpcError> {
        let r = self.wait(t, None, self.call_timeout())?;
        expect(r, MemResponse::Written)
    }

    /// Reads several ranges in one request into `buf` (their concatenation).
    fn read_v(&self, ranges: &[Range], buf: &mut [u8]) -> Result<(), RpcError> {
        let total: u64 = ranges.iter().map(|r| r.len as u64).sum();
        if total != buf.len() as u64 {
            return Err(RpcError::Unexpected(
                "buffer length differs from the ranges' total".into(),
            ));
        }
        let t = self.send_read_v(ranges)?;
        self.wait_read(t, buf)
    }

    /// Starts a vectored read; finish it with [`MemTransport::wait_read`]
    /// into a buffer of the ranges' total length.
    fn send_read_v(&self, ranges: &[Range]) -> Result<Ticket, RpcError> {
        self.send(
            &MemRequest::ReadV {
                ranges: ranges.to_vec(),
            },
            &[],
        )
    }

    /// Writes several ranges in one request; `data[i]` goes to `ranges[i]`.
    fn write_v(&self, ranges: &[Range], data: &[&[u8]]) -> Result<(), RpcError> {
        if ranges.len() != data.len() || ranges.iter().zip(data).any(|(r, d)| r.len as usize != d.len()) {
            return Err(RpcError::Unexpected("ranges and data differ in shape".into()));
        }
        let t = self.send(
            &MemRequest::WriteV {
                ranges: ranges.to_vec(),
            },
            data,
        )?;
        self.wait_write(t)
    }

    /// Asks this node to rebuild erasure-code shards into its region `cap`
    /// from survivors on its peers; returns the bytes it wrote and the
    /// checksum of each row it wrote.
    #[allow(clippy::too_many_arguments)]
    fn rebuild(
        &self,
        cap: Cap,
        k: u8,
        m: u8,
        want: u8,
        sources: Vec<RebuildSource>,
        rows: Vec<RebuildRow>,
        timeout: Duration,
    ) -> Result<(u64, Vec<u64>), RpcError> {
        let req = MemRequest::Rebuild {
            cap,
            k,
            m,
            want,
            sources,
            rows,
        };
        let t = self.send(&req, &[])?;
        match self.wait(t, None, timeout)? {
            MemResponse::Rebuilt { bytes, checksums } => Ok((bytes, checksums)),
            other => Err(unexpected(other)),
        }
    }

    /// Starts phase one of a transaction (see [`MemRequest::Prepare`]);
    /// `payload` is the op's payload (new bytes for `Put`, the delta for
    /// `Apply`, empty for `Move`). Finish with [`MemTransport::wait_prepare`].
    fn send_prepare(&self, txn: TxnId, op: TxnOp, payload: &[u8]) -> Result<Ticket, RpcError> {
        self.send(&MemRequest::Prepare { txn, op }, &[payload])
    }

    /// Starts phase one of several changes at once (see
    /// [`MemRequest::PrepareMany`]); `payloads` are the ops' payloads in order.
    fn send_prepare_many(&self, txn: TxnId, ops: Vec<TxnOp>, payloads: &[&[u8]]) -> Result<Ticket, RpcError> {
        self.send(&MemRequest::PrepareMany { txn, ops }, payloads)
    }

    /// Waits for a prepare; a returned delta goes to `delta` (exactly the
    /// member's length), which must be given for `return_delta` ops.
    fn wait_prepare(&self, t: Ticket, delta: Option<&mut [u8]>) -> Result<(), RpcError> {
        let r = self.wait(t, delta, self.call_timeout())?;
        expect(r, MemResponse::Prepared)
    }

    /// Phase one of a transaction, waited for.
    fn prepare(&self, txn: TxnId, op: TxnOp, payload: &[u8], delta: Option<&mut [u8]>) -> Result<(), RpcError> {
        let t = self.send_prepare(txn, op, payload)?;
        self.wait_prepare(t, delta)
    }

    /// Phase two: applies what `txn` staged on this node. `cap` is any owner
    /// capability of a region on this node.
    fn commit(&self, cap: Cap, txn: TxnId) -> Result<(), RpcError> {
        let t = self.send(&MemRequest::Commit { cap, txn }, &[])?;
        let r = self.wait(t, None, self.call_timeout())?;
        expect(r, MemResponse::Committed)
    }

    /// Drops what `txn` staged on this node.
    fn abort(&self, cap: Cap, txn: TxnId) -> Result<(), RpcError> {
        let t = self.send(&MemRequest::Abort { cap, txn }, &[])?;
        let r = self.wait(t, None, self.call_timeout())?;
        expect(r, MemResponse::Aborted)
    }

    /// Reads the member at `offset` into `buf`; returns its generation.
    fn read_member(&self, cap: Cap, offset: u64, buf: &mut [u8]) -> Result<u64, RpcError> {
        let len = u32::try_from(buf.len()).map_err(|_| RpcError::Unexpected("read too large".into()))?;
        let t = self.send(&MemRequest::ReadMember { cap, offset, len }, &[])?;
        match self.wait(t, Some(buf), self.call_timeout())? {
            MemResponse::Member { generation } => Ok(generation),
            other => Err(unexpected(other)),
        }
    }

    /// How busy the node is. `timeout` bounds the wait: a caller polling
    /// loads goes on without a node that is slow to answer.
    fn load(&self, timeout: Duration) -> Result<NodeLoad, RpcError> {
        let t = self.send(&MemRequest::Load, &[])?;
        match self.wait(t, None, timeout)? {
            MemResponse::Load(l) => Ok(l),
            other => Err(unexpected(other)),
        }
    }

    /// Liveness probe.
    fn ping(&self) -> Result<(), RpcError> {
        let t = self.send(&MemRequest::Ping, &[])?;
        let r = self.wait(t, None, self.call_timeout())?;
        expect(r, MemResponse::Pong)
    }
}

/// Where a compute node's far memory comes from: regions from a manager
/// and connections to the memory nodes holding them.
pub trait FarBackend: Send + Sync {
    /// This compute node's id.
    fn id(&self) -> ComputeId;

    /// Allocates `count` regions, on distinct memory nodes if `distinct`,
    /// avoiding the nodes in `exclude`.
    fn alloc(&self, count: u32, distinct: bool, exclude: &[NodeId]) -> Result<Vec<RegionGrant>, RpcError>;

    /// Gives a region back.
    fn free(&self, region: RegionId) -> Result<(), RpcError>;

    /// The channel of notices (a node died, the session expired); once.
    fn take_events(&self) -> Option<Receiver<SessionEvent>>;

    /// Opens a new connection to the memory node at `addr`.
    fn connect(&self, addr: &str) -> Result<Arc<dyn MemTransport>, RpcError>;

    /// Asks whoever rules on membership whether memory node `node`, which
    /// failed this compute node, is alive (true) or dead (false). A dead
    /// verdict also arrives as a `NodeDead` notice.
    fn confirm(&self, node: NodeId) -> Result<bool, RpcError>;
}

/// The real thing: a manager session and TCP connections to memory nodes.
pub struct TcpBackend {
    session: ComputeSession,
    opts: ConnOptions,
}

impl TcpBackend {
    /// Registers with the manager at `manager` under `name`.
    pub fn open(manager: &str, name: &str, opts: ConnOptions) -> Result<Self, RpcError> {
        Ok(Self {
            session: ComputeSession::open(manager, name, opts.clone())?,
            opts,
        })
    }

    /// The manager session.
    pub fn session(&self) -> &ComputeSession {
        &self.session
    }
}

impl FarBackend for TcpBackend {
    fn id(&self) -> ComputeId {
        self.session.id()
    }

    fn alloc(&self, count: u32, distinct: bool, exclude: &[NodeId]) -> Result<Vec<RegionGrant>, RpcError> {
        self.session.alloc(count, distinct, exclude)
    }

    fn free(&self, region: RegionId) -> Result<(), RpcError> {
        self.session.free(region)
    }

    fn take_events(&self) -> Option<Receiver<SessionEvent>> {
        self.session.take_events()
    }

    fn connect(&self, addr: &str) -> Result<Arc<dyn MemTransport>, RpcError> {
        Ok(Arc::new(MemNodeClient::connect(addr, self.opts.clone())?))
    }

    fn confirm(&self, node: NodeId) -> Result<bool, RpcError> {
        self.session.suspect(node)
    }
}
