//! Switches the synchronization primitives the pointer protocol, the deref
//! scopes (`scope.rs`) and the pause gate (`pause_gate.rs`) use between
//! `std` and loom's model-checked versions (`RUSTFLAGS="--cfg loom"`), as
//! tokio's `src/loom` does, so the loom models (`loom_models`) run the
//! crate's own code. Without `cfg(loom)` every name is the `std` one.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex};

// Loom runs its threads on one OS thread: a std mutex held across a loom
// step would deadlock it (and `scope.rs` takes loom's `thread_local!`: a
// std one would be shared by all of them).
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

/// Hints the CPU that this is a short busy-wait.
#[cfg(not(loom))]
pub(crate) fn spin_hint() {
    std::hint::spin_loop();
}

/// Yields to loom's scheduler (a spin that never yields would not end).
#[cfg(loom)]
pub(crate) fn spin_hint() {
    loom::thread::yield_now();
}

/// Yields the CPU while spinning on a contended pointer lock.
#[cfg(not(loom))]
pub(crate) fn spin_yield() {
    std::thread::yield_now();
}

/// Yields to loom's scheduler while spinning.
#[cfg(loom)]
pub(crate) fn spin_yield() {
    loom::thread::yield_now();
}

/// A `Release` store to an atomic that other threads update with
/// read-modify-writes (a pointer word: [`crate::pointer::Slot::unlock_with`]).
#[cfg(not(loom))]
#[inline]
pub(crate) fn store_release(a: &AtomicU64, v: u64) {
    a.store(v, Ordering::Release);
}

/// Under loom the store is a `swap` with the same ordering: loom 0.7 lets
/// a plain store land between the read and the write of a concurrent RMW on
/// the same atomic (tokio-rs/loom#254, fix pending in #391), so the RMW
/// overwrites a store it never read, which neither hardware nor the C++
/// memory model allows (the models then report, e.g., a word left locked
/// by a stale mark's `fetch_and` that read it locked). The swap keeps loom
/// to possible histories; it differs from the store only in continuing the
/// release sequences of earlier release writes to the word, as the models'
/// own copies of these stores always did.
#[cfg(loom)]
pub(crate) fn store_release(a: &AtomicU64, v: u64) {
    a.swap(v, Ordering::Release);
}

/// Waits a little for background work to finish (a pause waiting for a
/// round in flight).
#[cfg(not(loom))]
pub(crate) fn nap() {
    std::thread::sleep(std::time::Duration::from_millis(1));
}

/// Yields to loom's scheduler while waiting.
#[cfg(loom)]
pub(crate) fn nap() {
    loom::thread::yield_now();
}

/// Loom's `Arc`, whose count's release and acquire the model sees (a
/// `strong_count` read acquires, as `Rcu`'s fence after it does), made safe
/// to drop after a model failed: loom drops thread-locals once the failed
/// execution is over, where a loom step would abort the test run.
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct Arc<T>(Option<loom::sync::Arc<T>>);

#[cfg(loom)]
impl<T> Arc<T> {
    pub(crate) fn new(v: T) -> Self {
        Self(Some(loom::sync::Arc::new(v)))
    }

    fn get(this: &Self) -> &loom::sync::Arc<T> {
        this.0.as_ref().expect("taken only on drop")
    }

    pub(crate) fn strong_count(this: &Self) -> usize {
        loom::sync::Arc::strong_count(Self::get(this))
    }
}

#[cfg(loom)]
impl<T> Clone for Arc<T> {
    fn clone(&self) -> Self {
        Self(Some(loom::sync::Arc::clone(Self::get(self))))
    }
}

#[cfg(loom)]
impl<T> std::ops::Deref for Arc<T> {
    type Target = T;

    fn deref(&self) -> &T {
        Self::get(self)
    }
}

#[cfg(loom)]
impl<T> Drop for Arc<T> {
    fn drop(&mut self) {
        if let Some(a) = self.0.take()
            && std::thread::panicking()
        {
            std::mem::forget(a);
        }
    }
}
