//! Failure detection on the compute node: its own evidence first, the
//! manager's verdict last.
//!
//! A memory node that fails a request (connection refused or broken, or a
//! read overdue well beyond what reads have been taking) becomes a
//! **suspect** at once: schemes read around it (degraded reads) and place
//! no new data on it. Each new suspect is handed to the runtime's confirm
//! thread, which asks the manager to rule ([`remora_proto::FarBackend::confirm`]);
//! the manager probes the node and declares it dead (recovery starts on its
//! `NodeDead` notice) or answers that it is alive, and the suspicion is
//! lifted. Without a verdict a suspicion lapses after [`SUSPECT_FOR`].
//!
//! **Overdue reads.** [`Latency`] keeps a decaying log2 histogram of read
//! round trips; a read is overdue past [`OVERDUE_FACTOR`] times their p99,
//! never less than [`OVERDUE_MIN`] (below that a scheduling hiccup on a busy
//! machine would look like a failure) nor more than the call timeout. An
//! overdue read only costs a degraded read and a question to the manager,
//! so a false alarm is cheap; recovery waits for the manager.
//!
//! **Overdue writes.** A stripe write overdue by the same rule (its own
//! histogram) is placed again without that node. Its pages there stay
//! allocated until the write's outcome is known (`scheme::shards`): the
//! node may still carry it out, and a page reused meanwhile could be
//! overwritten by it.
//!
//! **Overdue transaction steps.** A compaction or an ec-2pc write holds its
//! spanset busy, and degraded reads of that spanset wait for it; so its
//! prepares, commits and aborts wait no longer than their own bound either.
//! An overdue prepare aborts the transaction; an overdue commit or abort
//! stays queued on the connection (the node carries it out if it comes
//! back) and its node is suspected, as the paper's cancelling of a
//! compaction that involves a failed node.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use remora_proto::NodeId;

/// How long a node that failed a request is avoided and read around unless
/// the manager rules sooner.
pub(crate) const SUSPECT_FOR: Duration = Duration::from_secs(3);
/// A read is overdue past this multiple of the recent p99 round trip.
pub(crate) const OVERDUE_FACTOR: u32 = 8;
/// ... and never before this.
pub(crate) const OVERDUE_MIN: Duration = Duration::from_millis(200);
/// Reads between two recomputations of the bound (and halvings of the
/// histogram, so old samples fade).
const RECOMPUTE_EVERY: u32 = 1024;
const BUCKETS: usize = 48;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
struct SuspectState {
    since: HashMap<NodeId, Instant>,
    /// New suspects the confirm thread has not taken yet.
    queue: VecDeque<NodeId>,
    /// Queued or being confirmed: not queued again meanwhile.
    asking: HashSet<NodeId>,
}

/// Nodes that failed a request recently: avoided for new data and read
/// around until the manager's verdict (or [`SUSPECT_FOR`]) settles it.
#[derive(Debug, Default)]
pub(crate) struct Suspects {
    st: Mutex<SuspectState>,
    /// Entries in `st.since`: every swap-in asks whether its node is a
    /// suspect, and almost always none is, so that answer takes no lock.
    listed: AtomicUsize,
    asked: Condvar,
    /// Suspicions raised (a node already suspect is not counted again).
    raised: AtomicU64,
    /// Suspicions the manager found wrong.
    cleared: AtomicU64,
}

impl Suspects {
    pub(crate) fn suspect(&self, node: NodeId) {
        let mut st = lock(&self.st);
        let before = st.since.insert(node, Instant::now());
        if before.is_none() {
            self.listed.fetch_add(1, Ordering::Release);
        }
        let fresh = before.is_none_or(|t| t.elapsed() >= SUSPECT_FOR);
        if fresh {
            self.raised.fetch_add(1, Ordering::Relaxed);
        }
        if st.asking.insert(node) {
            st.queue.push_back(node);
            self.asked.notify_one();
        }
    }

    pub(crate) fn is_suspect(&self, node: NodeId) -> bool {
        if self.listed.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut st = lock(&self.st);
        match st.since.get(&node) {
            Some(t) if t.elapsed() < SUSPECT_FOR => true,
            Some(_) => {
                st.since.remove(&node);
                self.listed.fetch_sub(1, Ordering::Release);
                false
            }
            None => false,
        }
    }

    pub(crate) fn list(&self) -> Vec<NodeId> {
        if self.listed.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        lock(&self.st)
            .since
            .iter()
            .filter(|(_, t)| t.elapsed() < SUSPECT_FOR)
            .map(|(n, _)| *n)
            .collect()
    }

    /// Wakes the confirm thread from its wait for a suspect (the runtime
    /// is stopping).
    pub(crate) fn wake(&self) {
        let _st = lock(&self.st);
        self.asked.notify_all();
    }

