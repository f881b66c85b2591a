//! The runtime's local object heap: the page heap, one central free list per
//! size class, dedicated spans for large objects, and the registry of spans
//! that eviction sweeps. Adds to the allocator what eviction and swap-in need:
//! pinning a span while it is written out, and adopting a swapped-in span.

use std::sync::{Arc, Mutex};

#[cfg(any(test, feature = "internals"))]
use crate::census::LocalCensus;
use crate::central_freelist::CentralFreeList;
use crate::error::RuntimeError;
use crate::error::{AllocError, FreeError};
use crate::eviction::{EvictionPolicy, Sweep};
use crate::page_heap::{PageHeap, PageHeapConfig};
use crate::size_classes::{ClassIndex, NUM_CLASSES, PAGE_SIZE, SizeClass};
use crate::span::{EVICTING_POS, NOT_LISTED, Span, SpanKind};
pub(crate) use crate::span_registry::SpanRef;
use crate::span_registry::SpanRegistry;

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
    pub(crate) fn new(policy: Arc<dyn EvictionPolicy>) -> Self {
        let pages = Arc::new(PageHeap::new(PageHeapConfig::default()));
        let registry = Arc::new(SpanRegistry::with_policy(policy));
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

    /// Allocates a slot of class `c` and runs `init` on its address while no
    /// eviction thread can look at the span (see [`ObjectHeap::alloc_with`]).
    pub(crate) fn alloc_in_class(&self, c: ClassIndex, init: impl FnOnce(usize)) -> Result<(), RuntimeError> {
        self.class_list(c).alloc_with(init).map(|_| ()).map_err(local)
    }

    /// Allocates `size` bytes and runs `init` on the address while no
    /// eviction thread can look at the span.
    pub(crate) fn alloc_with(&self, size: usize, init: impl FnOnce(usize)) -> Result<(), RuntimeError> {
        match SizeClass::for_object(size) {
            Some(c) => self.alloc_in_class(c, init),
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

    /// Asks the policy for up to `n` victims among the local spans.
    pub(crate) fn pick_cold(&self, policy: &dyn EvictionPolicy, n: usize) -> Vec<SpanRef> {
        let mut ring = self.registry.lock();
        let mut sweep = Sweep::new(&mut ring);
        policy.pick(&mut sweep, n);
        sweep.into_chosen()
    }

    /// As `pick_cold`, among the spans the filtering threads queued as cold
    /// only (`EvictionPolicy::pick_queued`).
    pub(crate) fn pick_queued(&self, policy: &dyn EvictionPolicy, n: usize) -> Vec<SpanRef> {
        let mut ring = self.registry.lock();
        let mut sweep = Sweep::new(&mut ring);
        policy.pick_queued(&mut sweep, n);
        sweep.into_chosen()
    }

    /// Spans in the filtering threads' cold queue (some may have changed since).
    pub(crate) fn cold_queued(&self) -> usize {
        self.registry.lock().cold.len()
    }

    /// For filtering threads: runs `visit` on up to `n` local spans from
    /// `*cursor` on in the registry's ring (a filter's own clock hand, which
    /// it advances), with the registry locked: the spans stay in use while
    /// `visit` reads their objects' headers, as in `pick_cold`. `visit` must
    /// not take a class lock (lock order: class, then registry).
    pub(crate) fn visit_spans(&self, cursor: &mut usize, n: usize, mut visit: impl FnMut(SpanRef)) {
        let ring = self.registry.lock();
        let total = ring.spans.len();
        if total == 0 {
            return;
        }
        let start = *cursor % total;
        for k in 0..n.min(total) {
            visit(ring.spans[(start + k) % total]);
        }
        *cursor = (start + n.min(total)) % total;
    }

    /// Queues spans a filtering thread found all cold for eviction (see
    /// [`SpanRegistry::queue_cold`]).
    pub(crate) fn queue_cold(&self, spans: impl IntoIterator<Item = SpanRef>) {
        self.registry.queue_cold(spans);
    }

    /// Visits those of `spans` that are still registered (under the registry
    /// lock, as [`ObjectHeap::visit_spans`]).
    pub(crate) fn visit_listed(&self, spans: &[SpanRef], mut visit: impl FnMut(SpanRef)) {
        let ring = self.registry.lock();
        for &s in spans {
            if ring.contains(s) {
                visit(s);
            }
        }
    }

    /// A registered span of `class` with room, pinned for a filtering thread
    /// to fill with `hot` or cold objects (see `CentralFreeList::filter_span`).
    pub(crate) fn filter_span(&self, class: ClassIndex, hot: bool) -> Result<SpanRef, RuntimeError> {
        self.class_list(class).filter_span(hot).map(SpanRef::new).map_err(local)
    }

    /// Claims slot `index` of a small span the caller pinned and whose bytes
    /// it has written (a moved object's new home).
    pub(crate) fn claim_pinned(&self, s: SpanRef, index: usize) -> bool {
        match s.get().kind() {
            Some(SpanKind::Small(c)) => self.class_list(c).claim_pinned(s.get(), index),
            _ => false,
        }
    }

    /// The local spans grouped by what they are doing (see [`LocalCensus`]).
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn census(&self) -> LocalCensus {
        LocalCensus::of(&self.registry.lock())
    }

    /// Unpins a small span a filtering thread pinned; true if it was empty
    /// and went back to the page heap (see `CentralFreeList::end_filter`).
    pub(crate) fn end_filter(&self, s: SpanRef, relist: bool) -> bool {
        match s.get().kind() {
            Some(SpanKind::Small(c)) => {
                let released = self.class_list(c).end_filter(s.get(), relist);
                if !released && s.get().is_cold() {
                    self.registry.queue_cold([s]);
                }
                released
            }
            _ => {
                tracing::error!("end_filter on a span that is not a small in-use span");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::census::SpanUse;
    use crate::eviction::Clock;
    use crate::pointer::{Slot, local_word};

    /// Fills `spans` spans of 1 KiB objects; objects of the spans in `hot`
    /// get a set hotness byte. Returns the slots (kept alive by the caller;
    /// boxed because headers name them, so they must not move).
    #[allow(clippy::vec_box)]
    fn fill(heap: &ObjectHeap, spans: usize, hot: &[usize]) -> Vec<Box<Slot>> {
        let mut slots = Vec::new();
        let per_span = PER_SPAN;
        for s in 0..spans {
            for _ in 0..per_span {
                let slot = Box::new(Slot::new(0));
                let h = if hot.contains(&s) { 255 } else { 0 };
                let ptr = &*slot as *const Slot as u64;
                heap.alloc_with(1032, |addr| {
                    // SAFETY: a fresh object slot of the heap.
                    unsafe { &*(addr as *const std::sync::atomic::AtomicU64) }
                        .store(ptr, std::sync::atomic::Ordering::Release);
                    slot.word.store(local_word(addr, 0, h), crate::loom::Ordering::Release);
                })
                .unwrap();
                slots.push(slot);
            }
        }
        slots
    }

    /// Objects of 1 KiB and header per span (the 1152-byte class).
    const PER_SPAN: usize = 7;

    fn span_of_slot(heap: &ObjectHeap, s: &Slot) -> usize {
        let w = s.word.load(crate::loom::Ordering::Relaxed);
        heap.pages.span_of(crate::pointer::local_addr(w)).unwrap().start()
    }

    #[test]
    fn clock_picks_unreferenced_spans_first_then_ages() {
        let heap = ObjectHeap::new(Arc::new(Clock));
        let slots = fill(&heap, 3, &[1]);
        let hot_span = span_of_slot(&heap, &slots[PER_SPAN]);
        let victims = heap.pick_cold(&Clock, 2);
        assert_eq!(victims.len(), 2);
        assert!(
            victims.iter().all(|v| v.get().start() != hot_span),
            "a referenced span was chosen first"
        );
        // The hand aged the hot span as it passed: a full revolution later it
        // is a victim too.
        let again = heap.pick_cold(&Clock, 3);
        assert!(again.iter().any(|v| v.get().start() == hot_span));
        assert!(
            hotness_of(&slots).iter().all(|&h| !Clock.age(h).0),
            "the hand left a reference it passed"
        );
    }

    /// Sets the hotness byte of every object in `slots`.
    fn set_hotness(slots: &[Box<Slot>], h: u8) {
        for s in slots {
            let w = s.word.load(crate::loom::Ordering::Relaxed);
            s.age(w, h);
        }
    }

    fn hotness_of(slots: &[Box<Slot>]) -> Vec<u8> {
        slots
            .iter()
            .map(|s| crate::pointer::hotness(s.word.load(crate::loom::Ordering::Relaxed)))
            .collect()
    }

    #[test]
    fn census_counts_spans_by_use_and_occupancy() {
        let heap = ObjectHeap::new(Arc::new(Clock));
        let slots = fill(&heap, 3, &[]);
        let c = heap.census();
        assert_eq!(
            (c.spans(), c.live(), c.free_slots(), c.cold_queue),
            (3, 3 * PER_SPAN, 0, 0)
        );
        // One span flagged cold and queued; one object of another freed,
        // which puts its span on the class's list with a hole.
        let cold = heap.pages.span_of(span_of_slot(&heap, &slots[2 * PER_SPAN])).unwrap();
        cold.set_cold(true);
        heap.queue_cold([SpanRef::new(cold)]);
        let w = slots[0].word.load(crate::loom::Ordering::Relaxed);
        // SAFETY: the object's header is an atomic word at its start.
        unsafe { &*(crate::pointer::local_addr(w) as *const std::sync::atomic::AtomicU64) }
            .store(0, std::sync::atomic::Ordering::Release);
        heap.free(crate::pointer::local_addr(w));
        let c = heap.census();
        assert_eq!(
            (c.spans(), c.live(), c.free_slots(), c.cold_queue),
            (3, 3 * PER_SPAN - 1, 1, 1)
        );
        let cold_use = SpanUse {
            cold: true,
            kept: false,
            pinned: false,
            listed: false,
        };
        let listed_use = SpanUse {
            listed: true,
            cold: false,
            ..cold_use
        };
        let group = |u: SpanUse| c.groups.iter().find(|g| g.usage == u).copied();
        let g = group(cold_use).expect("a cold group");
        assert_eq!((g.spans, g.live, g.capacity), (1, PER_SPAN, PER_SPAN));
        let g = group(listed_use).expect("a listed group");
        assert_eq!((g.spans, g.live, g.free_slots()), (1, PER_SPAN - 1, 1));
        assert_eq!(g.object_size, 1152);
    }

    #[test]
    fn clock_takes_cold_spans_from_filtering_at_once() {
        let heap = ObjectHeap::new(Arc::new(Clock));
        let slots = fill(&heap, 2, &[0, 1]);
        // Touched since the hand passed, but not since the filter found it cold.
        set_hotness(&slots[..PER_SPAN], 0x0F);
        let cold = heap.pages.span_of(span_of_slot(&heap, &slots[0])).unwrap();
        cold.set_cold(true);
        let victims = heap.pick_cold(&Clock, 1);
        assert_eq!(victims.len(), 1);
        assert_eq!(victims[0].get().start(), cold.start());
    }

    #[test]
    fn queued_cold_spans_go_without_the_hand_aging_hot_ones() {
        let heap = ObjectHeap::new(Arc::new(Clock));
        let slots = fill(&heap, 4, &[0, 1, 2, 3]);
        set_hotness(&slots[3 * PER_SPAN..], 0x0F);
        let cold = heap.pages.span_of(span_of_slot(&heap, &slots[3 * PER_SPAN])).unwrap();
        cold.set_cold(true);
        heap.queue_cold([SpanRef::new(cold)]);
        let hand = heap.registry.lock().hand;
        let victims = heap.pick_cold(&Clock, 1);
        assert_eq!(victims.len(), 1);
        assert_eq!(victims[0].get().start(), cold.start());
        assert_eq!(
            heap.registry.lock().hand,
            hand,
            "the hand moved although the queue had a victim"
        );
        assert!(
            hotness_of(&slots[..3 * PER_SPAN]).iter().all(|&h| h == 0xFF),
            "hot spans were aged"
        );
        assert!(heap.registry.lock().cold.is_empty());
    }

    #[test]
    fn a_cold_span_touched_since_the_filter_is_left_to_the_hand() {
        let heap = ObjectHeap::new(Arc::new(Clock));
        let slots = fill(&heap, 2, &[0]);
        let touched = heap.pages.span_of(span_of_slot(&heap, &slots[0])).unwrap();
        touched.set_cold(true);
        heap.queue_cold([SpanRef::new(touched)]);
        let victims = heap.pick_cold(&Clock, 1);
        assert_eq!(victims.len(), 1);
        assert_ne!(
            victims[0].get().start(),
            touched.start(),
            "a touched cold span went first"
        );
    }

    #[test]
    fn the_filter_and_the_hand_age_their_own_bits() {
        let p = Clock;
        let touched = p.on_access();
        let (referenced, after_hand) = p.age(touched);
        assert!(referenced);
        let (hot, after_filter) = p.filter_age(after_hand);
        assert!(hot, "the hand's pass made the object look cold to the filter");
        assert_eq!(after_filter, 0);
        let (hot, after_filter) = p.filter_age(touched);
        assert!(hot);
        assert!(
            p.age(after_filter).0,
            "the filter's pass made the object look unreferenced to the hand"
        );
        assert_eq!(p.age(0), (false, 0));
        assert_eq!(p.filter_age(0), (false, 0));
    }
}
