//! The access barrier: the fast and slow paths of a dereference (pointer
//! protocol steps 1 and 3, [`Slot::fast_path`] and [`Slot::slow_path`]),
//! with the policy's hotness, the used-bytes counter and the swap-in.

use std::ptr::NonNull;

use super::{DerefScope, Inner, slot_ref};
use crate::error::RuntimeError;
use crate::pointer::{Slot, Slow, far_loc};
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
        match s.fast_path(write, || self.policy.on_access()) {
            Some(addr) => Ok(addr),
            None => self.access_slow(s, write, scope),
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

    /// The slow path ([`Slot::slow_path`]), swapping a far span in until the
    /// object is local; also says whether it was far when we came (a miss).
    fn access_slow_inner(&self, s: &Slot, write: bool, scope: &DerefScope<'_>) -> Result<(usize, bool), RuntimeError> {
        let mut missed = false;
        loop {
            let w = match s.slow_path(write, || self.policy.on_access(), |addr| self.count_used(addr)) {
                Slow::Local(addr) => return Ok((addr, missed)),
                Slow::Far(w) => w,
            };
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
        }
    }

    /// Counts the object at `addr` as used since its span was swapped in.
    fn count_used(&self, addr: usize) {
        let size = self.heap.object_size_at(addr) as u64;
        self.counters.swapped_in_used(size);
    }
}
