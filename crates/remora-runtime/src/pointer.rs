//! The pointer word (paper Figure 2) and the protocol that guards it.
//!
//! Rust moves have no hook, so the word does not live in the user's
//! `RemBox`/`RemRc` (which are 8-byte handles that may be moved freely) but
//! in a runtime-owned [`Slot`] that never moves. Each object in a span starts
//! with an 8-byte header holding the address of its slot (the reverse
//! reference), so eviction and swap-in can find and fix the word of every
//! object in a span.
//!
//! ```text
//!  63                          16 15        8  7   6   5   4   3   2   1   0
//! +------------------------------+-----------+---+---+---+---+---+---+---+---+
//! |           payload            |  hotness  | F | Z | D | E | M | S | L | P |
//! +------------------------------+-----------+---+---+---+---+---+---+---+---+
//!   P = 1: payload = local address of the object's header (48-bit user space)
//!   P = 0: payload = region index (16) | span page in region (20) | object index (12)
//! ```
//!
//! P Present, L Lock, S Shared, M Moving, E Evicting, D Dirty (written since
//! its last swap-out), Z sealed (the eviction is past its grace period and
//! will not be abandoned for an access), F fresh (swapped in, not yet
//! dereferenced), hotness: set to 255 on access, aged by the policy.
//!
//! `D` is the dirty rule clean re-eviction relies on: whenever an object's
//! bytes at its local address may differ from its span's kept far copy, its
//! word has `D`. A writer sets it before it writes (the barrier), allocation
//! sets it, and a move between spans sets it.
//!
//! # Protocol
//!
//! Threads: application threads dereference and drop; background threads
//! move objects out of local memory (eviction) or between local spans
//! (filtering).
//!
//! 1. **Fast path** (application, inside a deref scope): load the word; if
//!    `P` is set and `L`, `M`, `E` are clear, the object is local and nobody is
//!    taking it away, so the address is used directly. No atomic write unless
//!    hotness or dirty must be raised (then one `fetch_or`).
//!    ([`Slot::fast_path`].)
//! 2. **Marking** (background): set `E` (or `M`) with a `fetch_or`, then wait
//!    for a grace period (module `scope`): every thread that was inside a
//!    scope when the bit was set has left it. A thread that enters a scope
//!    afterwards is guaranteed to see the bit (both sides issue a SeqCst fence
//!    between their store and their load: Dekker) and takes the slow path.
//!    ([`Slot::mark`]; for the objects of a span, [`evict::mark`].)
//! 3. **Slow path** (application): spin until `L` is clear, then race for `L`
//!    with a CAS. The winner either clears `E`/`M` (the application keeps the
//!    object local and the background operation aborts) or, if `P` is clear,
//!    goes on to swap the span in. ([`Slot::slow_path`]; the swap-in is
//!    its caller's.)
//! 4. **Seal** (background): after the grace period, add `Z` to each marked
//!    word that still names the object with exactly `P|E` among its flags
//!    (hotness and dirty may have changed: a reader that loaded the word
//!    before the mark can still raise them, and it has left its scope by
//!    now). If a word no longer qualifies, an application thread won the
//!    race (or freed the object): the span's eviction is abandoned and the
//!    marks are taken back the same way, ignoring hotness and dirty. Once
//!    sealed, an application thread that finds `E|Z` waits for the word to
//!    change instead of racing: the evictor no longer waits for any scope,
//!    so this wait cannot deadlock, and under memory pressure the evictor,
//!    not the application, must win or the budget could not hold. The aging
//!    sweep leaves marked words alone. ([`evict::seal`]; taking the marks
//!    back: [`evict::unmark`].)
//! 5. **Commit** (background): after the far copy is acknowledged, take `L`
//!    on every object of the span (the word must still be `P|E|Z` for the
//!    object; it changes only if the owner freed it: abort), then store the
//!    far word (which clears `P`, `E`, `Z` and `L` at once).
//!    ([`evict::lock_sealed`], then [`evict::commit_far`].)
//! 6. **Move** (filtering thread, `runtime/filtering.rs`): the object's span
//!    is pinned by the filter (as eviction pins it: no allocation from it,
//!    not released, skipped by the evictor), and so is the destination span.
//!    Mark `M` on each object of the batch as in step 2 ([`Slot::mark`];
//!    it refuses a word with `E`, `M` or `L`, and the evictor's mark refuses
//!    one with `M`), then ONE grace period for the batch. Per object: take
//!    `L` only if the word is still exactly `P|M` for the object's address
//!    ([`Slot::move_marked`] runs this step and the next two;
//!    [`Slot::transition`]: hotness and dirty may differ, as in step 4);
//!    copy the object (header and payload) into a free slot of the
//!    destination and claim that slot; store the word naming the copy
//!    ([`Slot::commit_move`]: same `S`, `F` and hotness, `D` set by the
//!    dirty rule, since the destination's kept far copy, if it has one,
//!    does not hold this object; `M` and `L` cleared); then free the old
//!    slot, which releases the source span once it is empty and unpinned. If the word no longer qualifies, an
//!    application thread won the race (step 3 cleared `M`) or the owner
//!    freed the object: the move is abandoned, `M` taken back if still there
//!    ([`Slot::unmark`]), and nothing was copied. There is no seal: an
//!    access that finds `M` always races for `L`; it loses only if the mover
//!    already holds `L`, and then it waits for one object copy and finds the
//!    new word. `L` is taken *before* the copy on purpose: copying first and
//!    validating after (seqlock style) would let a thread that cleared `M`
//!    write the object while the mover reads it, a data race (loom reports
//!    it: `copy_before_lock_races_a_writer` in `loom_models/moving.rs`).
//! 7. **Free** (application, the owner's last handle dropped): spin until
//!    `L` is clear; if `P` is set, take `L` on the word exactly as it is,
//!    marks and all ([`Slot::lock_for_free`]): a marked eviction or move
//!    finds the word changed and aborts (steps 4-6), so the dropper owns
//!    the object's bytes and frees its place in the span. A far word is
//!    freed under its far span's lock instead. Either way the slot is
//!    given back last ([`Slot::reset`]: the word becomes 0).
//!
//! `loom` checks these steps, the crate's own functions named above and
//! its deref scopes, in the unit-test modules `loom_models::pointer` (the
//! access barrier and the free against eviction) and `loom_models::moving`
//! (the move and the free against it), run under `--cfg loom`. What the
//! runtime does around them and loom cannot run (reading headers in span
//! memory, the swap-out and swap-in, the far page map, copying a moved
//! object's bytes, the heap's free) is its callers': `runtime/access.rs`,
//! `runtime/evictor.rs`, `runtime/filtering.rs`, `runtime/free.rs`.
//!
//! # Invariants
//!
//! - I1: a word with `P` set has a payload pointing at a live object header in
//!   a local span; a word with `P` clear names a live far span.
//! - I2: a thread dereferences a local address only inside a deref scope and
//!   only after seeing `P` set with `E`/`M` clear, or after clearing them while
//!   holding `L`.
//! - I3: an object's local memory is released only after a grace period that
//!   began after its word lost `P` or gained `E`/`M`, and only while its word
//!   holds `L` or already names the far copy (or, after a move, the new
//!   local copy).
//! - I4: only the holder of `L` changes the payload or `P`.
//! - I5 (move): the new slot is claimed (visible to sweeps) only after its
//!   header and payload are written, and the word names it only after that;
//!   the mover reads and writes object bytes only while holding `L`, so no
//!   application thread accesses either copy during the copy.
//! - I6: a word carries at most one of `E` and `M`, and a span is pinned by
//!   at most one background thread (eviction or filtering) at a time.

