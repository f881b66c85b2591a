//! Step 1 of a filtering round: which spans to move objects out of.

use std::time::Instant;

use super::{
    BATCH, Chosen, DENSE_DEN, DENSE_NUM, Filter, KEPT_DEN, KEPT_NUM, MIN_SLOTS, SPARSE, SWEEP_EVERY, Temp, WINDOW,
};
use crate::object_heap::SpanRef;
use crate::pointer;
use crate::runtime::Inner;
use crate::span::{EVICTING_POS, SpanKind};

impl Inner {
    /// Step 1: sweeps a window of spans, ages their objects and returns the
    /// spans worth moving out of.
    pub(super) fn classify(&self, f: &mut Filter) -> Vec<Chosen> {
        let mut chosen = Vec::new();
        let mut room = Vec::new();
        let mut newly_cold = Vec::new();
        let mut cursor = f.cursor;
        // Spans swapped in since the last round first: each came back for
        // the object that was touched, and its other objects are cold, so
        // the touched one moves out at once and the rest can go back (clean,
        // without a write) before it pins local memory for a whole sweep.
        let fresh = self.filtering.take_swapped_in(BATCH);
        // Fresh spans may fill the batch; the sweep's window is chosen from
        // beyond it. When fresh spans capped the batch for both, a steady
        // stream of swap-ins left every span the sweep passed unclassified
        // and unaged (`bench micro` at 4 threads: a batch of fresh spans
        // every round), so hot spans kept their cold objects until the hand
        // took the span: 0.101 misses per op, as many as an ideal LRU of 85k
        // objects while 94k were local (see `SWEEP_EVERY` for after).
        let mut visit = |s: SpanRef, cap: usize| {
            let sp = s.get();
            if chosen.len() >= cap
                || !matches!(sp.kind(), Some(SpanKind::Small(_)))
                || sp.capacity() < MIN_SLOTS
                || sp.list_pos() == EVICTING_POS
                || f.is_dest(s)
            {
                return;
            }
            let cap = sp.capacity();
            let mut hot = vec![0u64; cap.div_ceil(64)];
            let (mut n_hot, mut n_cold, mut cold_dirty) = (0usize, 0usize, 0usize);
            for i in (0..cap).filter(|&i| sp.is_allocated(i)) {
                // SAFETY: an allocated slot of a registered span (the
                // registry is locked, so the span stays in use).
                let Some((slot, w)) = (unsafe { pointer::object_at(sp.object_addr(i)) }) else {
                    continue;
                };
                let (is_hot, aged) = self.policy.filter_age(pointer::hotness(w));
                if is_hot {
                    n_hot += 1;
                    hot[i / 64] |= 1 << (i % 64);
                } else {
                    n_cold += 1;
                    cold_dirty += usize::from(w & pointer::DIRTY != 0);
                }
                slot.age(w, aged);
            }
            let live = n_hot + n_cold;
            if live == 0 {
                return;
            }
            let mixed = n_hot > 0 && n_cold > 0;
            let sparse = live * SPARSE <= cap;
            // A span swapped in whose far copy still holds its cold objects
            // (kept, none of them changed): they stay, so it goes back
            // without a write; only the touched ones move out. Moving the
            // cold ones too would cost a write of them later, for the local
            // memory the span will give back anyway once evicted.
            let clean_copy = sp.kept() != 0 && cold_dirty == 0 && n_cold > 0 && n_cold * KEPT_DEN >= cap * KEPT_NUM;
            if clean_copy && mixed {
                chosen.push(Chosen {
                    span: s,
                    hot,
                    keep: Some(Temp::Cold),
                });
            } else if clean_copy {
                if !sp.is_cold() {
                    newly_cold.push(s);
                }
                sp.set_cold(true);
            } else if sparse {
                chosen.push(Chosen {
                    span: s,
                    hot,
                    keep: None,
                });
            } else if mixed {
                // Move the minority if the majority stays dense (one object
                // touched in a cold span moves alone); otherwise everything,
                // so no half-empty span is left behind.
                let (majority, temp) = if n_hot > n_cold {
                    (n_hot, Temp::Hot)
                } else {
                    (n_cold, Temp::Cold)
                };
                let keep = (majority * DENSE_DEN >= cap * DENSE_NUM).then_some(temp);
                chosen.push(Chosen { span: s, hot, keep });
            } else {
                if n_hot == 0 && !sp.is_cold() {
                    newly_cold.push(s);
                }
                sp.set_cold(n_hot == 0);
                if let (0, Some(SpanKind::Small(c))) = (n_hot, sp.kind()) {
                    if !sp.is_full() {
                        room.push((c, s));
                    }
                }
            }
        };
        self.heap.visit_listed(&fresh, |s| visit(s, BATCH));
        // The sweep advances one window per `SWEEP_EVERY` intervals, however
        // often rounds run to keep up with fresh spans: its pace sets how
        // long an untouched object takes to count as cold, which must not
        // shrink as swap-ins speed up.
        let advance = f.last_sweep.is_none_or(|t| t.elapsed() >= f.interval * SWEEP_EVERY);
        if advance {
            // Every span of the window may be chosen: it bounds the
            // sweep's share of the batch.
            self.heap.visit_spans(&mut cursor, WINDOW, |s| visit(s, usize::MAX));
            f.last_sweep = Some(Instant::now());
            f.cursor = cursor;
        }
        for (c, s) in room {
            f.note_room(c, s);
        }
        self.heap.queue_cold(newly_cold);
        chosen
    }
}
