//! CLOCK (second chance) over spans: the hand passes each span, clearing
//! its objects' reference bytes; a span none of whose objects was touched
//! since the hand last passed is a victim.
//!
//! Two preferences are policy, not tie-breakers:
//! - spans the filtering threads filled with cold objects are victims at
//!   once (their objects were found cold before they were moved);
//! - a span of large objects is a victim while at most half of its objects
//!   were touched: swapping it back wastes less per object used (swap-in
//!   amplification, §3.3), and a span holds few of them.

use super::{EvictionPolicy, Sweep};

/// Objects at least this large count as large for the policy.
const LARGE_OBJECT: usize = 8 << 10;

/// The CLOCK policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Clock;

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn age(&self, _hotness: u8) -> u8 {
        0
    }

    fn pick(&self, sweep: &mut Sweep<'_>, n: usize) {
        while sweep.chosen() < n {
            let Some(c) = sweep.next() else { return };
            if c.is_cold() {
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
