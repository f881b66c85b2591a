//! Loom models of the move step of the pointer protocol (step 6 in
//! [`crate::pointer`]): a filtering thread marks `M`, waits one grace
//! period and runs [`Slot::move_marked`], the function `move_object` in
//! `runtime/filtering.rs` runs (take `L` if the word is still exactly
//! `P|M`, copy the object to its new slot, store the new word), then
//! releases the old slot; application threads dereference, write and free
//! the object meanwhile (`runtime/access.rs`, `runtime/free.rs`).
//!
//! The word is the crate's own [`Slot`] and every transition is the real
//! one (`mark`, `move_marked`, `unmark`, `try_lock_exact`, `age`); the
//! deref scopes and the grace period are the real `Rcu`. The object's old
//! and new homes are loom `UnsafeCell`s: loom reports any access of one
//! that is not ordered with a write to it (the copy, a write through
//! `deref_mut`, or the release of the old slot, modelled as a write of
//! poison), and the value checks catch an access that is ordered but reads
//! the wrong home.
//!
//! `copy_before_lock_races_a_writer` shows why the mover takes `L` before
//! copying: a labelled copy of the steps in the other order (copy first,
//! validate with the exact-word CAS afterwards: the seqlock order) lets a
//! thread that won the race (cleared `M`) write the object while it is
//! being read, which loom reports as a data race.

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

use super::{Scopes, access, check, check_bounded, store};
use crate::pointer::{
    DIRTY, EVICTING, FRESH, Freeing, LOCK, MOVING, PRESENT, SEALED, SHARED, Slot, hotness, local_addr, local_word,
};

/// The object's old home (its header address; only the payload of the word matters).
const SRC: usize = 0x1000;
/// Its new home, a free slot of the filter's destination span.
const DST: usize = 0x2000;
/// Where the slot's next tenant lives after the object is dropped.
const OTHER: usize = 0x3000;
/// The object's contents.
const VALUE: u64 = 42;
/// What a writer writes.
const WRITTEN: u64 = 43;
/// Poison left in the old slot once it is released and reused.
const FREED: u64 = 0xdead;

/// One object, its slot, its two possible homes, and the readers' scope states.
struct World {
    slot: Slot,
    /// The old home's bytes.
    src: UnsafeCell<u64>,
    /// The new home's bytes.
    dst: UnsafeCell<u64>,
    /// The old slot was released (set after the poison is written).
    src_released: AtomicBool,
    /// The readers' scope records and the grace period.
    scopes: Scopes,
}

impl World {
    fn new(flags: u64, hot: u8) -> Self {
        Self {
            slot: Slot::new(local_word(SRC, flags, hot)),
            src: UnsafeCell::new(VALUE),
            dst: UnsafeCell::new(0),
            src_released: AtomicBool::new(false),
            scopes: Scopes::new(Ordering::Release),
        }
    }

    /// The home at `addr`.
    fn home(&self, addr: usize) -> &UnsafeCell<u64> {
        match addr {
            SRC => &self.src,
            DST => &self.dst,
            _ => panic!("no object at {addr:#x}"),
        }
    }

    fn read(&self, addr: usize) -> u64 {
        // SAFETY: loom checks the access against every write to the cell.
        self.home(addr).with(|p| unsafe { *p })
    }

    fn write(&self, addr: usize, v: u64) {
        // SAFETY: as above.
        self.home(addr).with_mut(|p| unsafe { *p = v });
    }
}

/// How a move ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// `mark` refused (busy, freed, or already marked).
    NotMarked,
    /// The word changed after the grace period (an access cleared `M`, or
    /// the owner freed the object): nothing copied, the object stays.
    Aborted,
    /// The word names the new home and the old slot was released.
    Moved,
}

