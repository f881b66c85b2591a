//! Swap-in: one remote read of a far span. From a span of small objects
//! (while filtering runs) only the object asked for comes back, into a slot
//! of its class, and the far span keeps the rest ([`Inner::swap_in_object`]);
//! otherwise the whole span comes back and its objects' words point at it.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering as StdOrdering;
use std::time::{Duration, Instant};

use super::{DerefScope, Inner, header};
use crate::error::RuntimeError;
use crate::far_page_map::{FarSpan, FarSpanState};
use crate::loom::Ordering;
use crate::object::HEADER;
use crate::object_heap::SpanRef;
use crate::pointer::{self, DIRTY, FRESH, PRESENT, SHARED, Slot, far_loc, local_word};
use crate::scheme::SpanAddr;
use crate::size_classes::{ClassIndex, MIN_SHARED_OBJECTS};

/// An object swap-in from a far span this soon after the last one from it
/// brings the whole span back instead. Random misses rarely meet a span
/// twice this close (`bench micro`, Zipf 0.99: a far span is missed on
/// about twice a second), while a scan of a span's objects does, at once:
/// without the rule it would read the span once per object.
const SCAN_WINDOW: Duration = Duration::from_millis(10);

/// An object swap-in leaves its far span at least `DENSE_NUM / DENSE_DEN`
/// full; from a sparser one the whole span comes back, and filtering packs
/// its objects into full spans. Without the bound, far spans keep every
/// hole object swap-ins leave until their last object goes: `bench micro`
/// (issue 7's flags, non-ft) held 298 MiB of far memory for 158 MiB of far
/// data; with it, 162 MiB (as before object swap-in: 165), while 74 % of
/// swap-ins still bring one object (with 3 / 4: 165 MiB, 25 %).
const DENSE_NUM: usize = 1;
const DENSE_DEN: usize = 2;

impl Inner {
    /// Brings the object at `loc` back with one remote read of its far span:
    /// alone, or with the whole span and the words of its live objects fixed.
    ///
    /// The two waits on the network (for another thread's swap-in of the
    /// same span, and the remote read) run outside the caller's scope when
    /// it holds nothing ([`DerefScope::step_out`]), so grace periods do not
    /// wait for them. Everything from publishing the span on runs inside:
    /// once its words are local the evictor may pick it, and only the
    /// scope keeps it from being released while we still use it.
    pub(super) fn swap_in(&self, loc: pointer::FarLoc, scope: &DerefScope<'_>) -> Result<(), RuntimeError> {
        let Some(fs) = self.far_map.get(loc.region, loc.page) else {
            return Ok(()); // already swapped in by another thread
        };
        let mut st = scope.step_out(|| fs.lock());
        if st.gone {
            return Ok(());
        }
        let at = SpanAddr {
            region: fs.region,
            page: fs.page,
        };
        if let Some(class) = self.object_swap_in_class(&fs) {
            // A second miss on the span soon after the first is a scan (or
            // a span of objects used together): the rest comes back whole.
            if (st.live_count as usize - 1) * DENSE_DEN >= fs.capacity as usize * DENSE_NUM {
                let now = Instant::now();
                if st.object_swapped_in.is_none_or(|t| now.duration_since(t) > SCAN_WINDOW) {
                    st.object_swapped_in = Some(now);
                    return self.swap_in_object(&fs, st, loc.object, class, at, scope);
                }
            }
        }
        self.swap_in_whole(&fs, st, at, scope, true).map(|_| ())
    }

