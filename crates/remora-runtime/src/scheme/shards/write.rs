//! Writing stripes: placing them on stripe groups and writing every
//! position at once, one request per memory node, re-placing a stripe away
//! from a node that failed its write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use remora_proto::msg::MemResponse;
use remora_proto::rpc::Ticket;
use remora_proto::{NodeId, RpcError};

use super::{Stripes, WRITE_ATTEMPTS, Waiters, lock};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::region_table::Link;
use crate::scheme::node_writes::{self, NodeWrites};
use crate::scheme::placement::Placement;

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
            match far.regions().client(g.regions[*pos]) {
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
        let bound = far.detector().writes.bound(full);
        // The replies are waited for one node after the other, so a timely
        // node's reply may sit unread when its turn comes after the bound
        // is spent (a preempted evictor spends it alone): a wait with no
        // time left still takes a reply that has arrived.
        let left = bound.saturating_sub(sent_at.elapsed());
        let id = t.raw();
        match b.link.wait_keeping(t, None, left) {
            Ok(MemResponse::Written) => far.detector().writes.record(sent_at.elapsed()),
            Ok(other) => {
                first_err.get_or_insert((b.node, RpcError::Unexpected(format!("{other:?}")).into()));
            }
            Err(e @ RpcError::Timeout { .. }) if bound < full => {
                far.detector().writes.count_overdue();
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
    pub(super) fn reap(&self, far: &FarMemory, place: &Placement) {
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
            Ok(()) => {
                c.write_failures.ok();
                return Ok(placed);
            }
            Err(WriteFailure { node, err, late }) => {
                c.write_failures.fail(format_args!(
                    "{}: write to {node} failed ({err}); placing the stripe again",
                    c.name
                ));
                far.suspect(node);
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
