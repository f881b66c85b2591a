//! Filtering threads (paper §3.3 "span filtering", §3.6): they move objects
//! between local spans so that each span holds only hot or only cold
//! objects, and empty sparse spans. Eviction picks whole spans, so without
//! filtering one hot object pins every cold byte of its span; after it, cold
//! spans can go whole and hot spans stay (the eviction policy can prefer
//! spans flagged [`crate::span::Span::is_cold`]).
//!
//! One round of a filtering thread:
//!
//! 1. **Classify**: with the span registry locked (as `pick_cold` does), walk
//!    a window of local spans from the thread's own clock hand; read each
//!    live object's hotness and age it with the policy's `age`. An object is
//!    *hot* if its hotness is non-zero (with CLOCK: touched since the last
//!    sweep). A span of a size class with at least `MIN_SLOTS` slots is chosen if it
//!    is sparse (at most a quarter of its slots live: all its objects move,
//!    and it is freed) or mixes hot and cold objects: then the minority
//!    moves if the majority fills at least three quarters of the span (one
//!    touched object in a cold span moves alone, and the span stays, all
//!    cold), otherwise all of them move (no half-empty span is left). Any
//!    other span gets its cold flag set to "all cold".
//! 2. **Pin and mark**: pin each chosen span with the eviction pin
//!    (`begin_evict`: `EVICTING_POS`, so the evictor skips it, nothing is
//!    allocated from it, it is not released under us; a span the evictor
//!    pinned first is skipped), then mark `M` on every live object that is
//!    to move.
//! 3. **One grace period** for the whole batch.
//! 4. **Move** each marked object (pointer protocol step 6): take `L` if the
//!    word is still exactly `P|M` for its address, copy header and payload
//!    into the hot or cold destination span of its class, claim that slot,
//!    store the word naming the copy, free the old slot. A word that changed
//!    (the application touched or freed the object) loses its mark and the
//!    object stays where it is.
//! 5. **Unpin** the sources (an emptied one goes back to the page heap:
//!    `spans_filtered`; one that kept its cold majority is flagged cold and
//!    kept off the free list) and the destinations.
//!
//! Destinations: for each size class a thread keeps one hot and one cold
//! destination span, pinned while it fills them, so application allocations
//! never land in a half-filled destination and the evictor never picks one
//! mid-fill. A cold destination is preferably a cold span with free slots
//! the thread saw (holes left by frees or by minority moves), else a fresh
//! span the filter takes from the page heap itself. A hot one is preferably
//! a span on the class's free list (hot, with holes: a cold minority moved
//! out of it), else a fresh span. At the
//! end of a round they are unpinned: a hot destination goes back on the
//! class's free list (new objects are hot too); a cold one (flagged cold)
//! stays off the list, so only the filter puts objects there (a free in a
//! cold span does not list it either). Each is remembered and pinned again
//! next round until it is full, and is never itself a filtering source while
//! remembered, so a half-filled destination is not "compacted" into a new
//! one round after round. (If the remembered span was released and its
//! metadata reused meanwhile, the filter at worst fills some other span of
//! the same class with objects of that temperature: the pin is taken under
//! the class lock, so this is a placement question, not a safety one.)

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::Ordering as StdOrdering;
use std::time::{Duration, Instant};

use super::{Inner, header, slot_ref};
use crate::error::RuntimeError;
use crate::loom::Ordering;
use crate::object::HEADER;
use crate::object_heap::SpanRef;
use crate::pointer::{self, MOVING, Slot};
use crate::size_classes::ClassIndex;
use crate::span::SpanKind;

mod classify;
mod destination;
mod shared;

pub(super) use shared::Filtering;