/// The order of the mover's steps after the grace period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// [`Slot::move_marked`], as `move_object` runs it: take `L` (exact
    /// `P|M`), copy, commit.
    LockThenCopy,
    /// A copy of the steps in the seqlock order, which the move must not
    /// use: copy, then take `L` (exact `P|M`), commit.
    CopyThenLock,
}

/// The filter's `pin_and_mark` + grace period + `move_object` for one object.
fn mover(w: &World, order: Order) -> Move {
    if w.slot.mark(SRC, MOVING).is_none() {
        return Move::NotMarked;
    }
    w.scopes.synchronize();
    let copy = |w: &World| {
        let v = w.read(SRC);
        w.write(DST, v);
    };
    let (locked, new) = match order {
        Order::LockThenCopy => {
            let mut locked = 0;
            let new = w.slot.move_marked(SRC, |l| {
                locked = l;
                copy(w);
                DST
            });
            let Some(new) = new else {
                return Move::Aborted;
            };
            (locked, new)
        }
        Order::CopyThenLock => {
            copy(w);
            let Some(locked) = w.slot.transition(SRC, PRESENT | MOVING, LOCK) else {
                w.slot.unmark(SRC, MOVING);
                return Move::Aborted;
            };
            (locked, w.slot.commit_move(locked, DST))
        }
    };
    assert_eq!(new & (LOCK | MOVING), 0);
    assert_eq!(local_addr(new), DST);
    assert_eq!(new & (SHARED | FRESH), locked & (SHARED | FRESH), "S and F kept");
    assert_ne!(new & DIRTY, 0, "a moved object is dirty (the dirty rule)");
    assert_eq!(hotness(new), hotness(locked), "hotness kept");
    // `heap.free` of the old slot: the span may hand it out again.
    w.write(SRC, FREED);
    w.src_released.store(true, Ordering::Release);
    Move::Moved
}

/// A reader (or writer) in one scope: dereferences, checks the value, and
/// writes `WRITTEN` if `write`. Returns the address it used.
fn reader(w: &World, r: usize, write: bool) -> usize {
    let scope = w.scopes.enter(r);
    let addr = access(&w.slot, write)
        .addr()
        .expect("the object never leaves local memory here");
    assert_eq!(w.read(addr), VALUE, "read a stale or released home at {addr:#x}");
    if write {
        w.write(addr, WRITTEN);
    }
    drop(scope);
    addr
}

/// After everyone is done: the word names one home, unlocked and unmarked,
/// and that home holds `want`.
fn settled(w: &World, m: Move, want: u64) {
    let word = w.slot.word.load(Ordering::Acquire);
    assert_eq!(
        word & (PRESENT | LOCK | MOVING | EVICTING | SEALED),
        PRESENT,
        "word {word:#x} after {m:?}"
    );
    let addr = local_addr(word);
    assert_eq!(addr, if m == Move::Moved { DST } else { SRC });
    assert_eq!(w.read(addr), want, "the object's home holds the wrong value");
}

/// An object swapped in and not yet dereferenced (`F`): the move keeps `F`,
/// and the reader's first dereference clears it, before or after the move.
#[test]
fn fresh_object_vs_mover() {
    check("fresh_object_vs_mover", || {
        let w = Arc::new(World::new(FRESH, 255));
        let w2 = Arc::clone(&w);
        let mv = thread::spawn(move || mover(&w2, Order::LockThenCopy));
        reader(&w, 0, false);
        let m = mv.join().unwrap();
        settled(&w, m, VALUE);
        assert_eq!(
            w.slot.word.load(Ordering::Relaxed) & FRESH,
            0,
            "F left after a dereference"
        );
    });
}

/// A reader against a mover: it never reads a home the mover has not
/// finished writing or has released, and a mover that finds the object
/// touched after the grace period leaves it in place and unmarked.
fn reader_vs_mover(hot: u8) {
    check("reader_vs_mover", move || {
        let w = Arc::new(World::new(0, hot));
        let w2 = Arc::clone(&w);
        let mv = thread::spawn(move || mover(&w2, Order::LockThenCopy));
        let addr = reader(&w, 0, false);
        let m = mv.join().unwrap();
        assert_ne!(m, Move::NotMarked, "nothing else marks the word");
        if addr == DST {
            assert_eq!(m, Move::Moved);
        }
        settled(&w, m, VALUE);
    });
}

