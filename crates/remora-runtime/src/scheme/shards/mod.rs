//! Reading and writing the shards of an erasure-coded stripe, shared by
//! `ec-batch` (a shard is a whole span, or a parity span) and `ec-split` (a
//! shard is one fragment of a span):
//!
//! - [`gather`]: reads shards, preferred ones first, until enough have
//!   arrived (and passed the caller's check), all reads of a wave in
//!   flight at once; a failed or rejected shard is replaced by the next
//!   candidate. With late binding, the first wave asks for one shard more
//!   than needed and takes the first to arrive, so one straggler does not
//!   hold the read up.
//! - [`place_and_write`] / [`place_and_write_many`]: places stripes on
//!   stripe groups and writes them, every position in flight at once and
//!   one request per memory node, re-placing them away from a node that
//!   failed a write.
//! - [`Stripes`]: what every erasure-coded scheme holds besides its own
//!   layout: the code, stripe-group placement, recovery, counters.
//! - [`Waiters`]: the threads that wait for late-bound reads. A transport
//!   waits for one ticket at a time, so "the first k of k+1 to arrive"
//!   needs the waits to run in parallel: one thread per connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use remora_proto::msg::{MemRequest, MemResponse};
use remora_proto::rpc::Ticket;
use remora_proto::{Cap, RpcError};

use remora_ec::Codec;

use super::SchemeReport;
use super::placement::Placement;
use super::recovery::Recovery;
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::region_table::Link;

mod gather;
mod waiters;
mod write;

pub(crate) use gather::{Shard, gather};
pub(crate) use waiters::Waiters;
pub(crate) use write::{Settling, place_and_write, place_and_write_many};

/// Write attempts (each on a new placement) before a swap-out gives up.
const WRITE_ATTEMPTS: usize = 3;

/// An RS(k, m) code on stripe groups of k+m positions, its recoveries and
/// counters.
pub(crate) struct Stripes {
    pub(crate) name: &'static str,
    pub(crate) codec: Codec,
    pub(crate) k: usize,
    pub(crate) m: usize,
    pub(crate) place: Placement,
    /// Swap-ins served by decoding around a lost shard.
    pub(crate) degraded: AtomicU64,
    /// Corrupt far copies rewritten.
    pub(crate) repairs: AtomicU64,
    /// Stripes (spansets or rows) written, and those with fewer than k spans.
    pub(crate) batches: AtomicU64,
    pub(crate) partial_batches: AtomicU64,
    pub(crate) recovery: Recovery,
    /// Writes given up as overdue, until their outcome is known.
    pub(crate) settling: Settling,
    /// Writes and commits a memory node failed, logged as a streak: a node
    /// that stopped serving fails every one of them until it is suspected,
    /// and again at each retry.
    pub(crate) write_failures: remora_proto::Repeated,
}

impl Stripes {
    pub(crate) fn new(name: &'static str, k: usize, m: usize) -> Result<Self, RuntimeError> {
        Ok(Self {
            name,
            codec: Codec::new(k, m).map_err(|e| RuntimeError::Config(format!("{name}: {e}")))?,
            k,
            m,
            place: Placement::new(k + m, name),
            degraded: AtomicU64::new(0),
            repairs: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            partial_batches: AtomicU64::new(0),
            recovery: Recovery::default(),
            settling: Settling::default(),
            write_failures: remora_proto::Repeated::new("writes to memory nodes succeed", "writes failed"),
        })
    }

    /// Frees the pages of overdue writes settled since, then gives empty
    /// stripe groups back (see `Scheme::give_back`).
    pub(crate) fn give_back(&self, far: &FarMemory) -> u64 {
        self.settling.reap(far, &self.place);
        self.place.give_back_empty(far)
    }

    /// Joins the background work every such scheme has: recoveries, and
    /// waits for writes given up as overdue.
    pub(crate) fn stop(&self) {
        self.recovery.stop();
        self.settling.stop();
    }

