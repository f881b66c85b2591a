//! Remotable objects and the pointers that own them (§3.2).
//!
//! An object lives in a span as raw bytes: an 8-byte header holding the
//! address of its pointer slot (the reverse reference), then the value.
//! Values are never serialized, so `T` must be plain data whose bytes can be
//! copied to another machine and back: [`Remotable`] marks such types. Because
//! remotable pointers are handles to slots that never move, a `RemBox` inside
//! an object stays valid while the object is in far memory, so linked
//! structures can be built from remotable objects.
//!
//! ```
//! use remora_runtime::{RemBox, Remotable};
//! #[derive(Clone, Copy)]
//! struct Point { x: u64, y: u64 }
//! // SAFETY: two integers; no references, no heap pointers.
//! unsafe impl Remotable for Point {}
//! struct Node { value: u64, next: Option<RemBox<Node>> }
//! // SAFETY: an integer and a remotable pointer.
//! unsafe impl Remotable for Node {}
//! ```
//!
//! A reference obtained inside a deref scope cannot outlive it:
//!
//! ```compile_fail
//! # fn f(rt: &remora_runtime::Runtime, b: &remora_runtime::RemBox<u64>) {
//! let r: &u64 = {
//!     let scope = rt.scope();
//!     b.deref(&scope).unwrap()
//! }; // `scope` dropped here while still borrowed
//! println!("{r}");
//! # }
//! ```

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::RuntimeError;
use crate::pointer::Slot;
use crate::runtime::{DerefScope, Inner};

/// Types whose values may live in far memory as raw bytes.
///
/// # Safety
/// Every bit pattern the value holds must stay meaningful after being copied
/// to another machine and back into a different local address: no
/// references, raw pointers into local memory, or owning heap pointers
/// (`Box`, `Vec`, `String`); remotable pointers are fine. Alignment must be
/// at most 8. No interior mutability (atomics, `Cell`): the bytes may change
/// only through `deref_mut`, which marks the object dirty, or a span swapped
/// back out without a write (clean re-eviction) would lose the change.
pub unsafe trait Remotable: Send + Sync + 'static {}

macro_rules! plain {
    ($($t:ty),*) => { $(
        // SAFETY: plain integers / floats / bool / char: self-contained bytes.
        unsafe impl Remotable for $t {}
    )* };
}
plain!(
    u8,
    u16,
    u32,
    u64,
    usize,
    i8,
    i16,
    i32,
    i64,
    isize,
    f32,
    f64,
    bool,
    char,
    ()
);

// SAFETY: an array of remotable values is remotable.
unsafe impl<T: Remotable, const N: usize> Remotable for [T; N] {}
// SAFETY: an option of a remotable value is remotable.
unsafe impl<T: Remotable> Remotable for Option<T> {}
// SAFETY: remotable pointers are slot handles, valid wherever the object lives.
unsafe impl<T: Remotable> Remotable for RemBox<T> {}
// SAFETY: as for `RemBox`.
unsafe impl<T: Remotable> Remotable for RemRc<T> {}
macro_rules! tuples {
    ($(($($n:ident),+)),*) => { $(
        // SAFETY: a tuple of remotable values is remotable.
        unsafe impl<$($n: Remotable),+> Remotable for ($($n,)+) {}
    )* };
}
tuples!((A), (A, B), (A, B, C), (A, B, C, D));

/// Size of the object header (the reverse reference).
pub(crate) const HEADER: usize = 8;

/// The object behind `slot` for the scope's lifetime, swapping it in if needed.
fn shared_ref<'s, T: Remotable>(slot: NonNull<Slot>, scope: &'s DerefScope<'_>) -> Result<&'s T, RuntimeError> {
    let addr = scope.inner().access(slot, false, scope)?;
    scope.note_handed();
    // SAFETY: `access` returned the header address of this live object,
    // which stays put until the scope ends (pointer-protocol I2/I3), and the
    // caller's pointer keeps the object alive at least that long.
    Ok(unsafe { &*((addr + HEADER) as *const T) })
}

/// A unique remotable pointer: 8 bytes, owns one object that may live in
/// local or far memory. Dereference it inside a [`DerefScope`].
pub struct RemBox<T: Remotable> {
    slot: NonNull<Slot>,
    _owns: PhantomData<T>,
}

// SAFETY: the object is owned like a Box<T>; T is Send + Sync.
unsafe impl<T: Remotable> Send for RemBox<T> {}
// SAFETY: shared access only hands out &T inside scopes.
unsafe impl<T: Remotable> Sync for RemBox<T> {}

