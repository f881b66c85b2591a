//! Central free lists: per size class, the spans that still have free object slots (paper
//! §3.3, the "global cache of free lists, with each list having its own spinlock").
//!
//! ```text
//!   CentralFreeList (class c)          spans of class c
//!   +--------------------------+
//!   | Mutex {                  |       listed:   [S7] [S2] [S9]   (>= 1 free slot each;
//!   |   nonempty: [S7, S2, S9] | ----> each span's `list_pos` is its index here)
//!   |   spans: 5, live: 1234   |       unlisted: [S4] [S5]        (full)
//!   | }                        |
//!   +--------------------------+
//! ```
//!
//! Allocation takes a slot from the most recently listed span, asking the page heap for a
//! fresh span when none is listed; a span that fills up leaves the list. Freeing puts a full
//! span back on the list and gives a span whose last object was freed back to the page heap
//! at once. Each class has its own lock, taken before the page-heap lock and never the other
//! way round; finding an object's span is a lock-free page-map lookup. There is no per-thread
//! cache in front of these lists (the paper has one).

#[cfg(test)]
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{AllocError, FreeError};
use crate::page_heap::{PageHeap, SpanPtr};
use crate::size_classes::ClassIndex;
use crate::span::{EVICTING_POS, NOT_LISTED, SlotError, Span, SpanKind};
use crate::span_registry::SpanRegistry;

/// A snapshot of one class's accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClassStats {
    /// Spans of this class taken from the page heap and not yet returned.
    pub spans: usize,
    /// Spans with at least one free slot.
    pub partial_spans: usize,
    /// Objects allocated and not freed.
    pub live_objects: usize,
    /// Free slots in this class's spans.
    pub free_slots: usize,
}

struct ListState {
    nonempty: Vec<SpanPtr>,
    spans: usize,
    live: usize,
}

/// The central free list of one size class.
pub(crate) struct CentralFreeList {
    class: ClassIndex,
    kind: SpanKind,
    heap: Arc<PageHeap>,
    registry: Arc<SpanRegistry>,
    state: Mutex<ListState>,
}

