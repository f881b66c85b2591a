//! Deref scopes and grace periods: the RCU-like half of the pointer protocol
//! (see [`crate::pointer`] for the other half).
//!
//! An application thread may use a `&T` obtained from a remotable pointer only
//! while it is inside a [`crate::DerefScope`]; the borrow checker enforces this, as
//! the reference borrows the scope. Entering a scope is a store and a fence.
//! A background thread that wants to take objects away sets their `E`/`M`
//! bits and then waits for a *grace period*: until every thread that was
//! inside a scope at that moment has left it (or renewed it). Threads
//! entering later see the bits and take the slow path.
//!
//! A thread must not wait for eviction while inside a scope (the evictor may
//! be waiting for that very scope to end), so allocation and swap-in never
//! block on memory pressure inside a scope: the local budget is a soft limit
//! that the eviction threads restore. Long loops should call
//! [`crate::DerefScope::renew`] now and then so eviction can make progress.
//!
//! A swap-in's waits on the network run *outside* the scope when the scope is
//! the outermost one and has handed out no reference yet
//! (`ScopeGuard::step_out`): such a thread holds nothing a grace period
//! protects, so grace periods need not wait tens of microseconds for the
//! network. Only the waits: from the moment a swapped-in span is published
//! the evictor may pick it, and the rest of the swap-in uses it, so that part
//! runs inside the scope again. The deref that follows reloads the word.
//!
//! The registry, the records and their thread-local go through
//! `crate::loom`, so the loom models (`loom_models`) run this code itself.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicUsize};
use std::time::{Duration, Instant};

use crate::loom::{Arc, AtomicU64, Mutex, Ordering, fence, spin_hint, spin_yield};

/// One thread's scope state for one runtime.
#[derive(Debug, Default)]
pub(crate) struct ThreadRec {
    /// Odd while inside a scope; incremented on every entry and exit, so a
    /// grace period can tell "still in the same scope" from "in a new one".
    state: AtomicU64,
    /// Nesting depth; only its own thread touches it.
    depth: AtomicU32,
}

/// The registry of threads that have entered scopes of one runtime.
#[derive(Debug)]
pub(crate) struct Rcu {
    id: usize,
    threads: Mutex<Vec<Arc<ThreadRec>>>,
}

static NEXT_RCU_ID: AtomicUsize = AtomicUsize::new(1);

#[cfg(not(loom))]
thread_local! {
    /// This thread's records, one per runtime it has used.
    static RECS: RefCell<Vec<(usize, Arc<ThreadRec>)>> = const { RefCell::new(Vec::new()) };
}

// Loom runs its threads on one OS thread, so each needs loom's thread-local.
#[cfg(loom)]
loom::thread_local! {
    static RECS: RefCell<Vec<(usize, Arc<ThreadRec>)>> = RefCell::new(Vec::new());
}

impl Rcu {
    pub(crate) fn new() -> Self {
        Self {
            id: NEXT_RCU_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            threads: Mutex::new(Vec::new()),
        }
    }

    fn rec(&self) -> Arc<ThreadRec> {
        RECS.with(|r| {
            let mut r = r.borrow_mut();
            if let Some((_, rec)) = r.iter().find(|(id, _)| *id == self.id) {
                return Arc::clone(rec);
            }
            let rec = Arc::new(ThreadRec::default());
            let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            // Forget threads that have exited (only the registry still holds them).
            let known = threads.len();
            threads.retain(|t| Arc::strong_count(t) > 1);
            if threads.len() < known {
                // A grace period that no longer sees a forgotten thread's
                // record must still come after its last scope, which loading
                // its even state used to give. The count's last drop was a
                // release: acquire it (then the registry's lock passes it on).
                // The loom models found this.
                fence(Ordering::Acquire);
            }
            threads.push(Arc::clone(&rec));
            r.push((self.id, Arc::clone(&rec)));
            rec
        })
    }

    /// True if the calling thread is inside a scope of this runtime.
    pub(crate) fn in_scope(&self) -> bool {
        RECS.with(|r| {
            r.borrow()
                .iter()
                .any(|(id, rec)| *id == self.id && rec.depth.load(std::sync::atomic::Ordering::Relaxed) > 0)
        })
    }

    /// Enters a scope on the calling thread.
    pub(crate) fn enter(&self) -> ScopeGuard<'_> {
        let rec = self.rec();
        enter_rec(&rec);
        ScopeGuard {
            _rcu: PhantomData,
            rec,
            _not_send: PhantomData,
        }
    }

    /// Waits until every thread that is inside a scope now has left it.
    /// Returns how long that took.
    pub(crate) fn synchronize(&self) -> Duration {
        let start = Instant::now();
        fence(Ordering::SeqCst);
        let snapshot: Vec<(Arc<ThreadRec>, u64)> = {
            let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            threads
                .iter()
                .filter_map(|t| {
                    let s = t.state.load(Ordering::SeqCst);
                    (s & 1 == 1).then(|| (Arc::clone(t), s))
                })
                .collect()
        };
        for (t, s) in snapshot {
            let mut spins = 0u32;
            while t.state.load(Ordering::Acquire) == s {
                spins += 1;
                if spins < 64 {
                    spin_hint();
                } else {
                    spin_yield();
                }
            }
        }
        start.elapsed()
    }
}

