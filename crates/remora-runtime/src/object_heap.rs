//! The runtime's local object heap: the page heap, one central free list per
//! size class, dedicated spans for large objects, and the registry of spans
//! that eviction sweeps. Adds to the allocator what eviction and swap-in need:
//! pinning a span while it is written out, and adopting a swapped-in span.

use std::sync::atomic::Ordering as StdOrdering;
use std::sync::{Arc, Mutex};

use crate::central_freelist::CentralFreeList;
use crate::error::RuntimeError;
use crate::eviction::EvictionPolicy;
use crate::page_heap::{PageHeap, PageHeapConfig};
use crate::pointer::{PRESENT, Slot, hotness, local_addr};
use crate::size_classes::{ClassIndex, NUM_CLASSES, PAGE_SIZE, SizeClass};
use crate::span::{EVICTING_POS, NOT_LISTED, Span, SpanKind};
pub(crate) use crate::span_registry::SpanRef;
use crate::span_registry::SpanRegistry;
use crate::{AllocError, FreeError};

/// The local heap of objects.
pub(crate) struct ObjectHeap {
    pages: Arc<PageHeap>,
    classes: Vec<CentralFreeList>,
    /// Serializes state changes of dedicated large spans.
    large: Mutex<()>,
    registry: Arc<SpanRegistry>,
}

fn local(e: AllocError) -> RuntimeError {
    match e {
        AllocError::TooLarge { size } => RuntimeError::TooLarge { size },
        other => RuntimeError::LocalMemory(other.to_string()),
    }
}

impl ObjectHeap {
    pub(crate) fn new() -> Self {
        let pages = Arc::new(PageHeap::new(PageHeapConfig::default()));
        let registry = Arc::new(SpanRegistry::default());
        let classes = (1..NUM_CLASSES)
            .map(|c| {
                CentralFreeList::with_registry(
                    ClassIndex::new(c).expect("valid class"),
                    Arc::clone(&pages),
                    Arc::clone(&registry),
                )
            })
            .collect();
        Self {
            pages,
            classes,
            large: Mutex::new(()),
            registry,
        }
    }

    fn class_list(&self, c: ClassIndex) -> &CentralFreeList {
        &self.classes[c.get() - 1]
    }

    /// Bytes of local spans in use.
    pub(crate) fn bytes_in_use(&self) -> usize {
        self.pages.in_use_bytes()
    }

    /// Allocates `size` bytes and runs `init` on the address while no
    /// eviction thread can look at the span.
    pub(crate) fn alloc_with(&self, size: usize, init: impl FnOnce(usize)) -> Result<(), RuntimeError> {
        match SizeClass::for_size(size) {
            Some(c) => self.class_list(c).alloc_with(init).map(|_| ()).map_err(local),
            None => {
                let pages = size.div_ceil(PAGE_SIZE);
                if pages > crate::pointer::MAX_FAR_PAGE as usize {
                    return Err(RuntimeError::TooLarge { size });
                }
                let _g = self.large.lock().unwrap_or_else(|p| p.into_inner());
                let span = self.pages.alloc_large(pages).map_err(local)?;
                // Initialise, then claim, then register (see `CentralFreeList::alloc_with`).
                init(span.object_addr(0));
                span.claim_slot(0);
                self.registry.add(span);
                Ok(())
            }
        }
    }

    /// Frees the object at `addr`.
    pub(crate) fn free(&self, addr: usize) {
        let Some(span) = self.pages.span_of(addr) else {
            tracing::error!("free of {addr:#x}: not in the local heap");
            return;
        };
        let r = match span.kind() {
            Some(SpanKind::Small(c)) => {
                // SAFETY: the caller holds the object's pointer lock and will not touch it again.
                unsafe { self.class_list(c).free_in_span(span, addr) }
            }
            Some(SpanKind::Large) => self.free_large(span, addr),
            None => Err(FreeError::UnknownPointer(addr)),
        };
        if let Err(e) = r {
            tracing::error!("free of {addr:#x}: {e}");
        }
    }

    fn free_large(&self, span: &Span, addr: usize) -> Result<(), FreeError> {
        let _g = self.large.lock().unwrap_or_else(|p| p.into_inner());
        let i = span.slot_at(addr).ok_or(FreeError::NotObjectStart(addr))?;
        span.free_slot(i).map_err(|_| FreeError::DoubleFree(addr))?;
        if span.list_pos() != EVICTING_POS {
            self.registry.remove(span);
            // SAFETY: its only object was just freed.
            unsafe { self.pages.free_span(span) }?;
        }
        Ok(())
    }

    /// Pins a span for eviction.
    pub(crate) fn begin_evict(&self, s: SpanRef) -> bool {
        let span = s.get();
        match span.kind() {
            Some(SpanKind::Small(c)) => self.class_list(c).begin_evict(span),
            Some(SpanKind::Large) => {
                let _g = self.large.lock().unwrap_or_else(|p| p.into_inner());
                if span.kind() != Some(SpanKind::Large)
                    || span.list_pos() == EVICTING_POS
                    || !self.registry.contains(span)
                    || span.is_empty()
                {
                    return false;
                }
                span.set_list_pos(EVICTING_POS);
                true
            }
            None => false,
        }
    }