impl std::fmt::Debug for CentralFreeList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CentralFreeList")
            .field("class", &self.class)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl CentralFreeList {
    /// An empty list for `class`, taking spans from `heap`.
    #[cfg(test)]
    pub(crate) fn new(class: ClassIndex, heap: Arc<PageHeap>) -> Self {
        Self::with_registry(class, heap, Arc::new(SpanRegistry::default()))
    }

    /// An empty list for `class` that records its spans in `registry` (where
    /// eviction looks for cold spans).
    pub(crate) fn with_registry(class: ClassIndex, heap: Arc<PageHeap>, registry: Arc<SpanRegistry>) -> Self {
        Self {
            class,
            kind: SpanKind::Small(class),
            heap,
            registry,
            state: Mutex::new(ListState {
                nonempty: Vec::new(),
                spans: 0,
                live: 0,
            }),
        }
    }

    /// The page heap spans come from.
    #[cfg(test)]
    pub(crate) fn page_heap(&self) -> &Arc<PageHeap> {
        &self.heap
    }

    fn lock(&self) -> MutexGuard<'_, ListState> {
        // A panic mid-update may leave a span listed twice or a full span listed; allocating
        // from such a list could hand out a live slot, so poisoning is fatal.
        self.state.lock().expect("central free list lock poisoned")
    }

    /// Allocates one object of this class. Its bytes are uninitialised.
    ///
    /// # Errors
    /// Whatever the page heap reports when a fresh span is needed (budget, `mmap`).
    #[cfg(test)]
    pub(crate) fn alloc(&self) -> Result<NonNull<u8>, AllocError> {
        let addr = self.alloc_with(|_| {})?;
        Ok(NonNull::new(addr as *mut u8).expect("spans never start at address 0"))
    }

    /// Frees the object at `ptr`.
    ///
    /// # Safety
    /// `ptr` must have come from [`CentralFreeList::alloc`] on this list (or an equivalent
    /// path of the same heap) and not been freed since; nothing may use the object afterwards.
    ///
    /// # Errors
    /// Misuse that can be detected: a pointer outside this class's spans, not at an object's
    /// start, or to a free slot. Nothing changes then.
    #[cfg(test)]
    pub(crate) unsafe fn free(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        let addr = ptr.as_ptr() as usize;
        let span = self.heap.span_of(addr).ok_or(FreeError::UnknownPointer(addr))?;
        // SAFETY: forwarded from the caller.
        unsafe { self.free_in_span(span, addr) }
    }

    /// Frees the object at `addr`, already looked up as lying in `span`.
    ///
    /// # Safety
    /// As [`CentralFreeList::free`].
    pub(crate) unsafe fn free_in_span(&self, span: &Span, addr: usize) -> Result<(), FreeError> {
        let mut st = self.lock();
        // Spans of this class are created and retired under this lock, so the check holds
        // for as long as we keep it.
        if span.kind() != Some(self.kind) || !span.contains(addr) {
            return Err(FreeError::UnknownPointer(addr));
        }
        let index = span.slot_at(addr).ok_or(FreeError::NotObjectStart(addr))?;
        span.free_slot(index).map_err(|e| match e {
            SlotError::AlreadyFree(_) => FreeError::DoubleFree(addr),
            SlotError::OutOfRange { .. } => FreeError::NotObjectStart(addr),
        })?;
        st.live -= 1;
        if span.list_pos() == EVICTING_POS {
            // Pinned by an eviction thread; `end_evict` decides its fate.
        } else if span.is_empty() {
            self.unlist(&mut st, span);
            st.spans -= 1;
            self.registry.remove(span);
            // Unlisted and without objects, the span is unreachable from this class, so it
            // can go back without our lock held.
            drop(st);
            // SAFETY: the span has no allocated slot, so no live object is in its memory.
            unsafe { self.heap.free_span(span) }.expect("an in-use span of this heap is accepted by it");
        } else if span.list_pos() == NOT_LISTED && !span.is_cold() {
            // (A cold span stays off the list: filtering keeps it for cold objects.)
            push(&mut st, span);
        }
        Ok(())
    }

    /// Allocates one object and runs `init` on its address while the class
    /// lock is held, so an eviction thread never sees a slot that is
    /// allocated but not yet initialised.
    pub(crate) fn alloc_with(&self, init: impl FnOnce(usize)) -> Result<usize, AllocError> {
        let mut st = self.lock();
        let span = match st.nonempty.last() {
            Some(&ptr) => self.heap.span(ptr),
            None => {
                let span = self.heap.alloc_small(self.class)?;
                st.spans += 1;
                push(&mut st, span);
                self.registry.add(span);
                span
            }
        };
        // Initialise first, claim second: the eviction sweep reads the
        // header of every claimed slot without this lock, so a claimed slot
        // must never show stale bytes from the span's previous life.
        let index = span
            .first_free()
            .expect("a listed span has a free slot (slots change only under this lock)");
        let addr = span.object_addr(index);
        init(addr);
        let claimed = span.claim_slot(index);
        debug_assert!(claimed, "slots are claimed only under this lock");
        st.live += 1;
        if span.is_full() {
            self.unlist(&mut st, span);
        }
        Ok(addr)
    }

    /// Pins `span` for eviction: no allocation from it, no release of it.
    /// False if it is not an in-use span of this class or already pinned.
    pub(crate) fn begin_evict(&self, span: &Span) -> bool {
        let mut st = self.lock();
        if span.kind() != Some(self.kind) || span.list_pos() == EVICTING_POS || !self.registry.contains(span) {
            return false;
        }
        self.unlist(&mut st, span);
        span.set_list_pos(EVICTING_POS);
        true
    }

    /// Ends an eviction: `evicted` spans (their objects now far) go back to
    /// the page heap; aborted ones return to service.
    pub(crate) fn end_evict(&self, span: &Span, evicted: bool) {
        let mut st = self.lock();
        debug_assert_eq!(span.list_pos(), EVICTING_POS);
        span.set_list_pos(NOT_LISTED);
        if evicted {
            // Every object's word now names the far copy and a grace period has passed.
            st.live -= span.allocated();
            self.release(st, span);
        } else {
            self.settle(st, span);
        }
    }

    /// Puts an unlisted span back in service: to the page heap if no object
    /// lives in it, on the list if it has room.
    fn settle(&self, mut st: MutexGuard<'_, ListState>, span: &Span) {
        if span.is_empty() {
            self.release(st, span);
        } else if !span.is_full() {
            push(&mut st, span);
        }
    }

    /// Gives an unlisted span whose objects are gone (freed or far) back to the page heap.
    fn release(&self, mut st: MutexGuard<'_, ListState>, span: &Span) {
        st.spans -= 1;
        self.registry.remove(span);
        drop(st);
        // SAFETY: unlisted and unregistered, no live local object uses its memory.
        unsafe { self.heap.free_span(span) }.expect("an in-use span of this heap is accepted by it");
    }

    /// Takes a freshly swapped-in span of this class into service with the
    /// objects at `live` indices, running `fix` (which publishes their
    /// addresses) under the class lock.
    pub(crate) fn adopt(&self, span: &Span, live: &[usize], fix: impl FnOnce(&Span)) {
        let mut st = self.lock();
        for &i in live {
            let claimed = span.claim_slot(i);
            debug_assert!(claimed, "slot {i} of a fresh span is free");
        }
        st.spans += 1;
        st.live += live.len();
        self.registry.add(span);
        fix(span);
        self.settle(st, span);
    }

    fn unlist(&self, st: &mut ListState, span: &Span) {
        let pos = span.list_pos();
        if pos == NOT_LISTED || pos == EVICTING_POS {
            return;
        }
        let removed = st.nonempty.swap_remove(pos);
        debug_assert_eq!(removed, SpanPtr::from_ref(span));
        if let Some(&moved) = st.nonempty.get(pos) {
            self.heap.span(moved).set_list_pos(pos);
        }
        span.set_list_pos(NOT_LISTED);
    }

    /// A snapshot of the accounting.
    pub(crate) fn stats(&self) -> ClassStats {
        let st = self.lock();
        let free_slots = st
            .nonempty
            .iter()
            .map(|&p| {
                let span = self.heap.span(p);
                span.capacity() - span.allocated()
            })
            .sum();
        ClassStats {
            spans: st.spans,
            partial_spans: st.nonempty.len(),
            live_objects: st.live,
            free_slots,
        }
    }

    /// A span of this class for a filtering thread to move objects into:
    /// registered (eviction will find it once it is unpinned) and pinned as
    /// a span under eviction is (`EVICTING_POS`), so neither an allocation
    /// nor the evictor uses it while the filter fills it. Unpin it with
    /// [`CentralFreeList::end_filter`].
    ///
    /// For hot objects (`hot`) a listed span with room comes first, as it
    /// would for an allocation: listed spans hold hot objects (cold ones are
    /// kept off the list), and their holes (a cold minority moved out, an
    /// object freed) are otherwise filled only by allocations, which a
    /// steady workload makes few of. `bench micro` (1 KiB objects, 4
    /// threads) kept 2 700 of its 13 400 local spans listed with one hole
    /// each, 2.6 % of the local budget, while every hot object the filter
    /// moved took a fresh span. A span with a kept far copy is passed over:
    /// an object moved in would make it dirty, and it would be written
    /// instead of flipped back. Otherwise, and for cold objects, a fresh
    /// span.
    pub(crate) fn filter_span(&self, hot: bool) -> Result<&Span, AllocError> {
        let mut st = self.lock();
        if hot {
            let listed = st
                .nonempty
                .iter()
                .rev()
                .take(LISTED_PROBE)
                .map(|&p| self.heap.span(p))
                .find(|s| s.kept() == 0 && !s.is_cold());
            if let Some(span) = listed {
                self.unlist(&mut st, span);
                span.set_list_pos(EVICTING_POS);
                return Ok(span);
            }
        }
        let span = self.heap.alloc_small(self.class)?;
        st.spans += 1;
        span.set_list_pos(EVICTING_POS);
        self.registry.add(span);
        Ok(span)
    }

    /// Claims slot `index` of a pinned span whose bytes the caller (the
    /// filter) has just written: a moved object's new home. False if the
    /// slot was not free.
    pub(crate) fn claim_pinned(&self, span: &Span, index: usize) -> bool {
        let mut st = self.lock();
        debug_assert_eq!(span.list_pos(), EVICTING_POS);
        let claimed = span.kind() == Some(self.kind) && span.claim_slot(index);
        if claimed {
            st.live += 1;
        }
        claimed
    }

    /// Unpins a span a filtering thread pinned (a source it moved objects
    /// out of, or a destination it filled). An empty span goes back to the
    /// page heap (returns true); one with room goes back on the list only
    /// if `relist` (a cold destination stays off it, so allocations, which
    /// are hot, do not land among cold objects).
    pub(crate) fn end_filter(&self, span: &Span, relist: bool) -> bool {
        let mut st = self.lock();
        debug_assert_eq!(span.list_pos(), EVICTING_POS);
        span.set_list_pos(NOT_LISTED);
        if span.is_empty() {
            self.release(st, span);
            return true;
        }
        if relist && !span.is_full() {
            push(&mut st, span);
        }
        false
    }
}