fn enter_rec(rec: &ThreadRec) {
    let d = rec.depth.load(std::sync::atomic::Ordering::Relaxed);
    rec.depth.store(d + 1, std::sync::atomic::Ordering::Relaxed);
    if d == 0 {
        let s = rec.state.load(Ordering::Relaxed);
        debug_assert_eq!(s & 1, 0);
        // Release: a grace period that sees this odd state (rather than the
        // even one before it) must also see everything the previous scope
        // did, which `renew` makes the common case. Free on x86.
        rec.state.store(s + 1, Ordering::Release);
        // Pairs with the fence in `synchronize`: either the marker sees us
        // inside, or we see its marks on the words we load next.
        fence(Ordering::SeqCst);
    }
}

fn exit_rec(rec: &ThreadRec) {
    let d = rec.depth.load(std::sync::atomic::Ordering::Relaxed);
    rec.depth.store(d - 1, std::sync::atomic::Ordering::Relaxed);
    if d == 1 {
        let s = rec.state.load(Ordering::Relaxed);
        rec.state.store(s + 1, Ordering::Release);
    }
}

/// One thread's presence in a scope; the public face is [`crate::DerefScope`].
#[derive(Debug)]
pub(crate) struct ScopeGuard<'rt> {
    _rcu: PhantomData<&'rt Rcu>,
    rec: Arc<ThreadRec>,
    _not_send: PhantomData<*const ()>,
}

impl ScopeGuard<'_> {
    /// Leaves and re-enters the scope so background threads can make
    /// progress. Taking `&mut self` proves no reference from it is alive.
    pub(crate) fn renew(&mut self) {
        let d = self.rec.depth.load(std::sync::atomic::Ordering::Relaxed);
        if d == 1 {
            exit_rec(&self.rec);
            enter_rec(&self.rec);
        }
    }
}

impl ScopeGuard<'_> {
    /// Runs `f` (a blocking wait, e.g. a swap-in's remote read) outside the
    /// scope when that is safe, so grace periods do not wait for it.
    ///
    /// `held` says whether this scope has handed out any reference. With
    /// none, and this the outermost scope, the thread holds no reference a
    /// grace period protects: exactly the state `renew` proves with
    /// `&mut self`. The caller must reload any pointer word after `f`: marks
    /// set while the thread was out are not covered by its earlier loads.
    pub(crate) fn step_out<R>(&self, held: bool, f: impl FnOnce() -> R) -> R {
        let quiet = !held && self.rec.depth.load(std::sync::atomic::Ordering::Relaxed) == 1;
        if !quiet {
            return f();
        }
        /// Re-enters on the way out, also when `f` unwinds (the guard's drop
        /// would otherwise leave a scope it is not in).
        struct Reenter<'a>(&'a ThreadRec);
        impl Drop for Reenter<'_> {
            fn drop(&mut self) {
                enter_rec(self.0);
            }
        }
        exit_rec(&self.rec);
        let _back = Reenter(&self.rec);
        f()
    }
}

impl Drop for ScopeGuard<'_> {
    fn drop(&mut self) {
        exit_rec(&self.rec);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn grace_period_waits_for_readers_inside() {
        let rcu = Arc::new(Rcu::new());
        let inside = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (r2, i2, rel2) = (Arc::clone(&rcu), Arc::clone(&inside), Arc::clone(&release));
        let t = std::thread::spawn(move || {
            let _s = r2.enter();
            i2.store(true, std::sync::atomic::Ordering::SeqCst);
            while !rel2.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::yield_now();
            }
        });
        while !inside.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let (r3, done) = (Arc::clone(&rcu), Arc::new(AtomicBool::new(false)));
        let d2 = Arc::clone(&done);
        let waiter = std::thread::spawn(move || {
            r3.synchronize();
            d2.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(std::sync::atomic::Ordering::SeqCst),
            "grace period ended with a reader inside"
        );
        release.store(true, std::sync::atomic::Ordering::SeqCst);
        t.join().unwrap();
        waiter.join().unwrap();
        assert!(done.load(std::sync::atomic::Ordering::SeqCst));
    }

    /// Whether a grace period started now on another thread ends within 200 ms.
    fn grace_period_ends(rcu: &Arc<Rcu>) -> bool {
        let r = Arc::clone(rcu);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            r.synchronize();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_millis(200)).is_ok()
    }

    #[test]
    fn step_out_leaves_the_scope_only_while_nothing_is_held() {
        let rcu = Arc::new(Rcu::new());
        // Nothing handed out: the wait runs outside the scope.
        let s = rcu.enter();
        assert!(
            s.step_out(false, || grace_period_ends(&rcu)),
            "a grace period waited for a thread that held nothing"
        );
        assert!(!grace_period_ends(&rcu), "step_out did not re-enter the scope");
        // A reference was handed out: the thread must stay inside.
        assert!(
            !s.step_out(true, || grace_period_ends(&rcu)),
            "stepped out while holding a reference"
        );
        drop(s);
        // A nested scope: the outer one may hold references.
        let outer = rcu.enter();
        let inner = rcu.enter();
        assert!(
            !inner.step_out(false, || grace_period_ends(&rcu)),
            "stepped out of a nested scope"
        );
        drop(inner);
        drop(outer);
        // A fresh outermost scope starts with nothing handed out.
        let s = rcu.enter();
        assert!(s.step_out(false, || grace_period_ends(&rcu)));
    }

    #[test]
    fn nested_scopes_and_renew() {
        let rcu = Rcu::new();
        assert!(!rcu.in_scope());
        let mut a = rcu.enter();
        {
            let _b = rcu.enter();
            assert!(rcu.in_scope());
        }
        assert!(rcu.in_scope());
        a.renew();
        assert!(rcu.in_scope());
        drop(a);
        assert!(!rcu.in_scope());
        // No reader inside: returns at once.
        rcu.synchronize();
    }
}
