//! Loom model of the pause gate ([`crate::pause_gate`]) that
//! filtering rounds and compaction folds pass: once `PauseGate::pause`
//! returns, no round is under way and none starts.
//!
//! The gate is the crate's own type (loom atomics under `--cfg loom`, and
//! its wait loop yields to loom). A round's work is a write to a loom
//! `UnsafeCell`; the pauser reads the cell after the pause returns, so loom
//! reports a round whose write is not ordered before that read, and the
//! final check catches a round that started after the pause.
//!
//! `flag_read_before_count_lets_a_round_through` runs a labelled copy of
//! the gate with its two steps in the other order (read the flag, then
//! count in flight), which lets a round that read the flag before the pause start after the pause
//! returned; it shows the model catches that defect.

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use super::check;
use crate::pause_gate::PauseGate;

/// Rounds each background thread tries.
const ROUNDS: usize = 2;

struct Work(UnsafeCell<usize>);

// SAFETY: loom checks every access of the cell; this only lets the model
// share it between its threads.
unsafe impl Sync for Work {}

impl Work {
    fn round(&self) {
        // SAFETY: a data race on the cell is what loom is asked to find.
        self.0.with_mut(|p| unsafe { *p += 1 });
    }

    fn read(&self) -> usize {
        // SAFETY: as in `round`.
        self.0.with(|p| unsafe { *p })
    }
}

/// A background thread trying [`ROUNDS`] rounds through the real gate.
fn run_rounds(gate: &Arc<PauseGate>, work: &Arc<Work>) -> thread::JoinHandle<()> {
    let (gate, work) = (Arc::clone(gate), Arc::clone(work));
    thread::spawn(move || {
        for _ in 0..ROUNDS {
            if let Some(pass) = gate.enter() {
                work.round();
                drop(pass);
            }
        }
    })
}

/// Background threads run rounds through the real gate while the main
/// thread pauses it: after the pause, the work done is final.
#[test]
fn no_round_runs_after_pause_returns() {
    check("no_round_runs_after_pause_returns", || {
        let gate = Arc::new(PauseGate::new());
        let work = Arc::new(Work(UnsafeCell::new(0)));
        let t = run_rounds(&gate, &work);
        gate.pause();
        let seen = work.read();
        t.join().unwrap();
        assert_eq!(work.read(), seen, "a round ran after the pause returned");
        assert!(gate.enter().is_none());
    });
}

/// Pausing and resuming while rounds run: a round either ran before the
/// pause returned or after the resume, never in between.
#[test]
fn rounds_resume_after_the_gate_opens() {
    check("rounds_resume_after_the_gate_opens", || {
        let gate = Arc::new(PauseGate::new());
        let work = Arc::new(Work(UnsafeCell::new(0)));
        let t = run_rounds(&gate, &work);
        gate.pause();
        let seen = work.read();
        assert!(seen <= ROUNDS);
        gate.resume();
        t.join().unwrap();
        assert!(work.read() <= ROUNDS);
    });
}

/// A copy of the gate with its steps in the wrong order: a thread reads
/// the flag, then counts itself in flight. Loom finds the round that slips past the pause.
#[test]
#[should_panic]
fn flag_read_before_count_lets_a_round_through() {
    struct WrongGate {
        paused: AtomicBool,
        in_flight: AtomicUsize,
    }
    check("flag_read_before_count_lets_a_round_through", || {
        let gate = Arc::new(WrongGate {
            paused: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        });
        let work = Arc::new(Work(UnsafeCell::new(0)));
        let t = {
            let (gate, work) = (Arc::clone(&gate), Arc::clone(&work));
            thread::spawn(move || {
                if !gate.paused.load(Ordering::SeqCst) {
                    gate.in_flight.fetch_add(1, Ordering::SeqCst);
                    work.round();
                    gate.in_flight.fetch_sub(1, Ordering::SeqCst);
                }
            })
        };
        gate.paused.store(true, Ordering::SeqCst);
        while gate.in_flight.load(Ordering::SeqCst) > 0 {
            thread::yield_now();
        }
        let seen = work.read();
        t.join().unwrap();
        assert_eq!(work.read(), seen, "a round ran after the pause returned");
    });
}
