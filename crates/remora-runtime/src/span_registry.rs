//! Every local span that holds objects, in a ring the eviction policy's
//! clock hand sweeps, offered to the policy through [`crate::eviction::Sweep`];
//! the policy is told of spans coming and going. Lock order: a class lock,
//! then this registry's lock.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::eviction::EvictionPolicy;

use crate::span::Span;

/// A reference to type-stable span metadata (the page heap never frees a
/// `Span` record before the heap itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SpanRef(NonNull<Span>);

// SAFETY: `Span` is all atomics and lives as long as its page heap.
unsafe impl Send for SpanRef {}
// SAFETY: as above.
unsafe impl Sync for SpanRef {}

impl SpanRef {
    pub(crate) fn new(s: &Span) -> Self {
        Self(NonNull::from(s))
    }

    /// The metadata. Valid for as long as the page heap that made it.
    pub(crate) fn get<'a>(self) -> &'a Span {
        // SAFETY: span records are type-stable for the heap's lifetime, and
        // the runtime's heap outlives every use of a SpanRef.
        unsafe { self.0.as_ref() }
    }
}

#[derive(Default)]
pub(crate) struct Ring {
    pub(crate) spans: Vec<SpanRef>,
    pos: HashMap<SpanRef, usize>,
    pub(crate) hand: usize,
    /// Spans the filtering threads flagged cold, oldest first (entries may
    /// be stale: whoever pops one checks it is still registered and cold).
    pub(crate) cold: std::collections::VecDeque<SpanRef>,
}

impl Ring {
    /// Whether `s` is in the ring.
    pub(crate) fn contains(&self, s: SpanRef) -> bool {
        self.pos.contains_key(&s)
    }
}

/// The set of local object spans.
#[derive(Default)]
pub(crate) struct SpanRegistry {
    ring: Mutex<Ring>,
    /// Told of spans coming and going (the runtime's eviction policy).
    policy: Option<Arc<dyn EvictionPolicy>>,
}

impl SpanRegistry {
    /// A registry that tells `policy` of spans coming and going.
    pub(crate) fn with_policy(policy: Arc<dyn EvictionPolicy>) -> Self {
        Self {
            ring: Mutex::default(),
            policy: Some(policy),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, s: &Span) {
        let r = SpanRef::new(s);
        let mut g = self.lock();
        if !g.pos.contains_key(&r) {
            let n = g.spans.len();
            g.pos.insert(r, n);
            g.spans.push(r);
            if let Some(p) = &self.policy {
                p.span_added(s);
            }
        }
    }

    pub(crate) fn remove(&self, s: &Span) {
        let r = SpanRef::new(s);
        let mut g = self.lock();
        if let Some(i) = g.pos.remove(&r) {
            g.spans.swap_remove(i);
            if let Some(&moved) = g.spans.get(i) {
                g.pos.insert(moved, i);
            }
            if let Some(p) = &self.policy {
                p.span_removed(s);
            }
        }
    }

    pub(crate) fn contains(&self, s: &Span) -> bool {
        self.lock().pos.contains_key(&SpanRef::new(s))
    }

    /// Queues spans just flagged cold for eviction, so that eviction finds
    /// them without its hand sweeping (and aging) the hot spans between.
    /// The queue is bounded by the ring: beyond it the oldest entries go,
    /// and the hand still finds their spans.
    pub(crate) fn queue_cold(&self, spans: impl IntoIterator<Item = SpanRef>) {
        let mut g = self.lock();
        for s in spans {
            if g.pos.contains_key(&s) {
                g.cold.push_back(s);
            }
        }
        let max = g.spans.len();
        while g.cold.len() > max {
            g.cold.pop_front();
        }
    }
}
