//! The slot table: runtime-owned homes of pointer words that never move.
//!
//! Slots come in 64 KiB chunks aligned to 64 KiB. Slot 0 of every chunk is a
//! header naming the runtime that owns the chunk, so a `RemBox` (8 bytes: the
//! address of its slot) finds its runtime when dropped by masking its own
//! address. Chunks are freed only when the runtime's last user is gone.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::loom::Ordering;
use crate::pointer::Slot;

/// Bytes per chunk (and its alignment).
pub(crate) const CHUNK_BYTES: usize = 64 * 1024;
const SLOTS_PER_CHUNK: usize = CHUNK_BYTES / std::mem::size_of::<Slot>();
const _: () = assert!(std::mem::size_of::<Slot>() == 16);

/// The first slot of a chunk, reinterpreted: who owns the chunk.
#[repr(C, align(16))]
struct ChunkHeader {
    owner: *const (),
    _pad: usize,
}
const _: () = assert!(std::mem::size_of::<ChunkHeader>() == std::mem::size_of::<Slot>());

struct Inner {
    chunks: Vec<NonNull<u8>>,
    free: Vec<NonNull<Slot>>,
}

/// All slots of one runtime.
pub(crate) struct SlotTable {
    owner: *const (),
    inner: Mutex<Inner>,
}

// SAFETY: the raw pointers name memory this table owns exclusively (chunks)
// or the runtime that owns the table; access to the lists is under the mutex.
unsafe impl Send for SlotTable {}
// SAFETY: as above; slots themselves are atomics.
unsafe impl Sync for SlotTable {}

fn chunk_layout() -> Layout {
    Layout::from_size_align(CHUNK_BYTES, CHUNK_BYTES).expect("power of two")
}

impl SlotTable {
    /// A table whose chunks name `owner` (the runtime's shared state).
    pub(crate) fn new(owner: *const ()) -> Self {
        Self {
            owner,
            inner: Mutex::new(Inner {
                chunks: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    /// Takes a free slot and stores `word` in it.
    pub(crate) fn alloc(&self, word: u64) -> NonNull<Slot> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.free.is_empty() {
            // SAFETY: the layout has a non-zero size.
            let base = unsafe { alloc_zeroed(chunk_layout()) };
            let Some(base) = NonNull::new(base) else {
                std::alloc::handle_alloc_error(chunk_layout());
            };
            // SAFETY: the chunk is freshly allocated, aligned for ChunkHeader,
            // and large enough; nothing else refers to it yet.
            unsafe {
                base.cast::<ChunkHeader>().as_ptr().write(ChunkHeader {
                    owner: self.owner,
                    _pad: 0,
                });
            }
            for i in (1..SLOTS_PER_CHUNK).rev() {
                // SAFETY: i < SLOTS_PER_CHUNK keeps the pointer inside the chunk.
                let s = unsafe { base.cast::<Slot>().add(i) };
                g.free.push(s);
            }
            g.chunks.push(base);
        }
        let s = g.free.pop().expect("refilled above");
        drop(g);
        // SAFETY: the slot lies in a live chunk and is not in use (it was on
        // the free list), so no one else accesses it; zeroed memory is a
        // valid Slot (two zero atomics).
        let slot = unsafe { s.as_ref() };
        slot.refs.store(1, Ordering::Relaxed);
        slot.word.store(word, Ordering::Release);
        s
    }

    /// Returns a slot to the table.
    pub(crate) fn free(&self, s: NonNull<Slot>) {
        // SAFETY: callers pass a slot they own, from a live chunk of this table.
        unsafe { s.as_ref() }.reset();
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).free.push(s);
    }

    /// Number of slots in use.
    pub(crate) fn in_use(&self) -> usize {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.chunks.len() * (SLOTS_PER_CHUNK - 1) - g.free.len()
    }
}

impl Drop for SlotTable {
    fn drop(&mut self) {
        let g = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        for c in g.chunks.drain(..) {
            // SAFETY: allocated in `alloc` with this layout, freed once.
            unsafe { dealloc(c.as_ptr(), chunk_layout()) };
        }
    }
}

/// The owner recorded in the chunk holding `slot`.
///
/// # Safety
/// `slot` must point into a live chunk of some `SlotTable`.
pub(crate) unsafe fn owner_of(slot: NonNull<Slot>) -> *const () {
    let base = (slot.as_ptr() as usize) & !(CHUNK_BYTES - 1);
    // SAFETY: per the contract the chunk is live; its first 16 bytes are the header.
    unsafe { (*(base as *const ChunkHeader)).owner }
}
