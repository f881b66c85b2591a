//! Kept far copies: clean spans are re-evicted without a write.
//!
//! When a span is swapped in, its far copy is not released but *kept*
//! (through [`Scheme::keep`]), and the local span records the copy's id. If
//! the span is chosen for eviction again while its copy is still valid, and
//! none of its live objects is dirty, and it holds no object it did not hold
//! when it came in, eviction flips its words back to the kept copy (with a
//! live bitmap computed at that moment and the checksum recorded at the
//! first swap-out) instead of writing it.
//!
//! The dirty rule this relies on (see [`crate::pointer`]): every word whose
//! object's bytes may differ from the kept copy has `D` set. Writers set it
//! before they write, allocation sets it, and a move between spans sets it.
//!
//! A copy stops being valid when its span changes (dirty at eviction time:
//! the copy is dropped and the span written), when the local span is freed
//! or reused (found by [`Inner::sweep_kept`]), or when the scheme cancels it
//! (an EC row freed because its other members are gone: [`Scheme::reuse`]
//! then refuses and the span is written normally).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};
use std::sync::{Mutex, MutexGuard};

use super::Inner;
use super::evictor::Marked;
use crate::pointer::DIRTY;
use crate::scheme::SpanAddr;
use crate::span::Span;

/// A kept far copy of a local span.
pub(super) struct Kept {
    pub(super) at: SpanAddr,
    pub(super) pages: u32,
    pub(super) token: u64,
    pub(super) checksum: u64,
    /// The local span's first address.
    pub(super) start: usize,
    /// Objects live when it came in.
    pub(super) live: Vec<u64>,
}

/// Kept copies by id.
#[derive(Default)]
pub(super) struct KeptTable {
    map: Mutex<HashMap<u64, Kept>>,
    next: AtomicU64,
}

impl KeptTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Kept>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `k`; returns its id (never 0: a span's 0 means no copy).
    fn insert(&self, k: Kept) -> u64 {
        let id = self.next.fetch_add(1, StdOrdering::Relaxed) + 1;
        self.lock().insert(id, k);
        id
    }

    /// Takes the copy with id `id` out, if it is still recorded.
    fn take(&self, id: u64) -> Option<Kept> {
        self.lock().remove(&id)
    }

    /// Takes out every copy that `dead` says is orphaned, by id.
    fn take_orphans(&self, dead: impl Fn(u64, &Kept) -> bool) -> Vec<Kept> {
        let mut map = self.lock();
        let ids: Vec<u64> = map.iter().filter(|(id, k)| dead(**id, k)).map(|(id, _)| *id).collect();
        ids.into_iter().filter_map(|id| map.remove(&id)).collect()
    }
}

impl Inner {
    /// At swap-in: keeps the far copy of the span now at `span` if the
    /// scheme agrees, else releases it.
    pub(super) fn keep_or_release(&self, span: &Span, at: SpanAddr, pages: u32, checksum: u64, live: Vec<u64>) {
        let Some(token) = self.scheme.keep(&self.far, at, pages) else {
            return;
        };
        let id = self.kept.insert(Kept {
            at,
            pages,
            token,
            checksum,
            start: span.start(),
            live,
        });
        span.set_kept(id);
    }

    /// At eviction of `span` (sealed, its objects' words in `objs`): the
    /// kept copy to reuse instead of a write, if it is still valid. A copy
    /// that cannot be reused is dropped.
    pub(super) fn reuse_kept(&self, span: &Span, objs: &Marked) -> Option<Kept> {
        let id = span.take_kept();
        if id == 0 {
            return None;
        }
        let k = self.kept.take(id)?;
        let clean = k.start == span.start()
            && k.pages as usize == span.pages()
            && objs.iter().all(|o| {
                o.word & DIRTY == 0 && k.live.get(o.index / 64).is_some_and(|b| b & (1 << (o.index % 64)) != 0)
            });
        if clean && self.scheme.reuse(&self.far, k.at, k.pages, k.token) {
            return Some(k);
        }
        self.scheme.drop_kept(&self.far, k.at, k.pages, k.token);
        None
    }

    /// Drops kept copies whose local span was freed or reused meanwhile.
    pub(super) fn sweep_kept(&self) {
        let orphans = self
            .kept
            .take_orphans(|id, k| self.heap.span_at(k.start).is_none_or(|s| s.kept() != id));
        for k in orphans {
            self.scheme.drop_kept(&self.far, k.at, k.pages, k.token);
        }
    }
}
