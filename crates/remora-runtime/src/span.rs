//! Span metadata: where a span is, what it holds, and which of its object slots are free.
//!
//! ```text
//!   span (pages * 8 KiB, 8 KiB-aligned)
//!   +----------+----------+----------+-- ... --+--------------+-------+
//!   | slot 0   | slot 1   | slot 2   |         | slot cap-1   | waste |
//!   +----------+----------+----------+-- ... --+--------------+-------+
//!   ^start     ^start + object_size            ^start + (cap-1) * object_size
//!
//!   free bitmap: 16 x u64 = 1024 bits, bit i set <=> slot i is free; bits >= cap stay clear
//! ```
//!
//! A small-object span holds `capacity = span bytes / object_size` objects of one size class
//! (at most 1024, for the 8-byte class on one page). A large span holds one object that fills
//! it, and uses slot 0 of the same bitmap, so both kinds allocate and free the same way.
//! Objects hold no allocator state: all of it is here, so a stray write into an object cannot
//! corrupt the allocator.
//!
//! Every field is an atomic. Metadata is type-stable: the page heap recycles `Span`s but
//! never frees one before the heap itself, so a lock-free page-map reader holding a stale
//! `&Span` reads a valid (if outdated) span rather than freed memory. Who may write what:
//! the page heap, under its lock, writes the extent and kind; the central free list of the
//! span's class, under its lock, drives the slot operations (which are themselves atomic
//! read-modify-writes, so a slot is never handed out twice even without that lock).

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::size_classes::{ClassIndex, NUM_CLASSES, PAGE_SIZE};

/// Most objects a span can hold: one page of the 8-byte class.
pub(crate) const MAX_OBJECTS_PER_SPAN: usize = PAGE_SIZE / 8;
const BITMAP_WORDS: usize = MAX_OBJECTS_PER_SPAN / 64;

// `kind` encoding: size classes are 1..NUM_CLASSES, so they double as their own codes.
const KIND_FREE: u8 = 0;
const KIND_LARGE: u8 = 0xFE;
const KIND_UNUSED: u8 = 0xFF;
const _: () = assert!(NUM_CLASSES <= KIND_LARGE as usize);

/// Not on any central free list (`list_pos` value).
pub(crate) const NOT_LISTED: usize = usize::MAX;
/// Pinned by an eviction thread: not on a list, not to be freed (`list_pos` value).
pub(crate) const EVICTING_POS: usize = usize::MAX - 1;

/// What an in-use span holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// Objects of one size class.
    Small(ClassIndex),
    /// One object larger than the largest class, filling the span.
    Large,
}

/// Why a slot operation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// The index is not below the span's capacity.
    #[error("slot {index} out of range (capacity {capacity})")]
    OutOfRange {
        /// The index asked for.
        index: usize,
        /// The span's capacity.
        capacity: usize,
    },
    /// The slot was already free.
    #[error("slot {0} is already free")]
    AlreadyFree(usize),
}

/// Metadata of one span (see the module docs for the layout and the concurrency contract).
#[derive(Debug)]
pub struct Span {
    start: AtomicUsize,
    pages: AtomicUsize,
    kind: AtomicU8,
    object_size: AtomicUsize,
    capacity: AtomicU32,
    allocated: AtomicU32,
    /// Position in the class's list of spans with free slots, or `NOT_LISTED`.
    list_pos: AtomicUsize,
    /// Names the kept far copy of a swapped-in span (0: none); reset
    /// whenever the span is initialised for a new use.
    kept: AtomicU64,
    /// Filled by a filtering thread with objects it found cold.
    cold: std::sync::atomic::AtomicBool,
    free: [AtomicU64; BITMAP_WORDS],
}

impl Span {
    /// Fresh metadata describing nothing.
    pub(crate) fn unused() -> Self {
        Self {
            start: AtomicUsize::new(0),
            pages: AtomicUsize::new(0),
            kind: AtomicU8::new(KIND_UNUSED),
            object_size: AtomicUsize::new(0),
            capacity: AtomicU32::new(0),
            allocated: AtomicU32::new(0),
            list_pos: AtomicUsize::new(NOT_LISTED),
            kept: AtomicU64::new(0),
            cold: std::sync::atomic::AtomicBool::new(false),
            free: Default::default(),
        }
    }

