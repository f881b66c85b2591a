//! What crosses the wire to memory nodes, counted at the transport.
//!
//! Every connection the region table opens is wrapped in [`Counted`], so the
//! figures come from the requests really issued, whichever scheme or path
//! issued them, never from what a code path says it did. A read request is
//! counted when it is sent (a fragment of a split span is one request) and
//! its bytes when they arrive; a write's bytes when they are sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use remora_proto::msg::{MemRequest, MemResponse, TxnOp};
use remora_proto::rpc::Ticket;
use remora_proto::{MemTransport, RpcError};

use crate::region_table::Lane;

/// Counters of remote traffic, per lane where it matters.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    /// Read requests sent on the swap-in lane (swap-ins and degraded reads).
    pub(crate) swap_reads: AtomicU64,
    /// Read requests sent on the other lane.
    pub(crate) other_reads: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    /// Write requests sent (plain and vectored).
    pub(crate) writes: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    /// Transaction requests sent (prepare, commit, abort: compaction and
    /// in-place parity), and their bytes both ways (payloads sent, deltas
    /// returned).
    pub(crate) txn_requests: AtomicU64,
    pub(crate) txn_bytes: AtomicU64,
}

/// A transport whose every request is counted in [`Traffic`].
#[derive(Debug)]
pub(crate) struct Counted {
    inner: Arc<dyn MemTransport>,
    traffic: Arc<Traffic>,
    lane: Lane,
}

impl Counted {
    pub(crate) fn wrap(inner: Arc<dyn MemTransport>, traffic: Arc<Traffic>, lane: Lane) -> Arc<dyn MemTransport> {
        Arc::new(Self { inner, traffic, lane })
    }
}

impl MemTransport for Counted {
    fn peer(&self) -> &str {
        self.inner.peer()
    }

    fn is_broken(&self) -> bool {
        self.inner.is_broken()
    }

    fn close(&self) {
        self.inner.close();
    }

    fn wait_keeping(&self, t: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<MemResponse, RpcError> {
        // Only writes are waited on this way: no bytes arrive to count.
        debug_assert!(dest.is_none());
        self.inner.wait_keeping(t, dest, timeout)
    }

    fn call_timeout(&self) -> Duration {
        self.inner.call_timeout()
    }

    fn send(&self, req: &MemRequest, payload: &[&[u8]]) -> Result<Ticket, RpcError> {
        let t = self.inner.send(req, payload)?;
        let tr = &self.traffic;
        match req {
            MemRequest::Read { .. } | MemRequest::ReadV { .. } | MemRequest::ReadMember { .. } => {
                let c = match self.lane {
                    Lane::Swap => &tr.swap_reads,
                    Lane::Evict => &tr.other_reads,
                };
                c.fetch_add(1, Ordering::Relaxed);
            }
            MemRequest::Write { .. } | MemRequest::WriteV { .. } => {
                tr.writes.fetch_add(1, Ordering::Relaxed);
                let n: usize = payload.iter().map(|p| p.len()).sum();
                tr.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
            }
            // A put's bytes (ec-2pc: new data for a member changed in place)
            // are written data, though the memory node holds them until the
            // commit; other transaction payloads are deltas (compaction).
            MemRequest::Prepare { op, .. } => {
                tr.txn_requests.fetch_add(1, Ordering::Relaxed);
                let n: usize = payload.iter().map(|p| p.len()).sum();
                if matches!(op, TxnOp::Put { .. }) {
                    tr.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
                } else {
                    tr.txn_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
            MemRequest::PrepareMany { ops, .. } => {
                tr.txn_requests.fetch_add(1, Ordering::Relaxed);
                let n: usize = payload.iter().map(|p| p.len()).sum();
                let put: usize = ops
                    .iter()
                    .map(|op| match op {
                        TxnOp::Put { to, .. } => to.len as usize,
                        _ => 0,
                    })
                    .sum();
                tr.bytes_written.fetch_add(put.min(n) as u64, Ordering::Relaxed);
                tr.txn_bytes.fetch_add(n.saturating_sub(put) as u64, Ordering::Relaxed);
            }
            MemRequest::Commit { .. } | MemRequest::Abort { .. } => {
                tr.txn_requests.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(t)
    }

    fn wait(&self, t: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<MemResponse, RpcError> {
        let n = dest.as_ref().map_or(0, |d| d.len());
        let r = self.inner.wait(t, dest, timeout)?;
        match r {
            MemResponse::Data | MemResponse::Member { .. } => {
                self.traffic.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
            }
            MemResponse::Prepared => {
                self.traffic.txn_bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(r)
    }
}
