//! The local page heap: spans of whole 8 KiB pages carved from 2 MiB-aligned `mmap` chunks
//! (paper §3.3, "local page heap").
//!
//! ```text
//!   chunk (n x 2 MiB, 2 MiB-aligned, anonymous private mmap, MADV_HUGEPAGE)
//!   +-------------+-----------------------+-----------+--------------------------------+
//!   | span A      | free run B            | span C    | free run D                     |
//!   | in use, 1 p | 3 pages               | large, 9 p| ...                            |
//!   +-------------+-----------------------+-----------+--------------------------------+
//!   page map:  A A | B . B | C C C C C C C C C | D . . . D
//!   (in-use spans: every page; free runs: first and last page only, as in TCMalloc)
//!
//!   free lists:  lists[n], 1 <= n < 128: free runs of exactly n pages, keyed by address
//!                large: runs of >= 128 pages, keyed by (pages, address)
//! ```
//!
//! Every mapped page belongs to exactly one span, in use or free. Allocation takes the
//! shortest run that fits, lowest address first (a bitmask finds the first non-empty list in
//! one instruction; the large set is best-fit), and splits off the tail as a new free run;
//! only when nothing fits is a new chunk mapped. Freeing coalesces with free neighbours,
//! found through the page map: the page before a span is the last page of its left
//! neighbour and the page after it the first page of its right one, and those endpoint
//! entries are always current. Interior entries of free runs may be stale; lookups check.
//!
//! Chunks are unmapped only when the heap is dropped; [`PageHeap::release_free_memory`]
//! hands free pages back to the OS (`MADV_DONTNEED`) without unmapping them.
//!
//! # Concurrency
//! Every method takes `&self`. Allocation, freeing, statistics and configuration serialise
//! on one internal mutex (the paper's page-heap lock); callers need no lock of their own.
//! Lookups ([`PageHeap::span_of`], [`PageHeap::pagemap`]) take no lock. Span metadata is never
//! freed before the heap, so a `&Span` obtained here stays valid for the heap's lifetime,
//! though the span it describes may change once its memory is freed.

use std::collections::BTreeMap;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::error::{AllocError, FreeError};
use crate::pagemap::{ADDRESS_BITS, PageMap, page_of};
use crate::size_classes::{ClassIndex, PAGE_SIZE};
use crate::span::{Span, SpanKind};

/// Granularity and alignment of memory obtained from the OS: one x86-64 huge page.
pub(crate) const CHUNK_SIZE: usize = 2 << 20;
/// Free runs shorter than this many pages have a list of their own.
pub(crate) const MAX_LISTED_PAGES: usize = 128;

/// How a page heap gets and limits memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageHeapConfig {
    /// Most bytes that may be in spans at once, or `None` for no limit. Allocations that would
    /// exceed it fail with [`AllocError::BudgetExceeded`].
    pub limit: Option<usize>,
    /// Ask for transparent huge pages on each chunk (`madvise(MADV_HUGEPAGE)`, best effort).
    pub huge_pages: bool,
}

impl Default for PageHeapConfig {
    fn default() -> Self {
        Self {
            limit: None,
            huge_pages: true,
        }
    }
}

/// A snapshot of a page heap's accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PageHeapStats {
    /// Bytes mapped from the OS (never shrinks before drop).
    pub mapped_bytes: usize,
    /// Bytes in spans handed out (small-object and large).
    pub in_use_bytes: usize,
    /// Bytes in free runs: `mapped_bytes - in_use_bytes`.
    pub free_bytes: usize,
    /// Spans handed out.
    pub spans_in_use: usize,
    /// Large (single-object) spans handed out.
    pub large_spans: usize,
    /// Bytes in large spans handed out.
    pub large_bytes: usize,
    /// Free runs.
    pub free_runs: usize,
    /// The configured limit on `in_use_bytes`.
    pub limit: Option<usize>,
}

/// Pointer to span metadata owned by a [`PageHeap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpanPtr(NonNull<Span>);

// SAFETY: `Span` is all atomics (Sync), and the metadata it points to is only freed when its
// page heap drops, after every holder (which keep the heap alive) is gone.
unsafe impl Send for SpanPtr {}
// SAFETY: as above.
unsafe impl Sync for SpanPtr {}

