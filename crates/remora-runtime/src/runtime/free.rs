//! Freeing objects, local or far.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering as StdOrdering;

use super::{Inner, header, slot_ref};
use crate::far_page_map::{FarSpan, FarSpanState};
use crate::loom::Ordering;
use crate::object::{HEADER, Remotable};
use crate::pointer::{EVICTING, Freeing, Slot, far_loc, local_addr};
use crate::scheme::SpanAddr;
use crate::slots::owner_of;

impl Inner {
    /// Frees the object owned by `slot` (dropping its value first if `T`
    /// needs it) and the slot.
    ///
    /// Frees nested in another free on the same thread (a value's fields
    /// dropping their own pointers) are queued and run by the outermost one,
    /// so dropping a long linked structure uses constant stack.
    ///
    /// # Safety
    /// `slot` comes from a runtime's slot table and its last owner is giving it up.
    pub(crate) unsafe fn free_object<T: Remotable>(slot: NonNull<Slot>) {
        type Pending = (NonNull<Slot>, unsafe fn(NonNull<Slot>));
        thread_local! {
            static PENDING: std::cell::RefCell<Option<Vec<Pending>>> = const { std::cell::RefCell::new(None) };
        }
        let nested = PENDING.with(|p| {
            let mut p = p.borrow_mut();
            match p.as_mut() {
                Some(q) => {
                    q.push((slot, Self::free_one::<T>));
                    true
                }
                None => {
                    *p = Some(Vec::new());
                    false
                }
            }
        });
        if nested {
            return;
        }
        // SAFETY: forwarded from our caller.
        unsafe { Self::free_one::<T>(slot) };
        while let Some((s, f)) = PENDING.with(|p| p.borrow_mut().as_mut().and_then(Vec::pop)) {
            // SAFETY: queued by a nested call under the same contract.
            unsafe { f(s) };
        }
        PENDING.with(|p| *p.borrow_mut() = None);
    }

    /// Frees one object (see [`Inner::free_object`]).
    ///
    /// # Safety
    /// As [`Inner::free_object`].
    pub(super) unsafe fn free_one<T: Remotable>(slot: NonNull<Slot>) {
        // SAFETY: per the contract, the slot's chunk is live and names its runtime.
        let inner = unsafe { &*(owner_of(slot) as *const Inner) };
        let s = slot_ref(slot);
        let mut value: Option<T> = None;
        // The far copy could not be read back (its data is lost): the object
        // is freed far without running its drop glue.
        let mut unreadable = false;
        loop {
            let w = match s.lock_for_free() {
                Freeing::Far(w) => w,
                Freeing::Local(w) => {
                    // We hold L on a present object: no one can move it now; a
                    // pending eviction of its span will see the slot change and abort.
                    let addr = local_addr(w);
                    if std::mem::needs_drop::<T>() {
                        // SAFETY: the object is live and local; we read it out exactly once.
                        value = Some(unsafe { ((addr + HEADER) as *const T).read() });
                    }
                    // The header of an object whose span is being written out
                    // (`E`: the word cannot gain it while we hold `L`) is left
                    // alone: the evictor sends the span's bytes as they are, and
                    // computes the parity of a spanset from them, with no lock
                    // on the object. A store here could land between the two,
                    // leaving a far member that differs from what its parity
                    // covers: the eviction aborts on the changed word, but the
                    // member stays in its spanset as a hole, and every later
                    // decode that reads it comes out wrong. The slot is free in
                    // the span's bitmap all the same, and a stale reverse
                    // reference names a slot whose word no longer names this
                    // address, so nothing follows it.
                    if w & EVICTING == 0 {
                        // SAFETY: the header of a live local object.
                        unsafe { header(addr) }.store(0, StdOrdering::Release);
                    }
                    inner.heap.free(addr);
                    inner.wake_room();
                    break;
                }
            };
            if std::mem::needs_drop::<T>() && !unreadable {
                // Its drop glue must run on the real bytes: bring it back
                // first, inside a scope of our own (the swap-in needs one).
                let scope = inner.bare_scope();
                if let Err(e) = inner.swap_in(far_loc(w), &scope) {
                    // What it owned leaks, but its far space and slot do not.
                    tracing::error!("dropping an unreadable far object without its drop glue: {e}");
                    unreadable = true;
                }
                continue;
            }
            let loc = far_loc(w);
            let Some(fs) = inner.far_map.get(loc.region, loc.page) else {
                continue; // swapped in meanwhile; retry as local
            };
            let mut st = fs.lock();
            if st.gone || s.word.load(Ordering::Acquire) != w {
                continue;
            }
            inner.far_object_left(&fs, &mut st, loc.object as usize);
            break;
        }
        inner.slots.free(slot);
        drop(value);
        // SAFETY: balances the count taken when the object was allocated.
        unsafe { Arc::decrement_strong_count(inner as *const Inner) };
    }

    /// Object `i` left the far span `fs` (freed, or swapped in alone), whose
    /// lock `st` the caller holds: the span goes with its last object.
    pub(super) fn far_object_left(&self, fs: &FarSpan, st: &mut FarSpanState, i: usize) {
        st.live[i / 64] &= !(1 << (i % 64));
        st.live_count -= 1;
        self.far_map.object_freed();
        if st.live_count == 0 {
            st.gone = true;
            self.far_map.remove(fs.region, fs.page, 0);
            let at = SpanAddr {
                region: fs.region,
                page: fs.page,
            };
            self.scheme.release(&self.far, at, fs.pages);
        }
    }
}
