//! Variable-size objects: a slice whose length is chosen at run time.
//!
//! A [`RemSlice<T>`] is an 8-byte handle like [`crate::RemBox`], owning one
//! object that holds `len` values of `T` after the usual 8-byte header:
//!
//! ```text
//!   header (reverse reference, 8) | T[0] | T[1] | ... | T[len-1]
//! ```
//!
//! The length lives in the pointer slot, in the word a shared pointer uses
//! for its reference count (a slice is never shared), so it is known without
//! swapping the object in and the object holds nothing but its values.
//!
//! Where the object goes is the runtime's usual rule: a size class while it
//! fits one (up to 256 KiB, shared spans that filtering can sort hot from
//! cold), otherwise a span of its own, `ceil((8 + bytes) / 8 KiB)` pages. A
//! large object's span is evicted and swapped in whole like any other; in a
//! spanset its parity members are as long as its longest data member, and
//! the shorter members are never padded on the wire or on a memory node
//! (see `scheme::spanset`).
//!
//! Elements are `Copy`: a slice has no drop glue, so dropping a far slice
//! frees its far bytes without reading them back.

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::RuntimeError;
use crate::object::{HEADER, Remotable};
use crate::pointer::Slot;
use crate::runtime::{DerefScope, Inner};

/// The most bytes of values one variable-size object may hold. A far span
/// must fit in one region of a memory node, so the cluster's region size
/// must be at least this (plus a page) for slices this long to be evicted.
pub const MAX_OBJECT_BYTES: usize = 16 << 20;

/// Bytes every object carries before its values (the reverse reference):
/// an object of `n` value bytes takes `HEADER_BYTES + n` of its span.
pub const HEADER_BYTES: usize = HEADER;

/// A unique remotable pointer to a run-time-sized slice of `T`: 8 bytes.
/// Dereference it inside a [`DerefScope`].
///
/// ```no_run
/// # fn f(rt: &remora_runtime::Runtime) -> Result<(), remora_runtime::RuntimeError> {
/// let mut bytes = rt.alloc_slice_filled(1 << 20, 0u8)?; // 1 MiB, swapped like any object
/// {
///     let scope = rt.scope();
///     bytes.deref_mut(&scope)?[7] = 42;
/// }
/// let scope = rt.scope();
/// assert_eq!(bytes.deref(&scope)?[7], 42);
/// assert_eq!(bytes.len(), 1 << 20);
/// # Ok(()) }
/// ```
pub struct RemSlice<T: Remotable + Copy> {
    slot: NonNull<Slot>,
    _owns: PhantomData<T>,
}

// SAFETY: owned like a Box<[T]>; T is Send + Sync.
unsafe impl<T: Remotable + Copy> Send for RemSlice<T> {}
// SAFETY: shared access only hands out &[T] inside scopes.
unsafe impl<T: Remotable + Copy> Sync for RemSlice<T> {}
// SAFETY: a slot handle, valid wherever the object holding it lives.
unsafe impl<T: Remotable + Copy> Remotable for RemSlice<T> {}

/// Bytes of an object holding `len` values of `T`, header included, or
/// the typed error when that is beyond [`MAX_OBJECT_BYTES`].
fn object_bytes<T>(len: usize) -> Result<usize, RuntimeError> {
    const {
        assert!(
            std::mem::align_of::<T>() <= 8,
            "remotable objects are at most 8-aligned"
        )
    };
    match len.checked_mul(std::mem::size_of::<T>()) {
        Some(b) if b <= MAX_OBJECT_BYTES => Ok(HEADER + b),
        b => Err(RuntimeError::TooLarge {
            size: b.unwrap_or(usize::MAX),
        }),
    }
}

impl<T: Remotable + Copy> RemSlice<T> {
    /// A slice of `len` values, each written by `fill(i)` in place.
    pub(crate) fn alloc(
        inner: &std::sync::Arc<Inner>,
        len: usize,
        mut fill: impl FnMut(usize) -> T,
    ) -> Result<Self, RuntimeError> {
        let size = object_bytes::<T>(len)?;
        let slot = inner.alloc_raw(size, 0, |payload| {
            let p = payload as *mut T;
            for i in 0..len {
                // SAFETY: the payload is 8-aligned and `len` values long
                // (`alloc_raw`'s contract, `size` from `object_bytes`).
                unsafe { p.add(i).write(fill(i)) };
            }
        })?;
        // SAFETY: the slot is ours alone until the handle below is returned.
        unsafe { slot.as_ref() }
            .refs
            .store(len as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(Self {
            slot,
            _owns: PhantomData,
        })
    }

    /// Number of values (known locally: no swap-in).
    pub fn len(&self) -> usize {
        // SAFETY: the slot lives as long as this pointer.
        unsafe { self.slot.as_ref() }
            .refs
            .load(std::sync::atomic::Ordering::Relaxed) as usize
    }

    /// Whether the slice holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values, valid for the scope; swaps the object in if it is far.
    pub fn deref<'s>(&'s self, scope: &'s DerefScope<'_>) -> Result<&'s [T], RuntimeError> {
        let addr = scope.inner().access(self.slot, false, scope)?;
        scope.note_handed();
        // SAFETY: `access` returned the header address of this live object,
        // which holds `len` values after the header and stays put until the
        // scope ends (pointer-protocol I2/I3).
        Ok(unsafe { std::slice::from_raw_parts((addr + HEADER) as *const T, self.len()) })
    }

    /// The values, writable for the scope; marks the object dirty.
    pub fn deref_mut<'s>(&'s mut self, scope: &'s DerefScope<'_>) -> Result<&'s mut [T], RuntimeError> {
        let addr = scope.inner().access(self.slot, true, scope)?;
        scope.note_handed();
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        Ok(unsafe { std::slice::from_raw_parts_mut((addr + HEADER) as *mut T, self.len()) })
    }

    /// Whether the object is in local memory right now (a snapshot).
    pub fn is_local(&self) -> bool {
        // SAFETY: the slot lives as long as this pointer.
        let w = unsafe { self.slot.as_ref() }
            .word
            .load(std::sync::atomic::Ordering::Relaxed);
        w & crate::pointer::PRESENT != 0
    }
}

impl<T: Remotable + Copy> Drop for RemSlice<T> {
    fn drop(&mut self) {
        // `()` has no drop glue, like `T: Copy`: a far slice is freed where
        // it lies, without being read back.
        // SAFETY: the slot came from a runtime's slot table and this handle
        // is its only owner.
        unsafe { Inner::free_object::<()>(self.slot) };
    }
}

impl<T: Remotable + Copy> std::fmt::Debug for RemSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemSlice(len {})", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_beyond_the_limit_are_typed_errors() {
        assert_eq!(object_bytes::<u8>(0).ok(), Some(HEADER));
        assert_eq!(object_bytes::<u64>(3).ok(), Some(HEADER + 24));
        assert_eq!(
            object_bytes::<u8>(MAX_OBJECT_BYTES).ok(),
            Some(HEADER + MAX_OBJECT_BYTES)
        );
        assert!(matches!(
            object_bytes::<u8>(MAX_OBJECT_BYTES + 1),
            Err(RuntimeError::TooLarge { size }) if size == MAX_OBJECT_BYTES + 1
        ));
        assert!(matches!(
            object_bytes::<u64>(usize::MAX / 4),
            Err(RuntimeError::TooLarge { size: usize::MAX })
        ));
        assert_eq!(std::mem::size_of::<RemSlice<u8>>(), 8);
        assert_eq!(std::mem::size_of::<Option<RemSlice<u8>>>(), 8);
    }
}
