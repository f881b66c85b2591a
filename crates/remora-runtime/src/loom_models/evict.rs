//! The world of the pointer model (`pointer.rs`): one object, its slot
//! (the crate's own [`Slot`]), its local and far copies, the real deref
//! scopes ([`Scopes::Current`]), and the application and eviction steps
//! that race on the word: a reader in a scope (the access barrier,
//! [`Slot::fast_path`] and [`Slot::slow_path`]), `evict_round` for a span
//! of one object (`mark_span`, the grace period, the seal, the commit or
//! `unmark`: the functions of [`crate::pointer::evict`]), and a copy of
//! `free_object`'s steps on the word.
//!
//! The current protocol runs the crate's own functions, and the grace
//! period is `Rcu::synchronize`; `BEFORE_FIXES` runs the model's copies of
//! the old steps. The object's local memory is a loom `UnsafeCell`:
//! releasing it is a write (the span goes back to the page heap and is
//! reused), so loom reports any use that is not ordered before the
//! release, and the value checks catch a use that is ordered after it.

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Access, Scopes, access, store};
use crate::pointer::evict as steps;
use crate::pointer::{
    EVICTING, FarLoc, Freeing, LOCK, MOVING, PRESENT, SEALED, Slot, far_loc, far_word, hotness, local_addr, local_word,
};

/// Where the modelled object's header lives (only the payload matters).
pub(super) const ADDR: usize = 0x1000;
/// Where the slot's next tenant lives after the object is dropped.
pub(super) const ADDR2: usize = 0x2000;
/// The far copy the eviction commits to.
pub(super) const LOC: FarLoc = FarLoc {
    region: 1,
    page: 2,
    object: 3,
};
/// The object's contents while it is live.
pub(super) const VALUE: u64 = 42;
/// What a reader writes in the writer variants.
pub(super) const WRITTEN: u64 = 43;
/// Poison left in local memory once its span is released and reused.
const FREED: u64 = 0xdead;

/// The two places where the model can follow the eviction (`runtime/evictor.rs`)
/// and `scope.rs` as written before the findings were fixed, or as they are now.
#[derive(Debug, Clone, Copy)]
pub(super) struct Protocol {
    /// Ordering of the store that makes the scope state odd in `enter_rec`:
    /// `Release` runs the real `Rcu`, `Relaxed` the copy of it before the fix.
    pub(super) enter: Ordering,
    /// The evictor's word steps, and how an aborted eviction takes its mark back.
    pub(super) unmark: Unmark,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unmark {
    /// The old steps (a copy): the seal, the commit's lock and `unmark`
    /// each CAS from exactly the word as marked.
    Exact,
    /// The crate's own steps ([`crate::pointer::evict`]), whose `unmark`
    /// ([`Slot::unmark`]) clears `E` while the word still names this local
    /// object, whatever happened to its hotness and dirty bits meanwhile.
    Ours,
}

/// The protocol before the two findings were fixed; tests that run it are
/// `#[should_panic]`: they show the model catches those defects.
pub(super) const BEFORE_FIXES: Protocol = Protocol {
    enter: Ordering::Relaxed,
    unmark: Unmark::Exact,
};

/// The protocol as the runtime and `scope.rs` implement it now (the fixes
/// for both findings).
pub(super) const CURRENT: Protocol = Protocol {
    enter: Ordering::Release,
    unmark: Unmark::Ours,
};

/// One object, its slot, the far copy, and the deref scopes.
pub(super) struct World {
    pub(super) proto: Protocol,
    pub(super) slot: Slot,
    /// The object's reverse reference (a std atomic in the runtime).
    header: AtomicU64,
    /// The object's bytes in local memory.
    pub(super) local: UnsafeCell<u64>,
    /// The far copy, published before the far word (`far_map.insert` in `evict_round`).
    pub(super) far: UnsafeCell<u64>,
    /// The readers' scope records and the grace period.
    pub(super) scopes: Scopes,
}

impl World {
    pub(super) fn new(hot: u8, proto: Protocol) -> Self {
        Self {
            proto,
            slot: Slot::new(local_word(ADDR, 0, hot)),
            header: AtomicU64::new(1),
            local: UnsafeCell::new(VALUE),
            far: UnsafeCell::new(0),
            scopes: Scopes::new(proto.enter),
        }
    }
}

/// How an eviction attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Evict {
    /// `mark_span` found the object busy, gone or already marked.
    NotMarked,
    /// An application thread won the race for the word before the seal;
    /// the span stays local.
    Unsealed,
    /// The word changed after the seal (the owner freed the object); the span stays local.
    Aborted,
    /// The word names the far copy and the local span was released.
    Committed,
}