    /// Unpins a span after eviction (released if `evicted` or empty).
    pub(crate) fn end_evict(&self, s: SpanRef, evicted: bool) {
        let span = s.get();
        match span.kind() {
            Some(SpanKind::Small(c)) => self.class_list(c).end_evict(span, evicted),
            Some(SpanKind::Large) => {
                let _g = self.large.lock().unwrap_or_else(|p| p.into_inner());
                span.set_list_pos(NOT_LISTED);
                if evicted || span.is_empty() {
                    self.registry.remove(span);
                    // SAFETY: its object is far (or gone) and a grace period has passed.
                    if let Err(e) = unsafe { self.pages.free_span(span) } {
                        tracing::error!("releasing an evicted span: {e}");
                    }
                }
            }
            None => tracing::error!("end_evict on a span that is not in use"),
        }
    }

    /// The slot size of the object at `addr` (0 if it is not in the heap).
    pub(crate) fn object_size_at(&self, addr: usize) -> usize {
        self.pages.span_of(addr).map_or(0, |s| s.object_size())
    }

    /// The in-use span starting at `start`, if there is one.
    pub(crate) fn span_at(&self, start: usize) -> Option<&Span> {
        self.pages
            .span_of(start)
            .filter(|s| s.start() == start && s.kind().is_some())
    }

    /// The code recorded in far metadata for a span's kind: its class, or 0 for large.
    pub(crate) fn class_code(&self, span: &Span) -> u8 {
        match span.kind() {
            Some(SpanKind::Small(c)) => c.get() as u8,
            _ => 0,
        }
    }

    /// A fresh span to swap into (not yet visible to anyone).
    pub(crate) fn new_span(&self, class: u8, pages: usize) -> Result<SpanRef, RuntimeError> {
        let span = if class == 0 {
            self.pages.alloc_large(pages).map_err(local)?
        } else {
            let c = ClassIndex::new(class as usize).ok_or(RuntimeError::LocalMemory("bad class".into()))?;
            self.pages.alloc_small(c).map_err(local)?
        };
        Ok(SpanRef::new(span))
    }

    /// Gives back a span from `new_span` that was never published.
    pub(crate) fn discard_span(&self, s: SpanRef) {
        // SAFETY: the span was never published; nothing refers to its memory.
        if let Err(e) = unsafe { self.pages.free_span(s.get()) } {
            tracing::error!("discarding a span: {e}");
        }
    }

    /// Publishes a swapped-in span with objects at `live`, running `fix`
    /// (which points their words at it) before anyone can evict or free it.
    pub(crate) fn adopt_span(&self, s: SpanRef, live: &[usize], fix: impl FnOnce(&Span)) {
        let span = s.get();
        match span.kind() {
            Some(SpanKind::Small(c)) => self.class_list(c).adopt(span, live, fix),
            _ => {
                let _g = self.large.lock().unwrap_or_else(|p| p.into_inner());
                for &i in live {
                    span.claim_slot(i);
                }
                self.registry.add(span);
                fix(span);
            }
        }
    }

    /// Sweeps the clock hand over a window of spans: ranks each by the
    /// policy (aging its objects' hotness as it goes) and returns up to `n`
    /// of the coldest.
    pub(crate) fn pick_cold(&self, policy: &dyn EvictionPolicy, n: usize) -> Vec<SpanRef> {
        let mut ring = self.registry.lock();
        let total = ring.spans.len();
        if total == 0 {
            return Vec::new();
        }
        let window = (n * 8).max(64).min(total);
        let mut scored: Vec<(f64, SpanRef)> = Vec::with_capacity(window);
        let mut hot = Vec::new();
        for k in 0..window {
            let s = ring.spans[(ring.hand + k) % total];
            let span = s.get();
            if span.list_pos() == EVICTING_POS || span.is_empty() {
                continue;
            }
            hot.clear();
            for i in 0..span.capacity() {
                if !span.is_allocated(i) {
                    continue;
                }
                let addr = span.object_addr(i);
                // SAFETY: an allocated slot of a registered span; headers are
                // read atomically and may be stale (hotness is advisory).
                let h = unsafe { &*(addr as *const std::sync::atomic::AtomicU64) }.load(StdOrdering::Acquire);
                let Some(slot) = slot_of(h) else { continue };
                let w = slot.word.load(crate::loom::Ordering::Relaxed);
                if w & PRESENT == 0 || local_addr(w) != addr {
                    continue;
                }
                let hv = hotness(w);
                hot.push(hv);
                slot.age(w, policy.age(hv));
            }
            scored.push((policy.span_score(&hot, span.object_size()), s));
        }
        ring.hand = (ring.hand + window) % total.max(1);
        drop(ring);
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        scored.into_iter().take(n).map(|(_, s)| s).collect()
    }
}

/// The slot a header names, if any.
fn slot_of<'a>(header: u64) -> Option<&'a Slot> {
    // SAFETY: a non-null header names a slot in a chunk that lives as long
    // as the runtime; a stale one still points at a valid (reused) slot.
    unsafe { (header as *const Slot).as_ref() }
}