impl<T: Remotable> RemBox<T> {
    pub(crate) fn from_slot(slot: NonNull<Slot>) -> Self {
        Self {
            slot,
            _owns: PhantomData,
        }
    }

    /// A shared reference valid for the scope.
    pub fn deref<'s>(&'s self, scope: &'s DerefScope<'_>) -> Result<&'s T, RuntimeError> {
        shared_ref(self.slot, scope)
    }

    /// An exclusive reference valid for the scope; marks the object dirty.
    pub fn deref_mut<'s>(&'s mut self, scope: &'s DerefScope<'_>) -> Result<&'s mut T, RuntimeError> {
        let addr = scope.inner().access(self.slot, true, scope)?;
        scope.note_handed();
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        Ok(unsafe { &mut *((addr + HEADER) as *mut T) })
    }

    /// Whether the object is in local memory right now (a snapshot).
    pub fn is_local(&self) -> bool {
        // SAFETY: the slot lives as long as this pointer.
        let w = unsafe { self.slot.as_ref() }
            .word
            .load(std::sync::atomic::Ordering::Relaxed);
        w & crate::pointer::PRESENT != 0
    }

    /// The far span holding the object right now and its index in it, or
    /// `None` while it is local (a snapshot). A
    /// [`RuntimeError::DataLost`] names spans and objects the same way, so
    /// an application can tell which of its objects a loss concerns.
    pub fn far_span(&self) -> Option<(crate::scheme::SpanAddr, u16)> {
        // SAFETY: the slot lives as long as this pointer.
        let w = unsafe { self.slot.as_ref() }
            .word
            .load(std::sync::atomic::Ordering::Acquire);
        if w & (crate::pointer::PRESENT | crate::pointer::LOCK) != 0 {
            return None;
        }
        let loc = crate::pointer::far_loc(w);
        let at = crate::scheme::SpanAddr {
            region: loc.region,
            page: loc.page,
        };
        Some((at, loc.object))
    }
}

impl<T: Remotable> Drop for RemBox<T> {
    fn drop(&mut self) {
        // SAFETY: every slot handed to a RemBox comes from a runtime's slot
        // table, whose chunks live while any of their objects does.
        unsafe { Inner::free_object::<T>(self.slot) };
    }
}

impl<T: Remotable> std::fmt::Debug for RemBox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: the slot lives as long as this pointer.
        let w = unsafe { self.slot.as_ref() }
            .word
            .load(std::sync::atomic::Ordering::Relaxed);
        write!(f, "RemBox({:#x})", w)
    }
}

/// A shared remotable pointer: clones share one reference-counted slot.
pub struct RemRc<T: Remotable> {
    slot: NonNull<Slot>,
    _owns: PhantomData<T>,
}

// SAFETY: like Arc<T> with T: Send + Sync.
unsafe impl<T: Remotable> Send for RemRc<T> {}
// SAFETY: only shared references are handed out.
unsafe impl<T: Remotable> Sync for RemRc<T> {}

impl<T: Remotable> RemRc<T> {
    pub(crate) fn from_slot(slot: NonNull<Slot>) -> Self {
        Self {
            slot,
            _owns: PhantomData,
        }
    }

    /// A shared reference valid for the scope.
    pub fn deref<'s>(&'s self, scope: &'s DerefScope<'_>) -> Result<&'s T, RuntimeError> {
        shared_ref(self.slot, scope)
    }

    /// Number of `RemRc`s sharing the object.
    pub fn count(&self) -> u64 {
        // SAFETY: the slot lives while any clone does.
        unsafe { self.slot.as_ref() }
            .refs
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

impl<T: Remotable> Clone for RemRc<T> {
    fn clone(&self) -> Self {
        // SAFETY: the slot lives while any clone does.
        unsafe { self.slot.as_ref() }
            .refs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self::from_slot(self.slot)
    }
}

impl<T: Remotable> Drop for RemRc<T> {
    fn drop(&mut self) {
        // SAFETY: the slot lives while any clone does.
        let prev = unsafe { self.slot.as_ref() }
            .refs
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        if prev == 1 {
            // SAFETY: we were the last clone; the slot came from a runtime's table.
            unsafe { Inner::free_object::<T>(self.slot) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotable_pointers_are_eight_bytes() {
        assert_eq!(std::mem::size_of::<RemBox<u64>>(), 8);
        assert_eq!(std::mem::size_of::<RemRc<[u64; 64]>>(), 8);
        // The slot pointer is never null, so an optional link costs nothing.
        assert_eq!(std::mem::size_of::<Option<RemBox<u64>>>(), 8);
    }
}
