//! The evictor part of the runtime: the local budget and its watermarks,
//! waking the eviction threads, the rounds under way, and the state of
//! eviction as application threads see it (stalled, failing swap-outs).

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as StdOrdering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the eviction threads share with the rest of the runtime.
pub(super) struct Pressure {
    /// Local memory budget in bytes (changed by `Runtime::set_local_budget`).
    budget: AtomicU64,
    /// Eviction starts above this fraction of the budget...
    high: f64,
    /// ...and stops below this one.
    low: f64,
    /// Spans evicted per batch (one grace period per batch).
    batch: usize,
    /// Wakes eviction threads (pressure); see `kick`.
    kick: Mutex<()>,
    kicked: Condvar,
    /// Eviction threads asleep on `kicked`.
    idle_evictors: AtomicU64,
    /// Eviction rounds under way (a round holds far pages until it commits
    /// or aborts), and filtering rounds that pin spans.
    rounds: AtomicU64,
    /// A wait for eviction timed out and no span has been evicted since.
    stalled: AtomicBool,
    /// Swap-outs that fail, logged as a streak: while far memory is
    /// unreachable every eviction round fails, on every eviction thread.
    swap_out_failures: remora_proto::Repeated,
}

impl Pressure {
    /// A budget of `budget` bytes with eviction between the fractions
    /// `high` and `low` of it, `batch` spans at a time (at least one).
    pub(super) fn new(budget: usize, high: f64, low: f64, batch: usize) -> Self {
        Self {
            budget: AtomicU64::new(budget as u64),
            high,
            low,
            batch: batch.max(1),
            kick: Mutex::new(()),
            kicked: Condvar::new(),
            idle_evictors: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            swap_out_failures: remora_proto::Repeated::new("swap-outs succeed", "swap-outs deferred"),
        }
    }

    #[inline]
    pub(super) fn budget(&self) -> u64 {
        self.budget.load(StdOrdering::Relaxed)
    }

    pub(super) fn set_budget(&self, bytes: usize) {
        self.budget.store(bytes as u64, StdOrdering::Relaxed);
    }

    /// Eviction starts above this many local bytes.
    #[inline]
    pub(super) fn high_bytes(&self) -> u64 {
        (self.budget() as f64 * self.high) as u64
    }

    /// Eviction stops below this many local bytes.
    #[inline]
    pub(super) fn low_bytes(&self) -> u64 {
        (self.budget() as f64 * self.low) as u64
    }

    /// Spans per eviction batch.
    #[inline]
    pub(super) fn batch(&self) -> usize {
        self.batch
    }

    /// Wakes the eviction threads if any sleeps: one atomic load otherwise,
    /// so the swap-in path can call it freely.
    #[inline]
    pub(super) fn kick(&self) {
        if self.idle_evictors.load(StdOrdering::SeqCst) > 0 {
            self.wake_all();
        }
    }

    /// Wakes every thread asleep on the kick, idle or not (shutdown: the
    /// sleepers look at the stop flag under the kick's lock).
    pub(super) fn wake_all(&self) {
        let _k = self.kick.lock().unwrap_or_else(|p| p.into_inner());
        self.kicked.notify_all();
    }

    /// An eviction thread's sleep: announces it as idle, then sleeps until
    /// kicked or `timeout` unless `busy` (looked at once announced: a kick
    /// between the two sees the thread idle, both sides SeqCst).
    pub(super) fn idle(&self, timeout: Duration, busy: impl FnOnce() -> bool) {
        let k = self.kick.lock().unwrap_or_else(|p| p.into_inner());
        self.idle_evictors.fetch_add(1, StdOrdering::SeqCst);
        if !busy() {
            let _ = self.kicked.wait_timeout(k, timeout);
        } else {
            drop(k);
        }
        self.idle_evictors.fetch_sub(1, StdOrdering::SeqCst);
    }

    /// Sleeps until `deadline`, waking early when `stopping` says so (the
    /// runtime's drop wakes every sleeper on the kick).
    pub(super) fn sleep_until(&self, deadline: Instant, stopping: impl Fn() -> bool) {
        let mut k = self.kick.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            if now >= deadline || stopping() {
                break;
            }
            k = self
                .kicked
                .wait_timeout(k, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A round that holds far pages or pins spans begins.
    #[inline]
    pub(super) fn round_started(&self) {
        self.rounds.fetch_add(1, StdOrdering::AcqRel);
    }

    /// The round begun by `round_started` is over.
    #[inline]
    pub(super) fn round_ended(&self) {
        self.rounds.fetch_sub(1, StdOrdering::AcqRel);
    }

    /// Whether some round is under way.
    pub(super) fn rounds_under_way(&self) -> bool {
        self.rounds.load(StdOrdering::Acquire) > 0
    }

    /// Whether a wait for eviction timed out with no span evicted since.
    #[inline]
    pub(super) fn stalled(&self) -> bool {
        self.stalled.load(StdOrdering::Acquire)
    }

    /// A wait for eviction timed out.
    pub(super) fn stall(&self) {
        self.stalled.store(true, StdOrdering::Release);
    }

    /// Spans were evicted: eviction is not stalled.
    pub(super) fn progressed(&self) {
        self.stalled.store(false, StdOrdering::Release);
    }

    /// A swap-out succeeded (ends a streak of failures).
    pub(super) fn swap_out_ok(&self) {
        self.swap_out_failures.ok();
    }

    /// A swap-out failed (logged as part of a streak).
    pub(super) fn swap_out_failed(&self, what: impl Display) {
        self.swap_out_failures.fail(what);
    }
}