    /// The next suspect to ask the manager about, waiting up to `wait`.
    pub(crate) fn next_to_confirm(&self, wait: Duration) -> Option<NodeId> {
        let mut st = lock(&self.st);
        if st.queue.is_empty() {
            st = self.asked.wait_timeout(st, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
        st.queue.pop_front()
    }

    /// The manager ruled on `node`: lift the suspicion if it is alive.
    pub(crate) fn ruled(&self, node: NodeId, alive: bool) {
        let mut st = lock(&self.st);
        st.asking.remove(&node);
        if alive && st.since.remove(&node).is_some() {
            self.listed.fetch_sub(1, Ordering::Release);
            self.cleared.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asking about `node` failed (the manager unreachable): a later
    /// failure may ask again.
    pub(crate) fn unasked(&self, node: NodeId) {
        lock(&self.st).asking.remove(&node);
    }

    /// (suspicions raised, suspicions the manager found wrong).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.raised.load(Ordering::Relaxed),
            self.cleared.load(Ordering::Relaxed),
        )
    }
}

/// Recent read round trips, for the overdue bound.
#[derive(Debug)]
pub(crate) struct Latency {
    buckets: [AtomicU32; BUCKETS],
    count: AtomicU32,
    bound_ns: AtomicU64,
    /// Reads found overdue.
    overdue: AtomicU64,
}

impl Default for Latency {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU32::new(0)),
            count: AtomicU32::new(0),
            bound_ns: AtomicU64::new(OVERDUE_MIN.as_nanos() as u64),
            overdue: AtomicU64::new(0),
        }
    }
}

impl Latency {
    /// A read took `d`.
    pub(crate) fn record(&self, d: Duration) {
        let ns = (d.as_nanos() as u64).max(1);
        let b = (63 - ns.leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
        if self.count.fetch_add(1, Ordering::Relaxed) % RECOMPUTE_EVERY == RECOMPUTE_EVERY - 1 {
            self.recompute();
        }
    }

    fn recompute(&self) {
        let counts: Vec<u32> = self
            .buckets
            .iter()
            .map(|b| {
                // Halve as we read, so the histogram follows recent reads.
                let v = b.load(Ordering::Relaxed);
                b.fetch_sub(v / 2, Ordering::Relaxed);
                v
            })
            .collect();
        let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        if total == 0 {
            return;
        }
        let mut seen = 0u64;
        let mut p99_top = 1u64;
        for (b, &c) in counts.iter().enumerate() {
            seen += u64::from(c);
            if seen * 100 >= total * 99 {
                p99_top = 1u64 << (b + 1).min(63); // the bucket's upper edge
                break;
            }
        }
        let bound = p99_top
            .saturating_mul(u64::from(OVERDUE_FACTOR))
            .max(OVERDUE_MIN.as_nanos() as u64);
        self.bound_ns.store(bound, Ordering::Relaxed);
    }

    /// How long a read may take before it is overdue, at most `cap` (the
    /// call timeout).
    pub(crate) fn bound(&self, cap: Duration) -> Duration {
        Duration::from_nanos(self.bound_ns.load(Ordering::Relaxed)).min(cap)
    }

    pub(crate) fn count_overdue(&self) {
        self.overdue.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn overdue(&self) -> u64 {
        self.overdue.load(Ordering::Relaxed)
    }
}

/// The compute node's failure detector: suspects, and the latency of reads
/// (swap-ins) and of stripe writes (eviction), each with its own bound.
#[derive(Debug, Default)]
pub(crate) struct Detector {
    pub(crate) suspects: Suspects,
    pub(crate) reads: Latency,
    pub(crate) writes: Latency,
    /// Transaction steps (prepare, commit, abort) of compaction and ec-2pc.
    pub(crate) txns: Latency,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_follows_measured_reads_above_its_floor() {
        let l = Latency::default();
        let cap = Duration::from_secs(10);
        assert_eq!(l.bound(cap), OVERDUE_MIN, "no reads yet: the floor");
        for _ in 0..4 * RECOMPUTE_EVERY {
            l.record(Duration::from_micros(300));
        }
        assert_eq!(l.bound(cap), OVERDUE_MIN, "fast reads: still the floor");
        for _ in 0..8 * RECOMPUTE_EVERY {
            l.record(Duration::from_millis(50));
        }
        let b = l.bound(cap);
        assert!(
            b >= Duration::from_millis(400) && b <= Duration::from_millis(1100),
            "8 × a 50 ms p99: {b:?}"
        );
        assert_eq!(
            l.bound(Duration::from_millis(250)),
            Duration::from_millis(250),
            "capped by the call timeout"
        );
        for _ in 0..16 * RECOMPUTE_EVERY {
            l.record(Duration::from_micros(300));
        }
        assert_eq!(l.bound(cap), OVERDUE_MIN, "old slow reads fade");
    }

    #[test]
    fn a_suspect_is_asked_about_once_and_cleared_by_an_alive_verdict() {
        let s = Suspects::default();
        let n = NodeId(3);
        s.suspect(n);
        s.suspect(n);
        assert!(s.is_suspect(n));
        assert_eq!(s.next_to_confirm(Duration::ZERO), Some(n));
        assert_eq!(s.next_to_confirm(Duration::ZERO), None, "queued once while asking");
        s.ruled(n, true);
        assert!(!s.is_suspect(n));
        assert_eq!(s.counts(), (1, 1));
        s.suspect(n);
        assert_eq!(
            s.next_to_confirm(Duration::ZERO),
            Some(n),
            "asked again after a verdict"
        );
        s.ruled(n, false);
        assert!(s.is_suspect(n), "a dead verdict keeps it suspect");
    }
}
