//! Reading and writing the shards of an erasure-coded stripe, shared by
//! `ec-batch` (a shard is a whole span, or a parity span) and `ec-split` (a
//! shard is one fragment of a span):
//!
//! - [`gather`]: reads shards, preferred ones first, until enough have
//!   arrived (and passed the caller's check), all reads of a wave in
//!   flight at once; a failed or rejected shard is replaced by the next
//!   candidate. With late binding, the first wave asks for one shard more
//!   than needed and takes the first to arrive, so one straggler does not
//!   hold the read up.
//! - [`place_and_write`] / [`place_and_write_many`]: places stripes on
//!   stripe groups and writes them, every position in flight at once and
//!   one request per memory node, re-placing them away from a node that
//!   failed a write.
//! - [`Stripes`]: what every erasure-coded scheme holds besides its own
//!   layout: the code, stripe-group placement, recovery, counters.
//! - [`Waiters`]: the threads that wait for late-bound reads. A transport
//!   waits for one ticket at a time, so "the first k of k+1 to arrive"
//!   needs the waits to run in parallel: one thread per connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use remora_proto::msg::{MemRequest, MemResponse};
use remora_proto::rpc::Ticket;
use remora_proto::{Cap, NodeId, RpcError};

use remora_ec::Codec;

use super::node_writes::{self, NodeWrites};
use super::placement::Placement;
use super::recovery::Recovery;
use super::retry::Retry;
use super::{SchemeReport, SpanAddr};
use crate::error::{LossCause, RuntimeError};
use crate::far_memory::FarMemory;
use crate::region_table::Link;

/// Write attempts (each on a new placement) before a swap-out gives up.
const WRITE_ATTEMPTS: usize = 3;

/// An RS(k, m) code on stripe groups of k+m positions, its recoveries and
/// counters.
pub(crate) struct Stripes {
    pub(crate) name: &'static str,
    pub(crate) codec: Codec,
    pub(crate) k: usize,
    pub(crate) m: usize,
    pub(crate) place: Placement,
    /// Swap-ins served by decoding around a lost shard.
    pub(crate) degraded: AtomicU64,
    /// Corrupt far copies rewritten.
    pub(crate) repairs: AtomicU64,
    /// Stripes (spansets or rows) written, and those with fewer than k spans.
    pub(crate) batches: AtomicU64,
    pub(crate) partial_batches: AtomicU64,
    pub(crate) recovery: Recovery,
    /// Writes given up as overdue, until their outcome is known.
    pub(crate) settling: Settling,
}

impl Stripes {
    pub(crate) fn new(name: &'static str, k: usize, m: usize) -> Result<Self, RuntimeError> {
        Ok(Self {
            name,
            codec: Codec::new(k, m).map_err(|e| RuntimeError::Config(format!("{name}: {e}")))?,
            k,
            m,
            place: Placement::new(k + m, name),
            degraded: AtomicU64::new(0),
            repairs: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            partial_batches: AtomicU64::new(0),
            recovery: Recovery::default(),
            settling: Settling::default(),
        })
    }

    /// Decodes member `want` of spanset `id` in `group` into `out` from the
    /// first k of `cands` (in order of preference) to arrive: a degraded
    /// read. Fewer than k is a typed loss naming why.
    pub(crate) fn decode_from(
        &self,
        far: &FarMemory,
        group: usize,
        id: u64,
        cands: &[Shard],
        want: usize,
        out: &mut [u8],
    ) -> Result<(), RuntimeError> {
        let len = out.len();
        let mut space = vec![0u8; cands.len() * len];
        let mut dests: Vec<&mut [u8]> = space.chunks_mut(len.max(1)).collect();
        let got = gather(far, cands, &mut dests, self.k, None, &mut |_, _| true);
        if got.arrived.len() < self.k {
            return Err(RuntimeError::lost(
                None::<SpanAddr>,
                self.too_few(group, got.arrived.len()),
            ));
        }
        let present: Vec<(usize, &[u8])> = got.arrived.iter().map(|&i| (cands[i].pos, &*dests[i])).collect();
        self.codec
            .decode_data(&present, want, out)
            .map_err(|e| RuntimeError::lost_because(None::<SpanAddr>, format!("decode of spanset {id}: {e}")))
    }

