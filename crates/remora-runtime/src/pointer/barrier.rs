//! Steps 1 and 3 of the protocol ([`crate::pointer`]) on one word: the
//! access barrier's fast path and slow path, short of the swap-in.
//! `runtime/access.rs` runs them with the policy's hotness, the used-bytes
//! counter and the swap-in of a far span; the loom models run the same
//! functions.

use super::{DIRTY, EVICTING, FAST_MASK, FRESH, HOT_MASK, HOT_SHIFT, LOCK, MOVING, PRESENT, SEALED, Slot, local_addr};
use crate::loom::{Ordering, spin_yield};

/// How [`Slot::slow_path`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slow {
    /// The object is local at this header address and unmarked (a mark
    /// was cleared under `L`): the caller may use it until its scope ends.
    Local(usize),
    /// This word names the far copy: the caller swaps the span in and runs
    /// the slow path again.
    Far(u64),
}

impl Slot {
    /// Step 1, the fast path: the object's header address if the word has
    /// `P` and none of `L`, `M`, `E`, `F` ([`super::FAST_MASK`]), after
    /// raising its hotness (to `on_access()`) and, for a `write`, `D` if
    /// not already set. `None`: the caller takes [`Slot::slow_path`].
    #[inline]
    pub(crate) fn fast_path(&self, write: bool, on_access: impl FnOnce() -> u8) -> Option<usize> {
        let w = self.word.load(Ordering::Acquire);
        if w & FAST_MASK == PRESENT {
            self.touch(w, write, on_access);
            return Some(local_addr(w));
        }
        None
    }

    /// The word, loaded (`Acquire`) once `L` is clear: spins while a
    /// thread holds the lock.
    #[inline]
    pub(super) fn load_unlocked(&self) -> u64 {
        loop {
            let w = self.word.load(Ordering::Acquire);
            if w & LOCK == 0 {
                return w;
            }
            spin_yield();
        }
    }

    /// The read/write barrier on the word `w` just loaded: raises hotness
    /// (and dirty on a write) only if not already set, so a hot object costs
    /// no atomic write per access.
    #[inline]
    fn touch(&self, w: u64, write: bool, on_access: impl FnOnce() -> u8) {
        let want = if write { HOT_MASK | DIRTY } else { HOT_MASK };
        if w & want != want {
            self.word
                .fetch_or(((on_access() as u64) << HOT_SHIFT) | (want & DIRTY), Ordering::Relaxed);
        }
    }

    /// Step 3, the slow path: waits while the word is locked or sealed,
    /// races a background thread for `L` on a word marked `E` or `M` (and,
    /// winning, clears the mark, which aborts its operation), clears `F` on
    /// the first dereference after a swap-in, and returns where the object
    /// is. `used` is given the header address of an object whose `F` this
    /// call cleared (its bytes count as used since the swap-in).
    #[inline]
    pub(crate) fn slow_path(&self, write: bool, on_access: impl Fn() -> u8, mut used: impl FnMut(usize)) -> Slow {
        loop {
            let w = self.load_unlocked();
            if w & PRESENT == 0 {
                return Slow::Far(w);
            }
            if w & SEALED != 0 {
                // The evictor is past its grace period: wait for its verdict.
                spin_yield();
                continue;
            }
            if w & (EVICTING | MOVING) != 0 {
                // Race the background thread for the lock; winning aborts its operation.
                if self.try_lock_exact(w) {
                    let hot = (on_access() as u64) << HOT_SHIFT;
                    let dirty = if write { DIRTY } else { 0 };
                    self.unlock_with((w & !(EVICTING | MOVING | HOT_MASK | FRESH)) | hot | dirty);
                    if w & FRESH != 0 {
                        used(local_addr(w));
                    }
                    return Slow::Local(local_addr(w));
                }
                continue;
            }
            if w & FRESH != 0 {
                if self.clear_fresh(w) {
                    used(local_addr(w));
                }
                continue;
            }
            self.touch(w, write, &on_access);
            return Slow::Local(local_addr(w));
        }
    }
}
