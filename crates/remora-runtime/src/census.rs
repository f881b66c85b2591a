//! A census of the local spans: where the local budget goes at one moment.
//!
//! The level says how much local memory the runtime holds; the census says
//! what that memory is doing: spans full of objects the filter judged hot,
//! cold ones waiting for eviction, swapped-in spans whose far copy is kept,
//! spans with holes on their class's free list, spans pinned by an eviction
//! or filtering thread. It found both fixes of `bench micro`'s 4-thread
//! capacity loss (2.6 % of the budget in hot spans whose cold minority had
//! moved out, then the watermark band filled by cold spans waiting), and
//! `bench micro --census` prints it.
//!
//! Taking one walks every local span under the span registry's lock (about
//! 50 µs for 13k spans), which holds up eviction and filtering meanwhile:
//! a diagnostic, not a counter.

use std::collections::BTreeMap;

use crate::span::{EVICTING_POS, NOT_LISTED, SpanKind};
use crate::span_registry::Ring;

/// What a local span is doing, as far as where local memory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanUse {
    /// A filtering thread flagged it cold: its objects are eviction's first
    /// victims.
    pub cold: bool,
    /// It came back from far memory and its far copy is kept: evicting it
    /// again writes nothing while it stays clean.
    pub kept: bool,
    /// An eviction or filtering thread holds it right now.
    pub pinned: bool,
    /// On its size class's list of spans with free slots: allocations (and
    /// hot objects the filter moves) fill its holes.
    pub listed: bool,
}

/// Spans of one use, object size and occupancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CensusGroup {
    /// What the spans are doing.
    pub usage: SpanUse,
    /// Bytes per object slot.
    pub object_size: usize,
    /// Slots per span.
    pub capacity: usize,
    /// Live objects per span.
    pub live: usize,
    /// How many such spans.
    pub spans: usize,
}

/// What groups spans: use, object size, capacity, occupancy.
type GroupKey = (SpanUse, usize, usize, usize);

impl CensusGroup {
    fn key(&self) -> GroupKey {
        (self.usage, self.object_size, self.capacity, self.live)
    }

    /// Slots of these spans that hold no object.
    pub fn free_slots(&self) -> usize {
        self.capacity.saturating_sub(self.live) * self.spans
    }
}

/// The local spans grouped by [`CensusGroup`], at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalCensus {
    /// The groups, ordered by use, then object size, capacity and occupancy.
    pub groups: Vec<CensusGroup>,
    /// Entries in the queue of cold spans waiting for eviction (some may be
    /// stale: spans gone or touched since).
    pub cold_queue: usize,
}

impl LocalCensus {
    /// Local spans counted.
    pub fn spans(&self) -> usize {
        self.groups.iter().map(|g| g.spans).sum()
    }

    /// Live objects in them.
    pub fn live(&self) -> usize {
        self.groups.iter().map(|g| g.live * g.spans).sum()
    }

    /// Their slots that hold no object.
    pub fn free_slots(&self) -> usize {
        self.groups.iter().map(CensusGroup::free_slots).sum()
    }

    /// Adds `other`'s spans and cold-queue entries to these: a sum of
    /// censuses taken over time, which divided by their number is the
    /// average census.
    pub fn add(&mut self, other: &LocalCensus) {
        let mut m: BTreeMap<GroupKey, usize> = self.groups.iter().map(|g| (g.key(), g.spans)).collect();
        for g in &other.groups {
            *m.entry(g.key()).or_default() += g.spans;
        }
        self.groups = groups(m);
        self.cold_queue += other.cold_queue;
    }

    /// Counts the spans of `ring` (the registry's lock held by the caller).
    pub(crate) fn of(ring: &Ring) -> Self {
        let mut m: BTreeMap<GroupKey, usize> = BTreeMap::new();
        for s in &ring.spans {
            let sp = s.get();
            if !matches!(sp.kind(), Some(SpanKind::Small(_) | SpanKind::Large)) {
                continue;
            }
            let pos = sp.list_pos();
            let usage = SpanUse {
                cold: sp.is_cold(),
                kept: sp.kept() != 0,
                pinned: pos == EVICTING_POS,
                listed: pos != NOT_LISTED && pos != EVICTING_POS,
            };
            *m.entry((usage, sp.object_size(), sp.capacity(), sp.allocated()))
                .or_default() += 1;
        }
        Self {
            groups: groups(m),
            cold_queue: ring.cold.len(),
        }
    }
}

/// The groups of counted spans, in key order.
fn groups(m: BTreeMap<GroupKey, usize>) -> Vec<CensusGroup> {
    m.into_iter()
        .map(|((usage, object_size, capacity, live), spans)| CensusGroup {
            usage,
            object_size,
            capacity,
            live,
            spans,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(listed: bool, live: usize, spans: usize) -> CensusGroup {
        CensusGroup {
            usage: SpanUse {
                cold: false,
                kept: false,
                pinned: false,
                listed,
            },
            object_size: 1152,
            capacity: 7,
            live,
            spans,
        }
    }

    #[test]
    fn adding_censuses_sums_each_group_and_the_queue() {
        let mut sum = LocalCensus {
            groups: vec![group(false, 7, 10), group(true, 6, 2)],
            cold_queue: 3,
        };
        sum.add(&LocalCensus {
            groups: vec![group(true, 5, 1), group(true, 6, 4)],
            cold_queue: 1,
        });
        assert_eq!(
            sum.groups,
            vec![group(false, 7, 10), group(true, 5, 1), group(true, 6, 6)]
        );
        assert_eq!(sum.cold_queue, 4);
        assert_eq!((sum.spans(), sum.live(), sum.free_slots()), (17, 111, 8));
    }
}
