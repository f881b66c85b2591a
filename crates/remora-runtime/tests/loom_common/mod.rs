//! The harness both loom models share: the checker with a preemption bound,
//! the release store loom needs as a `swap`, and the readers' scope records
//! with the grace period (`scope.rs`) as the runtime implements them.

#![allow(dead_code, unreachable_pub)]

use loom::sync::atomic::{AtomicU64, Ordering, fence};
use loom::thread;
use remora_runtime::pointer::LOCK;

/// Reader threads with a scope record (a grace period checks each).
pub const READERS: usize = 2;

/// Runs `f` under loom with a preemption bound (`bound` unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise) and reports how many executions
/// were explored (visible with `--nocapture`).
pub fn check_bounded(name: &str, bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    // The grace-period wait and the lock spin are bounded only by the
    // scheduler; give loom room for them.
    b.max_branches = b.max_branches.max(20_000);
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    eprintln!(
        "{name}: {} executions (preemption bound {:?})",
        runs.load(std::sync::atomic::Ordering::Relaxed),
        b.preemption_bound
    );
}

/// `check_bounded` with the bound used for the two-thread models.
pub fn check(name: &str, f: impl Fn() + Sync + Send + 'static) {
    check_bounded(name, 5, f);
}

/// A release store to a word that other threads update with RMWs.
///
/// Written as a `swap`: loom 0.7 lets a plain store slip between the read and
/// the write of a concurrent RMW on the same atomic (tokio-rs/loom#254,
/// fix pending in #391), which reports impossible histories (e.g. the
/// evictor's `fetch_or(E)` reading the dropper's locked word and landing
/// after its reset of the slot). On hardware a store already behaves so;
/// the `swap` only keeps loom from exploring executions that cannot happen.
pub fn store(word: &AtomicU64, v: u64) {
    debug_assert_eq!(v & LOCK, 0);
    word.swap(v, Ordering::Release);
}

/// The readers' `ThreadRec::state`s (odd while inside a scope) and
/// `Rcu::synchronize`.
pub struct Scopes {
    state: [AtomicU64; READERS],
    /// Ordering of the store that makes the state odd in `enter_rec`
    /// (`Release` now; the pointer model also runs the old `Relaxed`).
    enter: Ordering,
}

impl Scopes {
    pub fn new(enter: Ordering) -> Self {
        Self {
            state: [AtomicU64::new(0), AtomicU64::new(0)],
            enter,
        }
    }

    /// `enter_rec` at depth 0 for reader `r`.
    pub fn enter(&self, r: usize) {
        let st = &self.state[r];
        let s = st.load(Ordering::Relaxed);
        st.store(s + 1, self.enter);
        fence(Ordering::SeqCst);
    }

    /// `exit_rec` at depth 1 for reader `r`.
    pub fn exit(&self, r: usize) {
        let st = &self.state[r];
        let s = st.load(Ordering::Relaxed);
        st.store(s + 1, Ordering::Release);
    }

    /// `Rcu::synchronize`: snapshot the readers inside a scope, then wait for
    /// each to leave it.
    pub fn synchronize(&self) {
        fence(Ordering::SeqCst);
        let snapshot = self.state.each_ref().map(|st| st.load(Ordering::SeqCst));
        for (st, s) in self.state.iter().zip(snapshot) {
            if s & 1 == 1 {
                while st.load(Ordering::Acquire) == s {
                    thread::yield_now();
                }
            }
        }
    }
}
