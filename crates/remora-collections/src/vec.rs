//! `RemVec<T>`: a growable vector in chunks, each chunk one far object.
//!
//! ```text
//!   local: len | tail lock | directory of chunk cells (append-only, lock-free lookup)
//!                              cell 0: RwLock<Option<RemSlice<T>>>   -> far or local object
//!                              cell 1: ...
//! ```
//!
//! A chunk holds `per_chunk` values (64 KiB of them by default, so a chunk
//! fills a span of its own and a scan swaps in whole chunks). Readers look
//! the chunk up without a lock and take only that chunk's read lock; writers
//! of a value take that chunk's write lock; pushes, pops and truncation are
//! serialised by the tail lock, and publish a new length only once the value
//! is written, so a reader that sees index `i < len` finds it written.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use remora_runtime::{HEADER_BYTES, RemSlice, Remotable, Runtime, RuntimeError};

use crate::directory::Directory;

/// Bytes of a chunk object by default (its 8-byte header included).
const CHUNK_BYTES: usize = 64 << 10;

type Cell<T> = RwLock<Option<RemSlice<T>>>;

/// A growable vector whose values live in far-memory chunks (see the module
/// docs for its layout and locking).
///
/// ```no_run
/// # fn f(rt: &remora_runtime::Runtime) -> Result<(), remora_runtime::RuntimeError> {
/// use remora_collections::RemVec;
/// let v = RemVec::new(rt);
/// v.extend_from_slice(&[1u64, 2, 3])?;
/// v.set(1, 20)?;
/// assert_eq!(v.pop()?, Some(3));
/// let all: Vec<u64> = v.iter().collect::<Result<_, _>>()?; // one chunk local at a time
/// assert_eq!(all, [1, 20]);
/// # Ok(()) }
/// ```
pub struct RemVec<'rt, T: Remotable + Copy> {
    rt: &'rt Runtime,
    per_chunk: usize,
    len: AtomicUsize,
    tail: Mutex<()>,
    chunks: Directory<Cell<T>>,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

impl<'rt, T: Remotable + Copy> RemVec<'rt, T> {
    /// An empty vector on `rt`, in chunks of 64 KiB.
    pub fn new(rt: &'rt Runtime) -> Self {
        Self::with_chunk_bytes(rt, CHUNK_BYTES)
    }

    /// An empty vector whose chunks are objects of about `bytes` bytes (at
    /// least one value each): smaller chunks make a random access that
    /// misses read less, larger ones make a scan read fewer times.
    pub fn with_chunk_bytes(rt: &'rt Runtime, bytes: usize) -> Self {
        let size = std::mem::size_of::<T>().max(1);
        let per_chunk = (bytes.saturating_sub(HEADER_BYTES) / size).clamp(1, remora_runtime::MAX_OBJECT_BYTES / size);
        Self {
            rt,
            per_chunk,
            len: AtomicUsize::new(0),
            tail: Mutex::new(()),
            chunks: Directory::new(),
        }
    }

    /// Values per chunk.
    pub fn chunk_len(&self) -> usize {
        self.per_chunk
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether the vector holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn tail(&self) -> std::sync::MutexGuard<'_, ()> {
        self.tail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `value`; returns its index.
    pub fn push(&self, value: T) -> Result<usize, RuntimeError> {
        self.extend_from_slice(std::slice::from_ref(&value))
    }

    /// Appends every value of `values` (chunk by chunk, one write lock per
    /// chunk); returns the index of the first.
    pub fn extend_from_slice(&self, values: &[T]) -> Result<usize, RuntimeError> {
        let _t = self.tail();
        let first = self.len.load(Ordering::Relaxed);
        let mut at = first;
        let mut rest = values;
        while !rest.is_empty() {
            let (c, off) = (at / self.per_chunk, at % self.per_chunk);
            let n = rest.len().min(self.per_chunk - off);
            let cell = self
                .chunks
                .get_or_create(c)
                .ok_or(RuntimeError::TooLarge { size: at })?;
            let mut g = write(cell);
            match g.as_mut() {
                Some(chunk) => {
                    let scope = self.rt.scope();
                    chunk.deref_mut(&scope)?[off..off + n].copy_from_slice(&rest[..n]);
                }
                None => {
                    debug_assert_eq!(off, 0);
                    // Past the values written, the chunk holds copies of the
                    // first one: never read, and no uninitialised bytes.
                    let src = &rest[..n];
                    *g = Some(self.rt.alloc_slice_with(self.per_chunk, |i| src[i.min(n - 1)])?);
                }
            }
            drop(g);
            at += n;
            rest = &rest[n..];
            // Published chunk by chunk: readers may see the first values of
            // a long extend before the last are written.
            self.len.store(at, Ordering::Release);
        }
        Ok(first)
    }

    /// Runs `f` on the chunk holding index `i` (read-locked, dereferenced
    /// in a scope) with `i`'s offset in it, if `i` is below the length.
    fn with_chunk<R>(&self, i: usize, f: impl FnOnce(&[T], usize) -> R) -> Result<Option<R>, RuntimeError> {
        if i >= self.len() {
            return Ok(None);
        }
        let Some(cell) = self.chunks.get(i / self.per_chunk) else {
            return Ok(None);
        };
        let g = read(cell);
        let Some(chunk) = g.as_ref() else {
            return Ok(None); // popped meanwhile
        };
        let scope = self.rt.scope();
        let values = chunk.deref(&scope)?;
        Ok(Some(f(values, i % self.per_chunk)))
    }

    /// The value at `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Result<Option<T>, RuntimeError> {
        self.with_chunk(i, |v, off| v[off])
    }

