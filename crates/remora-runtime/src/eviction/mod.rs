//! Eviction (§3.3, §3.6): when local memory crosses the high watermark,
//! eviction threads ask the policy for victims, write them to far memory
//! through the scheme, and release their local pages only once the write is
//! acknowledged.
//!
//! Which spans are cold is the policy's business, one file per policy behind
//! [`EvictionPolicy`] (CLOCK by default), shaped like foyer's eviction
//! trait: the policy hears when spans come and go and owns candidate
//! selection ("pick the next n victims"). The runtime owns the ring of local
//! spans and offers it to the policy through a [`Sweep`], one span at a
//! time from a hand that persists between calls.
//!
//! Access costs a policy nothing per dereference of a hot object: the
//! barrier writes the object's hotness byte ([`EvictionPolicy::on_access`])
//! only when it differs, and the policy ages the bytes during its sweep.
//! A counting policy (LFU, S3-FIFO's frequency bits) keeps its counts in
//! that byte: `on_access` is written once, and `age` decays it.

mod clock;

pub use clock::Clock;

use crate::pointer::{Slot, hotness, object_at};
use crate::span::Span;
use crate::span_registry::{Ring, SpanRef};

/// Ranks local spans for eviction; see the module docs.
pub trait EvictionPolicy: Send + Sync {
    /// The policy's name.
    fn name(&self) -> &'static str;

    /// Hotness written on access (only when the byte differs).
    fn on_access(&self) -> u8 {
        u8::MAX
    }

    /// One pass of the eviction sweep over an object: whether it was
    /// referenced since the sweep last passed it, and its hotness after.
    fn age(&self, hotness: u8) -> (bool, u8);

    /// One pass of a filtering thread over an object: whether it counts as
    /// hot (and goes to a hot span), and its hotness after.
    ///
    /// The filtering threads sweep at their own pace, usually faster than
    /// eviction needs victims. A policy should keep this pass apart from
    /// [`EvictionPolicy::age`] (CLOCK gives each its own bits of the byte):
    /// if the filter's pass cleared what the eviction sweep reads, objects
    /// touched a moment ago would look unreferenced to eviction.
    fn filter_age(&self, hotness: u8) -> (bool, u8) {
        self.age(hotness)
    }

    /// A span joined the local heap (allocated or swapped in).
    fn span_added(&self, _span: &Span) {}

    /// A span left the local heap (evicted or freed).
    fn span_removed(&self, _span: &Span) {}

    /// A span came back from far memory (after `span_added`).
    fn span_swapped_in(&self, _span: &Span) {}

    /// Chooses up to `n` victims with [`Sweep::choose`], looking at the spans
    /// the [`Sweep`] offers as an iterator (each at most twice per call).
    fn pick(&self, sweep: &mut Sweep<'_>, n: usize);

    /// Chooses up to `n` victims among the spans the filtering threads
    /// flagged cold ([`Sweep::next_cold`]) only, without moving the hand.
    /// Eviction calls this between the watermarks, so that the band between
    /// them holds hot objects rather than cold spans waiting for the next
    /// round. The default takes every such span.
    fn pick_queued(&self, sweep: &mut Sweep<'_>, n: usize) {
        while sweep.chosen() < n {
            let Some(c) = sweep.next_cold() else { return };
            sweep.choose(c);
        }
    }
}

/// Picks a policy by name.
pub fn policy_by_name(name: &str) -> Option<Box<dyn EvictionPolicy>> {
    match name {
        "clock" => Some(Box::new(Clock)),
        _ => None,
    }
}

/// The ring of local spans, offered to a policy from the hand on.
pub struct Sweep<'a> {
    ring: &'a mut Ring,
    /// Spans offered so far in this call.
    visited: usize,
    limit: usize,
    chosen: Vec<SpanRef>,
}