impl SpanPtr {
    pub(crate) fn from_ref(span: &Span) -> Self {
        Self(NonNull::from(span))
    }

    fn as_ptr(self) -> *mut Span {
        self.0.as_ptr()
    }
}

struct State {
    lists: [BTreeMap<usize, SpanPtr>; MAX_LISTED_PAGES],
    /// Bit `n` set iff `lists[n]` is non-empty.
    nonempty: u128,
    large: BTreeMap<(usize, usize), SpanPtr>,
    /// Every metadata record ever made, for `drop`.
    metadata: Vec<SpanPtr>,
    /// Recycled metadata records.
    spare: Vec<SpanPtr>,
    chunks: Vec<(usize, usize)>,
    mapped: usize,
    in_use: usize,
    spans_in_use: usize,
    large_spans: usize,
    large_bytes: usize,
    limit: Option<usize>,
}

/// The local page heap (see the module docs).
pub(crate) struct PageHeap {
    pagemap: PageMap<Span>,
    state: Mutex<State>,
    /// Mirror of the locked `in_use`, readable without the lock (the runtime
    /// checks it on every scope entry).
    in_use_bytes: AtomicUsize,
    huge_pages: bool,
}

impl Default for PageHeap {
    fn default() -> Self {
        Self::new(PageHeapConfig::default())
    }
}

