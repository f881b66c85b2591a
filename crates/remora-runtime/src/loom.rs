//! Switches the synchronization primitives the pointer protocol uses between
//! `std` and loom's model-checked versions (`RUSTFLAGS="--cfg loom"`), as
//! tokio's `src/loom` does.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};

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
