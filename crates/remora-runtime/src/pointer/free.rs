//! Step 7 of the protocol ([`crate::pointer`]) on one word: the owner's
//! free. `runtime/free.rs` `free_one` runs these functions with the heap,
//! the far page map and (for a far object with drop glue) the swap-in; the
//! loom models run the same functions.

use super::{PRESENT, Slot};

/// How [`Slot::lock_for_free`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freeing {
    /// The word was this (with `P`) and the caller now holds `L` on it: the
    /// object is local at its payload and no background thread can move
    /// or evict it any more (a pending eviction or move of its span sees
    /// the word changed and aborts).
    Local(u64),
    /// This word names the far copy; nothing was locked.
    Far(u64),
}

impl Slot {
    /// Waits while the word is locked, then locks a local object exactly
    /// as it is (whatever its marks: the free wins over a marked move or
    /// eviction, which abort on the changed word) or returns a far word.
    #[inline]
    pub(crate) fn lock_for_free(&self) -> Freeing {
        loop {
            let w = self.load_unlocked();
            if w & PRESENT == 0 {
                return Freeing::Far(w);
            }
            if self.try_lock_exact(w) {
                return Freeing::Local(w);
            }
        }
    }

    /// Gives the slot back: the word becomes 0 (no object), released
    /// (and unlocked, if the caller held `L`) with
    /// [`crate::loom::store_release`].
    #[inline]
    pub(crate) fn reset(&self) {
        crate::loom::store_release(&self.word, 0);
    }
}