    /// Brings the far span `fs` back whole (its lock `st` held) and points
    /// its live objects' words at it; returns the local span. With `keep`,
    /// the far copy may be kept for a clean re-eviction.
    pub(super) fn swap_in_whole(
        &self,
        fs: &FarSpan,
        mut st: MutexGuard<'_, FarSpanState>,
        at: SpanAddr,
        scope: &DerefScope<'_>,
        keep: bool,
    ) -> Result<SpanRef, RuntimeError> {
        let span = self.heap.new_span(fs.class, fs.pages as usize)?;
        // SAFETY: the span was just allocated for us and is not yet visible
        // to anyone; its memory is `bytes()` long and mapped.
        let dest = unsafe { std::slice::from_raw_parts_mut(span.get().start() as *mut u8, span.get().bytes()) };
        let keepable = match self.read_far_span(fs, at, dest, scope) {
            Ok(k) => k,
            Err(e) => {
                self.heap.discard_span(span);
                return Err(e);
            }
        };
        let live: Vec<usize> = (0..fs.capacity as usize)
            .filter(|&i| st.live[i / 64] & (1 << (i % 64)) != 0)
            .collect();
        self.heap.adopt_span(span, &live, |sp| {
            for &i in &live {
                let addr = sp.object_addr(i);
                // SAFETY: slot i of the new span holds the object's bytes as
                // evicted, header included; a live far object's header is
                // never clear (a free takes the far span's lock we hold).
                let s = unsafe { pointer::slot_of(addr) }.expect("a live far object's header names its slot");
                // Hotness starts at zero: only the objects touched from now on
                // count as hot (the one we came for is touched by its access).
                point_local(s, fs.loc(i as u16), addr, FRESH);
            }
        });
        self.policy.span_swapped_in(span.get());
        self.filtering.swapped_in(span);
        st.gone = true;
        self.far_map.remove(fs.region, fs.page, st.live_count);
        if keepable && keep {
            self.keep_or_release(span.get(), at, fs.pages, fs.checksum, st.live.clone());
        } else {
            self.scheme.release(&self.far, at, fs.pages);
        }
        drop(st);
        self.swapped_in_done(span.get().bytes());
        Ok(span)
    }

    /// Brings back up to a batch of the spans schemes queued for
    /// re-striping ([`crate::far_memory::FarMemory::restripe`]) and queues
    /// them as cold, so eviction writes them again on live memory nodes.
    /// Runs only while local memory is below the high watermark (room for
    /// the application first); returns the spans brought back.
    pub(super) fn restripe_round(&self) -> usize {
        if self.heap.bytes_in_use() as u64 > self.pressure.high_bytes() {
            return 0;
        }
        let spans = self.far.take_restripe(self.pressure.batch().max(1));
        if spans.is_empty() {
            return 0;
        }
        let mut back = Vec::with_capacity(spans.len());
        {
            let scope = self.bare_scope();
            for at in spans {
                let Some(fs) = self.far_map.get(at.region, at.page) else {
                    continue; // swapped in or freed meanwhile
                };
                let st = scope.step_out(|| fs.lock());
                if st.gone {
                    continue;
                }
                match self.swap_in_whole(&fs, st, at, &scope, false) {
                    Ok(span) => {
                        span.get().set_cold(true);
                        back.push(span);
                    }
                    // The scheme queues what is still far again.
                    Err(e) => tracing::debug!("re-striping span r{}:p{}: {e}", at.region, at.page),
                }
            }
        }
        let n = back.len();
        self.heap.queue_cold(back);
        self.far.restriped(n);
        n
    }

    /// Counts a swap-in that read `bytes` of far span, and wakes eviction if
    /// it took local memory past the high watermark.
    fn swapped_in_done(&self, bytes: usize) {
        self.counters.swapped_in(bytes as u64);
        if self.heap.bytes_in_use() as u64 >= self.pressure.high_bytes() {
            self.pressure.kick();
        }
    }

    /// The remote read of a far span into `dest`, checked against its
    /// checksum and read around or repaired by the scheme as needed
    /// ([`crate::scheme::read`]). Says whether the far copy holds exactly
    /// these bytes, so it can be kept. The read runs outside the caller's
    /// scope: `dest` is ours alone until it is published.
    fn read_far_span(
        &self,
        fs: &FarSpan,
        at: SpanAddr,
        dest: &mut [u8],
        scope: &DerefScope<'_>,
    ) -> Result<bool, RuntimeError> {
        let verified = scope.step_out(|| crate::scheme::read(&*self.scheme, &self.far, at, dest, fs.checksum))?;
        Ok(verified == crate::scheme::Verified::Copy)
    }

