//! CLOCK (second chance) over spans: the hand passes each span, clearing
//! its objects' reference bytes; a span none of whose objects was touched
//! since the hand last passed is a victim.
//!
//! The hotness byte holds two reference bits' worth: the low nibble is the
//! hand's, the high nibble the filtering threads' ([`EvictionPolicy::filter_age`]).
//! An access sets both; each sweep clears only its own, so the filter's
//! faster pass never makes an object look unreferenced to the hand.
//!
//! Two preferences are policy, not tie-breakers:
//! - spans the filtering threads filled with cold objects are victims at
//!   once, unless one of their objects was touched since the filter found
//!   it cold (then the span is judged like any other);
//! - a span of large objects is a victim while at most half of its objects
//!   were touched: swapping it back wastes less per object used (swap-in
//!   amplification, §3.3), and a span holds few of them.

use super::{EvictionPolicy, Sweep};

/// Objects at least this large count as large for the policy.
const LARGE_OBJECT: usize = 8 << 10;
/// The hand's reference bits.
const HAND: u8 = 0x0F;
/// The filtering threads' reference bits.
const FILTER: u8 = 0xF0;

/// The CLOCK policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Clock;

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn age(&self, hotness: u8) -> (bool, u8) {
        (hotness & HAND != 0, hotness & !HAND)
    }

    fn filter_age(&self, hotness: u8) -> (bool, u8) {
        (hotness & FILTER != 0, hotness & !FILTER)
    }

    fn pick_queued(&self, sweep: &mut Sweep<'_>, n: usize) {
        while sweep.chosen() < n {
            let Some(c) = sweep.next_cold() else { return };
            if c.count(|h| h & FILTER != 0) == 0 {
                sweep.choose(c);
            }
        }
    }

    fn pick(&self, sweep: &mut Sweep<'_>, n: usize) {
        // Cold spans first, from the filter's queue: the hand then moves
        // only when they run out, so its period (how long a hot span has
        // to be touched again) is set by how fast hot spans must go, not by
        // the churn of spans swapped in and found cold. One touched since
        // is left to the hand.
        self.pick_queued(sweep, n);
        while sweep.chosen() < n {
            let Some(c) = sweep.next() else { return };
            if c.is_cold() && c.count(|h| h & FILTER != 0) == 0 {
                sweep.choose(c);
                continue;
            }
            let objects = c.objects();
            let referenced = c.age(|h| self.age(h));
            if referenced == 0 || (c.object_size() >= LARGE_OBJECT && 2 * referenced <= objects) {
                sweep.choose(c);
            }
        }
    }
}
