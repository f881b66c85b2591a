//! Remote compaction (paper §3.4, §3.4.2, §3.6): folding a sparse spanset
//! into one whose holes sit where its live spans are.
//!
//! A fold of spanset B into spanset A (same stripe group, same row length)
//! moves each live span of B into A's hole at the same position. That hole
//! and the span are on the same memory node, so the node computes the delta
//! `D_new xor D_old` next to the data; A's parity is updated in place
//! (`P_j += A_ij · delta`), and all of B (its holes, its moved spans' old
//! pages and its parity) is given back. The paper's "exact complement" is
//! the case where B's live spans fill every hole of A; any B whose live
//! positions are holes of A will do, and the sparser spanset is always the
//! one folded, so at most k/2 spans move.
//!
//! Two ways to update parity, both two-phase commits through the memory
//! nodes' transactions (`remora_memnode::txn`):
//! - [`Mode::Local`] (EC-Batch Local): data nodes return their deltas, the
//!   compute node combines them per parity member and stages the result on
//!   the parity nodes.
//! - [`Mode::Remote`] (EC-Batch Remote): data nodes multiply their delta by
//!   each parity coefficient and stage it on the parity nodes themselves,
//!   with apply-delta capabilities the compute node delegates; only small
//!   requests leave the compute node.
//!
//! `ec-batch` chooses between them by the memory nodes' load, switching
//! only between folds (`adaptive`).
//!
//! Once every participant has prepared, the fold is decided: commits are
//! retried, and a participant that never answers is treated as failed (its
//! member is rebuilt from the others, which hold the new state). Before
//! that point any failure aborts the fold and nothing changed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use remora_proto::msg::{DeltaTarget, MemRequest, Member as TxnMember};
use remora_proto::rpc::Ticket;
use remora_proto::{RpcError, TxnId, TxnOp};

use super::adaptive::{Adaptive, Gate, Policy};
use super::pairing::{self, Candidate};
use super::{Held, Shared, Spanset, State, bytes, offset};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::pause_gate::PauseGate;
use crate::region_table::{FarRegion, Link};
use crate::scheme::{SchemeReport, shards};
use crate::size_classes::PAGE_SIZE;

/// Who computes the parity deltas of a fold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The compute node (EC-Batch Local).
    Local,
    /// The data memory nodes (EC-Batch Remote).
    Remote,
}

/// Folds picked per look at the spansets.
const BATCH: usize = 128;
/// The longest a walk that found few folds holds the next one back.
const WALK_AGAIN: Duration = Duration::from_millis(200);
/// How long an idle compaction thread sleeps before looking again.
const IDLE: Duration = Duration::from_millis(20);
/// How long the commits of a decided fold are asked again while no more
/// than m of them fail, none because its node's lease lapsed.
const COMMIT_DEADLINE: Duration = Duration::from_secs(2);

/// A scheme's compaction: its mode, threads and counters.
#[derive(Default)]
pub(crate) struct Compaction {
    /// `None`: the scheme does not compact.
    policy: Option<Policy>,
    /// The mode folds run in now.
    gate: Option<Gate>,
    /// Load polling, for [`Policy::Adaptive`].
    adaptive: Option<Adaptive>,
    threads: usize,
    /// Holes' share of the data pages at which folding starts (it stops
    /// below half of it), so folds run in bursts rather than all the time.
    trigger: f64,
    /// Between the trigger and its half: whether a burst is under way.
    active: AtomicBool,
    /// Set when a walk found few folds: the `State::made` before which, and
    /// the time before which, the spansets are not walked again (new holes
    /// and new spansets make new folds; a stripe group usable again after
    /// a suspicion does too, hence the time bound). A walk took 0.4 ms
    /// under the scheme's lock (5 500 spansets) and 45 % of walks found
    /// nothing in `bench micro`.
    walk_after: Mutex<Option<(u64, Instant)>>,
    next_txn: AtomicU64,
    folds: AtomicU64,
    /// Of those, folds in each mode.
    local_folds: AtomicU64,
    remote_folds: AtomicU64,
    aborted: AtomicU64,
    freed_pages: AtomicU64,
    dead_pages: AtomicU64,
    busy_ns: AtomicU64,
    /// Wakes idle threads early (shutdown).
    bell: (Mutex<()>, Condvar),
    /// Folding is paused (`Scheme::pause`); a pause waits for the batches
    /// under way.
    pause_gate: PauseGate,
    /// Failed commit attempts, logged as a streak.
    commit_failures: CommitFailures,
    /// Members in doubt repaired (see `repair`).
    pub(super) doubt_repairs: AtomicU64,
    /// No repair is tried before then (one failed: its node is still
    /// cut off).
    pub(super) repair_after: Mutex<Option<Instant>>,
}

