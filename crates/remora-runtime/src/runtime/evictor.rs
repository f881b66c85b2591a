//! The evictor: marks cold spans, waits one grace period per batch, writes
//! them out through the scheme and commits (pointer protocol steps 2, 4, 5;
//! the steps on the pointer words are [`crate::pointer::evict`]'s).

use std::sync::Arc;
use std::time::Instant;

use remora_proto::checksum::checksum;

use super::{Inner, kept};
use crate::error::RuntimeError;
use crate::far_page_map::FarSpan;
use crate::object_heap::SpanRef;
use crate::pointer::{self, Evictee, evict};
use crate::scheme::SpanAddr;

impl Inner {
    /// One round of eviction: pick cold spans and swap them out.
    pub(super) fn evict_round(&self) -> usize {
        self.evict_round_of(false)
    }

    /// One round of eviction among the spans the filter queued as cold only.
    pub(super) fn evict_queued_round(&self) -> usize {
        self.evict_round_of(true)
    }

    fn evict_round_of(&self, queued: bool) -> usize {
        let start = Instant::now();
        self.pressure.round_started();
        let n = self.evict_round_inner(queued);
        self.pressure.round_ended();
        if n > 0 {
            self.wake_room();
        }
        self.counters.evicting_took(start.elapsed());
        n
    }