#[cfg(test)]
use crate::loom::spin_yield;
use crate::loom::{AtomicU64, Ordering};

mod barrier;
pub(crate) mod evict;
mod free;

pub(crate) use barrier::Slow;
pub(crate) use evict::Evictee;
pub(crate) use free::Freeing;

/// Present: the object is in local memory.
pub(crate) const PRESENT: u64 = 1 << 0;
/// Lock: a thread holds the word's spinlock.
pub(crate) const LOCK: u64 = 1 << 1;
/// Shared: the slot belongs to a `RemRc` (reference counted).
pub(crate) const SHARED: u64 = 1 << 2;
/// Moving: a filtering thread is moving the object between local spans.
pub(crate) const MOVING: u64 = 1 << 3;
/// Evicting: an eviction thread is swapping the object's span out.
pub(crate) const EVICTING: u64 = 1 << 4;
/// Dirty: written since it was last swapped in.
pub(crate) const DIRTY: u64 = 1 << 5;
/// Sealed: the eviction is past its grace period and will complete or be
/// abandoned by the evictor alone.
pub(crate) const SEALED: u64 = 1 << 6;
/// Fresh: swapped in and not dereferenced since (counts the bytes a
/// swap-in brought that were used: swap-in amplification). Set only by
/// swap-in, so its first dereference of each object takes the slow path
/// once; objects allocated locally never have it.
pub(crate) const FRESH: u64 = 1 << 7;
/// Shift of the hotness byte.
pub(crate) const HOT_SHIFT: u32 = 8;
/// Mask of the hotness byte.
pub(crate) const HOT_MASK: u64 = 0xFF << HOT_SHIFT;
/// Shift of the payload.
pub(crate) const PAYLOAD_SHIFT: u32 = 16;
/// The bits that make a fast-path dereference impossible, plus `P`.
pub(crate) const FAST_MASK: u64 = PRESENT | LOCK | MOVING | EVICTING | FRESH;