    /// Replaces the value at `i`; `false` (and nothing changed) past the end.
    pub fn set(&self, i: usize, value: T) -> Result<bool, RuntimeError> {
        if i >= self.len() {
            return Ok(false);
        }
        let Some(cell) = self.chunks.get(i / self.per_chunk) else {
            return Ok(false);
        };
        let mut g = write(cell);
        let Some(chunk) = g.as_mut() else {
            return Ok(false);
        };
        // Checked again under the chunk's lock: a pop that took `i` away
        // holds the tail lock, not this one, but lowers the length first.
        if i >= self.len() {
            return Ok(false);
        }
        let scope = self.rt.scope();
        chunk.deref_mut(&scope)?[i % self.per_chunk] = value;
        Ok(true)
    }

    /// Removes and returns the last value.
    pub fn pop(&self) -> Result<Option<T>, RuntimeError> {
        let _t = self.tail();
        let len = self.len.load(Ordering::Relaxed);
        if len == 0 {
            return Ok(None);
        }
        let i = len - 1;
        let cell = self
            .chunks
            .get(i / self.per_chunk)
            .expect("a chunk below the length exists");
        let mut g = write(cell);
        let value = {
            let chunk = g.as_ref().expect("a chunk below the length is allocated");
            let scope = self.rt.scope();
            chunk.deref(&scope)?[i % self.per_chunk]
        };
        self.len.store(i, Ordering::Release);
        if i % self.per_chunk == 0 {
            // Its last value went: the chunk goes too, unread if it is far.
            *g = None;
        }
        Ok(Some(value))
    }

    /// Keeps the first `len` values; the chunks past them are freed where
    /// they lie (far ones are not read back).
    pub fn truncate(&self, len: usize) {
        let _t = self.tail();
        let old = self.len.load(Ordering::Relaxed);
        if len >= old {
            return;
        }
        self.len.store(len, Ordering::Release);
        let keep = len.div_ceil(self.per_chunk);
        for c in keep..old.div_ceil(self.per_chunk) {
            if let Some(cell) = self.chunks.get(c) {
                let gone = write(cell).take();
                drop(gone);
            }
        }
    }

    /// Removes every value (see [`RemVec::truncate`]).
    pub fn clear(&self) {
        self.truncate(0);
    }

    /// A cursor over the values from index `from`, by value, holding one
    /// chunk's copy at a time. It sees the values as they are when it
    /// reaches each chunk, and stops at the length it finds then.
    pub fn iter_from(&self, from: usize) -> VecIter<'_, 'rt, T> {
        VecIter {
            vec: self,
            next: from,
            buf: Vec::new(),
            buf_start: from,
        }
    }

    /// A cursor over every value (see [`RemVec::iter_from`]).
    pub fn iter(&self) -> VecIter<'_, 'rt, T> {
        self.iter_from(0)
    }

    /// Runs `f` on each chunk's values from `from` on, in order, each
    /// dereferenced in place (no copy) inside its own scope; stops early
    /// when `f` returns `false`.
    pub fn for_each_chunk(&self, from: usize, mut f: impl FnMut(usize, &[T]) -> bool) -> Result<(), RuntimeError> {
        let mut i = from;
        loop {
            let len = self.len();
            if i >= len {
                return Ok(());
            }
            let end = ((i / self.per_chunk + 1) * self.per_chunk).min(len);
            let go_on = self.with_chunk(i, |v, off| f(i, &v[off..off + (end - i)]))?;
            match go_on {
                Some(true) => i = end,
                _ => return Ok(()),
            }
        }
    }
}

/// A cursor over a [`RemVec`] (see [`RemVec::iter_from`]).
pub struct VecIter<'v, 'rt, T: Remotable + Copy> {
    vec: &'v RemVec<'rt, T>,
    next: usize,
    buf: Vec<T>,
    buf_start: usize,
}

impl<T: Remotable + Copy> Iterator for VecIter<'_, '_, T> {
    type Item = Result<T, RuntimeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let in_buf = self.next.wrapping_sub(self.buf_start);
        if in_buf >= self.buf.len() {
            self.buf.clear();
            self.buf_start = self.next;
            let per = self.vec.per_chunk;
            let end = ((self.next / per + 1) * per).min(self.vec.len());
            let buf = &mut self.buf;
            let start = self.next;
            match self.vec.with_chunk(start, |v, off| {
                buf.extend_from_slice(&v[off..off + end.saturating_sub(start)]);
            }) {
                Ok(Some(())) if !self.buf.is_empty() => {}
                Ok(_) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
        let v = self.buf[self.next - self.buf_start];
        self.next += 1;
        Some(Ok(v))
    }
}
