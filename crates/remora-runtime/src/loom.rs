//! Switches the synchronization primitives the pointer protocol and the
//! pause gate (`pause_gate.rs`) use between `std` and loom's model-checked
//! versions (`RUSTFLAGS="--cfg loom"`), as
//! tokio's `src/loom` does.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

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