impl<'a> Sweep<'a> {
    pub(crate) fn new(ring: &'a mut Ring) -> Self {
        let limit = 2 * ring.spans.len();
        Self {
            ring,
            visited: 0,
            limit,
            chosen: Vec::new(),
        }
    }

    /// Makes `c` a victim.
    pub fn choose(&mut self, c: Candidate<'a>) {
        self.chosen.push(c.at);
    }

    /// Victims chosen so far.
    pub fn chosen(&self) -> usize {
        self.chosen.len()
    }

    pub(crate) fn into_chosen(self) -> Vec<SpanRef> {
        self.chosen
    }

    /// The oldest span the filtering threads flagged cold and that still is
    /// (local, cold, not being evicted, not empty, not chosen), taken off
    /// their queue without moving the hand; `None` when none is left.
    pub fn next_cold(&mut self) -> Option<Candidate<'a>> {
        while let Some(s) = self.ring.cold.pop_front() {
            let span = s.get();
            if !self.ring.contains(s)
                || !span.is_cold()
                || span.list_pos() == crate::span::EVICTING_POS
                || span.is_empty()
                || self.chosen.contains(&s)
            {
                continue;
            }
            return Some(Candidate { span, at: s });
        }
        None
    }
}

/// The span under the hand, which then advances; `None` once every span has
/// been offered twice in this call. Spans being evicted or empty are skipped.
impl<'a> Iterator for Sweep<'a> {
    type Item = Candidate<'a>;

    fn next(&mut self) -> Option<Candidate<'a>> {
        while self.visited < self.limit && !self.ring.spans.is_empty() {
            let total = self.ring.spans.len();
            let s = self.ring.spans[self.ring.hand % total];
            self.ring.hand = (self.ring.hand + 1) % total;
            self.visited += 1;
            let span = s.get();
            if span.list_pos() == crate::span::EVICTING_POS || span.is_empty() || self.chosen.contains(&s) {
                continue;
            }
            return Some(Candidate { span: s.get(), at: s });
        }
        None
    }
}

/// One local span offered by a [`Sweep`].
pub struct Candidate<'a> {
    span: &'a Span,
    at: SpanRef,
}

impl Candidate<'_> {
    /// Bytes per object slot.
    pub fn object_size(&self) -> usize {
        self.span.object_size()
    }

    /// Live objects.
    pub fn objects(&self) -> usize {
        self.span.allocated()
    }

    /// Filled by the filtering threads with objects they found cold.
    pub fn is_cold(&self) -> bool {
        self.span.is_cold()
    }

    /// Visits the hotness byte of every live object, replacing it with the
    /// second half of `age(h)` (best effort: a word someone marked or
    /// locked is left alone). Returns for how many objects the first half
    /// (referenced) was true.
    pub fn age(&self, mut age: impl FnMut(u8) -> (bool, u8)) -> usize {
        let mut referenced = 0;
        self.for_each_live(|slot, w| {
            let (r, aged) = age(hotness(w));
            referenced += usize::from(r);
            slot.age(w, aged);
        });
        referenced
    }

    /// How many live objects' hotness bytes satisfy `pred` (nothing is
    /// aged).
    pub fn count(&self, mut pred: impl FnMut(u8) -> bool) -> usize {
        let mut n = 0;
        self.for_each_live(|_, w| n += usize::from(pred(hotness(w))));
        n
    }

    /// Calls `f` with the slot and current word of every live object of the
    /// span that is local at its slot's address.
    fn for_each_live(&self, mut f: impl FnMut(&Slot, u64)) {
        let span = self.span;
        for i in (0..span.capacity()).filter(|&i| span.is_allocated(i)) {
            // SAFETY: an allocated slot of a registered span (the registry is
            // locked for the sweep); hotness is advisory, a stale header is
            // caught by `object_at`'s word check.
            if let Some((slot, w)) = unsafe { object_at(span.object_addr(i)) } {
                f(slot, w);
            }
        }
    }
}