    /// A stripe of `spans` data spans was written: a partial one (fewer
    /// than k) costs (j+m)/j in bytes written, so it is counted apart.
    pub(crate) fn count_batch(&self, spans: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        if spans < self.k {
            self.partial_batches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Positions per stripe.
    pub(crate) fn n(&self) -> usize {
        self.k + self.m
    }

    /// Degraded reads, repairs, recoveries and stranded pages (holes and
    /// kept copies are the scheme's to add).
    pub(crate) fn report(&self) -> SchemeReport {
        SchemeReport {
            degraded_reads: self.degraded.load(Ordering::Relaxed),
            repairs: self.repairs.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            partial_batches: self.partial_batches.load(Ordering::Relaxed),
            stranded_bytes: self.settling.leaked_pages.load(Ordering::Relaxed) * crate::size_classes::PAGE_SIZE as u64,
            ..self.recovery.stats.report()
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads `dest.len()` bytes at `offset` through `link` for a scheme that
/// can read around the node: the round trip feeds the failure detector's
/// latency, and a read still unanswered past its overdue bound fails with
/// [`RpcError::Timeout`] (the caller then suspects the node and reads
/// around it) instead of waiting out the call timeout.
pub(crate) fn timed_read(far: &FarMemory, link: &Link, cap: Cap, offset: u64, dest: &mut [u8]) -> Result<(), RpcError> {
    let start = Instant::now();
    let t = link.send_read(cap, offset, dest.len())?;
    let cap_wait = link.call_timeout();
    let bound = far.detector().reads.bound(cap_wait);
    match link.wait(t, Some(dest), bound) {
        Ok(MemResponse::Data) => {
            far.detector().reads.record(start.elapsed());
            Ok(())
        }
        Ok(other) => Err(RpcError::Unexpected(format!("{other:?}"))),
        Err(e @ RpcError::Timeout { .. }) => {
            if bound < cap_wait {
                far.detector().reads.count_overdue();
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Waits for phase one of a transaction for no longer than the detector's
/// transaction bound (see `crate::detector`): an overdue participant fails
/// with [`RpcError::Timeout`], a transport error.
pub(crate) fn wait_prepared(far: &FarMemory, link: &Link, t: Ticket, delta: Option<&mut [u8]>) -> Result<(), RpcError> {
    let start = Instant::now();
    let full = link.call_timeout();
    let bound = far.detector().txns.bound(full);
    match link.wait(t, delta, bound) {
        Ok(MemResponse::Prepared) => {
            far.detector().txns.record(start.elapsed());
            Ok(())
        }
        Ok(other) => Err(RpcError::Unexpected(format!("{other:?}"))),
        Err(e) => Err(overdue(far, e, bound < full)),
    }
}

/// Sends phase two (`Commit` or `Abort`) and waits for it no longer than
/// the transaction bound. An overdue one stays queued on the connection.
pub(crate) fn decide(far: &FarMemory, link: &Link, req: &MemRequest) -> Result<(), RpcError> {
    let t = link.send(req, &[])?;
    wait_decided(far, link, req, t)
}

/// Waits for a phase two sent as `req` (ticket `t`), as [`decide`] does:
/// several decisions can be in flight at once on different nodes.
pub(crate) fn wait_decided(far: &FarMemory, link: &Link, req: &MemRequest, t: Ticket) -> Result<(), RpcError> {
    let full = link.call_timeout();
    let bound = far.detector().txns.bound(full);
    match (req, link.wait(t, None, bound)) {
        (MemRequest::Commit { .. }, Ok(MemResponse::Committed))
        | (MemRequest::Abort { .. }, Ok(MemResponse::Aborted)) => Ok(()),
        (_, Ok(other)) => Err(RpcError::Unexpected(format!("{other:?}"))),
        (_, Err(e)) => Err(overdue(far, e, bound < full)),
    }
}

fn overdue(far: &FarMemory, e: RpcError, early: bool) -> RpcError {
    if early && matches!(e, RpcError::Timeout { .. }) {
        far.detector().txns.count_overdue();
    }
    e
}
