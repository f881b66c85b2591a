//! The local page map: a two-level radix tree from page number to span metadata (paper §3.3).
//!
//! ```text
//!   virtual address (48 bits used; x86-64 and aarch64 user space)
//!   47                   28 27             13 12          0
//!  +-----------------------+-----------------+-------------+
//!  |   root index (20)     |  leaf index (15)| page offset |
//!  +-----------------------+-----------------+-------------+
//!   \______________ page number (35 bits) __/   (13 bits)
//! ```
//!
//! The root is 2^20 pointers (8 MiB of address space, obtained zeroed so that untouched parts
//! never become resident); each leaf is 2^15 pointers (256 KiB) and covers 256 MiB of
//! addresses. Leaves are allocated on first write and never freed before the map itself, which
//! is what lets readers walk the tree without a lock: a leaf pointer, once non-null, stays
//! valid. Entries are raw pointers that the map never dereferences; what they point to, and
//! how long it lives, is the owner's business (the page heap keeps span metadata alive for
//! its own lifetime).
//!
//! Writers publish with `Release` and readers load with `Acquire`, so a reader that sees an
//! entry also sees whatever the writer initialised before storing it. Writers may race with
//! each other (leaf installation is a compare-exchange), though the page heap serialises them
//! under its lock anyway.

use std::alloc::{self, Layout};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::size_classes::PAGE_SHIFT;

/// Bits of virtual address the map covers.
pub(crate) const ADDRESS_BITS: u32 = 48;
/// Bits of page number: `ADDRESS_BITS - PAGE_SHIFT`.
pub(crate) const PAGE_NUMBER_BITS: u32 = ADDRESS_BITS - PAGE_SHIFT;
/// Bits of page number that index the root.
pub(crate) const ROOT_BITS: u32 = 20;
/// Bits of page number that index a leaf.
pub(crate) const LEAF_BITS: u32 = PAGE_NUMBER_BITS - ROOT_BITS;

const ROOT_LEN: usize = 1 << ROOT_BITS;
const LEAF_LEN: usize = 1 << LEAF_BITS;

/// The page number of the page holding `addr`.
#[inline]
pub(crate) const fn page_of(addr: usize) -> usize {
    addr >> PAGE_SHIFT
}

#[repr(transparent)]
struct Leaf<T> {
    entries: [AtomicPtr<T>; LEAF_LEN],
}

/// A two-level radix tree from page numbers to `*mut T`, with lock-free lookups.
pub(crate) struct PageMap<T> {
    root: NonNull<AtomicPtr<Leaf<T>>>,
    leaves: AtomicUsize,
}

// SAFETY: the map holds only atomics (the root array and leaves) and never dereferences the
// `T` pointers it stores, so sharing or sending it is as safe as sharing `AtomicPtr<T>`.
unsafe impl<T> Send for PageMap<T> {}
// SAFETY: as above; every access to the shared arrays goes through atomics.
unsafe impl<T> Sync for PageMap<T> {}

