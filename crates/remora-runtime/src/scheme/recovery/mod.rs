//! The recovery driver every redundant scheme uses: when a memory node dies,
//! each (group, position) it held is rebuilt on a replacement region. The
//! scheme supplies the rebuild of one position ([`rebuild`], shared by the
//! erasure-coded schemes); the driver owns the threads, counts, and joins
//! them when the runtime stops (no recovery outlives its runtime).
//!
//! **Never give up while a rebuild could succeed.** A position waits in a
//! queue until it is rebuilt. A rebuild that fails (a survivor died or is
//! unreachable mid-rebuild, no replacement yet, a rebuilt shard failed its
//! checksum) is tried again after a pause that doubles up to
//! [`BACKOFF_MAX`], and at once whenever membership changes (another node
//! dies), reading whichever survivors the group has then; each retry picks
//! another set of survivors when there are spare ones, suspects last.
//!
//! **One worker per stripe group.** The positions of one group are rebuilt
//! one after another by one thread: two replacements for one group are
//! never granted on the same node, and a group that lost two positions
//! (m = 2) rebuilds the second from survivors that include the first.
//! Different groups rebuild in parallel, at most half the cores' worth at
//! once ([`rebuild_slots`]).
//!
//! **When it cannot be rebuilt.** A position whose group has fewer than k
//! surviving positions is lost for good, and the driver stops trying: a
//! node the manager declared dead is fenced and never serves its data
//! again, so survivors only ever decrease until a rebuild rebinds a
//! position. The lost position stays failed; its spans answer
//! [`crate::RuntimeError::DataLost`] naming them, the group's surviving
//! spans are still read directly, and the group takes no new spans.
//!
//! **A planned departure is a rebuild too.** When the manager says a node
//! is draining, its positions are failed and rebuilt elsewhere exactly as
//! if it had died (reads go around it meanwhile, nothing new is written to
//! it), and each old region is given back once its position is rebound, so
//! the node can leave with nothing lost. A draining position is failed only
//! where its group then has at most m − 1 failed positions (one, with
//! m = 1; [`Placement::fail_node_within`]): a failed position is not read,
//! so a member that dies while it moves must still leave k to read. The
//! rest stay on the node, which keeps serving them, until their groups are
//! rebuilt; the runtime asks again every second.

mod rebuild;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use remora_proto::{NodeId, Repeated};

pub(crate) use rebuild::{Row, ranked, rebuild, repair};

use super::placement::Placement;
use super::{Departure, SchemeReport};
use crate::error::RuntimeError;

/// First pause before a position whose rebuild failed is tried again.
const BACKOFF: Duration = Duration::from_millis(200);

/// Longest pause between tries (membership changes cut it short).
const BACKOFF_MAX: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counters of recoveries, for [`super::SchemeReport`].
#[derive(Debug, Default)]
pub(crate) struct RecoveryStats {
    pub(crate) rebuilt_bytes: AtomicU64,
    pub(crate) nanos: AtomicU64,
    /// Node failures whose every position was rebuilt or found lost.
    pub(crate) finished: AtomicU64,
    /// Node failures with positions still to rebuild.
    pub(crate) running: AtomicU64,
    pub(crate) retries: AtomicU64,
    /// Positions that can never be rebuilt (fewer than k survivors).
    pub(crate) lost: AtomicU64,
}

impl RecoveryStats {
    /// The recovery half of a [`SchemeReport`] (the rest left default).
    pub(crate) fn report(&self) -> SchemeReport {
        SchemeReport {
            reconstructed_bytes: self.rebuilt_bytes.load(Ordering::Relaxed),
            reconstruct_time: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
            recoveries: self.finished.load(Ordering::Relaxed),
            recovering: self.running.load(Ordering::Relaxed),
            rebuild_retries: self.retries.load(Ordering::Relaxed),
            lost_positions: self.lost.load(Ordering::Relaxed),
            ..SchemeReport::default()
        }
    }
}

/// The rebuild of one position, as the scheme does it.
type RebuildFn = dyn Fn(&Lost) -> Result<u64, RuntimeError> + Send + Sync;

/// A position waiting to be rebuilt.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Tries so far (each picks another set of survivors).
    attempts: usize,
    /// Which failure of the position this is: a rebuild settles only the
    /// failure it was started for (the replacement may die in turn).
    seq: u64,
}

/// A queued failure of one position: (group, position, seq).
type Queued = (usize, usize, u64);

/// What waits to be rebuilt.
#[derive(Default)]
struct Queue {
    /// Per group, its positions awaiting a rebuild.
    todo: BTreeMap<usize, BTreeMap<usize, Pending>>,
    /// Groups whose worker thread runs now.
    working: HashSet<usize>,
    /// Membership changes seen (node deaths): a waiting worker wakes when it moves.
    epoch: u64,
    next_seq: u64,
    /// Node failures not settled yet: when each began, and its positions
    /// (group, position, seq) not yet rebuilt or found lost.
    failures: Vec<(Instant, HashSet<Queued>)>,
}