/// Commits that fail, logged as a streak: a memory node that stopped
/// serving fails every commit of every fold in its groups.
struct CommitFailures(remora_proto::Repeated);

impl Default for CommitFailures {
    fn default() -> Self {
        Self(remora_proto::Repeated::new(
            "fold commits succeed",
            "commit attempts failed",
        ))
    }
}

impl Compaction {
    pub(crate) fn new(policy: Policy, threads: usize, trigger: f64) -> Self {
        let (first, adaptive) = match policy {
            Policy::Fixed(m) => (m, None),
            Policy::Adaptive => (Mode::Remote, Some(Adaptive::default())),
        };
        Self {
            policy: Some(policy),
            gate: Some(Gate::new(first)),
            adaptive,
            threads,
            trigger,
            ..Self::default()
        }
    }

    /// Compaction threads to start.
    pub(super) fn threads(&self) -> usize {
        if self.policy.is_some() { self.threads } else { 0 }
    }

    pub(super) fn wake(&self) {
        let _g = self.bell.0.lock().unwrap_or_else(|p| p.into_inner());
        self.bell.1.notify_all();
    }

    /// Pauses or resumes folding; a pause returns once no fold is in flight.
    pub(super) fn pause(&self, paused: bool) {
        if paused {
            self.pause_gate.pause();
        } else {
            self.pause_gate.resume();
            self.wake();
        }
    }

    fn nap(&self) {
        let g = self.bell.0.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.bell.1.wait_timeout(g, IDLE);
    }

    /// `base` with the compaction counters filled in.
    pub(super) fn report(&self, base: SchemeReport) -> SchemeReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SchemeReport {
            compactions: get(&self.folds),
            compactions_local: get(&self.local_folds),
            compactions_remote: get(&self.remote_folds),
            compaction_switches: self.adaptive.as_ref().map_or(0, Adaptive::switches),
            compaction_mode: self.gate.as_ref().map(|g| match g.mode() {
                Mode::Local => "local",
                Mode::Remote => "remote",
            }),
            memnode_cpu_permille: self.adaptive.as_ref().map_or(0, Adaptive::busiest),
            compactions_aborted: get(&self.aborted),
            compacted_bytes_freed: get(&self.freed_pages) * PAGE_SIZE as u64,
            compacted_dead_bytes: get(&self.dead_pages) * PAGE_SIZE as u64,
            compaction_busy: Duration::from_nanos(get(&self.busy_ns)),
            doubt_repairs: get(&self.doubt_repairs),
            ..base
        }
    }
}

/// One fold of spanset `b` into spanset `a`, as picked.
struct Fold {
    a: u64,
    b: u64,
    group: usize,
    /// Positions whose span moves from b to a.
    moves: Vec<usize>,
    /// Bytes of every member involved (the row).
    len: usize,
    /// Per move: a's page and generation there, b's page.
    a_at: Vec<(u32, u64)>,
    b_page: Vec<u32>,
    /// a's parity members: page and generation.
    parity: Vec<(u32, u64)>,
}