    /// Describes the free run `[start, start + pages * PAGE_SIZE)`.
    pub(crate) fn set_free(&self, start: usize, pages: usize) {
        debug_assert_eq!(start % PAGE_SIZE, 0);
        self.start.store(start, Ordering::Relaxed);
        self.pages.store(pages, Ordering::Relaxed);
        self.kind.store(KIND_FREE, Ordering::Relaxed);
        self.capacity.store(0, Ordering::Relaxed);
        self.allocated.store(0, Ordering::Relaxed);
    }

    /// Marks recycled metadata as describing nothing.
    pub(crate) fn set_unused(&self) {
        self.kind.store(KIND_UNUSED, Ordering::Relaxed);
        self.capacity.store(0, Ordering::Relaxed);
    }

    /// Turns the (free) span into an in-use one of `kind` with every slot free.
    pub(crate) fn init(&self, kind: SpanKind) {
        let bytes = self.bytes();
        let (code, size) = match kind {
            SpanKind::Small(class) => (class.get() as u8, class.info().size()),
            SpanKind::Large => (KIND_LARGE, bytes),
        };
        let capacity = bytes / size;
        debug_assert!((1..=MAX_OBJECTS_PER_SPAN).contains(&capacity));
        for (w, word) in self.free.iter().enumerate() {
            let bits_here = capacity.saturating_sub(w * 64).min(64);
            let bits = if bits_here == 64 {
                u64::MAX
            } else {
                (1u64 << bits_here) - 1
            };
            word.store(bits, Ordering::Relaxed);
        }
        self.object_size.store(size, Ordering::Relaxed);
        self.capacity.store(capacity as u32, Ordering::Relaxed);
        self.allocated.store(0, Ordering::Relaxed);
        self.list_pos.store(NOT_LISTED, Ordering::Relaxed);
        self.kept.store(0, Ordering::Relaxed);
        self.cold.store(false, Ordering::Relaxed);
        self.kind.store(code, Ordering::Release);
    }

    /// First byte of the span.
    #[inline]
    pub fn start(&self) -> usize {
        self.start.load(Ordering::Relaxed)
    }

    /// Length in pages.
    #[inline]
    pub fn pages(&self) -> usize {
        self.pages.load(Ordering::Relaxed)
    }

    /// Length in bytes.
    #[inline]
    pub fn bytes(&self) -> usize {
        self.pages() * PAGE_SIZE
    }

    /// One past the last byte.
    #[inline]
    pub fn end(&self) -> usize {
        self.start() + self.bytes()
    }

    /// Whether `addr` lies inside the span.
    #[inline]
    pub fn contains(&self, addr: usize) -> bool {
        let start = self.start();
        addr >= start && addr - start < self.bytes()
    }

    /// What the span holds, or `None` when it is free (in the page heap) or unused metadata.
    #[inline]
    pub fn kind(&self) -> Option<SpanKind> {
        match self.kind.load(Ordering::Acquire) {
            KIND_LARGE => Some(SpanKind::Large),
            code => ClassIndex::new(code as usize).map(SpanKind::Small),
        }
    }

    /// Whether the span is a free run owned by the page heap.
    #[inline]
    pub fn is_free(&self) -> bool {
        self.kind.load(Ordering::Acquire) == KIND_FREE
    }

    /// Size of each object slot (the whole span for a large span; 0 when not in use).
    #[inline]
    pub fn object_size(&self) -> usize {
        self.object_size.load(Ordering::Relaxed)
    }