struct Driver {
    stop: AtomicBool,
    q: Mutex<Queue>,
    /// Signalled when membership changes or the runtime stops.
    changed: Condvar,
    /// Failed rebuild attempts, logged as a streak: with too few live
    /// nodes or the manager down, every group's worker fails every retry.
    failures: Repeated,
    /// Rebuilds that may run now (see [`rebuild_slots`]), and the signal
    /// that one finished.
    slots: Mutex<usize>,
    slot_freed: Condvar,
}

/// How many positions rebuild at once: half the cores (at least one). A
/// rebuild is CPU work on this machine and on the memory nodes (reading
/// survivors, decoding, checksums); rebuilding every lost position at once
/// leaves the application threads nothing for as long as it lasts, while
/// one at a time on a small machine keeps most of their throughput over a
/// longer rebuild.
fn rebuild_slots() -> usize {
    thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

impl Driver {
    /// Runs `f` in a rebuild slot, waiting for one to be free.
    fn in_slot<R>(&self, f: impl FnOnce() -> R) -> R {
        let mut free = lock(&self.slots);
        while *free == 0 {
            free = self.slot_freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        drop(free);
        let r = f();
        *lock(&self.slots) += 1;
        self.slot_freed.notify_one();
        r
    }
}

impl Default for Driver {
    fn default() -> Self {
        Self {
            stop: AtomicBool::new(false),
            q: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            failures: Repeated::new("stripe-group rebuilds succeed", "rebuild attempts failed"),
            slots: Mutex::new(rebuild_slots()),
            slot_freed: Condvar::new(),
        }
    }
}

/// Runs and joins recoveries.
#[derive(Default)]
pub(crate) struct Recovery {
    pub(crate) stats: Arc<RecoveryStats>,
    d: Arc<Driver>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Per draining node, its positions that wait for their group to be
    /// within parity again (logged when the count changes).
    waiting_drains: Mutex<HashMap<NodeId, usize>>,
}

/// The code a scheme's stripes use, and its name for logs.
#[derive(Clone, Copy)]
struct Code {
    scheme: &'static str,
    k: usize,
    m: usize,
}

impl Recovery {
    /// Memory node `node` died or is draining (`why`): marks its positions
    /// in `place` failed (a draining node's only where parity covers the
    /// group) and queues each for `rebuild(lost)` (RS(k, m) stripes), which
    /// returns the bytes it rebuilt. Also wakes every rebuild waiting to
    /// retry (a departure changes which survivors there are).
    pub(crate) fn node_left<F>(
        &self,
        scheme: &'static str,
        (k, m): (usize, usize),
        place: &Placement,
        (node, why): (NodeId, Departure),
        rebuild: F,
    ) -> bool
    where
        F: Fn(&Lost) -> Result<u64, RuntimeError> + Send + Sync + 'static,
    {
        let (affected, left) = match why {
            Departure::Died => (place.fail_node(node), 0),
            Departure::Draining => place.fail_node_within(node, drain_room(m)),
        };
        let told = match why {
            Departure::Draining => lock(&self.waiting_drains).insert(node, left),
            Departure::Died => lock(&self.waiting_drains).remove(&node),
        };
        if left > 0 && told != Some(left) {
            tracing::warn!(
                "{scheme}: {node} is draining, but {left} of its stripe-group positions are in groups with \
                 failed positions: they stay on it until those groups are rebuilt"
            );
        }
        let idle: Vec<usize> = {
            let mut q = lock(&self.d.q);
            // A death changes who survives; a drain's second look that
            // moved nothing changes nothing (it comes every second).
            if why == Departure::Died || !affected.is_empty() {
                q.epoch += 1;
            }
            if !affected.is_empty() {
                match why {
                    Departure::Died => tracing::warn!(
                        "{scheme}: {node} died; rebuilding {} stripe-group positions",
                        affected.len()
                    ),
                    Departure::Draining => tracing::info!(
                        "{scheme}: {node} is draining; moving {} stripe-group positions to other nodes",
                        affected.len()
                    ),
                }
                let mut settle = HashSet::new();
                for &(g, pos) in &affected {
                    q.next_seq += 1;
                    let seq = q.next_seq;
                    q.todo.entry(g).or_default().insert(pos, Pending { attempts: 0, seq });
                    settle.insert((g, pos, seq));
                }
                q.failures.push((Instant::now(), settle));
                self.stats.running.fetch_add(1, Ordering::Relaxed);
            }
            // Groups with work and no worker (including any whose worker
            // could not be started before).
            let idle: Vec<usize> = q.todo.keys().filter(|g| !q.working.contains(g)).copied().collect();
            q.working.extend(idle.iter().copied());
            idle
        };
        self.d.changed.notify_all();
        if idle.is_empty() || self.d.stop.load(Ordering::Acquire) {
            return left > 0;
        }
        let rebuild: Arc<RebuildFn> = Arc::new(rebuild);
        let code = Code { scheme, k, m };
        for g in idle {
            let (d, stats, rebuild) = (Arc::clone(&self.d), Arc::clone(&self.stats), Arc::clone(&rebuild));
            let spawned = thread::Builder::new()
                .name("remora-recovery".into())
                .spawn(move || work(&d, &stats, g, code, &*rebuild));
            match spawned {
                Ok(h) => {
                    let mut t = lock(&self.threads);
                    t.retain(|h| !h.is_finished());
                    t.push(h);
                }
                Err(e) => {
                    // The next membership change tries again.
                    tracing::error!("cannot start recovery of stripe group {g}: {e}");
                    lock(&self.d.q).working.remove(&g);
                }
            }
        }
        left > 0
    }

    /// Stops retrying and waits for every recovery thread.
    pub(crate) fn stop(&self) {
        {
            // Under the queue's lock: a worker about to wait sees it.
            let _q = lock(&self.d.q);
            self.d.stop.store(true, Ordering::Release);
        }
        self.d.changed.notify_all();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// A worker: rebuilds group `g`'s queued positions until none is left (or
/// the runtime stops), pausing between rounds in which none succeeded.
fn work(d: &Driver, stats: &RecoveryStats, g: usize, code: Code, rebuild: &RebuildFn) {
    let mut backoff = BACKOFF;
    loop {
        let (todo, epoch) = {
            let mut q = lock(&d.q);
            let todo: Vec<(usize, Pending)> = q
                .todo
                .get(&g)
                .map(|t| t.iter().map(|(&p, &w)| (p, w)).collect())
                .unwrap_or_default();
            if todo.is_empty() || d.stop.load(Ordering::Acquire) {
                q.working.remove(&g);
                return;
            }
            (todo, q.epoch)
        };
        let mut progress = false;
        for (pos, pending) in todo {
            if d.stop.load(Ordering::Acquire) {
                break;
            }
            let lost = Lost {
                scheme: code.scheme,
                k: code.k,
                m: code.m,
                group: g,
                pos,
                attempt: pending.attempts,
            };
            match d.in_slot(|| rebuild(&lost)) {
                Ok(bytes) => {
                    d.failures.ok();
                    stats.rebuilt_bytes.fetch_add(bytes, Ordering::Relaxed);
                    settle(d, stats, g, pos, pending.seq);
                    progress = true;
                }
                Err(e) if e.is_final_loss() => {
                    tracing::error!(
                        "{}: group {g} position {pos} cannot be rebuilt ({e}); its spans are lost",
                        code.scheme
                    );
                    stats.lost.fetch_add(1, Ordering::Relaxed);
                    settle(d, stats, g, pos, pending.seq);
                    progress = true;
                }
                Err(RuntimeError::Shutdown) => break,
                Err(e) => {
                    stats.retries.fetch_add(1, Ordering::Relaxed);
                    d.failures.fail(format_args!(
                        "{}: rebuilding group {g} position {pos} failed (attempt {}): {e}; will retry",
                        code.scheme, pending.attempts
                    ));
                    if let Some(p) = lock(&d.q).todo.get_mut(&g).and_then(|t| t.get_mut(&pos)) {
                        p.attempts += 1;
                    }
                }
            }
        }
        if progress {
            backoff = BACKOFF;
            continue;
        }
        // Nothing succeeded: wait for a membership change or the pause.
        let q = lock(&d.q);
        let _ = d
            .changed
            .wait_timeout_while(q, backoff, |q| q.epoch == epoch && !d.stop.load(Ordering::Acquire));
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// How many failed positions a draining node's position may bring its
/// group to: m − 1, so that a member dying while it moves still leaves k
/// to read (the draining position counts as failed, though its node still
/// holds it); with m = 1, one (a move would otherwise never start).
fn drain_room(m: usize) -> usize {
    m.saturating_sub(1).max(1)
}

/// Position `pos` of group `g`, queued as failure `seq`, is rebuilt or lost.
fn settle(d: &Driver, stats: &RecoveryStats, g: usize, pos: usize, seq: u64) {
    let mut q = lock(&d.q);
    if let Some(t) = q.todo.get_mut(&g) {
        if t.get(&pos).is_some_and(|p| p.seq == seq) {
            t.remove(&pos);
        }
        if t.is_empty() {
            q.todo.remove(&g);
        }
    }
    q.failures.retain_mut(|(start, left)| {
        left.remove(&(g, pos, seq));
        if !left.is_empty() {
            return true;
        }
        stats
            .nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats.running.fetch_sub(1, Ordering::Relaxed);
        stats.finished.fetch_add(1, Ordering::Relaxed);
        false
    });
}

/// A position to rebuild, and the code its stripes use.
pub(crate) struct Lost {
    pub(crate) scheme: &'static str,
    pub(crate) k: usize,
    pub(crate) m: usize,
    pub(crate) group: usize,
    pub(crate) pos: usize,
    /// Which attempt this is: a retry reads another set of survivors.
    pub(crate) attempt: usize,
}
