//! The lifecycle part of the runtime: whether it is stopping, and whether
//! the manager expired its session.

use std::sync::atomic::{AtomicBool, Ordering as StdOrdering};

/// The runtime's stop flag and its session's expiry.
#[derive(Default)]
pub(super) struct Lifecycle {
    /// The handle was dropped: background threads and waits end.
    stop: AtomicBool,
    /// The manager expired our session: far memory is gone.
    expired: AtomicBool,
}

impl Lifecycle {
    /// Tells background threads and waits to end.
    pub(super) fn stop(&self) {
        self.stop.store(true, StdOrdering::Release);
    }

    #[inline]
    pub(super) fn stopping(&self) -> bool {
        self.stop.load(StdOrdering::Acquire)
    }

    /// The manager declared this compute node dead.
    pub(super) fn expire(&self) {
        self.expired.store(true, StdOrdering::Release);
    }

    #[inline]
    pub(super) fn expired(&self) -> bool {
        self.expired.load(StdOrdering::Acquire)
    }
}
