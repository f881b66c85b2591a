//! The access barrier: the fast and slow paths of a dereference (pointer
//! protocol steps 1 and 3).

use std::ptr::NonNull;

use super::{DerefScope, Inner, slot_ref};
use crate::error::RuntimeError;
use crate::loom::Ordering;
use crate::pointer::{
    DIRTY, EVICTING, FAST_MASK, FRESH, HOT_MASK, HOT_SHIFT, LOCK, MOVING, PRESENT, SEALED, Slot, far_loc, local_addr,
};
use crate::scheme::SpanAddr;

impl Inner {
    /// Resolves a pointer to its object's header address, swapping the span
    /// in if needed. Must be called inside a deref scope of this runtime.
    #[inline]
    pub(crate) fn access(
        &self,
        slot: NonNull<Slot>,
        write: bool,
        scope: &DerefScope<'_>,
    ) -> Result<usize, RuntimeError> {
        let s = slot_ref(slot);
        let w = s.word.load(Ordering::Acquire);
        if w & FAST_MASK == PRESENT {
            self.touch(s, w, write);
            return Ok(local_addr(w));
        }
        self.access_slow(s, write, scope)
    }

    /// The read/write barrier: raises hotness (and dirty on a write) only if
    /// not already set, so a hot object costs no atomic write per access.
    #[inline]
    pub(super) fn touch(&self, s: &Slot, w: u64, write: bool) {
        let want = if write { HOT_MASK | DIRTY } else { HOT_MASK };
        if w & want != want {
            s.word.fetch_or(
                ((self.policy.on_access() as u64) << HOT_SHIFT) | (want & DIRTY),
                Ordering::Relaxed,
            );
        }
    }

    #[cold]
    pub(super) fn access_slow(&self, s: &Slot, write: bool, scope: &DerefScope<'_>) -> Result<usize, RuntimeError> {
        let r = self.access_slow_inner(s, write, scope);
        if let Ok((_, true)) = r {
            self.counters.deref_missed();
        }
        r.map(|(addr, _)| addr)
    }

    /// The slow path; also says whether the object was far when we came (a miss).
    fn access_slow_inner(&self, s: &Slot, write: bool, scope: &DerefScope<'_>) -> Result<(usize, bool), RuntimeError> {
        let mut missed = false;
        loop {
            let w = s.word.load(Ordering::Acquire);
            if w & LOCK != 0 {
                crate::loom::spin_yield();
                continue;
            }
            if w & PRESENT == 0 {
                missed = true;
                let loc = far_loc(w);
                if let Err(e) = self.swap_in(loc, scope) {
                    return Err(if self.lifecycle.expired() {
                        RuntimeError::SessionExpired
                    } else {
                        // A loss names the object the caller asked for.
                        let at = SpanAddr {
                            region: loc.region,
                            page: loc.page,
                        };
                        e.naming(at, loc.object)
                    });
                }
                continue;
            }
            if w & SEALED != 0 {
                // The evictor is past its grace period: wait for its verdict.
                crate::loom::spin_yield();
                continue;
            }
            if w & (EVICTING | MOVING) != 0 {
                // Race the background thread for the lock; winning aborts its operation.
                if s.try_lock_exact(w) {
                    let hot = (self.policy.on_access() as u64) << HOT_SHIFT;
                    let dirty = if write { DIRTY } else { 0 };
                    s.unlock_with((w & !(EVICTING | MOVING | HOT_MASK | FRESH)) | hot | dirty);
                    if w & FRESH != 0 {
                        self.count_used(local_addr(w));
                    }
                    return Ok((local_addr(w), missed));
                }
                continue;
            }
            if w & FRESH != 0 {
                if s.clear_fresh(w) {
                    self.count_used(local_addr(w));
                }
                continue;
            }
            self.touch(s, w, write);
            return Ok((local_addr(w), missed));
        }
    }

    /// Counts the object at `addr` as used since its span was swapped in.
    fn count_used(&self, addr: usize) {
        let size = self.heap.object_size_at(addr) as u64;
        self.counters.swapped_in_used(size);
    }
}