/// Spans a round classifies (the window its clock hand advances by).
const WINDOW: usize = 64;
/// Filter intervals per window of the sweep: the sweep passes every local
/// span about once per `SWEEP_EVERY * interval * spans / WINDOW` (2.1 s for
/// `bench micro`'s 13k spans), and an object untouched for that long counts
/// as cold. `bench micro` (1 KiB objects, half local, Zipf 0.99) missed
/// 0.094 per op with 2 at both 2 and 4 threads; with 1, 0.094 at 4 threads
/// but 0.109 at 2 (cold too soon); with 3 and 6, 0.096 and 0.100.
const SWEEP_EVERY: u32 = 2;
/// Spans with fewer slots are left alone: moving one of their objects
/// moves a quarter of the span or more, and makes its copy dirty (no clean
/// re-eviction), while what filtering saves, swap-in amplification, is at
/// most this many objects' worth. The allocator gives most such objects a
/// span each instead ([`SizeClass::for_object`]); the policy handles the
/// rest (CLOCK evicts a span of large objects while at most half of them
/// were touched).
///
/// [`SizeClass::for_object`]: crate::size_classes::SizeClass::for_object
const MIN_SLOTS: usize = crate::size_classes::MIN_SHARED_OBJECTS;
/// A span with a kept far copy keeps its cold objects in place while they
/// fill at least `KEPT_NUM / KEPT_DEN` of it (below that, its far copy is
/// mostly holes, and rewriting them compactly frees it).
const KEPT_NUM: usize = 1;
const KEPT_DEN: usize = 2;
/// Most fresh (swapped-in) spans classified per round; the sweep's window
/// adds up to [`WINDOW`] more sources (one grace period for all).
const BATCH: usize = 32;
/// A span is sparse when at most `1 / SPARSE` of its slots are live.
const SPARSE: usize = 4;
/// Cold spans with room remembered per class.
const ROOM: usize = 16;
/// A mixed span keeps its majority (and moves only the minority) if the
/// majority fills at least `DENSE_NUM / DENSE_DEN` of its slots.
const DENSE_NUM: usize = 3;
const DENSE_DEN: usize = 4;

/// A filtering thread's body: a round every `interval` until the runtime stops.
pub(super) fn filtering_loop(weak: &std::sync::Weak<Inner>, index: usize, interval: Duration) {
    let mut filter = Filter::new(index, interval);
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.lifecycle.stopping() {
            return;
        }
        let paused = match inner.filtering.enter() {
            Some(_pass) => {
                inner.filter_round(&mut filter);
                if inner.queued_cold_due() {
                    inner.pressure.kick();
                }
                false
            }
            None => true,
        };
        if !paused && inner.filtering.swapped_in_waiting() >= BATCH {
            continue; // behind on fresh spans: no sleep
        }
        // Sleep, waking early when the runtime stops (its drop kicks).
        inner
            .pressure
            .sleep_until(Instant::now() + interval, || inner.lifecycle.stopping());
    }
}

/// Whether a destination holds hot or cold objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Temp {
    Hot,
    Cold,
}

/// A destination span of one size class and temperature.
struct Dest {
    span: SpanRef,
    /// Pinned by this thread now (only during a round).
    pinned: bool,
}

/// One filtering thread's state between rounds.
pub(super) struct Filter {
    /// Position of this thread's clock hand in the span registry's ring.
    cursor: usize,
    /// The hand advances one window per `SWEEP_EVERY` intervals.
    interval: Duration,
    /// When the hand last advanced.
    last_sweep: Option<Instant>,
    /// Destinations by (size class, temperature).
    dests: HashMap<(ClassIndex, Temp), Dest>,
    /// Cold spans with free slots, by class (most recently seen last): cold
    /// objects fill these before a fresh destination is taken.
    room: HashMap<ClassIndex, Vec<SpanRef>>,
}

impl Filter {
    pub(super) fn new(index: usize, interval: Duration) -> Self {
        Self {
            // Threads start their hands apart; the ring's length varies, so
            // this is only a spread, not a partition.
            cursor: index * WINDOW,
            interval,
            last_sweep: None,
            dests: HashMap::new(),
            room: HashMap::new(),
        }
    }

