//! [`LocalHeap`]: the local span allocator assembled from the page heap, the page map and the
//! central free lists.
//!
//! ```text
//!   alloc(size) --size <= 256 KiB--> class c --> central[c] --(no free slot)--> page heap
//!               --size >  256 KiB--> dedicated span of ceil(size / 8 KiB) pages -> page heap
//!   free(ptr)   --> page map (lock-free) --> span --> small: central[class] / large: page heap
//! ```

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::central_freelist::{CentralFreeList, ClassStats};
use crate::page_heap::{PageHeap, PageHeapConfig};
use crate::size_classes::{ClassIndex, PAGE_SIZE, SizeClass, pages_for};
use crate::span::{Span, SpanKind};
use crate::{AllocError, FreeError};

/// A snapshot of a [`LocalHeap`]'s accounting. Taken class by class, so under concurrent
/// use the fields may not add up exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapUsage {
    /// Bytes mapped from the OS.
    pub mapped_bytes: usize,
    /// Bytes in spans handed out by the page heap (what the budget limits).
    pub span_bytes: usize,
    /// Bytes mapped but in no span.
    pub free_bytes: usize,
    /// Live objects in size-class spans.
    pub small_objects: usize,
    /// Bytes of live small objects, rounded up to their class sizes.
    pub small_bytes: usize,
    /// Live objects in dedicated spans.
    pub large_objects: usize,
    /// Bytes of live large objects, rounded up to whole pages.
    pub large_bytes: usize,
    /// The budget on `span_bytes`, if any.
    pub limit: Option<usize>,
}

impl HeapUsage {
    /// Bytes of all live objects as allocated (rounded up).
    pub fn object_bytes(&self) -> usize {
        self.small_bytes + self.large_bytes
    }

    /// Live objects of either kind.
    pub fn objects(&self) -> usize {
        self.small_objects + self.large_objects
    }
}

/// A thread-safe local object heap: TCMalloc-style spans, size classes and page map.
///
/// Memory comes back uninitialised. Objects of size-class `s` are aligned to the largest power
/// of two dividing `s` (so 16 bytes for anything over 8 bytes); large objects to 8 KiB.
pub struct LocalHeap {
    heap: Arc<PageHeap>,
    /// `central[i]` serves class `i + 1`.
    central: Box<[CentralFreeList]>,
}

impl Default for LocalHeap {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for LocalHeap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalHeap")
            .field("usage", &self.usage())
            .finish_non_exhaustive()
    }
}

impl LocalHeap {
    /// A heap without a budget.
    pub fn new() -> Self {
        Self::with_config(PageHeapConfig::default())
    }

