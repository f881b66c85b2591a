//! Loom models of the pointer protocol, the move and the pause gate, run
//! on the crate's own code: the word transitions are [`Slot`]'s methods,
//! the access barrier is [`Slot::fast_path`] and [`Slot::slow_path`] (what
//! `runtime/access.rs` `Inner::access` runs), the dropper's are
//! [`Slot::lock_for_free`] and [`Slot::reset`] (what `runtime/free.rs`
//! `free_one` and the slot table run), the evictor's word steps are
//! [`crate::pointer::evict`]'s `mark`, `seal`, `lock_sealed`, `commit_far`
//! and `unmark` (what `runtime/evictor.rs` `evict_round` runs), the deref
//! scopes and grace periods are [`Rcu`] (`scope.rs`), the move is
//! [`Slot::move_marked`] (what `runtime/filtering.rs` `move_object` runs),
//! and the gate is [`crate::pause_gate::PauseGate`]. Under `--cfg loom`
//! their atomics, mutex and thread-locals are loom's (`crate::loom`).
//!
//! What the runtime does around those functions and loom cannot run stays
//! in the models as a stand-in: the swap-in of a far span (a network read;
//! `access` returns [`Access::Far`] where the runtime would swap in and run
//! the slow path again), reading object headers in span memory
//! (`mark_span`'s `slot_of`), the swap-out and the far page map (a write
//! of the object's cell, published before `commit_far`), the dropper's
//! heap free and far-map update. Still a copy here, in clearly labelled
//! `should_panic` tests: the old steps the models caught (`BEFORE_FIXES`,
//! the copy-first move, the gate with its steps swapped).
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

use crate::pointer::{LOCK, Slot, Slow};
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

/// A release store to a word that other threads update with RMWs, as
/// [`Slot::unlock_with`] makes it: [`crate::loom::store_release`], a
/// `swap` under loom (which would otherwise report impossible histories,
/// tokio-rs/loom#254). For the models' own stores (a dropper's reset of
/// the slot, a new tenant, the old steps of `BEFORE_FIXES`).
fn store(word: &AtomicU64, v: u64) {
    debug_assert_eq!(v & LOCK, 0);
    crate::loom::store_release(word, v);
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

/// The policy's `on_access` in the models (CLOCK's).
const ON_ACCESS: u8 = 255;

/// The access barrier on one word, for a read or a write, as
/// `Inner::access` runs it (`runtime/access.rs`): [`Slot::fast_path`], else
/// [`Slot::slow_path`]. Where the runtime swaps a far span in and runs the
/// slow path again, this returns [`Access::Far`].
fn access(s: &Slot, write: bool) -> Access {
    if let Some(addr) = s.fast_path(write, || ON_ACCESS) {
        return Access::Fast(addr);
    }
    match s.slow_path(write, || ON_ACCESS, |_| {}) {
        Slow::Local(addr) => Access::Slow(addr),
        Slow::Far(_) => Access::Far,
    }
}