#[test]
fn reader_vs_mover_hot_object() {
    reader_vs_mover(255);
}

#[test]
fn reader_vs_mover_cold_object() {
    // Hotness 0: a fast-path reader that loaded the word before the mark
    // raises hotness after it; the exact-flags transition ignores that.
    reader_vs_mover(0);
}

/// A writer, fast path or slow: its write is never lost. Either the mover
/// copies it (the grace period orders a fast-path write before the copy;
/// a slow-path writer that meets `L` waits and writes the new home), or
/// the writer cleared `M` first and the object stays where it wrote.
fn writer_vs_mover(flags: u64) {
    check("writer_vs_mover", move || {
        let w = Arc::new(World::new(flags, 255));
        let w2 = Arc::clone(&w);
        let mv = thread::spawn(move || mover(&w2, Order::LockThenCopy));
        reader(&w, 0, true);
        let m = mv.join().unwrap();
        settled(&w, m, WRITTEN);
        assert_ne!(w.slot.word.load(Ordering::Relaxed) & DIRTY, 0, "dirty kept");
    });
}

#[test]
fn writer_vs_mover_clean() {
    writer_vs_mover(0);
}

#[test]
fn writer_vs_mover_dirty_shared() {
    // Hot and already dirty: the fast-path write changes no word, so only
    // the grace period can order it before the copy. S must survive the move.
    writer_vs_mover(DIRTY | SHARED);
}

/// The seqlock order (copy first, validate with the exact-word CAS after):
/// a writer that clears `M` after the grace period writes the old home
/// while the mover reads it. The CAS then fails and the copy is discarded,
/// but the concurrent access is a data race, which loom reports.
#[test]
#[should_panic(expected = "Causality violation")]
fn copy_before_lock_races_a_writer() {
    check("copy_before_lock_races_a_writer", || {
        let w = Arc::new(World::new(DIRTY, 255));
        let w2 = Arc::clone(&w);
        let mv = thread::spawn(move || mover(&w2, Order::CopyThenLock));
        reader(&w, 0, true);
        let m = mv.join().unwrap();
        settled(&w, m, WRITTEN);
    });
}

/// Two readers in scopes against a mover (three threads: lower bound).
#[test]
fn two_readers_vs_mover() {
    check_bounded("two_readers_vs_mover", 2, || {
        let w = Arc::new(World::new(0, 255));
        let w2 = Arc::clone(&w);
        let mv = thread::spawn(move || mover(&w2, Order::LockThenCopy));
        let w3 = Arc::clone(&w);
        let r2 = thread::spawn(move || reader(&w3, 1, false));
        reader(&w, 0, false);
        r2.join().unwrap();
        let m = mv.join().unwrap();
        settled(&w, m, VALUE);
    });
}

/// `free_one` on the word ([`Slot::lock_for_free`]): lock it, read the
/// object out (its drop glue), free the slot in its span, reset the word
/// ([`Slot::reset`]). With `tenant`, the slot is reused at once for an
/// object elsewhere. Returns the home it freed.
fn dropper(w: &World, tenant: bool) -> usize {
    let Freeing::Local(wd) = w.slot.lock_for_free() else {
        panic!("the object went far; nothing evicts in these models");
    };
    let addr = local_addr(wd);
    assert_eq!(w.read(addr), VALUE, "dropped a stale or released home");
    // `slots.free`, then possibly `slots.alloc` for a new object elsewhere.
    w.slot.reset();
    if tenant {
        store(&w.slot.word, local_word(OTHER, 0, 255));
    }
    addr
}

