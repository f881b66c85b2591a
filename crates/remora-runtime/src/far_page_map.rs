//! The far page map (§3.3): far span (region index, first page) → what the
//! span holds and which of its objects are still alive.
//!
//! Lock order: a far span's mutex is taken before any pointer-word lock of
//! its objects (swap-in and dropping a far object both follow it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::pointer::FarLoc;

/// Mutable state of a far span.
pub(crate) struct FarSpanState {
    /// Bit i set: object i is alive.
    pub(crate) live: Vec<u64>,
    /// Number of live objects.
    pub(crate) live_count: u32,
    /// Swapped in (or freed): the entry is stale.
    pub(crate) gone: bool,
    /// When an object swap-in last took an object out of this span.
    pub(crate) object_swapped_in: Option<std::time::Instant>,
}

/// A span in far memory.
pub(crate) struct FarSpan {
    /// Region index.
    pub(crate) region: u16,
    /// First page in the region.
    pub(crate) page: u32,
    /// Length in pages.
    pub(crate) pages: u32,
    /// Size class, or 0 for a dedicated large span.
    pub(crate) class: u8,
    /// Object slots in the span.
    pub(crate) capacity: u32,
    /// Checksum of the span's bytes as written (verified on swap-in).
    pub(crate) checksum: u64,
    state: Mutex<FarSpanState>,
}

impl FarSpan {
    pub(crate) fn new(
        region: u16,
        page: u32,
        pages: u32,
        class: u8,
        capacity: u32,
        live: Vec<u64>,
        checksum: u64,
    ) -> Self {
        let live_count = live.iter().map(|w| w.count_ones()).sum();
        Self {
            region,
            page,
            pages,
            class,
            capacity,
            checksum,
            state: Mutex::new(FarSpanState {
                live,
                live_count,
                gone: false,
                object_swapped_in: None,
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, FarSpanState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The far location of object `i`.
    pub(crate) fn loc(&self, object: u16) -> FarLoc {
        FarLoc {
            region: self.region,
            page: self.page,
            object,
        }
    }

    /// Span length in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.pages as usize * crate::size_classes::PAGE_SIZE
    }
}

/// All far spans.
#[derive(Default)]
pub(crate) struct FarPageMap {
    map: Mutex<HashMap<(u16, u32), Arc<FarSpan>>>,
    /// Kept alongside the map so statistics never take its lock.
    spans: AtomicU64,
    bytes: AtomicU64,
    /// Live objects in the map's spans.
    objects: AtomicU64,
}

impl FarPageMap {
    /// Adds a far span with `live` live objects (its state may be locked
    /// by the caller, so the map does not read it).
    pub(crate) fn insert(&self, s: Arc<FarSpan>, live: u32) {
        let bytes = s.bytes() as u64;
        let objects = u64::from(live);
        let old = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((s.region, s.page), s);
        if old.is_none() {
            self.spans.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
            self.objects.fetch_add(objects, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(&self, region: u16, page: u32) -> Option<Arc<FarSpan>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(region, page))
            .cloned()
    }

    /// Removes a far span that had `live` live objects left (its state is
    /// locked by the caller, so the map does not read it).
    pub(crate) fn remove(&self, region: u16, page: u32, live: u32) {
        let old = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(region, page));
        if let Some(s) = old {
            self.spans.fetch_sub(1, Ordering::Relaxed);
            self.bytes.fetch_sub(s.bytes() as u64, Ordering::Relaxed);
            self.objects.fetch_sub(u64::from(live), Ordering::Relaxed);
        }
    }

    /// One object of a far span in the map was freed.
    pub(crate) fn object_freed(&self) {
        self.objects.fetch_sub(1, Ordering::Relaxed);
    }

    /// Live objects in far spans, without taking the map's lock.
    pub(crate) fn objects(&self) -> u64 {
        self.objects.load(Ordering::Relaxed)
    }

    /// Number of far spans and their bytes, without taking the map's lock.
    pub(crate) fn totals(&self) -> (u64, u64) {
        (self.spans.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }
}