/// `evict_round` for a span holding this one object: mark, grace period,
/// seal, copy out, commit or abort. `released_by_owner` is set by a dropper once
/// the object's slot in the span is free (`heap.free`); an aborted eviction
/// of a span left empty releases the span (`end_evict`).
pub(super) fn evict(w: &World, released_by_owner: Option<&AtomicBool>) -> Evict {
    if w.proto.unmark == Unmark::Exact {
        return evict_before_fixes(w, released_by_owner);
    }
    evict_span(&[w], released_by_owner)
}

/// `evict_round` for a span holding the objects of `span` (one `World`
/// each, the grace period `span[0]`'s: readers enter its scopes), with the
/// current protocol. `released_by_owner`: as in [`evict`], set once every
/// object's slot in the span is free.
///
/// It runs the evictor's own word steps ([`crate::pointer::evict`]:
/// `mark`, `seal`, `lock_sealed`, `commit_far`, and `unmark` inside them);
/// what stays here is what the runtime does around them in span memory and
/// far memory (`runtime/evictor.rs`): the header reads of `mark_span`, the
/// copy-out, publishing the far copy, and releasing the span.
pub(super) fn evict_span(span: &[&World], released_by_owner: Option<&AtomicBool>) -> Evict {
    // Phase 1: `mark_span`; `slot_of` finds no slot while a header is clear.
    let objs = span
        .iter()
        .enumerate()
        .map(|(i, w)| ((w.header.load(Ordering::Acquire) != 0).then_some(&w.slot), ADDR, i));
    let Some(mut objs) = steps::mark(objs, span.len()) else {
        return Evict::NotMarked;
    };
    // Phase 2: one grace period, then the seal.
    span[0].scopes.synchronize();
    if !steps::seal(&mut objs) {
        return Evict::Unsealed;
    }
    // Phase 3: copy the span out.
    let copies: Vec<u64> = span.iter().map(|w| copy_out(w)).collect();
    // Phase 4: commit.
    if steps::lock_sealed(&mut objs) {
        for (w, copy) in span.iter().zip(copies) {
            publish(w, copy);
        }
        steps::commit_far(&objs, |_| LOC);
        span.iter().for_each(|w| release_span(w));
        Evict::Committed
    } else {
        if released_by_owner.is_some_and(|r| r.load(Ordering::Acquire)) {
            // `end_evict(span, false)` on a span left empty releases it too.
            span.iter().for_each(|w| release_span(w));
        }
        Evict::Aborted
    }
}

/// A labelled copy of `evict` as it was before finding 1 was fixed: the
/// seal, the commit's lock and `unmark` each expect exactly the word as
/// marked (`BEFORE_FIXES` only).
fn evict_before_fixes(w: &World, released_by_owner: Option<&AtomicBool>) -> Evict {
    if w.header.load(Ordering::Acquire) == 0 {
        return Evict::NotMarked;
    }
    let prev = w.slot.word.fetch_or(EVICTING, Ordering::SeqCst);
    if prev & (PRESENT | LOCK | MOVING | EVICTING) != PRESENT || local_addr(prev) != ADDR {
        if prev & EVICTING == 0 {
            w.slot.word.fetch_and(!EVICTING, Ordering::SeqCst);
        }
        return Evict::NotMarked;
    }
    let exp = prev | EVICTING;
    w.scopes.synchronize();
    let unmark_exact = |exp: u64| {
        let _ = w
            .slot
            .word
            .compare_exchange(exp, exp & !(EVICTING | SEALED), Ordering::AcqRel, Ordering::Relaxed);
    };
    if w.slot
        .word
        .compare_exchange(exp, exp | SEALED, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        unmark_exact(exp);
        return Evict::Unsealed;
    }
    let exp = exp | SEALED;
    let copy = copy_out(w);
    if w.slot.try_lock_exact(exp) {
        publish(w, copy);
        store(&w.slot.word, far_word(LOC, exp, hotness(exp)));
        release_span(w);
        Evict::Committed
    } else {
        unmark_exact(exp);
        if released_by_owner.is_some_and(|r| r.load(Ordering::Acquire)) {
            release_span(w);
        }
        Evict::Aborted
    }
}

