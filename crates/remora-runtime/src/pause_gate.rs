//! The gate background work passes before each round, so that pausing it
//! returns only once no round is under way.
//!
//! `Runtime::pause_background` stops filtering rounds and compaction folds
//! while another runtime on the machine is measured (`remora bench micro`
//! alternates runtimes this way), and a test asserts that nothing moves
//! after the pause returns. A flag alone does not give that: a thread that
//! read the flag just before it was set goes on with its round. So a thread
//! first counts itself in flight, then reads the flag ([`PauseGate::enter`]);
//! the pause sets the flag, then waits for the count to reach zero
//! ([`PauseGate::pause`]). A SeqCst fence sits between each side's write
//! and its read, so of the two writes that race (the thread's count and the
//! pause's flag), at least one is seen by the other side's read: either the
//! thread sees the flag and skips its round, or the pause sees the thread in
//! flight and waits for its round to end. (SeqCst accesses alone would do on
//! hardware, but loom models them as AcqRel and checks only the fences.)
//! `loom_models::pause` checks this with loom.

use crate::loom::{AtomicBool, AtomicUsize, Ordering, fence, nap};

/// A pause flag and the rounds that passed it.
#[derive(Debug, Default)]
pub(crate) struct PauseGate {
    paused: AtomicBool,
    in_flight: AtomicUsize,
}

/// A round let through the gate: counted in flight until dropped.
#[derive(Debug)]
#[must_use = "the round is in flight only while its pass is held"]
pub(crate) struct Pass<'a>(&'a AtomicUsize);

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl PauseGate {
    /// An open gate.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Lets a round start unless the gate is paused; the round is in flight
    /// until the pass drops.
    pub(crate) fn enter(&self) -> Option<Pass<'_>> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let pass = Pass(&self.in_flight);
        fence(Ordering::SeqCst);
        (!self.paused.load(Ordering::SeqCst)).then_some(pass)
    }

    /// Closes the gate and waits until no round that passed it is in
    /// flight. Must not be called from inside a round (it would wait for
    /// itself), nor while holding anything a round waits for.
    pub(crate) fn pause(&self) {
        self.close();
        self.wait_idle();
    }

    /// Closes the gate without waiting for rounds in flight.
    pub(crate) fn close(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Waits until no round that passed the gate is in flight.
    pub(crate) fn wait_idle(&self) {
        fence(Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            nap();
        }
    }

    /// Opens the gate.
    pub(crate) fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Whether the gate is closed.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool as StdBool;
    use std::time::Duration;

    #[test]
    fn a_closed_gate_lets_no_round_through() {
        let g = PauseGate::new();
        assert!(g.enter().is_some());
        g.pause();
        assert!(g.is_paused());
        assert!(g.enter().is_none());
        g.resume();
        assert!(g.enter().is_some());
    }

    #[test]
    fn pause_waits_for_the_round_in_flight() {
        let g = Arc::new(PauseGate::new());
        let (started, done) = (Arc::new(StdBool::new(false)), Arc::new(StdBool::new(false)));
        let t = {
            let (g, started, done) = (Arc::clone(&g), Arc::clone(&started), Arc::clone(&done));
            std::thread::spawn(move || {
                let pass = g.enter().expect("open gate");
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                drop(pass);
            })
        };
        while !started.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::yield_now();
        }
        g.pause();
        assert!(
            done.load(std::sync::atomic::Ordering::SeqCst),
            "pause returned while a round was in flight"
        );
        t.join().unwrap();
    }
}