    /// Runs a degraded read `read` again while it fails only because fewer
    /// than k members could be read *now* ([`LossCause::Unreadable`]: a
    /// node paused or cut off but not yet declared dead, or its
    /// replacement still being rebuilt), up to the runtime's patience.
    /// Only a stripe that really lost more than m members
    /// ([`LossCause::TooFewSurvivors`]) reaches the caller as lost at once.
    pub(crate) fn until_readable<T>(
        &self,
        far: &FarMemory,
        mut read: impl FnMut() -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let start = Instant::now();
        loop {
            match read() {
                Err(RuntimeError::DataLost {
                    cause: LossCause::Unreadable { .. },
                    ..
                }) if start.elapsed() < far.patience => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// Frees the pages of overdue writes settled since, then gives empty
    /// stripe groups back (see `Scheme::give_back`).
    pub(crate) fn give_back(&self, far: &FarMemory) -> u64 {
        self.settling.reap(far, &self.place);
        self.place.give_back_empty(far)
    }

    /// Joins the background work every such scheme has: recoveries, and
    /// waits for writes given up as overdue.
    pub(crate) fn stop(&self) {
        self.recovery.stop();
        self.settling.stop();
    }

    /// A stripe of `spans` data spans was written: a partial one (fewer
    /// than k) costs (j+m)/j in bytes written, so it is counted apart.
    pub(crate) fn count_batch(&self, spans: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        if spans < self.k {
            self.partial_batches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Why fewer than k members of a stripe in `group` could be read
    /// (`read` arrived): final when fewer than k of the group's positions
    /// survive (a node declared dead never serves again), otherwise a
    /// later try may read them.
    pub(crate) fn too_few(&self, group: usize, read: usize) -> LossCause {
        let g = self.place.group(group);
        let survivors = g.failed.iter().filter(|&&f| !f).count();
        if survivors < self.k {
            LossCause::TooFewSurvivors {
                group,
                survivors,
                needed: self.k,
            }
        } else {
            LossCause::Unreadable { read, needed: self.k }
        }
    }

    /// Positions per stripe.
    pub(crate) fn n(&self) -> usize {
        self.k + self.m
    }

    /// Degraded reads, repairs, recoveries and stranded pages (holes and
    /// kept copies are the scheme's to add).
    pub(crate) fn report(&self) -> SchemeReport {
        SchemeReport {
            degraded_reads: self.degraded.load(Ordering::Relaxed),
            repairs: self.repairs.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            partial_batches: self.partial_batches.load(Ordering::Relaxed),
            stranded_bytes: self.settling.leaked_pages.load(Ordering::Relaxed) * crate::size_classes::PAGE_SIZE as u64,
            ..self.recovery.stats.report()
        }
    }
}

/// One shard to read: its code position, where it is, its length (0: an
/// all-zero shard that was never written, read for free).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shard {
    pub(crate) pos: usize,
    pub(crate) node: NodeId,
    pub(crate) region: u16,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    /// The generation the member must hold (read with `ReadMember` and
    /// refused otherwise, so a decode uses members of one generation);
    /// `None`: a plain read.
    pub(crate) generation: Option<u64>,
}

/// What [`gather`] got.
pub(crate) struct Gathered {
    /// Indices (into the candidates) of the shards that arrived and passed.
    pub(crate) arrived: Vec<usize>,
    /// Reads that failed or were rejected by the check.
    pub(crate) failed: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn send(far: &FarMemory, s: &Shard) -> Result<(Ticket, Link), RuntimeError> {
    let (r, c) = far.regions.reader(s.region)?;
    let t = match s.generation {
        None => c.send_read(r.grant.cap, s.offset, s.len)?,
        Some(_) => {
            let len = u32::try_from(s.len).map_err(|_| RuntimeError::Config("member too large".into()))?;
            c.send(
                &MemRequest::ReadMember {
                    cap: r.grant.cap,
                    offset: s.offset,
                    len,
                },
                &[],
            )?
        }
    };
    Ok((t, c))
}

/// Reads `dest.len()` bytes at `offset` through `link` for a scheme that
/// can read around the node: the round trip feeds the failure detector's
/// latency, and a read still unanswered past its overdue bound fails with
/// [`RpcError::Timeout`] (the caller then suspects the node and reads
/// around it) instead of waiting out the call timeout.
pub(crate) fn timed_read(far: &FarMemory, link: &Link, cap: Cap, offset: u64, dest: &mut [u8]) -> Result<(), RpcError> {
    let start = Instant::now();
    let t = link.send_read(cap, offset, dest.len())?;
    let cap_wait = link.call_timeout();
    let bound = far.detector.reads.bound(cap_wait);
    match link.wait(t, Some(dest), bound) {
        Ok(MemResponse::Data) => {
            far.detector.reads.record(start.elapsed());
            Ok(())
        }
        Ok(other) => Err(RpcError::Unexpected(format!("{other:?}"))),
        Err(e @ RpcError::Timeout { .. }) => {
            if bound < cap_wait {
                far.detector.reads.count_overdue();
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Waits for phase one of a transaction for no longer than the detector's
/// transaction bound (see `crate::detector`): an overdue participant fails
/// with [`RpcError::Timeout`], a transport error.
pub(crate) fn wait_prepared(far: &FarMemory, link: &Link, t: Ticket, delta: Option<&mut [u8]>) -> Result<(), RpcError> {
    let start = Instant::now();
    let full = link.call_timeout();
    let bound = far.detector.txns.bound(full);
    match link.wait(t, delta, bound) {
        Ok(MemResponse::Prepared) => {
            far.detector.txns.record(start.elapsed());
            Ok(())
        }
        Ok(other) => Err(RpcError::Unexpected(format!("{other:?}"))),
        Err(e) => Err(overdue(far, e, bound < full)),
    }
}

/// Sends phase two (`Commit` or `Abort`) and waits for it no longer than
/// the transaction bound. An overdue one stays queued on the connection.
pub(crate) fn decide(far: &FarMemory, link: &Link, req: &MemRequest) -> Result<(), RpcError> {
    let t = link.send(req, &[])?;
    wait_decided(far, link, req, t)
}

/// Waits for a phase two sent as `req` (ticket `t`), as [`decide`] does:
/// several decisions can be in flight at once on different nodes.
pub(crate) fn wait_decided(far: &FarMemory, link: &Link, req: &MemRequest, t: Ticket) -> Result<(), RpcError> {
    let full = link.call_timeout();
    let bound = far.detector.txns.bound(full);
    match (req, link.wait(t, None, bound)) {
        (MemRequest::Commit { .. }, Ok(MemResponse::Committed))
        | (MemRequest::Abort { .. }, Ok(MemResponse::Aborted)) => Ok(()),
        (_, Ok(other)) => Err(RpcError::Unexpected(format!("{other:?}"))),
        (_, Err(e)) => Err(overdue(far, e, bound < full)),
    }
}

fn overdue(far: &FarMemory, e: RpcError, early: bool) -> RpcError {
    if early && matches!(e, RpcError::Timeout { .. }) {
        far.detector.txns.count_overdue();
    }
    e
}

/// Whether a read's answer is the shard's bytes: data for a plain read, the
/// member at the wanted generation for a member read.
fn answered(s: &Shard, r: MemResponse) -> Result<(), RpcError> {
    match (s.generation, r) {
        (None, MemResponse::Data) => Ok(()),
        (Some(want), MemResponse::Member { generation }) if generation == want => Ok(()),
        (Some(want), MemResponse::Member { generation }) => Err(RpcError::Unexpected(format!(
            "member at generation {generation}, not {want}"
        ))),
        (_, other) => Err(RpcError::Unexpected(format!("{other:?}"))),
    }
}

/// Reads candidates (in order of preference) on the swap-in lane until
/// `need` have arrived and passed `check(index, bytes)`; shard `i` lands in
/// `dests[i][..len]` (the rest of `dests[i]` is left as it is: zero it for
/// padding). A node whose read fails in the transport becomes a suspect.
/// A read whose connection broke is tried again on a new connection, with
/// backoff for as long as a reply may take, once the other candidates ran
/// out: a broken connection to a live node is not a lost shard. Returns
/// fewer than `need` only when the candidates ran out.
pub(crate) fn gather(
    far: &FarMemory,
    cands: &[Shard],
    dests: &mut [&mut [u8]],
    need: usize,
    late: Option<&Waiters>,
    check: &mut dyn FnMut(usize, &[u8]) -> bool,
) -> Gathered {
    let mut got = Gathered {
        arrived: Vec::with_capacity(need),
        failed: 0,
    };
    // Candidates go in order (`next`); reads whose connection broke are
    // tried again (`again`) once the candidates ran out.
    let mut next = 0;
    let (mut broke, mut again): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut retry: Option<Retry> = None;
    let mut extra = usize::from(late.is_some());
    while got.arrived.len() < need {
        if next == cands.len() && again.is_empty() {
            if broke.is_empty() || !retry.as_mut().is_some_and(Retry::wait) {
                break;
            }
            again = std::mem::take(&mut broke);
        }
        let want = need - got.arrived.len() + std::mem::take(&mut extra);
        let wave: Vec<usize> = if next < cands.len() {
            let w: Vec<usize> = (next..cands.len()).take(want).collect();
            next += w.len();
            w
        } else {
            again.drain(..want.min(again.len())).collect()
        };
        let mut inflight = Vec::with_capacity(wave.len());
        for i in wave {
            let s = &cands[i];
            if s.len == 0 {
                got.arrived.push(i);
                continue;
            }
            match send(far, s) {
                Ok((t, c)) => {
                    retry.get_or_insert_with(|| Retry::new(c.call_timeout()));
                    inflight.push((i, t, c));
                }
                Err(e) => {
                    far.detector.suspects.suspect(s.node);
                    got.failed += 1;
                    tracing::debug!("shard {} on {}: {e}", s.pos, s.node);
                }
            }
        }
        let mut arrive = |i: usize, r: Result<(), RpcError>, bytes: &[u8], got: &mut Gathered| match r {
            Ok(()) if check(i, bytes) => got.arrived.push(i),
            Ok(()) => got.failed += 1,
            Err(e) => {
                if e.is_node_down() {
                    far.detector.suspects.suspect(cands[i].node);
                }
                if matches!(e, RpcError::Broken { .. }) {
                    broke.push(i);
                }
                tracing::debug!("shard {} on {}: {e}", cands[i].pos, cands[i].node);
                got.failed += 1;
            }
        };
        match late {
            None => {
                // With candidates to spare, a shard overdue is read around
                // rather than waited out.
                let spare = next < cands.len() || !again.is_empty();
                for (i, t, c) in inflight {
                    let d = &mut dests[i][..cands[i].len];
                    let wait = if spare {
                        far.detector.reads.bound(c.call_timeout())
                    } else {
                        c.call_timeout()
                    };
                    let r = c.wait(t, Some(d), wait).and_then(|r| answered(&cands[i], r));
                    if spare && matches!(r, Err(RpcError::Timeout { .. })) && wait < c.call_timeout() {
                        far.detector.reads.count_overdue();
                    }
                    arrive(i, r, d, &mut got);
                }
            }
            Some(pool) => {
                // The waits run in parallel; what arrives after `need` is dropped.
                let (tx, rx) = mpsc::channel();
                let sent = inflight.len();
                for (i, t, c) in inflight {
                    let (tx, len, link, shard) = (tx.clone(), cands[i].len, Arc::clone(&c), cands[i]);
                    let deadline = Instant::now() + c.call_timeout();
                    pool.submit(
                        &link,
                        Box::new(move || {
                            let mut b = vec![0u8; len];
                            let left = deadline.saturating_duration_since(Instant::now());
                            let r = c.wait(t, Some(&mut b), left).and_then(|r| answered(&shard, r));
                            let _ = tx.send((i, r, b));
                        }),
                    );
                }
                drop(tx);
                for (i, r, b) in rx.iter().take(sent) {
                    arrive(i, r, &b, &mut got);
                    if got.arrived.last() == Some(&i) {
                        dests[i][..b.len()].copy_from_slice(&b);
                    }
                    if got.arrived.len() >= need {
                        break;
                    }
                }
            }
        }
    }
    got
}

/// One write of a stripe: to position `pos`, the pieces `(offset, bytes)`
/// (one piece: a plain write; several: one vectored write).
pub(crate) type PositionWrite<'a> = (usize, Vec<(u64, &'a [u8])>);

/// A request given up as overdue, with the `(stripe, position)` pieces it carried.
type Late = (Vec<(usize, usize)>, Link, Ticket);

/// A stripe write that failed: the node that failed first, and the
/// requests that were overdue (their outcome still unknown).
struct WriteFailure {
    node: NodeId,
    err: RuntimeError,
    late: Vec<Late>,
}

/// Writes the positions of placed stripes (`placed[s]` is stripe `s`'s
/// group, `writes[s]` its writes), all in flight at once and one request
/// per memory node ([`node_writes`]). A request unanswered past the
/// detector's write bound is given up as overdue (left in flight, in
/// [`WriteFailure::late`]).
fn write_stripes(
    far: &FarMemory,
    place: &Placement,
    placed: &[usize],
    writes: &[Vec<PositionWrite<'_>>],
) -> Result<(), WriteFailure> {
    let mut first_err: Option<(NodeId, RuntimeError)> = None;
    let mut batches: Vec<NodeWrites<'_, (usize, usize)>> = Vec::new();
    for (s, (&group, ws)) in placed.iter().zip(writes).enumerate() {
        let g = place.group(group);
        for (pos, pieces) in ws {
            match far.regions.client(g.regions[*pos]) {
                Ok((r, link)) => {
                    for &(offset, d) in pieces {
                        node_writes::add(
                            &mut batches,
                            (g.nodes[*pos], Arc::clone(&link)),
                            r.grant.cap,
                            offset,
                            d,
                            (s, *pos),
                        );
                    }
                }
                Err(e) => {
                    first_err.get_or_insert((g.nodes[*pos], e));
                }
            }
        }
    }
    let mut inflight = Vec::with_capacity(batches.len());
    let sent_at = Instant::now();
    for b in batches {
        match b.send() {
            Ok(t) => inflight.push((t, b)),
            Err(e) => {
                first_err.get_or_insert((b.node, e.into()));
            }
        }
    }
    let mut late = Vec::new();
    for (t, b) in inflight {
        let full = b.link.call_timeout();
        let bound = far.detector.writes.bound(full);
        let left = bound.saturating_sub(sent_at.elapsed());
        let id = t.raw();
        match b.link.wait_keeping(t, None, left) {
            Ok(MemResponse::Written) => far.detector.writes.record(sent_at.elapsed()),
            Ok(other) => {
                first_err.get_or_insert((b.node, RpcError::Unexpected(format!("{other:?}")).into()));
            }
            Err(e @ RpcError::Timeout { .. }) if bound < full => {
                far.detector.writes.count_overdue();
                first_err.get_or_insert((b.node, e.into()));
                late.push((b.tags, b.link, Ticket::from_raw(id)));
            }
            Err(e) => {
                first_err.get_or_insert((b.node, e.into()));
            }
        }
    }
    first_err.map_or(Ok(()), |(node, err)| Err(WriteFailure { node, err, late }))
}

/// Pages of a given-up write, kept until its outcome is known.
#[derive(Debug)]
pub(crate) struct Unsettled {
    group: usize,
    pos: usize,
    page: u32,
    pages: u32,
    /// The node answered (or can no longer act): the pages may be reused.
    done: bool,
}

/// Writes given up as overdue, waited for in the background: the pages
/// they would write stay allocated until the node has answered (or its
/// connection broke: it is dead, or fenced by its lapsed lease, and
/// serves no buffered write). One still unanswered at its call timeout
/// keeps its pages for good, as the write might yet land.
#[derive(Default)]
pub(crate) struct Settling {
    waiters: Waiters,
    outcomes: Arc<Mutex<Vec<Unsettled>>>,
    /// Pages kept for good.
    pub(crate) leaked_pages: AtomicU64,
}

impl Settling {
    fn watch(&self, link: Link, t: Ticket, mut us: Vec<Unsettled>, left: std::time::Duration) {
        let outcomes = Arc::clone(&self.outcomes);
        let l = Arc::clone(&link);
        self.waiters.submit(
            &link,
            Box::new(move || {
                let done = match l.wait(t, None, left) {
                    Ok(_) | Err(RpcError::Remote(_) | RpcError::Broken { .. }) => true,
                    Err(e) => {
                        let pages: u32 = us.iter().map(|u| u.pages).sum();
                        tracing::warn!(
                            "a write given up as overdue is still unanswered ({e}): keeping its {pages} pages"
                        );
                        false
                    }
                };
                for u in &mut us {
                    u.done = done;
                }
                lock(&outcomes).append(&mut us);
            }),
        );
    }

    /// Frees the pages of writes settled since the last call.
    fn reap(&self, far: &FarMemory, place: &Placement) {
        let settled = std::mem::take(&mut *lock(&self.outcomes));
        for u in settled {
            if u.done {
                place.free(far, u.group, u.pos, u.page, u.pages);
            } else {
                self.leaked_pages.fetch_add(u64::from(u.pages), Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn stop(&self) {
        self.waiters.stop();
    }
}

/// Places runs of `sizes[p]` pages at each position of one group and
/// writes `writes(pages)` (offsets from the runs' first pages) there; a
/// node that fails a write is suspected and the stripe placed again
/// without it. Returns the group and the runs' first pages.
pub(crate) fn place_and_write<'a>(
    far: &FarMemory,
    c: &Stripes,
    sizes: &[u32],
    writes: impl Fn(&[u32]) -> Vec<PositionWrite<'a>>,
) -> Result<(usize, Vec<u32>), RuntimeError> {
    let mut placed = place_and_write_many(far, c, &[sizes], |_, pages| writes(pages))?;
    Ok(placed.pop().expect("one placement per stripe"))
}

/// [`place_and_write`] for several stripes at once (`sizes[s]` and
/// `writes(s, pages)` for stripe `s`): each is placed on its own, and
/// all are written together, one request per memory node. All or
/// nothing: when a write fails, every stripe is placed again without
/// the node that failed.
pub(crate) fn place_and_write_many<'a>(
    far: &FarMemory,
    c: &Stripes,
    sizes: &[&[u32]],
    writes: impl Fn(usize, &[u32]) -> Vec<PositionWrite<'a>>,
) -> Result<Vec<(usize, Vec<u32>)>, RuntimeError> {
    let place = &c.place;
    c.settling.reap(far, place);
    let mut exclude: Vec<NodeId> = Vec::new();
    loop {
        let mut placed: Vec<(usize, Vec<u32>)> = Vec::with_capacity(sizes.len());
        // Frees the runs of `placed` at the (stripe, position)s `free` picks.
        let free_runs = |placed: &[(usize, Vec<u32>)], free: &dyn Fn(usize, usize) -> bool| {
            for (s, (group, pages)) in placed.iter().enumerate() {
                for (p, &page) in pages.iter().enumerate() {
                    if free(s, p) {
                        place.free(far, *group, p, page, sizes[s][p]);
                    }
                }
            }
        };
        for sz in sizes {
            match place.place(far, sz, &exclude) {
                Ok(p) => placed.push(p),
                Err(e) => {
                    free_runs(&placed, &|_, _| true);
                    return Err(e);
                }
            }
        }
        let ws: Vec<Vec<PositionWrite<'a>>> = placed
            .iter()
            .enumerate()
            .map(|(s, (_, pages))| writes(s, pages))
            .collect();
        let groups: Vec<usize> = placed.iter().map(|p| p.0).collect();
        match write_stripes(far, place, &groups, &ws) {
            Ok(()) => return Ok(placed),
            Err(WriteFailure { node, err, late }) => {
                tracing::warn!("{}: write to {node} failed ({err}); placing the stripe again", c.name);
                far.detector.suspects.suspect(node);
                // The runs an overdue request may still write stay allocated.
                free_runs(&placed, &|s, p| {
                    !late.iter().any(|(carried, _, _)| carried.contains(&(s, p)))
                });
                for (carried, link, t) in late {
                    let left = link.call_timeout();
                    let mut us: Vec<Unsettled> = carried
                        .iter()
                        .map(|&(s, p)| Unsettled {
                            group: placed[s].0,
                            pos: p,
                            page: placed[s].1[p],
                            pages: sizes[s][p],
                            done: false,
                        })
                        .collect();
                    // A stripe's position may carry several pieces: free its run once.
                    us.dedup_by_key(|u| (u.group, u.pos, u.page));
                    c.settling.watch(link, t, us, left);
                }
                exclude.push(node);
                if exclude.len() >= WRITE_ATTEMPTS {
                    return Err(err);
                }
            }
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Threads that wait for late-bound reads: one per connection, waiting for
/// its replies in the order the reads were sent. A memory node answers a
/// connection in order, so no wait sits behind a reply that already came,
/// and each wait has its own deadline, so a stalled node's queue does not
/// add its timeouts up.
#[derive(Default)]
pub(crate) struct Waiters {
    lanes: Mutex<Vec<(Link, mpsc::Sender<Job>)>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    stopped: AtomicBool,
}

impl Waiters {
    /// Runs `job` (a wait on `link`) on that connection's waiter; inline
    /// once stopped or if no thread can be started.
    fn submit(&self, link: &Link, job: Job) {
        let mut lanes = lock(&self.lanes);
        if self.stopped.load(Ordering::Acquire) {
            drop(lanes);
            return job();
        }
        // A broken connection's waiter ends once its queue is drained.
        lanes.retain(|(l, _)| !l.is_broken() || Arc::ptr_eq(l, link));
        let job = match lanes.iter().find(|(l, _)| Arc::ptr_eq(l, link)) {
            Some((_, tx)) => match tx.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("remora-waiter".into())
            .spawn(move || rx.into_iter().for_each(|j| j()));
        match spawned {
            Ok(h) => {
                let mut hs = lock(&self.handles);
                hs.retain(|h| !h.is_finished());
                hs.push(h);
                drop(hs);
                if let Err(mpsc::SendError(job)) = tx.send(job) {
                    drop(lanes);
                    return job();
                }
                lanes.push((Arc::clone(link), tx));
            }
            Err(e) => {
                drop(lanes);
                tracing::warn!("cannot start a waiter thread ({e}); waiting inline");
                job();
            }
        }
    }

    /// Lets every waiter drain its queue and joins them.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        lock(&self.lanes).clear();
        for h in std::mem::take(&mut *lock(&self.handles)) {
            let _ = h.join();
        }
    }
}
