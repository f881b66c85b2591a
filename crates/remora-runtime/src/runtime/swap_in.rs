//! Swap-in: bring a far span back with one remote read and point its
//! objects' words at it.

use super::*;
use crate::error::LossCause;

impl Inner {
    /// Brings the far span holding `loc` back with one remote read and fixes
    /// the words of its live objects.
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
        let span = self.heap.new_span(fs.class, fs.pages as usize)?;
        // SAFETY: the span was just allocated for us and is not yet visible
        // to anyone; its memory is `bytes()` long and mapped.
        let dest = unsafe { std::slice::from_raw_parts_mut(span.get().start() as *mut u8, span.get().bytes()) };
        let at = SpanAddr {
            region: fs.region,
            page: fs.page,
        };
        if let Err(e) = scope.step_out(|| self.scheme.swap_in(&self.far, at, dest)) {
            self.heap.discard_span(span);
            return Err(e);
        }
        // Whether the far copy holds exactly these bytes, so it can be kept.
        let mut keepable = true;
        if checksum(dest) != fs.checksum {
            // A corrupt far copy is handled like a lost one: rebuild it from
            // redundancy, then write the good bytes back so the redundancy
            // that covers it stays consistent.
            tracing::warn!("span r{}:p{} failed its checksum; rebuilding it", fs.region, fs.page);
            let rebuilt = self.scheme.degraded_read(&self.far, at, dest);
            match rebuilt {
                Ok(()) if checksum(dest) == fs.checksum => {
                    if let Err(e) = self.scheme.repair(&self.far, at, dest) {
                        keepable = false;
                        tracing::warn!("could not rewrite repaired span r{}:p{}: {e}", fs.region, fs.page);
                    }
                }
                other => {
                    self.heap.discard_span(span);
                    return Err(match other {
                        Err(e) => e,
                        Ok(_) => RuntimeError::lost(at, LossCause::Corrupt),
                    });
                }
            }
        }
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
                let expect = fs.loc(i as u16);
                loop {
                    let w = s.word.load(Ordering::Acquire);
                    debug_assert!(w & PRESENT == 0 && far_loc(w) == expect, "far word mismatch");
                    // Hotness starts at zero: only the objects touched from now on
                    // count as hot (the one we came for is touched by its access).
                    let new = local_word(addr, (w & SHARED) | FRESH, 0);
                    if s.word
                        .compare_exchange(w, new, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
            }
        });
        self.policy.span_swapped_in(span.get());
        if self.filtering {
            self.swapped_in.push(span);
        }
        st.gone = true;
        self.far_map.remove(fs.region, fs.page, st.live_count);
        if keepable {
            self.keep_or_release(span.get(), at, fs.pages, fs.checksum, st.live.clone());
        } else {
            self.scheme.release(&self.far, at, fs.pages);
        }
        self.counters.swap_ins.fetch_add(1, StdOrdering::Relaxed);
        self.counters
            .swap_in_bytes
            .fetch_add(span.get().bytes() as u64, StdOrdering::Relaxed);
        drop(st);
        if self.heap.bytes_in_use() as u64 >= self.high_bytes() {
            self.kick();
        }
        Ok(())
    }
}
