//! The counters the runtime's paths bump, one method per event; `Inner::stats`
//! (in `stats.rs`) reads them into [`crate::Stats`].

use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};

/// Counters the runtime's paths bump (relaxed: they are statistics).
#[derive(Default)]
pub(super) struct Counters {
    swap_ins: AtomicU64,
    swap_outs: AtomicU64,
    aborted: AtomicU64,
    evicted_bytes: AtomicU64,
    deref_misses: AtomicU64,
    object_swap_ins: AtomicU64,
    swap_in_bytes: AtomicU64,
    swap_in_used_bytes: AtomicU64,
    room_wait_ns: AtomicU64,
    evict_busy_ns: AtomicU64,
    clean_evictions: AtomicU64,
    clean_bytes_saved: AtomicU64,
    objects_moved: AtomicU64,
    objects_moved_hot: AtomicU64,
    spans_filtered: AtomicU64,
    given_back: AtomicU64,
}

/// The counters' values at one moment (each read on its own).
pub(super) struct Counted {
    pub(super) swap_ins: u64,
    pub(super) swap_outs: u64,
    pub(super) aborted: u64,
    pub(super) evicted_bytes: u64,
    pub(super) deref_misses: u64,
    pub(super) object_swap_ins: u64,
    pub(super) swap_in_bytes: u64,
    pub(super) swap_in_used_bytes: u64,
    pub(super) room_wait_ns: u64,
    pub(super) evict_busy_ns: u64,
    pub(super) clean_evictions: u64,
    pub(super) clean_bytes_saved: u64,
    pub(super) objects_moved: u64,
    pub(super) objects_moved_hot: u64,
    pub(super) spans_filtered: u64,
    pub(super) given_back: u64,
}

/// Each method counts one event where it happens; `Inner::stats` reads them.
impl Counters {
    #[inline]
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, StdOrdering::Relaxed);
    }

    /// A dereference waited for a swap-in (its own or another thread's).
    #[inline]
    pub(super) fn deref_missed(&self) {
        Self::add(&self.deref_misses, 1);
    }

    /// A swap-in read `bytes` of far span.
    #[inline]
    pub(super) fn swapped_in(&self, bytes: u64) {
        Self::add(&self.swap_ins, 1);
        Self::add(&self.swap_in_bytes, bytes);
    }

    /// Of the swap-ins, one that brought back only the object asked for.
    #[inline]
    pub(super) fn object_swapped_in(&self) {
        Self::add(&self.object_swap_ins, 1);
    }

    /// A swapped-in object of `bytes` was dereferenced while its span was local.
    #[inline]
    pub(super) fn swapped_in_used(&self, bytes: u64) {
        Self::add(&self.swap_in_used_bytes, bytes);
    }

    /// An application thread waited this long for local room.
    pub(super) fn room_waited(&self, waited: std::time::Duration) {
        Self::add(&self.room_wait_ns, waited.as_nanos() as u64);
    }

    /// An eviction round took this long.
    pub(super) fn evicting_took(&self, busy: std::time::Duration) {
        Self::add(&self.evict_busy_ns, busy.as_nanos() as u64);
    }

    /// An eviction was abandoned (an application thread touched the span).
    pub(super) fn eviction_aborted(&self) {
        Self::add(&self.aborted, 1);
    }

    /// A clean span went without a write, saving `bytes`.
    pub(super) fn evicted_clean(&self, bytes: u64) {
        Self::add(&self.clean_evictions, 1);
        Self::add(&self.clean_bytes_saved, bytes);
    }

    /// A span was swapped out, writing `bytes` of data span (0 when clean).
    pub(super) fn swapped_out(&self, bytes: u64) {
        Self::add(&self.swap_outs, 1);
        if bytes > 0 {
            Self::add(&self.evicted_bytes, bytes);
        }
    }

    /// Filtering moved an object, into a hot span or a cold one.
    pub(super) fn object_moved(&self, hot: bool) {
        Self::add(&self.objects_moved, 1);
        if hot {
            Self::add(&self.objects_moved_hot, 1);
        }
    }

    /// Filtering emptied and freed a local span.
    pub(super) fn span_filtered(&self) {
        Self::add(&self.spans_filtered, 1);
    }

    /// Empty regions of `bytes` went back to the manager.
    pub(super) fn gave_back(&self, bytes: u64) {
        Self::add(&self.given_back, bytes);
    }

    /// Reads every counter.
    pub(super) fn read(&self) -> Counted {
        let get = |a: &AtomicU64| a.load(StdOrdering::Relaxed);
        Counted {
            swap_ins: get(&self.swap_ins),
            swap_outs: get(&self.swap_outs),
            aborted: get(&self.aborted),
            evicted_bytes: get(&self.evicted_bytes),
            deref_misses: get(&self.deref_misses),
            object_swap_ins: get(&self.object_swap_ins),
            swap_in_bytes: get(&self.swap_in_bytes),
            swap_in_used_bytes: get(&self.swap_in_used_bytes),
            room_wait_ns: get(&self.room_wait_ns),
            evict_busy_ns: get(&self.evict_busy_ns),
            clean_evictions: get(&self.clean_evictions),
            clean_bytes_saved: get(&self.clean_bytes_saved),
            objects_moved: get(&self.objects_moved),
            objects_moved_hot: get(&self.objects_moved_hot),
            spans_filtered: get(&self.spans_filtered),
            given_back: get(&self.given_back),
        }
    }
}