    pub(super) fn evict_round_inner(&self, queued: bool) -> usize {
        let pick = |n| {
            if queued {
                self.heap.pick_queued(&*self.policy, n)
            } else {
                self.heap.pick_cold(&*self.policy, n)
            }
        };
        let batch = self.pressure.batch();
        let mut candidates = pick(batch);
        if candidates.is_empty() {
            return 0;
        }
        // Spans with a kept far copy usually go back without a write; when
        // most of a batch is such, the few written would make partial
        // stripes, each costing (j+m)/j instead of (k+m)/k. Gather up to
        // MAX_GATHER batches until a whole stripe's worth is to be written.
        const MAX_GATHER: usize = 8;
        let want = self.scheme.stripe_spans();
        let to_write = |c: &[SpanRef]| c.iter().filter(|s| s.get().kept() == 0).count();
        let mut picks = 1;
        while picks < MAX_GATHER && to_write(&candidates) % want != 0 && candidates.len() == picks * batch {
            let more = pick(batch);
            if more.is_empty() {
                break;
            }
            let more: Vec<SpanRef> = more.into_iter().filter(|s| !candidates.contains(s)).collect();
            candidates.extend(more);
            picks += 1;
        }
        // Phase 1: mark E on every object of each span.
        let mut marked: Vec<(SpanRef, Marked)> = Vec::new();
        for span in candidates {
            if !self.heap.begin_evict(span) {
                continue;
            }
            match self.mark_span(span) {
                Some(objs) if objs.is_empty() => {
                    // Its objects were freed after it was picked: nothing to
                    // write (a far span without objects would never be freed).
                    self.heap.end_evict(span, false);
                }
                Some(objs) => marked.push((span, objs)),
                None => {
                    self.counters.eviction_aborted();
                    self.heap.end_evict(span, false);
                }
            }
        }
        if marked.is_empty() {
            return 0;
        }
        // Phase 2: one grace period for the whole batch, then seal: from here
        // on an access waits for the eviction instead of abandoning it.
        self.rcu.synchronize();
        let mut sealed: Vec<(SpanRef, Marked)> = Vec::with_capacity(marked.len());
        for (span, mut objs) in marked {
            if evict::seal(&mut objs) {
                sealed.push((span, objs));
            } else {
                self.counters.eviction_aborted();
                self.heap.end_evict(span, false);
            }
        }
        let marked = sealed;
        if marked.is_empty() {
            return 0;
        }
        // Phase 3: reuse the kept far copies of clean spans, write the others
        // out; nothing local is released yet.
        let kept: Vec<Option<kept::Kept>> = marked
            .iter()
            .map(|(span, objs)| self.reuse_kept(span.get(), objs))
            .collect();
        let bufs: Vec<&[u8]> = marked
            .iter()
            .zip(&kept)
            .filter(|(_, k)| k.is_none())
            .map(|((span, _), _)| {
                // SAFETY: the span is local and pinned by begin_evict. Its bytes
                // may change only if an application thread aborts the eviction
                // by clearing E, and then this copy is discarded in phase 4.
                unsafe { std::slice::from_raw_parts(span.get().start() as *const u8, span.get().bytes()) }
            })
            .collect();
        let sums: Vec<u64> = bufs.iter().map(|b| checksum(b)).collect();
        let written = if bufs.is_empty() {
            Vec::new()
        } else {
            match self.scheme.swap_out(&self.far, &bufs, &sums) {
                Ok(p) => {
                    self.pressure.swap_out_ok();
                    p
                }
                Err(e) => {
                    if !matches!(e, RuntimeError::Shutdown) {
                        self.pressure
                            .swap_out_failed(format_args!("swap-out of {} spans failed: {e}", bufs.len()));
                    }
                    for ((span, objs), k) in marked.into_iter().zip(kept) {
                        if let Some(k) = k {
                            self.scheme.release(&self.far, k.at, k.pages);
                        }
                        evict::unmark(&objs);
                        self.heap.end_evict(span, false);
                    }
                    return 0;
                }
            }
        };
        let mut written = written.into_iter().zip(sums);
        let placed: Vec<(SpanAddr, u64, bool)> = kept
            .into_iter()
            .map(|k| match k {
                Some(k) => (k.at, k.checksum, true),
                None => {
                    let (at, sum) = written.next().expect("one placement per written span");
                    (at, sum, false)
                }
            })
            .collect();
        // Phase 4: commit each span, or abort it if its owner freed an object meanwhile.
        let mut evicted = 0;
        for ((span, mut objs), (at, sum, clean)) in marked.into_iter().zip(placed) {
            let sp = span.get();
            if !evict::lock_sealed(&mut objs) {
                // The owner freed an object meanwhile: keep the span local.
                self.scheme.release(&self.far, at, sp.pages() as u32);
                self.counters.eviction_aborted();
                self.heap.end_evict(span, false);
                continue;
            }
            if clean {
                self.counters.evicted_clean(sp.bytes() as u64);
            }
            let mut live = vec![0u64; sp.capacity().div_ceil(64)];
            for o in &objs {
                live[o.index / 64] |= 1 << (o.index % 64);
            }
            let fs = Arc::new(FarSpan::new(
                at.region,
                at.page,
                sp.pages() as u32,
                self.heap.class_code(sp),
                sp.capacity() as u32,
                live,
                sum,
            ));
            // Published before the words, so whoever sees a far word finds
            // it; and locked until every word names it, so a swap-in (or a
            // free) started by the first far word waits for the others
            // instead of finding them still locked and local.
            let publishing = fs.lock();
            self.far_map.insert(Arc::clone(&fs), publishing.live_count);
            evict::commit_far(&objs, |i| fs.loc(i as u16));
            drop(publishing);
            self.counters.swapped_out(if clean { 0 } else { sp.bytes() as u64 });
            self.heap.end_evict(span, true);
            evicted += 1;
        }
        evicted
    }

    /// Sets E on every live object of `span`; `None` (and nothing marked) if
    /// an object is busy or being freed.
    pub(super) fn mark_span(&self, span: SpanRef) -> Option<Marked> {
        let sp = span.get();
        let objs = (0..sp.capacity()).filter(|&i| sp.is_allocated(i)).map(|i| {
            let addr = sp.object_addr(i);
            // SAFETY: slot i is allocated in a pinned local span.
            (unsafe { pointer::slot_of(addr) }, addr, i)
        });
        evict::mark(objs, sp.allocated())
    }
}

/// The objects of a span marked for eviction (slots live as long as the runtime).
pub(super) type Marked = Vec<Evictee<'static>>;

#[cfg(all(test, not(loom)))]
mod tests;