/// A compaction thread: folds until `stop`.
pub(super) fn run(sh: &Arc<Shared>, far: &Arc<FarMemory>, stop: &AtomicBool) {
    let c = &sh.compaction;
    let Some(gate) = &c.gate else { return };
    while !stop.load(Ordering::Acquire) {
        let Some(in_flight) = c.pause_gate.enter() else {
            c.nap();
            continue;
        };
        if let Some(a) = &c.adaptive {
            a.tick(far, gate);
        }
        sh.repair_doubtful(far);
        // Short groups full width again: their short spansets can then be
        // folded into the full ones written there.
        sh.c.place.widen(far);
        let folds = sh.pick_folds(far, BATCH);
        if folds.is_empty() {
            drop(in_flight);
            sh.compaction.nap();
            continue;
        }
        // Few folds found: the scan costs more than it wins; let holes
        // gather before the next one.
        let few = folds.len() < BATCH / 4;
        // A batch aborted (a node of its group failed it): the next look
        // would likely pick the same folds at once.
        let mut aborted = false;
        for batch in by_group(folds) {
            // Picked with the rest; a node of its group may have failed a
            // fold since. Its spansets stay busy while they wait, and their
            // degraded reads wait for them.
            let group = batch[0].group;
            // Stopping: the rest of the picked folds are given up, not run.
            let stopping = stop.load(Ordering::Acquire) || far.is_stopping();
            if stopping || (0..sh.c.n()).any(|p| sh.c.place.unusable(far, group, p)) {
                for f in &batch {
                    sh.finish_fold(far, f, false, &[]);
                }
                continue;
            }
            let start = Instant::now();
            let mode = gate.enter();
            let (committed, doubt) = match sh.execute(far, &batch, *mode) {
                Ok(doubt) => {
                    match *mode {
                        Mode::Local => &c.local_folds,
                        Mode::Remote => &c.remote_folds,
                    }
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    (true, doubt)
                }
                Err(e) => {
                    tracing::debug!("{}: {} folds in group {group} aborted: {e}", sh.c.name, batch.len());
                    aborted = true;
                    (false, Vec::new())
                }
            };
            drop(mode);
            for f in &batch {
                sh.finish_fold(far, f, committed, &doubt);
            }
            sh.compaction
                .busy_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        drop(in_flight);
        if few || aborted {
            sh.compaction.nap();
        }
    }
}

/// Sends phase one of `ops` (with their payloads, in order) as one request.
fn prepare(c: &Link, txn: TxnId, mut ops: Vec<TxnOp>, payloads: &[&[u8]]) -> Result<Ticket, RpcError> {
    if ops.len() == 1 {
        let op = ops.pop().expect("one op");
        c.send_prepare(txn, op, payloads.first().copied().unwrap_or(&[]))
    } else {
        c.send_prepare_many(txn, ops, payloads)
    }
}

/// The folds split by stripe group, each group's folds one transaction.
fn by_group(folds: Vec<Fold>) -> Vec<Vec<Fold>> {
    let mut groups: Vec<Vec<Fold>> = Vec::new();
    for f in folds {
        match groups.iter_mut().find(|b| b[0].group == f.group) {
            Some(b) => b.push(f),
            None => groups.push(vec![f]),
        }
    }
    groups
}

impl Shared {
    /// Whether holes are many enough to fold (with hysteresis).
    fn worth_folding(&self, far: &FarMemory, st: &State) -> bool {
        let (k, n) = (self.c.k as f64, self.c.n() as f64);
        // Data members' pages: far pages in use less the parity's share.
        let data_pages = far.used_bytes() as f64 / PAGE_SIZE as f64 * k / n;
        let share = st.hole_pages as f64 / data_pages.max(1.0);
        let (active, trigger) = (&self.compaction.active, self.compaction.trigger);
        if share >= trigger {
            active.store(true, Ordering::Relaxed);
        } else if share < trigger / 2.0 {
            active.store(false, Ordering::Relaxed);
        }
        active.load(Ordering::Relaxed)
    }

    /// Picks up to `max` folds of disjoint spanset pairs, marks their
    /// spansets busy and cancels the kept copies the folds would break.
    fn pick_folds(&self, far: &FarMemory, max: usize) -> Vec<Fold> {
        let mut st = self.lock();
        if st.hole_pages == 0 || !self.worth_folding(far, &st) {
            return Vec::new();
        }
        let mut walk_after = self.compaction.walk_after.lock().unwrap_or_else(|p| p.into_inner());
        if walk_after.is_some_and(|(made, at)| st.made < made && Instant::now() < at) {
            return Vec::new();
        }
        // Whether each stripe group may take part, looked up once per group.
        let mut usable: Vec<Option<bool>> = Vec::new();
        // (row length, group, live spans, candidate): one vector sorted
        // once, not a map of buckets, since this runs under the scheme's
        // lock and walks every spanset.
        let mut cands: Vec<(u32, usize, (u32, u32), Candidate)> = Vec::new();
        for (&id, ss) in &st.sets {
            // A member in doubt holds old bytes or new: moving it would
            // copy whichever it holds, and updating parity by its delta
            // would make the wrong one what the spanset decodes to.
            if ss.busy || ss.doubt_mask() != 0 {
                continue;
            }
            debug_assert!(ss.masks_agree(), "spanset {id}'s masks are stale");
            let (live, holes) = (ss.live_mask(), ss.fold_holes());
            // A spanset can only be folded (few live spans) or be folded
            // into (some holes): most full ones are neither.
            let foldable = live != 0 && live.count_ones() <= (self.c.k as u32 / 2).max(1);
            if live == 0 || !(foldable || holes != 0) {
                continue;
            }
            if usable.len() <= ss.group {
                usable.resize(ss.group + 1, None);
            }
            let ok = *usable[ss.group].get_or_insert_with(|| {
                !st.recovering.contains(&ss.group) && (0..self.c.n()).all(|p| !self.c.place.unusable(far, ss.group, p))
            });
            if ok {
                let order = (live.count_ones(), ss.kept_mask().count_ones());
                cands.push((ss.row_pages, ss.group, order, (id, live, holes)));
            }
        }
        // Larger rows first (a fold gives back the whole folded spanset);
        // within a bucket, spansets with few live spans first, as `pair`
        // wants them, and of those the ones with fewest kept copies (a
        // folded spanset's kept copies are lost with it).
        cands.sort_unstable_by_key(|&(rows, group, order, (id, _, _))| (std::cmp::Reverse(rows), group, order, id));
        let v: Vec<Candidate> = cands.iter().map(|c| c.3).collect();
        let mut buckets: Vec<std::ops::Range<usize>> = Vec::new();
        for (i, c) in cands.iter().enumerate() {
            match buckets.last_mut() {
                Some(r) if (cands[r.start].0, cands[r.start].1) == (c.0, c.1) => r.end = i + 1,
                _ => buckets.push(i..i + 1),
            }
        }
        let mut pairs: Vec<(u64, u64, u64)> = Vec::new();
        // Spansets with few live spans first: each moved span costs about a
        // span of deltas, each hole of the folded spanset is what is won.
        // Up to k/2 live spans when those are too few to be worth this walk
        // of every spanset under the lock (each such fold still moves no
        // more bytes than it frees).
        let k = self.c.k as u32;
        let (few, more) = ((k / 4).max(1), (k / 2).max(1));
        let mut taken: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for limit in if few < more { vec![few, more] } else { vec![few] } {
            for r in &buckets {
                if pairs.len() == max {
                    break;
                }
                // The second pass leaves out what the first paired.
                let free: Vec<Candidate>;
                let v = if taken.is_empty() {
                    &v[r.clone()]
                } else {
                    free = v[r.clone()].iter().filter(|c| !taken.contains(&c.0)).copied().collect();
                    &free[..]
                };
                for (a, b) in pairing::pair(v, limit, max - pairs.len()) {
                    pairs.push((v[a].0, v[b].0, v[b].1));
                    taken.extend([v[a].0, v[b].0]);
                }
            }
            if pairs.len() >= max / 4 {
                break;
            }
        }
        *walk_after = (pairs.len() < max / 4).then(|| (st.made + max as u64, Instant::now() + WALK_AGAIN));
        drop(walk_after);
        pairs
            .into_iter()
            .map(|(a, b, live_b)| self.begin_fold(&mut st, a, b, live_b))
            .collect()
    }

    /// Marks `a` and `b` busy, cancels kept copies in b and at the holes of
    /// a that b's spans fill, and describes the fold.
    fn begin_fold(&self, st: &mut State, a: u64, b: u64, live_b: u64) -> Fold {
        let moves: Vec<usize> = (0..self.c.k).filter(|&p| live_b & (1 << p) != 0).collect();
        let mut cancelled = 0u64;
        let bs = st.sets.get_mut(&b).expect("picked from the table");
        bs.busy = true;
        for p in 0..bs.k() {
            if bs.is_kept(p) {
                bs.set_held(p, Held::Hole);
                cancelled += bs.members[p].pages as u64;
            }
        }
        let b_page = moves.iter().map(|&p| bs.members[p].page).collect();
        let as_ = st.sets.get_mut(&a).expect("picked from the table");
        as_.busy = true;
        // A's kept holes are never picked (see `Spanset::fold_holes`).
        debug_assert_eq!(as_.kept_mask() & live_b, 0, "a fold fills a kept hole");
        let fold = Fold {
            a,
            b,
            group: as_.group,
            len: bytes(as_.row_pages),
            a_at: moves
                .iter()
                .map(|&p| (as_.members[p].page, as_.members[p].generation))
                .collect(),
            b_page,
            parity: as_.parity().iter().map(|p| (p.page, p.generation)).collect(),
            moves,
        };
        // k > 1 here (replication does not compact): a kept copy weighs its pages.
        st.kept_pages -= cancelled;
        st.hole_pages += cancelled;
        fold
    }

    /// Runs the folds' two-phase commit on the memory nodes: the folds of
    /// one stripe group as one transaction, so each node of the group is
    /// sent one commit for all of them, every commit in flight at once. The
    /// folds' spansets are disjoint, so no member is staged twice.
    /// Returns the positions whose commit is in doubt (never acknowledged).
    fn execute(&self, far: &FarMemory, folds: &[Fold], mode: Mode) -> Result<Vec<usize>, RuntimeError> {
        let (k, m) = (self.c.k, self.c.m);
        let Some(group) = folds.first().map(|f| f.group) else {
            return Ok(Vec::new());
        };
        debug_assert!(
            folds.iter().all(|f| f.group == group),
            "one stripe group per transaction"
        );
        let g = self.c.place.group(group);
        let txn = TxnId(self.compaction.next_txn.fetch_add(1, Ordering::Relaxed) + 1);
        // A participant that fails or is overdue is suspected, so the
        // batch's other folds in its group are skipped.
        let blame = |pos: usize| {
            let node = g.nodes[pos];
            move |e: RpcError| {
                if e.is_node_down() {
                    far.suspect(node);
                }
                e
            }
        };
        // Every position of the group that a fold touches, in order.
        let mut involved = vec![false; k + m];
        for f in folds {
            for &p in &f.moves {
                involved[p] = true;
            }
        }
        involved[k..].iter_mut().for_each(|i| *i = true);
        let links: Vec<Option<(Arc<FarRegion>, Link)>> = (0..k + m)
            .map(|p| involved[p].then(|| far.regions().client(g.regions[p])).transpose())
            .collect::<Result<_, _>>()?;
        let link = |p: usize| links[p].as_ref().expect("an involved position has a link");
        let member = |r: &FarRegion, page: u32, generation: u64, len: usize| TxnMember {
            cap: r.grant.cap,
            offset: offset(page),
            len: len as u32,
            generation,
        };
        let prepared = (|| -> Result<(), RuntimeError> {
            let targets = |f: &Fold, pos: usize| -> Result<Vec<DeltaTarget>, RuntimeError> {
                if mode == Mode::Local {
                    return Ok(Vec::new());
                }
                (0..m)
                    .map(|j| {
                        let (r, _) = link(k + j);
                        Ok(DeltaTarget {
                            addr: r.grant.addr.clone(),
                            member: TxnMember {
                                cap: r.grant.cap.apply_delta(),
                                ..member(r, f.parity[j].0, f.parity[j].1, f.len)
                            },
                            coef: self
                                .c
                                .codec
                                .coefficient(pos, j)
                                .map_err(|e| RuntimeError::Config(e.to_string()))?,
                        })
                    })
                    .collect()
            };
            // Each data node gets the moves of every fold at its position as
            // one request (and sends each parity node their shares as one),
            // all data nodes at once.
            let mut by_pos: Vec<(Vec<TxnOp>, Vec<usize>)> = (0..k).map(|_| (Vec::new(), Vec::new())).collect();
            for (fi, f) in folds.iter().enumerate() {
                for (i, &pos) in f.moves.iter().enumerate() {
                    let (r, _) = link(pos);
                    by_pos[pos].0.push(TxnOp::Move {
                        to: member(r, f.a_at[i].0, f.a_at[i].1, f.len),
                        from_cap: r.grant.cap,
                        from: offset(f.b_page[i]),
                        return_delta: mode == Mode::Local,
                        targets: targets(f, pos)?,
                    });
                    by_pos[pos].1.push(fi);
                }
            }
            let mut tickets = Vec::new();
            for (pos, (ops, fis)) in by_pos.into_iter().enumerate() {
                if !ops.is_empty() {
                    let t = prepare(&link(pos).1, txn, ops, &[])?;
                    tickets.push((pos, fis, t));
                }
            }
            // Local: per fold, the parity deltas its moves add up to.
            let mut deltas: Vec<Vec<Vec<u8>>> = Vec::new();
            if mode == Mode::Local {
                deltas = folds.iter().map(|f| vec![vec![0u8; f.len]; m]).collect();
            }
            let mut returned = Vec::new();
            for (pos, fis, t) in tickets {
                let (_, c) = link(pos);
                if mode == Mode::Local {
                    returned.resize(fis.iter().map(|&fi| folds[fi].len).sum(), 0);
                    shards::wait_prepared(far, c, t, Some(&mut returned)).map_err(blame(pos))?;
                    let mut rest = &returned[..];
                    for &fi in &fis {
                        let (delta, r) = rest.split_at(folds[fi].len);
                        rest = r;
                        for (j, d) in deltas[fi].iter_mut().enumerate() {
                            self.c
                                .codec
                                .apply_delta(pos, j, delta, d)
                                .map_err(|e| RuntimeError::Config(e.to_string()))?;
                        }
                    }
                } else {
                    shards::wait_prepared(far, c, t, None).map_err(blame(pos))?;
                }
            }
            if mode == Mode::Local {
                // Each parity node gets every fold's delta for it as one request.
                let mut tickets = Vec::with_capacity(m);
                for j in 0..m {
                    let (r, c) = link(k + j);
                    let ops = folds
                        .iter()
                        .map(|f| TxnOp::Apply {
                            to: member(r, f.parity[j].0, f.parity[j].1, f.len),
                        })
                        .collect();
                    let payloads: Vec<&[u8]> = deltas.iter().map(|d| d[j].as_slice()).collect();
                    tickets.push((k + j, prepare(c, txn, ops, &payloads)?));
                }
                for (pos, t) in tickets {
                    shards::wait_prepared(far, &link(pos).1, t, None).map_err(blame(pos))?;
                }
            }
            Ok(())
        })();
        let everyone = || links.iter().flatten();
        if let Err(e) = prepared {
            for (r, c) in everyone() {
                let _ = shards::decide(far, c, &MemRequest::Abort { cap: r.grant.cap, txn });
            }
            return Err(e);
        }
        // Decided: every participant prepared. Every commit in flight at
        // once; those that fail are sent again together.
        let mut pending: Vec<_> = links
            .iter()
            .enumerate()
            .filter_map(|(p, l)| l.as_ref().map(|(r, c)| (p, r, c)))
            .collect();
        let mut outcomes = self.commit(far, txn, &pending);
        let start = Instant::now();
        let mut attempt = 0;
        let mut doubt = Vec::new();
        loop {
            let mut failed = Vec::new();
            for (at, outcome) in pending.iter().zip(outcomes) {
                match outcome {
                    Ok(()) => {
                        self.compaction.commit_failures.0.ok();
                    }
                    Err(e) => {
                        self.compaction.commit_failures.0.fail(format_args!(
                            "{}: commit on {} failed ({e}), attempt {attempt}",
                            self.c.name, at.1.grant.addr
                        ));
                        failed.push((*at, e));
                    }
                }
            }
            if failed.is_empty() {
                break;
            }
            attempt += 1;
            let waited = start.elapsed();
            // Members left in doubt are read around and repaired, which
            // needs k trusted members: with at most m failing a short wait
            // will do; with more, the commits are asked again up to the
            // outage deadline. A node that refuses because its lease lapsed
            // (the manager is down) is alive and keeps its staged change:
            // it is asked up to the outage deadline too, since leaving its
            // members in doubt would make it a suspect, and its stripe
            // groups unusable, until a manager that has just restarted
            // vouches for it. A runtime shutting down does not wait: its
            // members are read around, as after any commit left
            // unacknowledged; nor does one whose node was declared dead.
            let short = failed.len() <= self.c.codec.m();
            pending.clear();
            for ((p, r, c), e) in failed {
                let deadline = match e {
                    RpcError::Remote(remora_proto::RemoteError::Unavailable) => far.outage_deadline(),
                    _ if short => COMMIT_DEADLINE,
                    _ => far.outage_deadline(),
                };
                let give_up = far.is_stopping()
                    || far.is_dead(r.grant.node)
                    || waited >= deadline
                    || matches!(e, RpcError::Timeout { .. });
                if give_up {
                    tracing::warn!(
                        "{}: commit on {} failed {attempt} times in {waited:?} ({e}); its members are read around",
                        self.c.name,
                        r.grant.addr
                    );
                    // Its members may hold the old state or the new: they
                    // are read around (the others committed) until rebuilt.
                    // The node itself may well be alive (its lease lapsed),
                    // so a suspicion, which the manager can lift, is not
                    // enough.
                    far.suspect(r.grant.node);
                    doubt.push(p);
                } else {
                    pending.push((p, r, c));
                }
            }
            if pending.is_empty() {
                break;
            }
            let again = Instant::now() + Duration::from_millis(20 << attempt.min(4));
            while !far.is_stopping() && Instant::now() < again {
                std::thread::sleep(IDLE);
            }
            outcomes = self.commit(far, txn, &pending);
        }
        Ok(doubt)
    }

    /// Sends `txn`'s commit to every participant in `to` at once and waits
    /// for each answer. A participant whose first answer is late is not
    /// asked again: its commit stays queued on the connection.
    fn commit(&self, far: &FarMemory, txn: TxnId, to: &[(usize, &Arc<FarRegion>, &Link)]) -> Vec<Result<(), RpcError>> {
        let sent: Vec<_> = to
            .iter()
            .map(|(_, r, c)| {
                let req = MemRequest::Commit { cap: r.grant.cap, txn };
                let t = c.send(&req, &[]);
                (req, t)
            })
            .collect();
        to.iter()
            .zip(sent)
            .map(|((_, _, c), (req, t))| t.and_then(|t| shards::wait_decided(far, c, &req, t)))
            .collect()
    }

    /// Records a fold's outcome: on commit, a holds b's spans and b is given
    /// back; either way both stop being busy. The members of a at positions
    /// in `doubt` (their commit was never acknowledged) and changed by the
    /// fold are read around from then on.
    fn finish_fold(&self, far: &FarMemory, f: &Fold, committed: bool, doubt: &[usize]) {
        let mut guard = self.lock();
        let st = &mut *guard;
        // Spansets a walk skipped as busy can fold again.
        st.made += 1;
        if !committed {
            self.compaction.aborted.fetch_add(1, Ordering::Relaxed);
            for id in [f.a, f.b] {
                if let Some(ss) = st.sets.get_mut(&id) {
                    ss.busy = false;
                }
            }
            drop(guard);
            self.idle.notify_all();
            for id in [f.a, f.b] {
                self.release_busy_if_empty(far, id);
            }
            return;
        }
        let regions = self.c.place.group(f.group).regions;
        let b = st.sets.remove(&f.b).expect("a busy spanset stays in the table");
        let a = st.sets.get_mut(&f.a).expect("a busy spanset stays in the table");
        st.hole_pages -= a.hole_pages() + b.hole_pages();
        for &p in &f.moves {
            let bm = b.members[p];
            let am = &mut a.members[p];
            st.by_span.remove(&(regions[p], am.name));
            am.name = bm.name;
            am.sum = bm.sum;
            am.generation += 1;
            // Live, or a hole if it came back meanwhile (b is busy: no
            // kept copies).
            a.set_held(p, b.held(p));
            st.by_span.insert((regions[p], bm.name), (f.a, p));
        }
        for par in a.parity_mut() {
            par.generation += 1;
            par.sum = None;
        }
        let mut in_doubt = false;
        for &p in doubt {
            if p >= self.c.k || f.moves.contains(&p) {
                a.set_doubt(p, true);
                in_doubt = true;
            }
        }
        for (p, bm) in b.data().iter().enumerate() {
            if bm.pages > 0 && !f.moves.contains(&p) {
                st.by_span.remove(&(regions[p], bm.name));
            }
        }
        st.hole_pages += a.hole_pages();
        a.busy = false;
        if in_doubt {
            st.doubtful.insert(f.a);
        }
        let a_empty = a.live_mask() == 0;
        self.compaction.folds.fetch_add(1, Ordering::Relaxed);
        self.compaction.freed_pages.fetch_add(b.far_pages(), Ordering::Relaxed);
        // Dead spans the fold did away with: b's holes, given back, and a's
        // holes that b's spans now fill (their space holds live data again;
        // the moved spans' old pages are what is given back for them). The
        // paper's exact complement frees k dead spans this way.
        let b_holes: u64 = b
            .data()
            .iter()
            .enumerate()
            .filter(|(p, m)| !f.moves.contains(p) && m.pages > 0)
            .map(|(_, m)| m.pages as u64)
            .sum();
        let a_filled: u64 = f.moves.iter().map(|&p| a.members[p].pages as u64).sum();
        self.compaction
            .dead_pages
            .fetch_add(b_holes + a_filled, Ordering::Relaxed);
        let b = if b.readers > 0 {
            st.retired.insert(f.b, b);
            None
        } else {
            Some(b)
        };
        let a = if a_empty { self.remove_set(st, f.a) } else { None };
        drop(guard);
        self.idle.notify_all();
        for ss in [b, a].into_iter().flatten() {
            self.free_far(far, &ss);
        }
    }

    /// Frees spanset `id` if nothing in it is live (its spans left while it
    /// was busy) and nobody holds it busy.
    fn release_busy_if_empty(&self, far: &FarMemory, id: u64) {
        let mut st = self.lock();
        let empty = st
            .sets
            .get(&id)
            .is_some_and(|ss: &Spanset| !ss.busy && ss.live_mask() == 0);
        let ss = if empty { self.remove_set(&mut st, id) } else { None };
        drop(st);
        if let Some(ss) = ss {
            self.free_far(far, &ss);
        }
    }
}