/// Phase 3: the span's bytes as sent to far memory. Once sealed no thread
/// writes the object, so the copy is its last value.
fn copy_out(w: &World) -> u64 {
    // SAFETY: loom checks this read against every write.
    w.local.with(|p| unsafe { *p })
}

/// The far copy, published before the far word (`far_map.insert`).
fn publish(w: &World, copy: u64) {
    // SAFETY: loom checks the access; the far copy is published before the far word.
    w.far.with_mut(|p| unsafe { *p = copy });
}

/// `end_evict` releasing the span: its memory goes back to the page heap.
fn release_span(w: &World) {
    // SAFETY: loom reports this write if any use of the object is not ordered before it.
    w.local.with_mut(|p| unsafe { *p = FREED });
}

/// A reader in one scope: dereferences the object and reads it (or, with
/// `write`, writes it through `deref_mut`), checking it is still live.
/// Returns what it saw: the local value, or the far copy if it found the word far.
pub(super) fn reader(w: &World, r: usize, write: bool) -> (Access, u64) {
    let scope = w.scopes.enter(r);
    let seen = use_object(w, write);
    drop(scope);
    seen
}

/// [`reader`]'s work inside a scope the caller holds.
pub(super) fn use_object(w: &World, write: bool) -> (Access, u64) {
    let a = access(&w.slot, write);
    let v = match a {
        Access::Fast(_) | Access::Slow(_) => {
            // SAFETY: loom checks the access against the release of the span.
            let v = w.local.with(|p| unsafe { *p });
            assert_eq!(v, VALUE, "read an object after its span was released");
            if write {
                // SAFETY: as above.
                w.local.with_mut(|p| unsafe { *p = WRITTEN });
            }
            v
        }
        Access::Far => {
            // The swap-in looks the far span up; it was published before the word.
            let wd = w.slot.word.load(Ordering::Acquire);
            assert_eq!(far_loc(wd), LOC);
            // SAFETY: loom checks this read against the evictor's write.
            let v = w.far.with(|p| unsafe { *p });
            assert_eq!(v, VALUE, "far copy missing or stale");
            v
        }
    };
    (a, v)
}

/// `free_one` on one word ([`Slot::lock_for_free`], then the heap's and
/// the far map's stand-ins, then [`Slot::reset`]): returns whether it freed
/// the local object (`true`) or the far copy (`false`). `released` is set
/// after `heap.free`.
pub(super) fn drop_object(w: &World, released: &AtomicBool) -> bool {
    match w.slot.lock_for_free() {
        Freeing::Local(_) => {
            // The value is read out for its drop glue.
            // SAFETY: loom checks this read against the release of the span.
            let v = w.local.with(|p| unsafe { *p });
            assert_eq!(v, VALUE, "dropped an object whose span was released");
            w.header.store(0, Ordering::Release);
            // `heap.free`: the slot in the span is free; a pinned span stays put.
            released.store(true, Ordering::Release);
            // `slots.free`: the word is reset (and may get a new tenant).
            w.slot.reset();
            true
        }
        Freeing::Far(wd) => {
            // The live bit is cleared under the far span's lock; the copy must be visible.
            assert_eq!(far_loc(wd), LOC);
            // SAFETY: loom checks this read against the evictor's write.
            assert_eq!(w.far.with(|p| unsafe { *p }), VALUE);
            w.slot.reset();
            false
        }
    }
}
