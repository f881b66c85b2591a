//! Loom models of the pointer protocol, the move and the pause gate, run
//! on the crate's own code: the word transitions are [`Slot`]'s methods,
//! the deref scopes and grace periods are [`Rcu`] (`scope.rs`), the move is
//! [`Slot::move_marked`] (what `runtime/filtering.rs` `move_object` runs),
//! and the gate is [`crate::pause_gate::PauseGate`]. Under `--cfg loom`
//! their atomics, mutex and thread-locals are loom's (`crate::loom`).
//!
//! What is still a copy here: the access barrier (`runtime/access.rs`
//! needs a whole runtime; `access` below follows it step by step), the
//! evictor's and the dropper's sequence of `Slot` calls around the real
//! transitions, and, in clearly labelled `should_panic` tests, the old
//! steps the models caught (`BEFORE_FIXES`, the copy-first move, the gate
//! with its steps swapped).
//!
//! Running the real `Rcu` found a third defect, since fixed: a reader
//! thread that ended was dropped from the registry by the next thread to
//! register without acquiring its last scope, so a grace period could end
//! unordered with that scope's reads (`Rcu::rec` now fences after pruning;
//! `two_readers_vs_mover` and `two_readers_vs_evictor` failed without it).
//!
//! Run (seconds in release):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p remora-runtime --release --lib loom_models -- --nocapture
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS` overrides the preemption bounds.

mod evict;
mod moving;
mod pause;
mod pointer;

use loom::sync::atomic::{AtomicU64, Ordering, fence};
use loom::thread;

use crate::pointer::{
    DIRTY, EVICTING, FAST_MASK, FRESH, HOT_MASK, HOT_SHIFT, LOCK, MOVING, PRESENT, SEALED, Slot, local_addr,
};
use crate::scope::{Rcu, ScopeGuard};

/// Reader threads a model may run (the old scope copy keeps one state each).
const READERS: usize = 2;

/// Runs `f` under loom with a preemption bound (`bound` unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise) and reports how many executions
/// were explored (visible with `--nocapture`).
fn check_bounded(name: &str, bound: usize, f: impl Fn() + Sync + Send + 'static) {
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
fn check(name: &str, f: impl Fn() + Sync + Send + 'static) {
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
fn store(word: &AtomicU64, v: u64) {
    debug_assert_eq!(v & LOCK, 0);
    word.swap(v, Ordering::Release);
}

/// The deref-scope handshake a model runs.
enum Scopes {
    /// The crate's own [`Rcu`].
    Current(Rcu),
    /// A copy of `scope.rs` before the fix of finding 2 (`enter_rec` stored
    /// the odd state `Relaxed`), one state per reader; `should_panic` only.
    BeforeFix([AtomicU64; READERS]),
}

/// One reader's presence in a scope; leaves it when dropped.
enum InScope<'a> {
    Current(Option<ScopeGuard<'a>>),
    BeforeFix(&'a AtomicU64),
}

impl Drop for InScope<'_> {
    fn drop(&mut self) {
        // A model that failed unwinds outside loom's execution, where a loom
        // step would abort the test run (and `should_panic` with it).
        let unwinding = std::thread::panicking();
        match self {
            InScope::Current(g) => {
                if let Some(g) = g.take()
                    && unwinding
                {
                    std::mem::forget(g);
                }
            }
            InScope::BeforeFix(st) => {
                if !unwinding {
                    // The old `exit_rec` at depth 1 (as today's).
                    let s = st.load(Ordering::Relaxed);
                    st.store(s + 1, Ordering::Release);
                }
            }
        }
    }
}

impl InScope<'_> {
    /// Leaves the scope and enters a new one.
    fn renew(&mut self) {
        match self {
            InScope::Current(g) => g.as_mut().expect("held until drop").renew(),
            InScope::BeforeFix(st) => {
                // The old `exit_rec` then `enter_rec`, as `renew` runs them.
                let s = st.load(Ordering::Relaxed);
                st.store(s + 1, Ordering::Release);
                st.store(s + 2, Ordering::Relaxed);
                fence(Ordering::SeqCst);
            }
        }
    }
}

impl Scopes {
    /// The real handshake for `Release` (the scope entry as `enter_rec`
    /// makes it), the old copy for `Relaxed`.
    fn new(enter: Ordering) -> Self {
        match enter {
            Ordering::Relaxed => Self::BeforeFix([AtomicU64::new(0), AtomicU64::new(0)]),
            _ => Self::Current(Rcu::new()),
        }
    }

    /// Enters a scope on the calling thread, reader `r` of the model (the
    /// real `Rcu` finds the thread's record itself).
    fn enter(&self, r: usize) -> InScope<'_> {
        match self {
            Self::Current(rcu) => InScope::Current(Some(rcu.enter())),
            Self::BeforeFix(state) => {
                // The old `enter_rec` at depth 0.
                let st = &state[r];
                let s = st.load(Ordering::Relaxed);
                st.store(s + 1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                InScope::BeforeFix(st)
            }
        }
    }

    /// A grace period.
    fn synchronize(&self) {
        match self {
            Self::Current(rcu) => {
                rcu.synchronize();
            }
            Self::BeforeFix(state) => {
                // `Rcu::synchronize` as it was (and is).
                fence(Ordering::SeqCst);
                let snapshot = state.each_ref().map(|st| st.load(Ordering::SeqCst));
                for (st, s) in state.iter().zip(snapshot) {
                    if s & 1 == 1 {
                        while st.load(Ordering::Acquire) == s {
                            thread::yield_now();
                        }
                    }
                }
            }
        }
    }
}

/// What `access` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Fast path: the object was local and unmarked, at this address.
    Fast(usize),
    /// Slow path: the object was local at this address; any mark was
    /// cleared under `L`.
    Slow(usize),
    /// The word named the far copy (the runtime would swap it in).
    Far,
}

impl Access {
    /// The caller may use the local object until its scope ends.
    fn local(self) -> bool {
        self != Access::Far
    }

    /// The local address used (`None` if far).
    fn addr(self) -> Option<usize> {
        match self {
            Access::Fast(a) | Access::Slow(a) => Some(a),
            Access::Far => None,
        }
    }
}

/// A copy of `Inner::access` + `access_slow` (`runtime/access.rs`) on one
/// word, for a read or a write, without the swap-in; the policy's
/// `on_access` is 255 (CLOCK). The word operations are the same `Slot`
/// calls; the runtime's function needs a whole runtime.
fn access(s: &Slot, write: bool) -> Access {
    let touch = |w: u64| {
        let want = if write { HOT_MASK | DIRTY } else { HOT_MASK };
        if w & want != want {
            s.word.fetch_or((255 << HOT_SHIFT) | (want & DIRTY), Ordering::Relaxed);
        }
    };
    let w = s.word.load(Ordering::Acquire);
    if w & FAST_MASK == PRESENT {
        touch(w);
        return Access::Fast(local_addr(w));
    }
    loop {
        let w = s.word.load(Ordering::Acquire);
        if w & LOCK != 0 {
            thread::yield_now();
            continue;
        }
        if w & PRESENT == 0 {
            return Access::Far;
        }
        if w & SEALED != 0 {
            // Past the grace period the evictor alone decides: wait for it.
            thread::yield_now();
            continue;
        }
        if w & (EVICTING | MOVING) != 0 {
            if s.try_lock_exact(w) {
                let dirty = if write { DIRTY } else { 0 };
                store(
                    &s.word,
                    (w & !(EVICTING | MOVING | HOT_MASK | FRESH)) | (255 << HOT_SHIFT) | dirty,
                );
                return Access::Slow(local_addr(w));
            }
            continue;
        }
        if w & FRESH != 0 {
            // The first dereference after a swap-in (it counts the object as used).
            s.clear_fresh(w);
            continue;
        }
        touch(w);
        return Access::Slow(local_addr(w));
    }
}
