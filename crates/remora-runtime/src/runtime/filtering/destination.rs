//! Where moved objects go: each filtering thread's destination spans.

use super::{Dest, Filter, Temp};
use crate::error::RuntimeError;
use crate::object_heap::SpanRef;
use crate::runtime::Inner;
use crate::size_classes::ClassIndex;
use crate::span::SpanKind;

impl Inner {
    /// The pinned destination span with room for `class` objects of `temp`:
    /// the one this thread is filling, pinned again if it was unpinned at the
    /// end of the last round, or a fresh one.
    pub(super) fn destination(&self, f: &mut Filter, class: ClassIndex, temp: Temp) -> Result<SpanRef, RuntimeError> {
        let key = (class, temp);
        if let Some(d) = f.dests.get_mut(&key) {
            if d.pinned && !d.span.get().is_full() {
                return Ok(d.span);
            }
            if !d.pinned && self.pin_dest(d.span, class, temp) {
                d.pinned = true;
                return Ok(d.span);
            }
            if let Some(dd) = f.dests.remove(&key) {
                if dd.pinned {
                    self.heap.end_filter(dd.span, temp == Temp::Hot);
                }
            }
        }
        // Cold objects first fill the holes of cold spans this thread saw.
        if temp == Temp::Cold {
            while let Some(span) = f.room.get_mut(&class).and_then(Vec::pop) {
                if !f.is_dest(span) && self.pin_dest(span, class, temp) {
                    f.dests.insert(key, Dest { span, pinned: true });
                    return Ok(span);
                }
            }
        }
        let span = self.heap.filter_span(class, temp == Temp::Hot)?;
        span.get().set_cold(temp == Temp::Cold);
        f.dests.insert(key, Dest { span, pinned: true });
        Ok(span)
    }

    /// Pins a span this thread remembers (a destination from an earlier
    /// round, or a cold span with room) to fill with `temp` objects of
    /// `class`, if it still is such a span with room. The metadata may have
    /// been reused since: the checks are repeated once the pin holds.
    fn pin_dest(&self, span: SpanRef, class: ClassIndex, temp: Temp) -> bool {
        let sp = span.get();
        // Never a span with a kept far copy: an object moved in would make
        // it dirty, and it would be written instead of flipped back.
        let fits = || {
            sp.kind() == Some(SpanKind::Small(class))
                && sp.is_cold() == (temp == Temp::Cold)
                && !sp.is_full()
                && sp.kept() == 0
        };
        if !fits() || !self.heap.begin_evict(span) {
            return false;
        }
        if fits() {
            return true;
        }
        match sp.kind() {
            Some(SpanKind::Small(_)) => {
                self.heap.end_filter(span, !sp.is_cold());
            }
            _ => self.heap.end_evict(span, false),
        }
        false
    }
}