impl std::fmt::Debug for PageHeap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageHeap")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl PageHeap {
    /// An empty heap; maps nothing until the first allocation.
    pub(crate) fn new(config: PageHeapConfig) -> Self {
        Self {
            pagemap: PageMap::new(),
            in_use_bytes: AtomicUsize::new(0),
            state: Mutex::new(State {
                lists: std::array::from_fn(|_| BTreeMap::new()),
                nonempty: 0,
                large: BTreeMap::new(),
                metadata: Vec::new(),
                spare: Vec::new(),
                chunks: Vec::new(),
                mapped: 0,
                in_use: 0,
                spans_in_use: 0,
                large_spans: 0,
                large_bytes: 0,
                limit: config.limit,
            }),
            huge_pages: config.huge_pages,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under this lock may have left the free lists half-updated; handing out
        // memory from them could overlap live spans, so poisoning is fatal.
        self.state.lock().expect("page heap lock poisoned")
    }

    /// The span metadata behind `ptr`, which must come from this heap.
    pub(crate) fn span(&self, ptr: SpanPtr) -> &Span {
        // SAFETY: every `SpanPtr` this heap handles came from its own `new_metadata`, and
        // metadata records are freed only in `drop`, which outlives `&self`.
        unsafe { &*ptr.as_ptr() }
    }

    /// Allocates a span for objects of `class`, as long as the class says, with every slot
    /// free. Its memory is uninitialised: zero if fresh from the OS, old contents if reused.
    ///
    /// # Errors
    /// [`AllocError::BudgetExceeded`] past the limit; otherwise only when the OS refuses memory.
    pub(crate) fn alloc_small(&self, class: ClassIndex) -> Result<&Span, AllocError> {
        self.alloc_span(class.info().pages(), SpanKind::Small(class))
    }

    /// Allocates a dedicated span of `pages` pages (at least one) for one large object, its
    /// single slot free. Memory as for [`PageHeap::alloc_small`].
    ///
    /// # Errors
    /// As [`PageHeap::alloc_small`], plus [`AllocError::TooLarge`] for absurd lengths.
    pub(crate) fn alloc_large(&self, pages: usize) -> Result<&Span, AllocError> {
        self.alloc_span(pages.max(1), SpanKind::Large)
    }

    fn alloc_span(&self, pages: usize, kind: SpanKind) -> Result<&Span, AllocError> {
        let bytes = pages
            .checked_mul(PAGE_SIZE)
            .filter(|&b| b < 1 << ADDRESS_BITS)
            .ok_or(AllocError::TooLarge {
                size: pages.saturating_mul(PAGE_SIZE),
            })?;
        let mut st = self.lock();
        if let Some(limit) = st.limit {
            if st.in_use + bytes > limit {
                return Err(AllocError::BudgetExceeded {
                    requested: bytes,
                    in_use: st.in_use,
                    limit,
                });
            }
        }
        let found = match self.take_free(&mut st, pages) {
            Some(found) => found,
            None => {
                self.grow(&mut st, bytes)?;
                self.take_free(&mut st, pages).expect("a fresh chunk holds the request")
            }
        };
        let span = self.span(found);
        let have = span.pages();
        if have > pages {
            let rest = self.new_metadata(&mut st);
            self.span(rest).set_free(span.start() + bytes, have - pages);
            self.insert_free(&mut st, rest);
            span.set_free(span.start(), pages);
        }
        span.init(kind);
        self.pagemap.set_range(page_of(span.start()), pages, found.as_ptr());
        st.in_use += bytes;
        self.in_use_bytes.store(st.in_use, Ordering::Relaxed);
        st.spans_in_use += 1;
        if kind == SpanKind::Large {
            st.large_spans += 1;
            st.large_bytes += bytes;
        }
        Ok(span)
    }

    /// Bytes in spans handed out, without taking the heap's lock.
    pub(crate) fn in_use_bytes(&self) -> usize {
        self.in_use_bytes.load(Ordering::Relaxed)
    }

    /// Returns an in-use span to the heap, coalescing it with free neighbours.
    ///
    /// # Safety
    /// Nothing may use the span's memory afterwards: the heap will hand it out again.
    ///
    /// # Errors
    /// [`FreeError::UnknownPointer`] if `span` is not an in-use span of this heap; nothing
    /// changes then.
    pub(crate) unsafe fn free_span(&self, span: &Span) -> Result<(), FreeError> {
        let ptr = SpanPtr::from_ref(span);
        let mut st = self.lock();
        // Under the lock the extent and kind cannot change, so this check is reliable.
        let Some(kind) = span.kind() else {
            return Err(FreeError::UnknownPointer(span.start()));
        };
        if self.pagemap.get_addr(span.start()) != ptr.as_ptr() {
            return Err(FreeError::UnknownPointer(span.start()));
        }
        let bytes = span.bytes();
        st.in_use -= bytes;
        self.in_use_bytes.store(st.in_use, Ordering::Relaxed);
        st.spans_in_use -= 1;
        if kind == SpanKind::Large {
            st.large_spans -= 1;
            st.large_bytes -= bytes;
        }
        span.set_free(span.start(), span.pages());
        self.coalesce_and_file(&mut st, ptr);
        Ok(())
    }

    /// Merges a free run with free neighbours (recycling their metadata) and files it.
    fn coalesce_and_file(&self, st: &mut State, ptr: SpanPtr) {
        let span = self.span(ptr);
        let (mut start, mut pages) = (span.start(), span.pages());
        if let Some(left) = self.free_neighbour(page_of(start).wrapping_sub(1)) {
            let left_span = self.span(left);
            if left_span.end() == start {
                self.remove_free(st, left);
                start = left_span.start();
                pages += left_span.pages();
                self.recycle(st, left);
            }
        }
        if let Some(right) = self.free_neighbour(page_of(start) + pages) {
            let right_span = self.span(right);
            if right_span.start() == start + pages * PAGE_SIZE {
                self.remove_free(st, right);
                pages += right_span.pages();
                self.recycle(st, right);
            }
        }
        span.set_free(start, pages);
        self.insert_free(st, ptr);
    }

    /// The in-use span containing `addr`, without locking. `None` for addresses outside this
    /// heap's in-use spans.
    #[inline]
    pub(crate) fn span_of(&self, addr: usize) -> Option<&Span> {
        let ptr = NonNull::new(self.pagemap.get_addr(addr))?;
        let span = self.span(SpanPtr(ptr));
        // Interior entries of free runs can be stale; a current in-use span contains `addr`.
        (span.kind().is_some() && span.contains(addr)).then_some(span)
    }

    /// A snapshot of the accounting.
    pub(crate) fn stats(&self) -> PageHeapStats {
        let st = self.lock();
        PageHeapStats {
            mapped_bytes: st.mapped,
            in_use_bytes: st.in_use,
            free_bytes: st.mapped - st.in_use,
            spans_in_use: st.spans_in_use,
            large_spans: st.large_spans,
            large_bytes: st.large_bytes,
            free_runs: st.lists.iter().map(BTreeMap::len).sum::<usize>() + st.large.len(),
            limit: st.limit,
        }
    }

    /// Changes the limit on bytes in use. Lowering it below current use fails later
    /// allocations only; nothing is reclaimed.
    #[cfg(test)]
    pub(crate) fn set_limit(&self, limit: Option<usize>) {
        self.lock().limit = limit;
    }

    /// Gives the physical memory behind every free run back to the OS (`MADV_DONTNEED`); the
    /// address space stays mapped and refills with zero pages on use. Returns the bytes
    /// released. The heap also does this by itself when a limit is set and mapping another
    /// chunk would take the mapped bytes past it, so that resident memory stays near the
    /// budget even when free runs are too fragmented to reuse.
    #[cfg(test)]
    pub(crate) fn release_free_memory(&self) -> usize {
        let st = self.lock();
        self.release_runs(&st)
    }

    fn release_runs(&self, st: &State) -> usize {
        let mut released = 0;
        let runs = st.lists.iter().flat_map(|l| l.values()).chain(st.large.values());
        for &ptr in runs {
            let span = self.span(ptr);
            let (start, len) = (span.start() as *mut libc::c_void, span.bytes());
            // SAFETY: the run lies inside a chunk we mapped and is free, so no one holds a
            // reference into it; DONTNEED only replaces its contents with zero pages.
            if unsafe { libc::madvise(start, len, libc::MADV_DONTNEED) } == 0 {
                released += len;
            }
        }
        released
    }

    /// A free run whose endpoint page is `page`, if any.
    fn free_neighbour(&self, page: usize) -> Option<SpanPtr> {
        let ptr = SpanPtr(NonNull::new(self.pagemap.get(page))?);
        self.span(ptr).is_free().then_some(ptr)
    }

    fn take_free(&self, st: &mut State, pages: usize) -> Option<SpanPtr> {
        if pages < MAX_LISTED_PAGES {
            let candidates = st.nonempty & (u128::MAX << pages);
            if candidates != 0 {
                let n = candidates.trailing_zeros() as usize;
                let (_, ptr) = st.lists[n].pop_first().expect("non-empty list");
                if st.lists[n].is_empty() {
                    st.nonempty &= !(1u128 << n);
                }
                return Some(ptr);
            }
        }
        let key = *st.large.range((pages, 0)..).next()?.0;
        st.large.remove(&key)
    }

    /// Files a free run (whose extent is already set) and updates its endpoint entries.
    fn insert_free(&self, st: &mut State, ptr: SpanPtr) {
        let span = self.span(ptr);
        let (start, pages) = (span.start(), span.pages());
        self.pagemap.set(page_of(start), ptr.as_ptr());
        self.pagemap.set(page_of(start) + pages - 1, ptr.as_ptr());
        if pages < MAX_LISTED_PAGES {
            st.lists[pages].insert(start, ptr);
            st.nonempty |= 1u128 << pages;
        } else {
            st.large.insert((pages, start), ptr);
        }
    }

    fn remove_free(&self, st: &mut State, ptr: SpanPtr) {
        let span = self.span(ptr);
        let (start, pages) = (span.start(), span.pages());
        let removed = if pages < MAX_LISTED_PAGES {
            let removed = st.lists[pages].remove(&start);
            if st.lists[pages].is_empty() {
                st.nonempty &= !(1u128 << pages);
            }
            removed
        } else {
            st.large.remove(&(pages, start))
        };
        debug_assert_eq!(removed, Some(ptr));
    }

    fn new_metadata(&self, st: &mut State) -> SpanPtr {
        st.spare.pop().unwrap_or_else(|| {
            let ptr = SpanPtr(NonNull::from(Box::leak(Box::new(Span::unused()))));
            st.metadata.push(ptr);
            ptr
        })
    }

    fn recycle(&self, st: &mut State, ptr: SpanPtr) {
        self.span(ptr).set_unused();
        st.spare.push(ptr);
    }

    /// Maps a chunk of at least `bytes` and files it as a free run.
    fn grow(&self, st: &mut State, bytes: usize) -> Result<(), AllocError> {
        let len = bytes
            .checked_next_multiple_of(CHUNK_SIZE)
            .ok_or(AllocError::TooLarge { size: bytes })?;
        if st.limit.is_some_and(|limit| st.mapped + len > limit) {
            self.release_runs(st);
        }
        let start = map_aligned(len, self.huge_pages)?;
        st.chunks.push((start, len));
        st.mapped += len;
        let run = self.new_metadata(st);
        self.span(run).set_free(start, len / PAGE_SIZE);
        // Chunks that happen to be adjacent merge like any freed neighbours.
        self.coalesce_and_file(st, run);
        Ok(())
    }
}