/// Where a far object lives: region-table index, span page and object index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FarLoc {
    /// Index in the compute node's region table.
    pub region: u16,
    /// Page index of the span inside the region (8 KiB pages).
    pub page: u32,
    /// Object index inside the span.
    pub object: u16,
}

/// Largest page index a far word can name.
pub(crate) const MAX_FAR_PAGE: u32 = (1 << 20) - 1;
/// Largest object index a far word can name.
pub(crate) const MAX_FAR_OBJECT: u16 = (1 << 12) - 1;

impl FarLoc {
    fn to_payload(self) -> u64 {
        debug_assert!(self.page <= MAX_FAR_PAGE && self.object <= MAX_FAR_OBJECT);
        ((self.region as u64) << 32) | ((self.page as u64) << 12) | self.object as u64
    }

    fn from_payload(p: u64) -> Self {
        Self {
            region: (p >> 32) as u16,
            page: ((p >> 12) & MAX_FAR_PAGE as u64) as u32,
            object: (p & MAX_FAR_OBJECT as u64) as u16,
        }
    }
}

/// Builds the word of a local object.
pub(crate) const fn local_word(header_addr: usize, flags: u64, hotness: u8) -> u64 {
    ((header_addr as u64) << PAYLOAD_SHIFT) | ((hotness as u64) << HOT_SHIFT) | flags | PRESENT
}

/// Builds the word of a far object (`P` clear); `flags` keeps `S`.
pub(crate) fn far_word(loc: FarLoc, flags: u64, hotness: u8) -> u64 {
    (loc.to_payload() << PAYLOAD_SHIFT) | ((hotness as u64) << HOT_SHIFT) | (flags & SHARED)
}

/// The local header address in a present word.
pub(crate) const fn local_addr(w: u64) -> usize {
    (w >> PAYLOAD_SHIFT) as usize
}

/// The far location in a word without `P`.
pub(crate) fn far_loc(w: u64) -> FarLoc {
    FarLoc::from_payload(w >> PAYLOAD_SHIFT)
}

/// The hotness byte.
pub(crate) const fn hotness(w: u64) -> u8 {
    ((w & HOT_MASK) >> HOT_SHIFT) as u8
}

/// A pointer slot: the word plus, for shared pointers, the reference count.
/// Slots never move while in use.
#[derive(Debug)]
#[repr(C, align(16))]
pub(crate) struct Slot {
    /// The Figure-2 word.
    pub word: AtomicU64,
    /// `RemRc` reference count (unused by `RemBox`); next-free link when free.
    pub refs: AtomicU64,
}

impl Slot {
    /// A slot holding `word`.
    #[cfg(test)]
    pub(crate) fn new(word: u64) -> Self {
        Self {
            word: AtomicU64::new(word),
            refs: AtomicU64::new(1),
        }
    }

    /// Spins until it holds `L`; returns the word as it was (without `L`).
    #[cfg(test)]
    pub(crate) fn lock(&self) -> u64 {
        loop {
            let w = self.word.load(Ordering::Acquire);
            if w & LOCK == 0
                && self
                    .word
                    .compare_exchange_weak(w, w | LOCK, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return w;
            }
            spin_yield();
        }
    }