    /// The size class of `fs` if a swap-in from it brings back only the
    /// object asked for (see [`Tuning::object_swap_in`]).
    fn object_swap_in_class(&self, fs: &FarSpan) -> Option<ClassIndex> {
        if !self.filtering.object_swap_in() || fs.class == 0 || (fs.capacity as usize) < MIN_SHARED_OBJECTS {
            return None;
        }
        ClassIndex::new(fs.class as usize)
    }

    /// Brings back object `object` of the far span `fs` alone: one remote
    /// read of the whole span (checked against its checksum as usual), then
    /// the object is copied into a slot of its class in a local span, as an
    /// allocation would place it, and its word is pointed there. The far
    /// span keeps its other objects and loses this one, as a free would take
    /// it (and goes when it was the last).
    ///
    /// Why: a span swapped in whole for one object gives its other objects
    /// nothing (`bench micro`, 1 KiB objects in 8 KiB spans: 7.03× swap-in
    /// amplification, so about one object used per span), yet costs an
    /// 8 KiB span of local memory, a filtering move of the object, and a
    /// second eviction with its grace period.
    fn swap_in_object(
        &self,
        fs: &FarSpan,
        mut st: MutexGuard<'_, FarSpanState>,
        object: u16,
        class: ClassIndex,
        at: SpanAddr,
        scope: &DerefScope<'_>,
    ) -> Result<(), RuntimeError> {
        let i = usize::from(object);
        if i >= fs.capacity as usize || st.live[i / 64] & (1 << (i % 64)) == 0 {
            // Brought back (or freed) by another thread while we waited for
            // the lock: the caller reloads the word.
            return Ok(());
        }
        let size = class.info().size();
        let mut buf = vec![0u8; fs.bytes()];
        self.read_far_span(fs, at, &mut buf, scope)?;
        let from = &buf[i * size..(i + 1) * size];
        let h = u64::from_ne_bytes(from[..HEADER].try_into().expect("a slot holds its header"));
        // SAFETY: the buffer holds the far span's bytes as evicted, headers
        // included, and the checksum matched.
        let s = unsafe { pointer::slot_named(h) }.expect("a live far object's header names its slot");
        let expect = fs.loc(object);
        self.heap.alloc_in_class(class, |to| {
            // SAFETY: `to` is a fresh slot of `size` bytes in a local span,
            // reserved for us under the class lock; nothing else can see it.
            // `from` is `size` bytes of our own buffer. Payload first, header
            // second (sweeps read the header of every claimed slot).
            unsafe {
                std::ptr::copy_nonoverlapping(from[HEADER..].as_ptr(), (to + HEADER) as *mut u8, size - HEADER);
                header(to).store(h, StdOrdering::Release);
            }
            // Dirty: no far copy of the span it joins holds it. Fresh, as
            // after a whole-span swap-in: its first dereference counts it
            // as used (a drop of a far object brings it back unused).
            point_local(s, expect, to, DIRTY | FRESH);
        })?;
        self.far_object_left(fs, &mut st, i);
        drop(st);
        self.counters.object_swapped_in();
        self.swapped_in_done(fs.bytes());
        Ok(())
    }
}

/// Points the word of a far object (named `expect`) at its local copy at
/// `addr`, keeping `S` and adding `flags`, hotness zero. Only swap-ins (which
/// hold the far span's lock) change a far object's word, but the CAS keeps
/// any flag bit set meanwhile from being lost silently.
fn point_local(s: &Slot, expect: pointer::FarLoc, addr: usize, flags: u64) {
    loop {
        let w = s.word.load(Ordering::Acquire);
        debug_assert!(w & PRESENT == 0 && far_loc(w) == expect, "far word mismatch");
        let new = local_word(addr, (w & SHARED) | flags, 0);
        if s.word
            .compare_exchange(w, new, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}