/// Maps `len` bytes (a multiple of `CHUNK_SIZE`) aligned to `CHUNK_SIZE`, inside the page
/// map's address range.
fn map_aligned(len: usize, huge_pages: bool) -> Result<usize, AllocError> {
    let over = len + CHUNK_SIZE;
    // SAFETY: a fresh anonymous private mapping at an address of the kernel's choosing
    // touches no existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(AllocError::Map {
            bytes: len,
            source: io::Error::last_os_error(),
        });
    }
    let raw = raw as usize;
    let start = raw.next_multiple_of(CHUNK_SIZE);
    let head = start - raw;
    let tail = over - head - len;
    if head > 0 {
        // SAFETY: `[raw, start)` is part of the mapping just made, outside the part we keep,
        // and nothing refers to it.
        unsafe { libc::munmap(raw as *mut libc::c_void, head) };
    }
    if tail > 0 {
        // SAFETY: likewise for `[start + len, raw + over)`.
        unsafe { libc::munmap((start + len) as *mut libc::c_void, tail) };
    }
    if start + len > 1 << ADDRESS_BITS {
        // SAFETY: `[start, start + len)` is the rest of our fresh mapping.
        unsafe { libc::munmap(start as *mut libc::c_void, len) };
        return Err(AllocError::AddressOutOfRange { addr: start });
    }
    if huge_pages {
        // SAFETY: advice on our own fresh mapping; failure (no THP support) is harmless.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    }
    Ok(start)
}

