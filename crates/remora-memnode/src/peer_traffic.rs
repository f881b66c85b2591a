//! What a memory node sends to other memory nodes, counted where it is
//! served. A read made with a delegated (read-only) capability comes from a
//! peer: only the owner holds the read-write one, and it hands read-only
//! ones to the node rebuilding a lost member. Counted as served, so the
//! figure is what crossed the wire, not what a code path meant to send.
//! Parity deltas a data node sends a parity node are counted the same way,
//! by the receiver, from their delegated apply-delta capability.

use std::sync::atomic::{AtomicU64, Ordering};

use remora_proto::Rights;
use remora_proto::msg::{PeerTraffic, Range};

/// Counters behind [`PeerTraffic`] (relaxed: they are statistics).
#[derive(Debug, Default)]
pub(crate) struct PeerCounters {
    rebuild_reads: AtomicU64,
    rebuild_bytes: AtomicU64,
    delta_applies: AtomicU64,
    delta_bytes: AtomicU64,
    /// Deltas this node has sent to peers and not yet heard back about (a
    /// gauge, for `Stats`).
    deltas_in_flight: AtomicU64,
}

impl PeerCounters {
    /// A read of `bytes` made with capability rights `rights` was answered.
    pub(crate) fn served_read(&self, rights: Rights, bytes: u64) {
        if rights == Rights::ReadOnly {
            self.rebuild_reads.fetch_add(1, Ordering::Relaxed);
            self.rebuild_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// A vectored read of `bytes` was answered; it came from a peer if
    /// every range was opened with a delegated capability.
    pub(crate) fn served_read_v(&self, ranges: &[Range], bytes: u64) {
        let delegated = !ranges.is_empty() && ranges.iter().all(|r| r.cap.rights == Rights::ReadOnly);
        self.served_read(if delegated { Rights::ReadOnly } else { Rights::ReadWrite }, bytes);
    }

    /// A parity delta of `bytes` was staged; it came from a peer if it was
    /// sent with a delegated apply-delta capability.
    pub(crate) fn staged_delta(&self, rights: Rights, bytes: u64) {
        if rights == Rights::ApplyDelta {
            self.delta_applies.fetch_add(1, Ordering::Relaxed);
            self.delta_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// `n` deltas leave for peers; the guard counts them back in when dropped.
    pub(crate) fn deltas_sent(&self, n: u64) -> InFlight<'_> {
        self.deltas_in_flight.fetch_add(n, Ordering::Relaxed);
        InFlight { c: self, n }
    }

    /// Deltas sent to peers and not yet answered.
    pub(crate) fn deltas_in_flight(&self) -> u64 {
        self.deltas_in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn snapshot(&self) -> PeerTraffic {
        PeerTraffic {
            rebuild_reads: self.rebuild_reads.load(Ordering::Relaxed),
            rebuild_bytes: self.rebuild_bytes.load(Ordering::Relaxed),
            delta_applies: self.delta_applies.load(Ordering::Relaxed),
            delta_bytes: self.delta_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Deltas counted in flight until dropped (see [`PeerCounters::deltas_sent`]).
pub(crate) struct InFlight<'a> {
    c: &'a PeerCounters,
    n: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.c.deltas_in_flight.fetch_sub(self.n, Ordering::Relaxed);
    }
}
