//! The filter part of the runtime: what the filtering threads share with
//! the rest of it (the spans swapped in for them to look at first, whether
//! they run, the gate their rounds pass, and object swap-in, which needs
//! them).

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::object_heap::SpanRef;
use crate::pause_gate::{Pass, PauseGate};

/// Most spans the swapped-in queue remembers (beyond it the oldest are left
/// to the regular sweep).
const SWAPPED_IN_MAX: usize = 4096;

/// The filtering threads' side of the runtime.
pub(in crate::runtime) struct Filtering {
    /// Spans swapped in and not yet looked at by a filtering thread.
    swapped_in: Mutex<VecDeque<SpanRef>>,
    /// Filtering threads run (else nobody drains `swapped_in`).
    runs: bool,
    /// Swap-ins from spans of small objects bring back one object (only
    /// while filtering runs; see [`crate::Tuning::object_swap_in`]).
    object_swap_in: bool,
    /// Filtering rounds pass it (see `Runtime::pause_background`).
    gate: PauseGate,
}

impl Filtering {
    /// The part for `threads` filtering threads; `object_swap_in` as asked,
    /// if they run.
    pub(in crate::runtime) fn new(threads: usize, object_swap_in: bool) -> Self {
        Self {
            swapped_in: Mutex::default(),
            runs: threads > 0,
            object_swap_in: object_swap_in && threads > 0,
            gate: PauseGate::new(),
        }
    }

    /// Whether a swap-in from a span of small objects brings back only the
    /// object asked for.
    #[inline]
    pub(in crate::runtime) fn object_swap_in(&self) -> bool {
        self.object_swap_in
    }

    /// Hands a span just swapped in to the filtering threads, if they run.
    #[inline]
    pub(in crate::runtime) fn swapped_in(&self, s: SpanRef) {
        if self.runs {
            self.queue(s);
        }
    }

    /// Queues `s` for the filtering threads (bounded: the oldest go).
    pub(super) fn queue(&self, s: SpanRef) {
        let mut q = self.swapped_in.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= SWAPPED_IN_MAX {
            q.pop_front();
        }
        q.push_back(s);
    }

    /// Takes up to `n` of the spans swapped in, oldest first.
    pub(super) fn take_swapped_in(&self, n: usize) -> Vec<SpanRef> {
        let mut q = self.swapped_in.lock().unwrap_or_else(|p| p.into_inner());
        let n = n.min(q.len());
        q.drain(..n).collect()
    }

    /// Spans swapped in and not yet taken.
    pub(super) fn swapped_in_waiting(&self) -> usize {
        self.swapped_in.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Lets a filtering round start unless filtering is paused; the round
    /// is in flight until the pass drops.
    pub(super) fn enter(&self) -> Option<Pass<'_>> {
        self.gate.enter()
    }

    /// Pauses (`true`) or resumes filtering rounds. Pausing waits for the
    /// round in flight unless `in_scope`: a round's grace period would
    /// wait for the caller's scope. (Only `Runtime::pause_background`,
    /// behind `internals`, pauses filtering.)
    #[cfg(feature = "internals")]
    pub(in crate::runtime) fn pause(&self, paused: bool, in_scope: bool) {
        if !paused {
            self.gate.resume();
        } else if in_scope {
            self.gate.close();
        } else {
            self.gate.pause();
        }
    }
}