impl Drop for PageHeap {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for &(start, len) in &st.chunks {
            // SAFETY: each chunk is a mapping this heap made; `&mut self` means no span of it
            // is reachable any more (holders of spans borrow the heap).
            unsafe { libc::munmap(start as *mut libc::c_void, len) };
        }
        for &ptr in &st.metadata {
            // SAFETY: metadata records were made by `Box::leak` in `new_metadata`, appear once
            // in `metadata`, and nothing borrows them past `&mut self`.
            drop(unsafe { Box::from_raw(ptr.as_ptr()) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size_classes::SizeClass;

    const CHUNK_PAGES: usize = CHUNK_SIZE / PAGE_SIZE;

    fn small() -> ClassIndex {
        SizeClass::for_size(64).unwrap()
    }

    fn free(heap: &PageHeap, span: &Span) {
        // SAFETY: the tests never touch a span's memory after freeing it.
        unsafe { heap.free_span(span) }.unwrap();
    }

    #[test]
    fn first_span_comes_from_an_aligned_chunk() {
        let heap = PageHeap::default();
        let span = heap.alloc_small(small()).unwrap();
        assert_eq!(span.start() % CHUNK_SIZE, 0);
        assert_eq!(span.pages(), 1);
        assert_eq!(span.capacity(), PAGE_SIZE / 64);
        let stats = heap.stats();
        assert_eq!(stats.mapped_bytes, CHUNK_SIZE);
        assert_eq!(stats.in_use_bytes, PAGE_SIZE);
        assert_eq!(stats.free_bytes, CHUNK_SIZE - PAGE_SIZE);
        assert_eq!((stats.spans_in_use, stats.free_runs), (1, 1));
        // The memory is really there.
        // SAFETY: the span is ours, one page long and not shared.
        unsafe { std::ptr::write_bytes(span.start() as *mut u8, 0xAB, PAGE_SIZE) };
        free(&heap, span);
        assert_eq!(heap.stats().in_use_bytes, 0);
        assert_eq!(heap.stats().free_runs, 1);
    }

    #[test]
    fn split_then_coalesce_in_every_order() {
        for order in [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
            let heap = PageHeap::default();
            let spans = [1, 3, 2].map(|p| heap.alloc_large(p).unwrap());
            // Carved head first, so they sit back to back.
            assert_eq!(spans[0].end(), spans[1].start());
            assert_eq!(spans[1].end(), spans[2].start());
            let base = spans[0].start();
            for i in order {
                free(&heap, spans[i]);
            }
            let stats = heap.stats();
            assert_eq!((stats.in_use_bytes, stats.free_runs), (0, 1), "order {order:?}");
            // Everything merged back: one run covers the whole chunk again.
            let whole = heap.alloc_large(CHUNK_PAGES).unwrap();
            assert_eq!(whole.start(), base);
            assert_eq!(heap.stats().mapped_bytes, CHUNK_SIZE);
        }
    }

    #[test]
    fn freed_runs_are_reused_lowest_address_first() {
        let heap = PageHeap::default();
        let a = heap.alloc_large(2).unwrap();
        let a_start = a.start();
        let b = heap.alloc_large(2).unwrap();
        let c = heap.alloc_large(2).unwrap();
        let _d = heap.alloc_large(2).unwrap();
        let c_start = c.start();
        free(&heap, c);
        free(&heap, a);
        // Two exact-length runs: the lower one wins.
        assert_eq!(heap.alloc_large(2).unwrap().start(), a_start);
        // A one-page request splits the shortest run that fits (c's), not the chunk tail.
        assert_eq!(heap.alloc_large(1).unwrap().start(), c_start);
        free(&heap, b);
    }

    #[test]
    fn large_spans_map_bigger_chunks() {
        let heap = PageHeap::default();
        let span = heap.alloc_large(CHUNK_PAGES + 44).unwrap();
        assert_eq!(span.start() % CHUNK_SIZE, 0);
        let stats = heap.stats();
        assert_eq!(stats.mapped_bytes, 2 * CHUNK_SIZE);
        assert_eq!((stats.large_spans, stats.large_bytes), (1, span.bytes()));
        // Every page of the span resolves to it, including interior addresses.
        for page in 0..span.pages() {
            let addr = span.start() + page * PAGE_SIZE + (page * 97) % PAGE_SIZE;
            assert!(std::ptr::eq(heap.span_of(addr).unwrap(), span));
        }
        assert!(heap.span_of(span.end()).is_none(), "the tail run is free");
        free(&heap, span);
        assert!(heap.span_of(span.start()).is_none());
        assert_eq!(heap.stats().large_spans, 0);
    }

    #[test]
    fn budget_is_enforced_and_typed() {
        let heap = PageHeap::new(PageHeapConfig {
            limit: Some(10 * PAGE_SIZE),
            huge_pages: false,
        });
        let a = heap.alloc_large(8).unwrap();
        let err = heap.alloc_large(3).unwrap_err();
        assert!(
            matches!(
                err,
                AllocError::BudgetExceeded { requested, in_use, limit }
                    if requested == 3 * PAGE_SIZE && in_use == 8 * PAGE_SIZE && limit == 10 * PAGE_SIZE
            ),
            "{err}"
        );
        let b = heap.alloc_large(2).unwrap();
        free(&heap, a);
        let c = heap.alloc_large(3).unwrap();
        heap.set_limit(None);
        let d = heap.alloc_large(100).unwrap();
        for s in [b, c, d] {
            free(&heap, s);
        }
        assert_eq!(heap.stats().in_use_bytes, 0);
    }

    #[test]
    fn bad_frees_are_refused_without_damage() {
        let heap = PageHeap::default();
        let a = heap.alloc_small(small()).unwrap();
        free(&heap, a);
        // SAFETY: the span's memory is not touched.
        let again = unsafe { heap.free_span(a) };
        assert_eq!(again, Err(FreeError::UnknownPointer(a.start())));
        let other = PageHeap::default();
        let foreign = other.alloc_small(small()).unwrap();
        // SAFETY: as above.
        let wrong_heap = unsafe { heap.free_span(foreign) };
        assert!(matches!(wrong_heap, Err(FreeError::UnknownPointer(_))));
        assert_eq!(heap.stats().free_runs, 1);
        assert_eq!(other.stats().spans_in_use, 1);
    }

    #[test]
    fn released_memory_reads_as_zero() {
        let heap = PageHeap::default();
        let a = heap.alloc_large(4).unwrap();
        let start = a.start();
        // SAFETY: the span is ours and four pages long.
        unsafe { std::ptr::write_bytes(start as *mut u8, 0x5A, 4 * PAGE_SIZE) };
        free(&heap, a);
        assert_eq!(heap.release_free_memory(), CHUNK_SIZE);
        let b = heap.alloc_large(4).unwrap();
        assert_eq!(b.start(), start);
        // SAFETY: the span is ours again, four pages, and DONTNEED made it zero-filled.
        let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, 4 * PAGE_SIZE) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    /// Whether every page of `[start, start + len)` is resident.
    fn resident(start: usize, len: usize) -> bool {
        let mut vec = vec![0u8; len.div_ceil(4096)];
        // SAFETY: the range is inside a live mapping of the heap under test and `vec` has one
        // byte per 4 KiB page of it.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().all(|&v| v & 1 == 1)
    }

    #[test]
    fn growing_past_the_limit_releases_fragmented_runs() {
        let heap = PageHeap::new(PageHeapConfig {
            limit: Some(CHUNK_SIZE + CHUNK_SIZE / 2),
            huge_pages: false,
        });
        let spans: Vec<&Span> = (0..CHUNK_PAGES).map(|_| heap.alloc_large(1).unwrap()).collect();
        for s in &spans {
            // SAFETY: each span is ours and one page long.
            unsafe { std::ptr::write_bytes(s.start() as *mut u8, 1, PAGE_SIZE) };
        }
        let holes: Vec<usize> = spans.iter().step_by(2).map(|s| s.start()).collect();
        for s in spans.iter().step_by(2) {
            free(&heap, s);
        }
        assert!(holes.iter().all(|&h| resident(h, PAGE_SIZE)));
        // Only one-page holes are free, so two pages need a second chunk, which would take
        // the mapping past the limit: the holes are given back first.
        let two = heap.alloc_large(2).unwrap();
        assert_eq!(heap.stats().mapped_bytes, 2 * CHUNK_SIZE);
        assert!(holes.iter().all(|&h| !resident(h, PAGE_SIZE)));
        assert!(resident(spans[1].start(), PAGE_SIZE), "live spans keep their memory");
        free(&heap, two);
        for s in spans.iter().skip(1).step_by(2) {
            free(&heap, s);
        }
        let stats = heap.stats();
        // Two runs, or one if the kernel placed the chunks back to back.
        assert!((1..=2).contains(&stats.free_runs), "{stats:?}");
        assert_eq!(stats.in_use_bytes, 0);
    }

    #[test]
    fn random_span_traffic_keeps_the_page_invariants() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let heap = PageHeap::new(PageHeapConfig {
            limit: None,
            huge_pages: false,
        });
        let mut rng = StdRng::seed_from_u64(7);
        let mut live: Vec<&Span> = Vec::new();
        for step in 0..3000 {
            if live.is_empty() || rng.random_bool(0.55) {
                let pages = if rng.random_bool(0.05) {
                    rng.random_range(100..600)
                } else {
                    rng.random_range(1..20)
                };
                let span = if rng.random_bool(0.5) {
                    let span = heap.alloc_large(pages).unwrap();
                    assert_eq!((span.pages(), span.kind()), (pages, Some(SpanKind::Large)));
                    span
                } else {
                    let class = ClassIndex::new(rng.random_range(1..86)).unwrap();
                    let span = heap.alloc_small(class).unwrap();
                    assert_eq!(span.kind(), Some(SpanKind::Small(class)));
                    assert_eq!(span.pages(), class.info().pages());
                    assert_eq!(span.capacity(), class.info().objects());
                    span
                };
                live.push(span);
            } else {
                let i = rng.random_range(0..live.len());
                free(&heap, live.swap_remove(i));
            }
            if step % 100 == 0 {
                let mut extents: Vec<_> = live.iter().map(|s| (s.start(), s.end())).collect();
                extents.sort_unstable();
                for w in extents.windows(2) {
                    assert!(w[0].1 <= w[1].0, "spans overlap: {w:?}");
                }
                for s in &live {
                    assert!(std::ptr::eq(heap.span_of(s.end() - 1).unwrap(), *s));
                }
                let stats = heap.stats();
                let in_use: usize = live.iter().map(|s| s.bytes()).sum();
                assert_eq!(stats.in_use_bytes, in_use);
                assert_eq!(stats.spans_in_use, live.len());
                assert_eq!(stats.free_bytes + stats.in_use_bytes, stats.mapped_bytes);
            }
        }
        for s in live.drain(..) {
            free(&heap, s);
        }
        let stats = heap.stats();
        assert_eq!(stats.in_use_bytes, 0);
        // Whatever got mapped has merged back into at most one run per mapping.
        assert!(stats.free_runs <= heap.lock().chunks.len());
    }
}