    /// Remembers a cold span of `class` with free slots.
    fn note_room(&mut self, class: ClassIndex, span: SpanRef) {
        let v = self.room.entry(class).or_default();
        if !v.contains(&span) {
            if v.len() >= ROOM {
                v.remove(0);
            }
            v.push(span);
        }
    }

    fn is_dest(&self, s: SpanRef) -> bool {
        self.dests.values().any(|d| d.span == s)
    }
}

/// A chosen span, which of its slots were hot when classified, and the
/// temperature whose objects stay (`None`: every object moves).
struct Chosen {
    span: SpanRef,
    hot: Vec<u64>,
    keep: Option<Temp>,
}

/// An object marked `M`: its slot, its address, and where it goes.
struct Marked {
    slot: NonNull<Slot>,
    addr: usize,
    temp: Temp,
}

/// A pinned source span, its marked objects, and the temperature of the
/// objects that stay in it.
struct Source {
    span: SpanRef,
    class: ClassIndex,
    objs: Vec<Marked>,
    keep: Option<Temp>,
    /// Every object that was to move has moved (so far).
    complete: bool,
}

fn bit(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

impl Inner {
    /// One filtering round (see the module docs); returns the objects moved.
    pub(super) fn filter_round(&self, f: &mut Filter) -> usize {
        let chosen = self.classify(f);
        if chosen.is_empty() {
            return 0;
        }
        // Counted with the eviction rounds while it pins spans, so
        // `wait_for_eviction` also waits for the spans it holds to be released.
        self.pressure.round_started();
        let moved = self.move_batch(f, chosen);
        self.pressure.round_ended();
        moved
    }

    /// Steps 2 to 5 for the spans `classify` chose.
    fn move_batch(&self, f: &mut Filter, chosen: Vec<Chosen>) -> usize {
        let mut sources = self.pin_and_mark(chosen);
        if sources.iter().all(|s| s.objs.is_empty()) {
            for s in sources {
                self.unpin_source(f, &s);
            }
            return 0;
        }
        self.rcu.synchronize();
        let mut moved = 0;
        let mut failed = false;
        for src in &mut sources {
            for o in &src.objs {
                if failed {
                    slot_ref(o.slot).unmark(o.addr, MOVING);
                    src.complete = false;
                    continue;
                }
                match self.move_object(f, src.class, o) {
                    Ok(true) => moved += 1,
                    Ok(false) => src.complete = false,
                    Err(e) => {
                        // No destination span (local memory refused): take
                        // the remaining marks back and try again next round.
                        tracing::debug!("filtering stops this round: {e}");
                        src.complete = false;
                        failed = true;
                    }
                }
            }
        }
        for src in &sources {
            self.unpin_source(f, src);
        }
        // Unpin the destinations; one emptied meanwhile (its objects freed)
        // went back to the page heap and is forgotten.
        f.dests
            .retain(|&(_, temp), d| !std::mem::take(&mut d.pinned) || !self.heap.end_filter(d.span, temp == Temp::Hot));
        moved
    }

    /// Step 2: pins each chosen span and marks `M` on its live objects.
    fn pin_and_mark(&self, chosen: Vec<Chosen>) -> Vec<Source> {
        let mut sources = Vec::with_capacity(chosen.len());
        for c in chosen {
            if !self.heap.begin_evict(c.span) {
                continue; // pinned by the evictor (or another filter), or released
            }
            let sp = c.span.get();
            let Some(SpanKind::Small(class)) = sp.kind() else {
                // Its metadata was reused for a large span meanwhile.
                self.heap.end_evict(c.span, false);
                continue;
            };
            // Not known to be all cold until the round is over.
            sp.set_cold(false);
            let mut objs = Vec::with_capacity(sp.allocated());
            let mut complete = true;
            for i in (0..sp.capacity()).filter(|&i| sp.is_allocated(i)) {
                let addr = sp.object_addr(i);
                // SAFETY: slot i is allocated in a span we pinned.
                let Some(slot) = (unsafe { pointer::slot_of(addr) }) else {
                    continue;
                };
                // Hot if it was when classified (slot i may have been
                // reallocated since: then this is only a placement guess) or
                // touched since.
                let w = slot.word.load(Ordering::Relaxed);
                let hot = (i / 64 < c.hot.len() && bit(&c.hot, i)) || self.policy.filter_age(pointer::hotness(w)).0;
                let temp = if hot { Temp::Hot } else { Temp::Cold };
                if Some(temp) == c.keep {
                    continue;
                }
                // Busy, being freed, or no longer this object: left in place.
                if slot.mark(addr, MOVING).is_none() {
                    complete = false;
                    continue;
                }
                objs.push(Marked {
                    slot: NonNull::from(slot),
                    addr,
                    temp,
                });
            }
            sources.push(Source {
                span: c.span,
                class,
                objs,
                keep: c.keep,
                complete,
            });
        }
        sources
    }

    /// Step 4 for one object: `Ok(true)` if it moved, `Ok(false)` if the
    /// application won the race or freed it; `Err` if no destination span
    /// could be had (the object keeps its mark: the caller takes it back).
    fn move_object(&self, f: &mut Filter, class: ClassIndex, o: &Marked) -> Result<bool, RuntimeError> {
        let s = slot_ref(o.slot);
        let dest = match self.destination(f, class, o.temp) {
            Ok(d) => d,
            Err(e) => {
                s.unmark(o.addr, MOVING);
                return Err(e);
            }
        };
        let d = dest.get();
        let moved = s.move_marked(o.addr, |_| {
            let index = d
                .first_free()
                .expect("a pinned destination with room keeps it (only its filter claims)");
            let to = d.object_addr(index);
            let size = d.object_size();
            // SAFETY: we hold L on a word naming the object at `o.addr`, after a
            // grace period that began after M was set: no application thread
            // reads or writes the object now (pointer protocol I2, I5), and its
            // span is pinned so the slot is neither reused nor released. Slot
            // `index` of the pinned destination is free and only this thread
            // claims slots there, so nothing else uses those bytes either. Both
            // are `size`-byte slots of one size class in different spans.
            unsafe {
                std::ptr::copy_nonoverlapping((o.addr + HEADER) as *const u8, (to + HEADER) as *mut u8, size - HEADER);
                header(to).store(o.slot.as_ptr() as u64, StdOrdering::Release);
            }
            // Written first, claimed second: sweeps read the header of every
            // claimed slot without our lock.
            let claimed = self.heap.claim_pinned(dest, index);
            debug_assert!(claimed, "slot {index} of a pinned destination was free");
            to
        });
        if moved.is_none() {
            // An access cleared M (it keeps the object here) or the owner
            // freed it; `move_marked` took the mark back if it was still there.
            return Ok(false);
        }
        // The old copy is unreachable now: the word names the new one, and
        // every thread that could have loaded the old address has left its
        // scope (grace period) or found M and met our lock.
        // SAFETY: the old slot is still allocated in a pinned span.
        unsafe { header(o.addr) }.store(0, StdOrdering::Release);
        self.heap.free(o.addr);
        self.counters.object_moved(o.temp == Temp::Hot);
        if d.is_full() {
            // Done with it: back to service, forgotten.
            if let Some(dd) = f.dests.remove(&(class, o.temp)) {
                self.heap.end_filter(dd.span, o.temp == Temp::Hot);
            }
        }
        Ok(true)
    }

    /// Step 5 for a source span; counts it if it was emptied and released.
    /// A span left with only its cold majority is flagged cold and kept off
    /// the free list, like a cold destination.
    fn unpin_source(&self, f: &mut Filter, src: &Source) {
        let span = src.span;
        let sp = span.get();
        let cold = src.keep == Some(Temp::Cold) && src.complete;
        sp.set_cold(cold);
        let class = match sp.kind() {
            Some(SpanKind::Small(c)) => Some(c),
            _ => None,
        };
        if self.heap.end_filter(span, !cold) {
            self.counters.span_filtered();
        } else if let (true, Some(c)) = (cold, class) {
            f.note_room(c, span);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
