//! Which compaction mode a fold runs in, and switching it (paper §3.4.2:
//! a runtime "can" move the parity work between the compute node and the
//! memory nodes; `ec-batch` does).
//!
//! Remote compaction spends memory-node CPU (each data node multiplies its
//! delta by the parity coefficients and sends it on); Local compaction
//! spends the compute node's CPU and network instead. So an adaptive
//! compaction folds Remote while the memory nodes have CPU to spare and
//! Local otherwise:
//!
//! - **What it looks at**: every [`POLL_EVERY`], one compaction thread asks
//!   each memory node holding this compute node's regions for its load
//!   ([`remora_proto::NodeLoad`], the node's own CPU use over the last half
//!   second), all at once on connections of their own, and takes the
//!   busiest: a fold waits for every node it involves, so one busy node
//!   slows the fold.
//! - **The rule** ([`Rule`]): Remote turns Local when the busiest node uses
//!   [`BUSY_PERMILLE`] of a core or more; Local turns back only after
//!   [`CALM_POLLS`] polls in a row below [`CALM_PERMILLE`]. The gap and the
//!   count keep it from flapping on the load remote folds cause themselves.
//!   A poll no node answered changes nothing.
//! - **Draining** ([`Gate`]): a fold holds the gate shared from its first
//!   prepare to its last commit and reads its mode there; a switch takes
//!   the gate exclusively, so it waits for the folds in flight, and no fold
//!   ever mixes modes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use remora_proto::rpc::Ticket;

use super::compaction::Mode;
use crate::far_memory::FarMemory;
use crate::region_table::Link;

/// How often the loads are polled.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(300);
/// How long a poll waits for a node's answer: a node that is slower has
/// bigger problems than its CPU, and the poll must not stall compaction.
const LOAD_TIMEOUT: Duration = Duration::from_millis(200);
/// CPU use (thousandths of a core) from which a memory node has none to
/// spare: Remote turns Local. Half a core: a memory node serves each
/// connection on one thread, and one that already keeps half a core busy
/// serves its data path late if it also computes deltas.
pub(crate) const BUSY_PERMILLE: u32 = 500;
/// CPU use below which a memory node is calm again.
pub(crate) const CALM_PERMILLE: u32 = 250;
/// Calm polls in a row before Local turns back to Remote.
pub(crate) const CALM_POLLS: u32 = 3;

/// How a scheme's compaction chooses its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Always this mode (`ec-batch-local`, `ec-batch-remote`).
    Fixed(Mode),
    /// By the memory nodes' load (`ec-batch`).
    Adaptive,
}

/// The switching rule, apart from polling so it can be tested alone.
#[derive(Debug)]
pub(crate) struct Rule {
    mode: Mode,
    /// Calm polls in a row while Local.
    calm: u32,
}

impl Default for Rule {
    /// Memory nodes are presumed idle until one says otherwise.
    fn default() -> Self {
        Self {
            mode: Mode::Remote,
            calm: 0,
        }
    }
}

impl Rule {
    /// The mode after a poll whose busiest node used `busiest` thousandths
    /// of a core (`None`: no node answered).
    pub(crate) fn next(&mut self, busiest: Option<u32>) -> Mode {
        let Some(b) = busiest else { return self.mode };
        match self.mode {
            Mode::Remote if b >= BUSY_PERMILLE => {
                self.mode = Mode::Local;
                self.calm = 0;
            }
            Mode::Remote => {}
            Mode::Local if b < CALM_PERMILLE => {
                self.calm += 1;
                if self.calm >= CALM_POLLS {
                    self.mode = Mode::Remote;
                    self.calm = 0;
                }
            }
            Mode::Local => self.calm = 0,
        }
        self.mode
    }
}

/// The current mode, held shared by each fold while it runs (see the
/// module docs).
#[derive(Debug)]
pub(crate) struct Gate {
    mode: RwLock<Mode>,
    /// The mode as last switched, for reports: a switch waiting for a long
    /// fold (a commit retried through a manager outage) holds the lock's
    /// queue, and a report must not wait behind it.
    shown: AtomicBool,
}

impl Gate {
    pub(crate) fn new(mode: Mode) -> Self {
        Self {
            mode: RwLock::new(mode),
            shown: AtomicBool::new(mode == Mode::Local),
        }
    }

    /// Held by a fold from its first request to its last: its mode.
    pub(crate) fn enter(&self) -> RwLockReadGuard<'_, Mode> {
        self.mode.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Switches to `to` once no fold is in flight; false if already there.
    /// The caller must not be inside a fold ([`Gate::enter`]).
    pub(crate) fn switch(&self, to: Mode) -> bool {
        let mut m = self.mode.write().unwrap_or_else(|p| p.into_inner());
        let changed = *m != to;
        *m = to;
        self.shown.store(to == Mode::Local, Ordering::Relaxed);
        changed
    }

    /// The mode now, for reports; never waits (a fold reads it through
    /// [`Gate::enter`]).
    pub(crate) fn mode(&self) -> Mode {
        if self.shown.load(Ordering::Relaxed) {
            Mode::Local
        } else {
            Mode::Remote
        }
    }
}

/// Load polling of an adaptive compaction.
#[derive(Default)]
pub(crate) struct Adaptive {
    rule: Mutex<Rule>,
    /// When the last poll started; `None` before the first.
    polled: Mutex<Option<Instant>>,
    /// A connection of its own per memory node, by address: a load request
    /// must not queue behind eviction writes.
    links: Mutex<HashMap<String, Link>>,
    /// The busiest node's CPU use at the last poll any node answered.
    busiest: AtomicU32,
    switches: AtomicU64,
}