    /// Tries once to take `L` on a word equal to `expect` (which has `L` clear).
    pub(crate) fn try_lock_exact(&self, expect: u64) -> bool {
        self.word
            .compare_exchange(expect, expect | LOCK, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Stores `w` (which must not have `L`), releasing the lock: a
    /// `Release` store ([`crate::loom::store_release`]; a `swap` under loom).
    #[inline]
    pub(crate) fn unlock_with(&self, w: u64) {
        debug_assert_eq!(w & LOCK, 0);
        crate::loom::store_release(&self.word, w);
    }

    /// Step 2, the mark: sets `bit` (`E` or `M`) on the word of the local
    /// object at `addr` with a SeqCst `fetch_or` (the Dekker half of the
    /// grace period). Returns the marked word, or `None` (and nothing marked)
    /// if the word is locked, already marked, or names another object.
    pub(crate) fn mark(&self, addr: usize, bit: u64) -> Option<u64> {
        let prev = self.word.fetch_or(bit, Ordering::SeqCst);
        if prev & (PRESENT | LOCK | MOVING | EVICTING) == PRESENT && local_addr(prev) == addr {
            Some(prev | bit)
        } else {
            if prev & bit == 0 {
                self.word.fetch_and(!bit, Ordering::SeqCst);
            }
            None
        }
    }

    /// Sets `add` on the word of the local object at `addr` if it has exactly
    /// the flags `need` among P, L, M, E, Z, whatever its hotness and dirty
    /// bits say (steps 4 and 5). Returns the new word, or `None` if the word
    /// no longer qualifies (the object was freed, or an access aborted the mark).
    pub(crate) fn transition(&self, addr: usize, need: u64, add: u64) -> Option<u64> {
        const FLAGS: u64 = PRESENT | LOCK | MOVING | EVICTING | SEALED;
        loop {
            let w = self.word.load(Ordering::Acquire);
            if w & FLAGS != need || local_addr(w) != addr {
                return None;
            }
            if self
                .word
                .compare_exchange(w, w | add, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(w | add);
            }
        }
    }

    /// Takes back a mark (`bits`: `E|Z` or `M`) from a word that still names
    /// the object at `addr`, whatever happened to its hotness or dirty bits
    /// meanwhile. A word that is locked, freed or already unmarked is left to
    /// its holder.
    pub(crate) fn unmark(&self, addr: usize, bits: u64) {
        let mark = bits & (EVICTING | MOVING);
        loop {
            let w = self.word.load(Ordering::Acquire);
            if w & PRESENT == 0 || w & LOCK != 0 || w & mark == 0 || local_addr(w) != addr {
                return;
            }
            if self
                .word
                .compare_exchange(w, w & !bits, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// The first dereference after a swap-in clears `F` on `w`; true if this
    /// call did (so the caller counts the object as used).
    pub(crate) fn clear_fresh(&self, w: u64) -> bool {
        w & FRESH != 0
            && self
                .word
                .compare_exchange(w, w & !FRESH, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// The aging sweep: replaces the hotness of `w` with `aged` if the word
    /// is still `w` and nobody has marked or locked it (a mark's commit
    /// expects the word it marked, hotness included). Best effort.
    pub(crate) fn age(&self, w: u64, aged: u8) {
        if w & (EVICTING | SEALED | LOCK | MOVING) == 0 && hotness(w) != aged {
            let new = (w & !HOT_MASK) | ((aged as u64) << HOT_SHIFT);
            let _ = self.word.compare_exchange(w, new, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Step 6 after the grace period, for the object at `addr` marked `M`:
    /// takes `L` if the word is still exactly `P|M` for it, runs `copy`
    /// (given the locked word; it copies the object and returns the new
    /// header address) and commits ([`Slot::commit_move`]). Returns the new
    /// word, or `None` if the word no longer qualified (an access cleared
    /// `M`, or the owner freed the object): nothing was copied and the mark
    /// is taken back if still there. One function for the runtime's
    /// `move_object` and the loom model of the move.
    pub(crate) fn move_marked(&self, addr: usize, copy: impl FnOnce(u64) -> usize) -> Option<u64> {
        let Some(locked) = self.transition(addr, PRESENT | MOVING, LOCK) else {
            self.unmark(addr, MOVING);
            return None;
        };
        let to = copy(locked);
        Some(self.commit_move(locked, to))
    }

    /// Step 6, the move's commit: with `L` held on `locked` (the word
    /// [`Slot::transition`]`(addr, P|M, L)` returned), stores the word of the
    /// same object at `new_addr`, keeping `S`, `F` and hotness, setting `D`
    /// (the dirty rule: the new span's kept far copy, if any, does not hold
    /// this object) and clearing `M` and `L`, which releases the lock.
    /// Returns the new word.
    ///
    /// A `swap` rather than a store: the same release, and it keeps loom
    /// 0.7 from placing it between the read and write of a concurrent RMW
    /// (tokio-rs/loom#254; see `loom_models::store`).
    pub(crate) fn commit_move(&self, locked: u64, new_addr: usize) -> u64 {
        const FLAGS: u64 = PRESENT | LOCK | MOVING | EVICTING | SEALED;
        debug_assert_eq!(locked & FLAGS, PRESENT | LOCK | MOVING);
        let w = local_word(new_addr, (locked & (SHARED | FRESH)) | DIRTY, hotness(locked));
        self.word.swap(w, Ordering::Release);
        w
    }
}

/// The slot named by the header of the object at `addr` (the reverse pointer
/// every object starts with), or `None` while the header is clear (the
/// object is being freed).
///
/// # Safety
/// `addr` must be the start of an allocated object slot of a local span that
/// stays in use meanwhile (pinned, or its registry locked). The header may
/// be stale (the slot freed and reused): a caller checks that the slot's word
/// names `addr` (as [`object_at`] does, or a mark does) before trusting it.
pub(crate) unsafe fn slot_of(addr: usize) -> Option<&'static Slot> {
    // SAFETY: per the contract `addr` is an 8-aligned, mapped object start;
    // headers are only ever accessed atomically.
    let h = unsafe { &*(addr as *const std::sync::atomic::AtomicU64) }.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: forwarded: `h` was read from an object's header.
    unsafe { slot_named(h) }
}

/// The slot a header value names (`None` for a clear header).
///
/// # Safety
/// `h` was read from the header of an object of this process's runtime (in
/// place, or from a copy of its span's bytes).
pub(crate) unsafe fn slot_named(h: u64) -> Option<&'static Slot> {
    // SAFETY: a non-null header names a slot in a chunk that lives as long as
    // the runtime (a stale one still names a valid slot).
    unsafe { (h as *const Slot).as_ref() }
}

/// The slot of the object at `addr` and its current word, if that word says
/// the object is local at `addr` (else the header was stale, or the object
/// is far or moved).
///
/// # Safety
/// As [`slot_of`].
pub(crate) unsafe fn object_at(addr: usize) -> Option<(&'static Slot, u64)> {
    // SAFETY: forwarded contract.
    let slot = unsafe { slot_of(addr) }?;
    let w = slot.word.load(Ordering::Relaxed);
    (w & PRESENT != 0 && local_addr(w) == addr).then_some((slot, w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_round_trips() {
        let w = local_word(0x7fff_dead_beef, SHARED | DIRTY, 200);
        assert_eq!(local_addr(w), 0x7fff_dead_beef);
        assert_eq!(hotness(w), 200);
        assert_eq!(w & FAST_MASK, PRESENT);
        let loc = FarLoc {
            region: 65535,
            page: MAX_FAR_PAGE,
            object: MAX_FAR_OBJECT,
        };
        let f = far_word(loc, SHARED | DIRTY | PRESENT, 7);
        assert_eq!(f & PRESENT, 0);
        assert_eq!(f & SHARED, SHARED);
        assert_eq!(f & DIRTY, 0);
        assert_eq!(far_loc(f), loc);
        assert_eq!(hotness(f), 7);
        let small = FarLoc {
            region: 1,
            page: 2,
            object: 3,
        };
        assert_eq!(far_loc(far_word(small, 0, 0)), small);
    }

    #[test]
    fn lock_and_exact_lock() {
        let s = Slot::new(local_word(0x1000, 0, 0));
        let w = s.lock();
        assert!(!s.try_lock_exact(w), "already locked");
        s.unlock_with(w | EVICTING);
        assert!(s.try_lock_exact(w | EVICTING));
        assert!(!s.try_lock_exact(w));
    }
}
