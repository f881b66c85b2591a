//! Steps 2, 4 and 5 of the protocol ([`crate::pointer`]) on the words of
//! one span's objects: the evictor's marks, the seal after the grace
//! period, the commit (take `L` on every word, then store the far words)
//! and, whenever it gives up, taking the marks back. `runtime/evictor.rs`
//! runs them around its grace period and its swap-out (the write to far
//! memory, which stays there); the loom models run the same functions.

use super::{EVICTING, FarLoc, LOCK, PRESENT, SEALED, Slot, far_word, hotness, local_addr};

/// An object of a span under eviction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Evictee<'a> {
    /// Its slot.
    pub slot: &'a Slot,
    /// Its word as the evictor last left it: as marked ([`mark`]), then as
    /// sealed ([`seal`]), then as locked without `L` ([`lock_sealed`]).
    pub word: u64,
    /// Its index in the span.
    pub index: usize,
}

/// Step 2 for a span: marks `E` ([`Slot::mark`]) on each of `objs` (its
/// slot, `None` while its header is clear because it is being freed; its
/// header address; its index in the span). Returns the marked objects, or
/// `None` with every mark taken back if an object was busy, being freed or
/// already marked. `capacity`: how many objects to expect.
pub(crate) fn mark<'a>(
    objs: impl IntoIterator<Item = (Option<&'a Slot>, usize, usize)>,
    capacity: usize,
) -> Option<Vec<Evictee<'a>>> {
    let mut marked = Vec::with_capacity(capacity);
    for (slot, addr, index) in objs {
        let ok = slot.and_then(|slot| slot.mark(addr, EVICTING).map(|word| Evictee { slot, word, index }));
        match ok {
            Some(o) => marked.push(o),
            None => {
                unmark(&marked);
                return None;
            }
        }
    }
    Some(marked)
}

/// Step 4 for a span, after the grace period that followed its marks:
/// adds `Z` to every word that is still exactly `P|E` for its object
/// ([`Slot::transition`]). True if all were sealed; otherwise an
/// application thread won the race (or the owner freed an object), every
/// mark is taken back ([`unmark`]) and the eviction is abandoned.
pub(crate) fn seal(objs: &mut [Evictee<'_>]) -> bool {
    let sealed = objs.iter_mut().all(|o| {
        let w = o.slot.transition(local_addr(o.word), PRESENT | EVICTING, SEALED);
        o.word = w.unwrap_or(o.word);
        w.is_some()
    });
    if !sealed {
        unmark(objs);
    }
    sealed
}

/// Step 5's first half, once the far copy is acknowledged: takes `L` on
/// every word that is still `P|E|Z` for its object. True if all are locked
/// (then [`commit_far`] releases them). Otherwise the owner freed an object
/// meanwhile: the words locked so far are unlocked without `E` and `Z`, the
/// others' marks taken back, and the span stays local.
pub(crate) fn lock_sealed(objs: &mut [Evictee<'_>]) -> bool {
    let mut locked = 0;
    for o in objs.iter_mut() {
        match o.slot.transition(local_addr(o.word), PRESENT | EVICTING | SEALED, LOCK) {
            Some(w) => o.word = w & !LOCK,
            None => break,
        }
        locked += 1;
    }
    if locked < objs.len() {
        for o in &objs[..locked] {
            o.slot.unlock_with(o.word & !(EVICTING | SEALED));
        }
        unmark(&objs[locked..]);
        return false;
    }
    true
}

/// Step 5's end, with `L` held on every word ([`lock_sealed`]) and the far
/// span published: stores each object's far word (`loc` of its index),
/// keeping `S` and hotness; this clears `P`, `E`, `Z` and `L` at once.
pub(crate) fn commit_far(objs: &[Evictee<'_>], loc: impl Fn(usize) -> FarLoc) {
    for o in objs {
        o.slot.unlock_with(far_word(loc(o.index), o.word, hotness(o.word)));
    }
}

/// Takes back the marks (`E` and `Z`) of `objs` ([`Slot::unmark`]). The
/// span is pinned meanwhile, so its memory is not reused: a present word
/// that names an object's address is still that object's.
pub(crate) fn unmark(objs: &[Evictee<'_>]) {
    for o in objs {
        o.slot.unmark(local_addr(o.word), EVICTING | SEALED);
    }
}