/// A drop racing a move: the dropper frees exactly the home the word named
/// when it locked it; the mover either moved before (the dropper frees the
/// new home) or finds the word gone and moves nothing. With a new tenant in
/// the slot, the mover's stale `transition` and `unmark` leave it alone.
fn dropper_vs_mover(tenant: bool) {
    check("dropper_vs_mover", move || {
        let w = Arc::new(World::new(0, 255));
        let w2 = Arc::clone(&w);
        let mv = thread::spawn(move || mover(&w2, Order::LockThenCopy));
        let freed = dropper(&w, tenant);
        let m = mv.join().unwrap();
        assert_eq!(freed == DST, m == Move::Moved, "freed {freed:#x} after {m:?}");
        let word = w.slot.word.load(Ordering::Relaxed);
        if tenant {
            assert_eq!(word, local_word(OTHER, 0, 255), "the tenant's word was touched");
        } else {
            assert_eq!(word, 0);
        }
    });
}

#[test]
fn dropper_vs_mover_slot_freed() {
    dropper_vs_mover(false);
}

#[test]
fn dropper_vs_mover_slot_reused() {
    dropper_vs_mover(true);
}

/// The aging sweep (`pick_cold`, or the filter's own classify) racing a
/// move: `age` leaves marked and locked words alone, so a move is never
/// broken by it and never leaves `M` behind.
#[test]
fn ager_vs_mover() {
    check("ager_vs_mover", || {
        let w = Arc::new(World::new(0, 255));
        let w2 = Arc::clone(&w);
        let mv = thread::spawn(move || mover(&w2, Order::LockThenCopy));
        let cur = w.slot.word.load(Ordering::Relaxed);
        w.slot.age(cur, 0);
        let m = mv.join().unwrap();
        assert_eq!(m, Move::Moved, "nothing else clears M here");
        settled(&w, m, VALUE);
    });
}

/// The evictor's mark and the filter's mark on one word (the span pins keep
/// them apart; this checks the word alone does too): at most one wins, and
/// the loser leaves no bit behind.
#[test]
fn evictor_and_mover_marks_exclude_each_other() {
    check("evictor_and_mover_marks_exclude_each_other", || {
        let w = Arc::new(World::new(0, 255));
        let w2 = Arc::clone(&w);
        let ev = thread::spawn(move || w2.slot.mark(SRC, EVICTING).is_some());
        let moved = w.slot.mark(SRC, MOVING).is_some();
        let evicting = ev.join().unwrap();
        assert!(!(moved && evicting), "both marks won");
        let word = w.slot.word.load(Ordering::Relaxed);
        let want = if moved {
            MOVING
        } else if evicting {
            EVICTING
        } else {
            0
        };
        assert_eq!(word & (MOVING | EVICTING), want, "word {word:#x}");
    });
}

/// A stale mark landing on the word during a move: a sweep that read an
/// old header naming this slot at another address (the evictor's
/// `mark_span`, or another filtering thread) sets its bit, sees the word is
/// not its object's and takes the bit back. The move either completes or
/// aborts, a reader finds a valid home, and no bit is left behind.
#[test]
fn stale_mark_during_move() {
    check_bounded("stale_mark_during_move", 3, || {
        let w = Arc::new(World::new(0, 255));
        // The reader has used the runtime before: registering it with the
        // `Rcu` here, before the race, keeps three threads at bound 3 cheap
        // (the other models race the registration).
        drop(w.scopes.enter(0));
        let w2 = Arc::clone(&w);
        let mv = thread::spawn(move || mover(&w2, Order::LockThenCopy));
        let w3 = Arc::clone(&w);
        let stale = thread::spawn(move || {
            assert!(w3.slot.mark(OTHER, EVICTING).is_none(), "a stale mark never wins");
        });
        reader(&w, 0, false);
        stale.join().unwrap();
        let m = mv.join().unwrap();
        settled(&w, m, VALUE);
    });
}