/// Listed spans [`CentralFreeList::filter_span`] looks at, from the end,
/// for one without a kept far copy.
const LISTED_PROBE: usize = 8;

fn push(st: &mut ListState, span: &Span) {
    span.set_list_pos(st.nonempty.len());
    st.nonempty.push(SpanPtr::from_ref(span));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_heap::PageHeapConfig;
    use crate::size_classes::SizeClass;

    fn list(size: usize) -> CentralFreeList {
        let class = SizeClass::for_size(size).unwrap();
        CentralFreeList::new(class, Arc::new(PageHeap::new(PageHeapConfig::default())))
    }

    fn free(list: &CentralFreeList, ptr: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: the tests never touch an object after freeing it.
        unsafe { list.free(ptr) }
    }

    #[test]
    fn fills_spans_then_returns_them() {
        let list = list(1024); // 8 objects per one-page span
        let objs: Vec<_> = (0..20).map(|_| list.alloc().unwrap()).collect();
        let stats = list.stats();
        assert_eq!((stats.spans, stats.live_objects), (3, 20));
        assert_eq!((stats.partial_spans, stats.free_slots), (1, 4));
        let mut addrs: Vec<usize> = objs.iter().map(|p| p.as_ptr() as usize).collect();
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), 20);
        assert!(addrs.windows(2).all(|w| w[1] - w[0] >= 1024));
        for p in objs {
            free(&list, p).unwrap();
        }
        assert_eq!(list.stats(), ClassStats::default());
        assert_eq!(list.page_heap().stats().in_use_bytes, 0);
    }

    #[test]
    fn a_full_span_is_listed_again_after_a_free() {
        let list = list(262_144); // one object per 32-page span
        let a = list.alloc().unwrap();
        let b = list.alloc().unwrap();
        assert_eq!(list.stats().partial_spans, 0);
        let list8 = self::list(8);
        let objs: Vec<_> = (0..1024).map(|_| list8.alloc().unwrap()).collect();
        assert_eq!(list8.stats().partial_spans, 0);
        free(&list8, objs[500]).unwrap();
        assert_eq!(list8.stats().partial_spans, 1);
        assert_eq!(list8.alloc().unwrap(), objs[500]);
        free(&list, a).unwrap();
        assert_eq!(list.stats().spans, 1);
        free(&list, b).unwrap();
        assert_eq!(list.stats().spans, 0);
    }

    #[test]
    fn misuse_is_detected() {
        let list = list(48);
        let a = list.alloc().unwrap();
        let keep = list.alloc().unwrap();
        let addr = a.as_ptr() as usize;
        let interior = NonNull::new((addr + 8) as *mut u8).unwrap();
        assert_eq!(free(&list, interior), Err(FreeError::NotObjectStart(addr + 8)));
        free(&list, a).unwrap();
        assert_eq!(free(&list, a), Err(FreeError::DoubleFree(addr)));
        // The tail of the span past the last whole object (8192 % 48 = 32 bytes).
        let span = list.page_heap().span_of(addr).unwrap();
        let tail = NonNull::new((span.end() - 16) as *mut u8).unwrap();
        assert_eq!(free(&list, tail), Err(FreeError::NotObjectStart(span.end() - 16)));
        let other = self::list(64);
        assert!(matches!(free(&other, keep), Err(FreeError::UnknownPointer(_))));
        let on_stack = 0u64;
        let stack = NonNull::from(&on_stack).cast::<u8>();
        assert!(matches!(free(&list, stack), Err(FreeError::UnknownPointer(_))));
        assert_eq!(list.stats().live_objects, 1);
        free(&list, keep).unwrap();
    }

    #[test]
    fn concurrent_alloc_and_free_hand_out_distinct_slots() {
        let list = Arc::new(list(32));
        let per_thread = 3000;
        let all: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    let list = Arc::clone(&list);
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        for i in 0..per_thread {
                            let p = list.alloc().unwrap();
                            // SAFETY: a fresh 32-byte object owned by this thread.
                            unsafe { p.cast::<u64>().write((t * per_thread + i) as u64) };
                            mine.push(p.as_ptr() as usize);
                            if i % 3 == 0 {
                                let q = NonNull::new(mine.swap_remove(i / 2 % mine.len()) as *mut u8).unwrap();
                                free(&list, q).unwrap();
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
        assert_eq!(list.stats().live_objects, all.len());
        for p in all {
            free(&list, NonNull::new(p as *mut u8).unwrap()).unwrap();
        }
        assert_eq!(list.stats(), ClassStats::default());
        assert_eq!(list.page_heap().stats().in_use_bytes, 0);
    }

    /// Writes `seed`-derived bytes over the `len` bytes at `addr`.
    fn scribble(addr: usize, len: usize, seed: u8) {
        // SAFETY: callers pass a slot they own.
        let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
        for (i, x) in b.iter_mut().enumerate() {
            *x = seed.wrapping_add(i as u8).rotate_left(3);
        }
    }

    #[track_caller]
    fn check_scribble(addr: usize, len: usize, seed: u8) {
        // SAFETY: callers pass a live slot they own.
        let b = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        for (i, &x) in b.iter().enumerate() {
            assert_eq!(x, seed.wrapping_add(i as u8).rotate_left(3), "byte {i} of {addr:#x}");
        }
    }

    #[test]
    fn filter_spans_are_pinned_while_filled_and_cold_ones_stay_unlisted() {
        let list = list(1024); // 8 objects per one-page span
        let span = list.filter_span(false).unwrap();
        assert_eq!(span.list_pos(), EVICTING_POS);
        // Allocations never land in a span being filled.
        let other: Vec<_> = (0..8).map(|_| list.alloc().unwrap()).collect();
        assert!(other.iter().all(|p| !span.contains(p.as_ptr() as usize)));
        // The filter writes two objects, then claims their slots.
        let mut mine = Vec::new();
        for seed in [7u8, 9] {
            let i = span.first_free().unwrap();
            let addr = span.object_addr(i);
            scribble(addr, 1024, seed);
            assert!(list.claim_pinned(span, i));
            assert!(!list.claim_pinned(span, i), "claimed twice");
            mine.push((addr, seed));
        }
        assert_eq!(list.stats().live_objects, 10);
        span.set_cold(true);
        assert!(span.is_cold());
        assert!(!list.end_filter(span, false), "a span with objects is kept");
        assert_eq!(span.list_pos(), NOT_LISTED, "a cold destination is not listed");
        // Nor does a free list it: allocations go to a fresh span.
        let (addr, seed) = mine.pop().unwrap();
        check_scribble(addr, 1024, seed);
        free(&list, NonNull::new(addr as *mut u8).unwrap()).unwrap();
        assert_eq!(span.list_pos(), NOT_LISTED);
        let fresh = list.alloc().unwrap();
        assert!(!span.contains(fresh.as_ptr() as usize));
        // Freeing its last object releases it.
        let spans = list.stats().spans;
        let (addr, seed) = mine.pop().unwrap();
        check_scribble(addr, 1024, seed);
        free(&list, NonNull::new(addr as *mut u8).unwrap()).unwrap();
        assert_eq!(list.stats().spans, spans - 1);
        // A hot destination goes back on the list; an empty one back to the heap.
        let hot = list.filter_span(false).unwrap();
        let i = hot.first_free().unwrap();
        scribble(hot.object_addr(i), 1024, 3);
        assert!(list.claim_pinned(hot, i));
        assert!(!list.end_filter(hot, true));
        assert_ne!(hot.list_pos(), NOT_LISTED);
        check_scribble(hot.object_addr(i), 1024, 3);
        free(&list, NonNull::new(hot.object_addr(i) as *mut u8).unwrap()).unwrap();
        let empty = list.filter_span(false).unwrap();
        assert!(list.end_filter(empty, true), "an empty span is released");
        for p in other.into_iter().chain([fresh]) {
            free(&list, p).unwrap();
        }
        assert_eq!(list.stats(), ClassStats::default());
        assert_eq!(list.page_heap().stats().in_use_bytes, 0);
    }

    #[test]
    fn hot_filter_spans_fill_listed_holes_first() {
        let list = list(1024); // 8 objects per one-page span
        let objs: Vec<_> = (0..16u8)
            .map(|seed| {
                let p = list.alloc().unwrap();
                scribble(p.as_ptr() as usize, 1024, seed);
                (p, seed)
            })
            .collect();
        let spans = list.stats().spans;
        assert_eq!(spans, 2);
        // A hole in the first span (a cold object moved out, say) lists it.
        let (hole, _) = objs[2];
        free(&list, hole).unwrap();
        let holed = list.page_heap().span_of(hole.as_ptr() as usize).unwrap();
        assert_ne!(holed.list_pos(), NOT_LISTED);
        // A cold destination is a fresh span all the same.
        let cold = list.filter_span(false).unwrap();
        assert!(!std::ptr::eq(cold, holed));
        assert!(list.end_filter(cold, false), "the empty cold span is released");
        // A hot one is the listed span, pinned and off the list.
        let hot = list.filter_span(true).unwrap();
        assert!(std::ptr::eq(hot, holed), "hot objects fill the listed hole");
        assert_eq!(hot.list_pos(), EVICTING_POS);
        assert_eq!(list.stats().spans, spans, "no span taken from the page heap");
        let i = hot.first_free().unwrap();
        assert_eq!(hot.object_addr(i), hole.as_ptr() as usize);
        scribble(hot.object_addr(i), 1024, 99);
        assert!(list.claim_pinned(hot, i));
        assert!(!list.end_filter(hot, true));
        assert_eq!(hot.list_pos(), NOT_LISTED, "a full span is not listed");
        // A listed span with a kept far copy is passed over: a hot object
        // moved in would make it dirty.
        let (hole2, _) = objs[9];
        free(&list, hole2).unwrap();
        let kept = list.page_heap().span_of(hole2.as_ptr() as usize).unwrap();
        kept.set_kept(7);
        let fresh = list.filter_span(true).unwrap();
        assert!(!std::ptr::eq(fresh, kept));
        assert_eq!(list.stats().spans, spans + 1);
        assert!(list.end_filter(fresh, true));
        kept.set_kept(0);
        for (_, &(p, seed)) in objs.iter().enumerate().filter(|&(k, _)| k != 2 && k != 9) {
            check_scribble(p.as_ptr() as usize, 1024, seed);
            free(&list, p).unwrap();
        }
        check_scribble(hole.as_ptr() as usize, 1024, 99);
        free(&list, hole).unwrap();
        assert_eq!(list.stats(), ClassStats::default());
        assert_eq!(list.page_heap().stats().in_use_bytes, 0);
    }
}