impl<T> Default for PageMap<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> PageMap<T> {
    /// An empty map. Reserves the 8 MiB root, zeroed lazily by the OS.
    pub(crate) fn new() -> Self {
        Self {
            root: zeroed_array::<AtomicPtr<Leaf<T>>>(ROOT_LEN),
            leaves: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn root(&self) -> &[AtomicPtr<Leaf<T>>] {
        // SAFETY: `root` points to `ROOT_LEN` initialised (all-zero = null) atomics, allocated in
        // `new` and freed only in `drop`, which needs `&mut self`.
        unsafe { std::slice::from_raw_parts(self.root.as_ptr(), ROOT_LEN) }
    }

    /// The entry for page number `page`, or null when none was ever set or `page` is beyond
    /// the map's 35 bits.
    #[inline]
    pub(crate) fn get(&self, page: usize) -> *mut T {
        if page >> PAGE_NUMBER_BITS != 0 {
            return ptr::null_mut();
        }
        let leaf = self.root()[page >> LEAF_BITS].load(Ordering::Acquire);
        if leaf.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: non-null leaf pointers are installed once and freed only in `drop`.
        let leaf = unsafe { &*leaf };
        leaf.entries[page & (LEAF_LEN - 1)].load(Ordering::Acquire)
    }

    /// The entry for the page holding `addr`.
    #[inline]
    pub(crate) fn get_addr(&self, addr: usize) -> *mut T {
        self.get(page_of(addr))
    }

    /// Sets the entry for page number `page`.
    ///
    /// # Panics
    /// If `page` does not fit in [`PAGE_NUMBER_BITS`]; callers check addresses when they map
    /// memory.
    pub(crate) fn set(&self, page: usize, value: *mut T) {
        self.leaf_for(page).entries[page & (LEAF_LEN - 1)].store(value, Ordering::Release);
    }

    /// Sets the entries for `count` pages starting at `first`.
    ///
    /// # Panics
    /// As [`PageMap::set`], for any page of the range.
    pub(crate) fn set_range(&self, first: usize, count: usize, value: *mut T) {
        let mut page = first;
        let end = first.checked_add(count).expect("page range overflows");
        while page < end {
            let leaf = self.leaf_for(page);
            let stop = end.min((page | (LEAF_LEN - 1)) + 1);
            for entry in &leaf.entries[page & (LEAF_LEN - 1)..=(stop - 1) & (LEAF_LEN - 1)] {
                entry.store(value, Ordering::Release);
            }
            page = stop;
        }
    }

    /// Number of leaves allocated so far (each costs 256 KiB of address space).
    #[cfg(test)]
    pub(crate) fn leaves_allocated(&self) -> usize {
        self.leaves.load(Ordering::Relaxed)
    }

    fn leaf_for(&self, page: usize) -> &Leaf<T> {
        assert!(
            page >> PAGE_NUMBER_BITS == 0,
            "page number {page:#x} beyond the page map's {PAGE_NUMBER_BITS} bits"
        );
        let slot = &self.root()[page >> LEAF_BITS];
        let mut leaf = slot.load(Ordering::Acquire);
        if leaf.is_null() {
            let fresh = zeroed_array::<Leaf<T>>(1).as_ptr();
            match slot.compare_exchange(leaf, fresh, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.leaves.fetch_add(1, Ordering::Relaxed);
                    leaf = fresh;
                }
                Err(winner) => {
                    // SAFETY: `fresh` came from `zeroed_array::<Leaf<T>>(1)` and was never
                    // published, so nobody else can see it.
                    unsafe { free_array(NonNull::new_unchecked(fresh), 1) };
                    leaf = winner;
                }
            }
        }
        // SAFETY: non-null leaf pointers are installed once and freed only in `drop`.
        unsafe { &*leaf }
    }
}

impl<T> Drop for PageMap<T> {
    fn drop(&mut self) {
        for slot in self.root() {
            if let Some(leaf) = NonNull::new(slot.load(Ordering::Relaxed)) {
                // SAFETY: every non-null root entry is a leaf from `zeroed_array::<Leaf<T>>(1)`,
                // installed exactly once; `&mut self` means no reader is left.
                unsafe { free_array(leaf, 1) };
            }
        }
        // SAFETY: the root came from `zeroed_array(ROOT_LEN)` in `new` and is freed once, here.
        unsafe { free_array(self.root, ROOT_LEN) };
    }
}

/// Allocates `len` values of `U` with every byte zero. Only used for types made of atomic
/// pointers, for which all-zero is a valid (null) value.
fn zeroed_array<U>(len: usize) -> NonNull<U> {
    let layout = Layout::array::<U>(len).expect("page map array layout");
    // SAFETY: the layout has non-zero size (both users allocate at least one pointer).
    let raw = unsafe { alloc::alloc_zeroed(layout) };
    NonNull::new(raw.cast::<U>()).unwrap_or_else(|| alloc::handle_alloc_error(layout))
}

/// Frees an array from [`zeroed_array`].
///
/// # Safety
/// `ptr` must come from `zeroed_array::<U>(len)` with the same `len`, and must not be used
/// afterwards.
unsafe fn free_array<U>(ptr: NonNull<U>, len: usize) {
    let layout = Layout::array::<U>(len).expect("page map array layout");
    // SAFETY: the caller guarantees `ptr` was allocated with exactly this layout.
    unsafe { alloc::dealloc(ptr.as_ptr().cast(), layout) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size_classes::PAGE_SIZE;
    use std::sync::Arc;

    #[test]
    fn layout_matches_the_paper() {
        assert_eq!(PAGE_NUMBER_BITS, 35);
        assert_eq!(ROOT_BITS, 20);
        assert_eq!(LEAF_BITS, 15);
    }

    #[test]
    fn unset_pages_are_null() {
        let map = PageMap::<u64>::new();
        assert!(map.get(0).is_null());
        assert!(map.get((1 << PAGE_NUMBER_BITS) - 1).is_null());
        assert!(map.get(1 << PAGE_NUMBER_BITS).is_null());
        assert!(map.get(usize::MAX).is_null());
        assert_eq!(map.leaves_allocated(), 0);
    }

    #[test]
    fn set_and_get_resolve_every_page_of_a_range() {
        let map = PageMap::<u64>::new();
        let mut a = 1u64;
        let mut b = 2u64;
        let pa: *mut u64 = &mut a;
        let pb: *mut u64 = &mut b;
        // A range straddling a leaf boundary.
        let first = LEAF_LEN - 3;
        map.set_range(first, 7, pa);
        map.set(first + 7, pb);
        for page in first..first + 7 {
            assert_eq!(map.get(page), pa, "page {page}");
            assert_eq!(map.get_addr(page * PAGE_SIZE + 123), pa);
        }
        assert_eq!(map.get(first + 7), pb);
        assert!(map.get(first - 1).is_null());
        assert!(map.get(first + 8).is_null());
        assert_eq!(map.leaves_allocated(), 2);
        // The top of the address space works too.
        let top = (1 << PAGE_NUMBER_BITS) - 1;
        map.set(top, pb);
        assert_eq!(map.get(top), pb);
        assert_eq!(map.leaves_allocated(), 3);
    }

    #[test]
    #[should_panic(expected = "beyond the page map")]
    fn setting_beyond_35_bits_panics() {
        PageMap::<u64>::new().set(1 << PAGE_NUMBER_BITS, ptr::null_mut());
    }

    #[test]
    fn concurrent_writers_and_readers() {
        let map = Arc::new(PageMap::<u8>::new());
        // Each writer owns a disjoint set of pages in the same leaves, so leaf installation
        // races, and every entry encodes its own page number.
        let threads: Vec<_> = (0..4usize)
            .map(|t| {
                let map = Arc::clone(&map);
                std::thread::spawn(move || {
                    for i in 0..4096usize {
                        let page = (i * 4 + t) * 97;
                        map.set(page, ptr::without_provenance_mut(page + 1));
                        let other = (page * 4) % (4096 * 4 * 97);
                        let seen = map.get(other);
                        assert!(seen.is_null() || seen.addr() == other + 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for page in (0..4096 * 4).map(|i| i * 97) {
            assert_eq!(map.get(page).addr(), page + 1);
        }
    }
}