    /// Number of object slots (0 when not in use).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed) as usize
    }

    /// Number of allocated slots.
    #[inline]
    pub fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed) as usize
    }

    /// Whether every slot is allocated.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.allocated() == self.capacity()
    }

    /// Whether no slot is allocated.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.allocated() == 0
    }

    /// Claims the lowest free slot and returns its index, or `None` when the span is full.
    pub fn alloc_slot(&self) -> Option<usize> {
        let words = self.capacity().div_ceil(64);
        for (w, word) in self.free[..words].iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                let bit = bits.trailing_zeros() as usize;
                let mask = 1u64 << bit;
                // Acquire pairs with the Release in `free_slot`: the previous owner's writes to
                // the object happen before the new owner's.
                let before = word.fetch_and(!mask, Ordering::AcqRel);
                if before & mask != 0 {
                    self.allocated.fetch_add(1, Ordering::Relaxed);
                    return Some(w * 64 + bit);
                }
                bits = before & !mask;
            }
        }
        None
    }

    /// The lowest free slot, without claiming it (the caller claims it with
    /// [`Span::claim_slot`] once the object is initialised).
    pub fn first_free(&self) -> Option<usize> {
        let words = self.capacity().div_ceil(64);
        self.free[..words].iter().enumerate().find_map(|(w, word)| {
            let bits = word.load(Ordering::Acquire);
            (bits != 0).then(|| w * 64 + bits.trailing_zeros() as usize)
        })
    }

    /// Claims slot `index` if it is free (swap-in re-creates a span with its
    /// objects at their old indices). Returns whether it was free.
    pub fn claim_slot(&self, index: usize) -> bool {
        if index >= self.capacity() {
            return false;
        }
        let mask = 1u64 << (index % 64);
        let before = self.free[index / 64].fetch_and(!mask, Ordering::AcqRel);
        if before & mask != 0 {
            self.allocated.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Returns slot `index` to the free set.
    pub fn free_slot(&self, index: usize) -> Result<(), SlotError> {
        let capacity = self.capacity();
        if index >= capacity {
            return Err(SlotError::OutOfRange { index, capacity });
        }
        let mask = 1u64 << (index % 64);
        let before = self.free[index / 64].fetch_or(mask, Ordering::AcqRel);
        if before & mask != 0 {
            return Err(SlotError::AlreadyFree(index));
        }
        self.allocated.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether slot `index` is allocated (false when out of range).
    pub fn is_allocated(&self, index: usize) -> bool {
        index < self.capacity() && self.free[index / 64].load(Ordering::Acquire) & (1u64 << (index % 64)) == 0
    }

    /// Address of slot `index`'s first byte. `index` should be below the capacity.
    #[inline]
    pub fn object_addr(&self, index: usize) -> usize {
        debug_assert!(index < self.capacity());
        self.start() + index * self.object_size()
    }

    /// The slot whose bytes include `addr` (an interior address works), or `None` when `addr`
    /// is outside the span or in the unused tail.
    #[inline]
    pub fn slot_containing(&self, addr: usize) -> Option<usize> {
        let offset = addr.checked_sub(self.start())?;
        let size = self.object_size();
        if size == 0 {
            return None;
        }
        let index = offset / size;
        (index < self.capacity()).then_some(index)
    }

    /// The slot that starts exactly at `addr`.
    #[inline]
    pub fn slot_at(&self, addr: usize) -> Option<usize> {
        self.slot_containing(addr)
            .filter(|&i| addr == self.start() + i * self.object_size())
    }

    pub(crate) fn list_pos(&self) -> usize {
        self.list_pos.load(Ordering::Relaxed)
    }

    /// Whether a filtering thread filled this span with cold objects (or
    /// last found only cold objects in it; it clears the flag when it finds
    /// a hot one). Reset when the span is initialised for a new use.
    pub fn is_cold(&self) -> bool {
        self.cold.load(Ordering::Relaxed)
    }

    /// Marks this span as filled with cold objects (or not).
    pub fn set_cold(&self, cold: bool) {
        self.cold.store(cold, Ordering::Relaxed);
    }

    /// The id of this span's kept far copy (0: none).
    pub(crate) fn kept(&self) -> u64 {
        self.kept.load(Ordering::Acquire)
    }

    /// Records the id of this span's kept far copy.
    pub(crate) fn set_kept(&self, id: u64) {
        self.kept.store(id, Ordering::Release);
    }

    /// Takes the id of this span's kept far copy, leaving none.
    pub(crate) fn take_kept(&self) -> u64 {
        self.kept.swap(0, Ordering::AcqRel)
    }

    pub(crate) fn set_list_pos(&self, pos: usize) {
        self.list_pos.store(pos, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size_classes::SizeClass;
    use std::collections::HashSet;

    const BASE: usize = 0x7000_0000_0000;

    fn small_span(bytes: usize) -> Span {
        let class = SizeClass::for_size(bytes).unwrap();
        let span = Span::unused();
        span.set_free(BASE, class.info().pages());
        span.init(SpanKind::Small(class));
        span
    }

    #[test]
    fn fresh_metadata_is_nothing() {
        let span = Span::unused();
        assert_eq!(span.kind(), None);
        assert!(!span.is_free());
        assert_eq!(span.alloc_slot(), None);
        span.set_free(BASE, 3);
        assert!(span.is_free());
        assert_eq!(span.kind(), None);
        assert_eq!(
            (span.start(), span.pages(), span.end()),
            (BASE, 3, BASE + 3 * PAGE_SIZE)
        );
    }

    #[test]
    fn every_class_fills_and_empties_exactly() {
        for class in crate::size_classes::ClassIndex::all() {
            let info = class.info();
            let span = small_span(info.size());
            assert_eq!(span.kind(), Some(SpanKind::Small(class)));
            assert_eq!(span.capacity(), info.objects());
            let mut seen = HashSet::new();
            while let Some(i) = span.alloc_slot() {
                assert!(seen.insert(i));
                assert!(span.is_allocated(i));
            }
            assert_eq!(seen.len(), info.objects());
            assert!(span.is_full());
            for i in 0..info.objects() {
                span.free_slot(i).unwrap();
            }
            assert!(span.is_empty());
            assert_eq!(span.free_slot(0), Err(SlotError::AlreadyFree(0)));
            let cap = info.objects();
            assert_eq!(
                span.free_slot(cap),
                Err(SlotError::OutOfRange {
                    index: cap,
                    capacity: cap
                })
            );
        }
    }

    #[test]
    fn lowest_free_slot_first() {
        let span = small_span(64);
        for expect in 0..10 {
            assert_eq!(span.alloc_slot(), Some(expect));
        }
        span.free_slot(3).unwrap();
        span.free_slot(7).unwrap();
        assert_eq!(span.alloc_slot(), Some(3));
        assert_eq!(span.alloc_slot(), Some(7));
        assert_eq!(span.alloc_slot(), Some(10));
        assert_eq!(span.allocated(), 11);
    }

    #[test]
    fn address_index_round_trip() {
        let span = small_span(48);
        let size = span.object_size();
        assert_eq!(size, 48);
        for i in 0..span.capacity() {
            let addr = span.object_addr(i);
            assert_eq!(span.slot_at(addr), Some(i));
            assert_eq!(span.slot_containing(addr + size - 1), Some(i));
            if size > 1 {
                assert_eq!(span.slot_at(addr + 1), None);
            }
        }
        // 8192 / 48 = 170 slots, 32 bytes of tail waste.
        let tail = span.start() + span.capacity() * size;
        assert_eq!(span.slot_containing(tail), None);
        assert_eq!(span.slot_containing(BASE - 1), None);
        assert_eq!(span.slot_containing(span.end()), None);
        assert!(span.contains(span.end() - 1) && !span.contains(span.end()));
    }

    #[test]
    fn large_span_is_one_slot() {
        let span = Span::unused();
        span.set_free(BASE, 40);
        span.init(SpanKind::Large);
        assert_eq!(span.kind(), Some(SpanKind::Large));
        assert_eq!((span.capacity(), span.object_size()), (1, 40 * PAGE_SIZE));
        assert_eq!(span.alloc_slot(), Some(0));
        assert_eq!(span.alloc_slot(), None);
        assert_eq!(span.slot_containing(BASE + 40 * PAGE_SIZE - 1), Some(0));
        assert_eq!(span.slot_at(BASE), Some(0));
        span.free_slot(0).unwrap();
        assert!(span.is_empty());
    }

    #[test]
    fn concurrent_claims_never_share_a_slot() {
        let span = small_span(8);
        let claimed: Vec<Vec<usize>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| std::iter::from_fn(|| span.alloc_slot()).collect()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = claimed.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(all, (0..MAX_OBJECTS_PER_SPAN).collect::<Vec<_>>());
        assert!(span.is_full());
    }

    #[test]
    fn cold_hint_is_reset_when_the_span_is_reused() {
        let span = small_span(64);
        assert!(!span.is_cold());
        span.set_cold(true);
        assert!(span.is_cold());
        span.set_free(BASE, 1);
        span.init(SpanKind::Small(SizeClass::for_size(64).unwrap()));
        assert!(!span.is_cold(), "a new life starts hot");
    }
}