impl Adaptive {
    /// Mode switches so far.
    pub(crate) fn switches(&self) -> u64 {
        self.switches.load(Ordering::Relaxed)
    }

    /// The busiest memory node's CPU use at the last poll.
    pub(crate) fn busiest(&self) -> u32 {
        self.busiest.load(Ordering::Relaxed)
    }

    /// Called by compaction threads between folds, outside the gate: polls
    /// the loads if one is due (one thread at a time) and switches `gate`
    /// as the rule says.
    pub(crate) fn tick(&self, far: &FarMemory, gate: &Gate) {
        {
            // Another thread polling now: it will switch if needed.
            let Ok(mut polled) = self.polled.try_lock() else { return };
            if polled.is_some_and(|t| t.elapsed() < POLL_EVERY) {
                return;
            }
            *polled = Some(Instant::now());
        }
        let busiest = self.poll(far);
        if let Some(b) = busiest {
            self.busiest.store(b, Ordering::Relaxed);
        }
        let to = self.rule.lock().unwrap_or_else(|p| p.into_inner()).next(busiest);
        if gate.switch(to) {
            self.switches.fetch_add(1, Ordering::Relaxed);
            tracing::info!("compaction switches to {to:?} mode (busiest memory node at {busiest:?}‰ of a core)");
        }
    }

    /// Asks every memory node holding a region of ours for its load, all at
    /// once; returns the highest CPU use any of them reported.
    fn poll(&self, far: &FarMemory) -> Option<u32> {
        let mut addrs: Vec<String> = far.regions().held().into_iter().map(|(_, g)| g.addr).collect();
        addrs.sort_unstable();
        addrs.dedup();
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links.retain(|a, l| !l.is_broken() && addrs.binary_search(a).is_ok());
        let mut sent: Vec<(Link, Ticket)> = Vec::with_capacity(addrs.len());
        for a in &addrs {
            let link = match links.get(a) {
                Some(l) => l.clone(),
                None => match far.regions().connect(a) {
                    Ok(l) => {
                        links.insert(a.clone(), l.clone());
                        l
                    }
                    // Dead or unreachable: it has no load to speak of.
                    Err(_) => continue,
                },
            };
            if let Ok(t) = link.send(&remora_proto::msg::MemRequest::Load, &[]) {
                sent.push((link, t));
            }
        }
        drop(links);
        let deadline = Instant::now() + LOAD_TIMEOUT;
        let mut busiest: Option<u32> = None;
        for (link, t) in sent {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(remora_proto::msg::MemResponse::Load(l)) = link.wait(t, None, left) {
                busiest = busiest.max(Some(l.cpu_permille));
            }
        }
        busiest
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    #[test]
    fn busy_nodes_turn_remote_to_local_and_calm_ones_turn_it_back() {
        let mut r = Rule::default();
        assert_eq!(r.next(None), Mode::Remote);
        assert_eq!(r.next(Some(0)), Mode::Remote);
        assert_eq!(r.next(Some(BUSY_PERMILLE - 1)), Mode::Remote);
        assert_eq!(r.next(Some(BUSY_PERMILLE)), Mode::Local);
        // Between the thresholds: stays Local however long it lasts.
        for _ in 0..10 {
            assert_eq!(r.next(Some(CALM_PERMILLE)), Mode::Local);
        }
        // Calm, but not long enough in a row: a busy poll restarts the count.
        for _ in 1..CALM_POLLS {
            assert_eq!(r.next(Some(0)), Mode::Local);
        }
        assert_eq!(r.next(Some(BUSY_PERMILLE + 100)), Mode::Local);
        for _ in 1..CALM_POLLS {
            assert_eq!(r.next(Some(CALM_PERMILLE - 1)), Mode::Local);
        }
        // A poll nobody answered neither counts nor breaks the run.
        assert_eq!(r.next(None), Mode::Local);
        assert_eq!(r.next(Some(CALM_PERMILLE - 1)), Mode::Remote);
        // Load just under the busy line, as remote folds may cause: no flap.
        for _ in 0..10 {
            assert_eq!(r.next(Some(BUSY_PERMILLE - 1)), Mode::Remote);
        }
    }

    #[test]
    fn a_switch_waits_for_the_folds_in_flight() {
        let gate = Arc::new(Gate::new(Mode::Remote));
        let fold = gate.enter();
        assert_eq!(*fold, Mode::Remote);
        let switched = Arc::new(AtomicBool::new(false));
        let switcher = {
            let (gate, switched) = (Arc::clone(&gate), Arc::clone(&switched));
            std::thread::spawn(move || {
                let changed = gate.switch(Mode::Local);
                switched.store(true, Ordering::Release);
                changed
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !switched.load(Ordering::Acquire),
            "the mode changed under a fold in flight"
        );
        // The fold ends in the mode it started in.
        assert_eq!(*fold, Mode::Remote);
        drop(fold);
        assert!(switcher.join().unwrap(), "the switch happened");
        assert_eq!(*gate.enter(), Mode::Local, "folds after the switch run Local");
        assert!(
            !gate.switch(Mode::Local),
            "switching to the mode in force changes nothing"
        );
    }
}