    /// A heap whose spans may hold at most `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        Self::with_config(PageHeapConfig {
            limit: Some(limit),
            ..PageHeapConfig::default()
        })
    }

    /// A heap configured as given.
    pub fn with_config(config: PageHeapConfig) -> Self {
        let heap = Arc::new(PageHeap::new(config));
        let central = ClassIndex::all()
            .map(|class| CentralFreeList::new(class, Arc::clone(&heap)))
            .collect();
        Self { heap, central }
    }

    fn central(&self, class: ClassIndex) -> &CentralFreeList {
        &self.central[class.get() - 1]
    }

    /// Allocates `size` bytes (a zero-byte request still gets a distinct object).
    ///
    /// # Errors
    /// [`AllocError::BudgetExceeded`] when a new span would push span bytes past the limit;
    /// [`AllocError::TooLarge`], [`AllocError::Map`] or [`AllocError::AddressOutOfRange`]
    /// when no memory can be had.
    #[inline]
    pub fn alloc(&self, size: usize) -> Result<NonNull<u8>, AllocError> {
        match SizeClass::for_size(size) {
            Some(class) => self.central(class).alloc(),
            None => self.alloc_large(size),
        }
    }

    /// Allocates for `layout`, honouring alignments up to a page by picking a class whose
    /// size is a multiple of the alignment.
    ///
    /// # Errors
    /// [`AllocError::UnsupportedAlignment`] above 8 KiB; otherwise as [`LocalHeap::alloc`].
    pub fn alloc_layout(&self, layout: Layout) -> Result<NonNull<u8>, AllocError> {
        if layout.align() > PAGE_SIZE {
            return Err(AllocError::UnsupportedAlignment { align: layout.align() });
        }
        match SizeClass::for_size_and_align(layout.size(), layout.align()) {
            Some(class) => self.central(class).alloc(),
            None => self.alloc_large(layout.size()),
        }
    }

    fn alloc_large(&self, size: usize) -> Result<NonNull<u8>, AllocError> {
        let pages = pages_for(size).ok_or(AllocError::TooLarge { size })?;
        let span = self.heap.alloc_large(pages)?;
        let slot = span.alloc_slot();
        debug_assert_eq!(slot, Some(0));
        Ok(NonNull::new(span.start() as *mut u8).expect("spans never start at address 0"))
    }

    /// Frees the object at `ptr`.
    ///
    /// # Safety
    /// `ptr` must have been returned by [`LocalHeap::alloc`] or [`LocalHeap::alloc_layout`] of
    /// this heap and not freed since, and nothing may use the object afterwards: its memory
    /// will be handed out again.
    ///
    /// # Errors
    /// Misuse that can be detected (a pointer into no live span, not at an object's start, or
    /// already free) is reported and changes nothing. A pointer freed twice whose slot was
    /// handed out in between cannot be told apart from the new object.
    pub unsafe fn free(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        let addr = ptr.as_ptr() as usize;
        let span = self.heap.span_of(addr).ok_or(FreeError::UnknownPointer(addr))?;
        match span.kind() {
            // SAFETY: forwarded from the caller.
            Some(SpanKind::Small(class)) => unsafe { self.central(class).free_in_span(span, addr) },
            Some(SpanKind::Large) => {
                if span.start() != addr {
                    return Err(FreeError::NotObjectStart(addr));
                }
                // The slot bit makes a racing double free lose here rather than free the span
                // twice.
                span.free_slot(0).map_err(|_| FreeError::DoubleFree(addr))?;
                // SAFETY: the caller gives up the only object in the span.
                unsafe { self.heap.free_span(span) }
            }
            None => Err(FreeError::UnknownPointer(addr)),
        }
    }

    /// The usable size of the live object starting at `ptr` (its class size, or its span's
    /// length for a large object); `None` if no live object starts there.
    pub fn usable_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        let addr = ptr.as_ptr() as usize;
        let span = self.heap.span_of(addr)?;
        let slot = span.slot_at(addr)?;
        span.is_allocated(slot).then(|| span.object_size())
    }

    /// The in-use span holding `addr` (any interior address), found without locking.
    #[inline]
    pub fn span_of(&self, addr: usize) -> Option<&Span> {
        self.heap.span_of(addr)
    }

    /// The page heap underneath.
    pub fn page_heap(&self) -> &PageHeap {
        &self.heap
    }

    /// Accounting of one size class.
    pub fn class_stats(&self, class: ClassIndex) -> ClassStats {
        self.central(class).stats()
    }

    /// A snapshot of the accounting.
    pub fn usage(&self) -> HeapUsage {
        let (small_objects, small_bytes) = ClassIndex::all()
            .map(|class| {
                let live = self.central(class).stats().live_objects;
                (live, live * class.info().size())
            })
            .fold((0, 0), |(n, b), (dn, db)| (n + dn, b + db));
        let pages = self.heap.stats();
        HeapUsage {
            mapped_bytes: pages.mapped_bytes,
            span_bytes: pages.in_use_bytes,
            free_bytes: pages.free_bytes,
            small_objects,
            small_bytes,
            large_objects: pages.large_spans,
            large_bytes: pages.large_bytes,
            limit: pages.limit,
        }
    }

    /// Changes the budget on span bytes (see [`PageHeap::set_limit`]).
    pub fn set_limit(&self, limit: Option<usize>) {
        self.heap.set_limit(limit);
    }

    /// Returns the physical memory of free page runs to the OS; see
    /// [`PageHeap::release_free_memory`].
    pub fn release_free_memory(&self) -> usize {
        self.heap.release_free_memory()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size_classes::MAX_SIZE;

    fn free(heap: &LocalHeap, ptr: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: the tests never touch an object after freeing it.
        unsafe { heap.free(ptr) }
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<LocalHeap>();
        check::<PageHeap>();
        check::<CentralFreeList>();
    }

    #[test]
    fn sizes_round_to_classes_or_pages() {
        let heap = LocalHeap::new();
        let cases = [
            (0, 8),
            (1, 8),
            (8, 8),
            (9, 16),
            (17, 32),
            (1025, 1152),
            (MAX_SIZE, MAX_SIZE),
            (MAX_SIZE + 1, MAX_SIZE + PAGE_SIZE),
            (3 << 20, 3 << 20),
        ];
        let ptrs: Vec<_> = cases
            .iter()
            .map(|&(size, usable)| {
                let p = heap.alloc(size).unwrap();
                assert_eq!(heap.usable_size(p), Some(usable), "size {size}");
                if size > 8 {
                    assert_eq!(p.as_ptr() as usize % 16, 0);
                }
                p
            })
            .collect();
        let usage = heap.usage();
        assert_eq!((usage.small_objects, usage.large_objects), (7, 2));
        assert_eq!(usage.large_bytes, MAX_SIZE + PAGE_SIZE + (3 << 20));
        assert_eq!(usage.small_bytes, 8 + 8 + 8 + 16 + 32 + 1152 + MAX_SIZE);
        for p in ptrs {
            free(&heap, p).unwrap();
            assert_eq!(heap.usable_size(p), None);
        }
        let usage = heap.usage();
        assert_eq!((usage.objects(), usage.object_bytes(), usage.span_bytes), (0, 0, 0));
        assert_eq!(usage.free_bytes, usage.mapped_bytes);
    }

    #[test]
    fn layouts_get_their_alignment() {
        let heap = LocalHeap::new();
        for align in [1, 2, 4, 8, 16, 32, 64, 256, 4096, 8192] {
            for size in [1, 24, 100, 3000, 9000, MAX_SIZE + 5] {
                let layout = Layout::from_size_align(size, align).unwrap();
                let p = heap.alloc_layout(layout).unwrap();
                assert_eq!(p.as_ptr() as usize % align, 0, "size {size} align {align}");
                assert!(heap.usable_size(p).unwrap() >= size);
                free(&heap, p).unwrap();
            }
        }
        let too_aligned = Layout::from_size_align(8, 2 * PAGE_SIZE).unwrap();
        assert!(matches!(
            heap.alloc_layout(too_aligned),
            Err(AllocError::UnsupportedAlignment { align }) if align == 2 * PAGE_SIZE
        ));
        assert!(matches!(heap.alloc(usize::MAX), Err(AllocError::TooLarge { .. })));
        assert!(matches!(heap.alloc(usize::MAX / 2), Err(AllocError::TooLarge { .. })));
    }

    #[test]
    fn budget_exceeded_is_typed_and_recoverable() {
        let limit = 64 * PAGE_SIZE;
        let heap = LocalHeap::with_limit(limit);
        let mut live = Vec::new();
        let err = loop {
            match heap.alloc(4096) {
                Ok(p) => live.push(p),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(err, AllocError::BudgetExceeded { limit: l, .. } if l == limit),
            "{err}"
        );
        // 4096-byte objects come two per one-page span: the budget is spent exactly.
        assert_eq!(live.len(), 2 * 64);
        assert_eq!(heap.usage().span_bytes, limit);
        assert!(matches!(
            heap.alloc(MAX_SIZE + 1),
            Err(AllocError::BudgetExceeded { .. })
        ));
        // Room in an existing span needs no budget.
        free(&heap, live.pop().unwrap()).unwrap();
        live.push(heap.alloc(4000).unwrap());
        // Freeing whole spans makes room again.
        for p in live.drain(..4) {
            free(&heap, p).unwrap();
        }
        live.push(heap.alloc(8000).unwrap());
        heap.set_limit(None);
        live.push(heap.alloc(1 << 20).unwrap());
        for p in live {
            free(&heap, p).unwrap();
        }
        assert_eq!(heap.usage().span_bytes, 0);
    }

    #[test]
    fn bad_frees_are_reported() {
        let heap = LocalHeap::new();
        let big = heap.alloc(MAX_SIZE * 2).unwrap();
        let addr = big.as_ptr() as usize;
        let inside = NonNull::new((addr + 64) as *mut u8).unwrap();
        assert_eq!(free(&heap, inside), Err(FreeError::NotObjectStart(addr + 64)));
        free(&heap, big).unwrap();
        assert_eq!(free(&heap, big), Err(FreeError::UnknownPointer(addr)));
        let x = 5u32;
        let stack = NonNull::from(&x).cast::<u8>();
        assert!(matches!(free(&heap, stack), Err(FreeError::UnknownPointer(_))));
        let small = heap.alloc(100).unwrap();
        let keep = heap.alloc(100).unwrap();
        free(&heap, small).unwrap();
        assert_eq!(free(&heap, small), Err(FreeError::DoubleFree(small.as_ptr() as usize)));
        assert_eq!(heap.usage().objects(), 1);
        free(&heap, keep).unwrap();
    }

    #[test]
    fn span_of_resolves_interior_addresses() {
        let heap = LocalHeap::new();
        let p = heap.alloc(5000).unwrap(); // class 5376, 2-page spans
        let addr = p.as_ptr() as usize;
        let span = heap.span_of(addr + 4999).unwrap();
        assert_eq!(span.kind(), Some(SpanKind::Small(SizeClass::for_size(5000).unwrap())));
        assert_eq!(span.slot_containing(addr + 4999), span.slot_at(addr));
        assert!(std::ptr::eq(heap.span_of(span.end() - 1).unwrap(), span));
        assert!(heap.span_of(span.end()).is_none());
        // SAFETY: frees the one live object, which is not used afterwards.
        unsafe { heap.free(p) }.unwrap();
        assert!(heap.span_of(addr).is_none());
    }
}
