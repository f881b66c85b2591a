//! `non-ft`: each evicted span goes to one memory node, once. No redundancy:
//! a memory node's death loses its spans (the error says so).

use remora_proto::{NodeId, RpcError};

use std::sync::atomic::{AtomicU64, Ordering};

use super::node_writes::{self, NodeWrites};
use super::placement::Placement;
use super::{CopyRead, Scheme, SchemeReport, SpanAddr};
use crate::error::{LossCause, RuntimeError};
use crate::far_memory::FarMemory;
use crate::size_classes::PAGE_SIZE;

/// The non-fault-tolerant scheme (AIFM-like placement of spans).
pub struct NonFt {
    /// Groups of one region: spans spread over them in turn.
    place: Placement,
    /// Far pages held by kept copies.
    kept_pages: AtomicU64,
}

impl Default for NonFt {
    fn default() -> Self {
        Self {
            place: Placement::new(1, "non-ft"),
            kept_pages: AtomicU64::new(0),
        }
    }
}

/// What a failed read of the only copy at `at` means: lost once the
/// manager declared its memory node dead, unavailable for now while the
/// node is only unreachable, or answers as a new incarnation that no longer
/// holds the region (the read path waits for the manager's word).
fn lost(far: &FarMemory, at: SpanAddr, e: RpcError) -> RuntimeError {
    if !e.is_node_down() && !e.is_region_gone() {
        return RuntimeError::Rpc(e);
    }
    tracing::debug!("span r{}:p{}: {e}", at.region, at.page);
    if far.is_dead(far.regions().get(at.region).grant.node) {
        RuntimeError::lost(at, LossCause::NoRedundancy { scheme: "non-ft" })
    } else {
        RuntimeError::unavailable(at, format!("its only copy's memory node cannot serve it: {e}"))
    }
}

impl Scheme for NonFt {
    fn name(&self) -> &'static str {
        "non-ft"
    }

    fn swap_out(&self, far: &FarMemory, spans: &[&[u8]], _sums: &[u64]) -> Result<Vec<SpanAddr>, RuntimeError> {
        let mut err: Option<(Option<NodeId>, RuntimeError)> = None;
        // Placed one by one (round robin over the nodes), then written with
        // one request per memory node, all in flight at once: a batch costs
        // each node one wake-up, not one per span.
        let mut placed: Vec<(SpanAddr, u32)> = Vec::with_capacity(spans.len());
        let mut batches: Vec<NodeWrites<'_, ()>> = Vec::new();
        for s in spans {
            let pages = (s.len() / PAGE_SIZE) as u32;
            let (g, at) = match self.place.place(far, &[pages], &[]) {
                Ok(p) => p,
                Err(e) => {
                    err = Some((None, e));
                    break;
                }
            };
            let grp = self.place.group(g);
            let (region, page) = (grp.regions[0], at[0]);
            placed.push((SpanAddr { region, page }, pages));
            // `client` reconnects when the region's connection broke earlier.
            match far.regions().client(region) {
                Ok((r, c)) => node_writes::add(
                    &mut batches,
                    (grp.nodes[0], c),
                    r.grant.cap,
                    page as u64 * PAGE_SIZE as u64,
                    s,
                    (),
                ),
                Err(e) => {
                    err = Some((Some(grp.nodes[0]), e));
                    break;
                }
            }
        }
        let mut inflight = Vec::with_capacity(batches.len());
        if err.is_none() {
            for b in batches {
                match b.send() {
                    Ok(t) => inflight.push((t, b.link, b.node)),
                    Err(e) => {
                        err = Some((Some(b.node), e.into()));
                        break;
                    }
                }
            }
        }
        for (t, c, node) in inflight {
            if let Err(e) = c.wait_write(t) {
                err.get_or_insert((Some(node), e.into()));
            }
        }
        if let Some((node, e)) = err {
            // Nothing stays half-placed: the caller keeps every span local,
            // and the next attempt avoids the node that failed for a while.
            if let Some(n) = node {
                far.suspect(n);
            }
            for (at, pages) in placed {
                far.pages().free(at.region, at.page, pages);
            }
            return Err(e);
        }
        Ok(placed.into_iter().map(|(at, _)| at).collect())
    }

    fn read_copy(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<CopyRead, RuntimeError> {
        // A node whose lease lapsed, or a broken connection, is not a dead
        // node: the read path tries again (on a new connection: the region
        // table opens one) until the outage deadline. Only a node the
        // manager declared dead has lost the span.
        let (r, c) = far.regions().reader(at.region).map_err(|e| match e {
            RuntimeError::Rpc(e) => lost(far, at, e),
            other => other,
        })?;
        c.read(r.grant.cap, at.page as u64 * PAGE_SIZE as u64, dest)
            .map(|()| CopyRead::Read)
            .map_err(|e| lost(far, at, e))
    }

    fn release(&self, far: &FarMemory, at: SpanAddr, pages: u32) {
        far.pages().free(at.region, at.page, pages);
    }

    fn keep(&self, _far: &FarMemory, _at: SpanAddr, pages: u32) -> Option<u64> {
        // The pages stay allocated: nothing else can take them.
        self.kept_pages.fetch_add(pages as u64, Ordering::Relaxed);
        Some(0)
    }

    fn reuse(&self, far: &FarMemory, at: SpanAddr, pages: u32, _token: u64) -> bool {
        // The kept copy is the only one: never bet the span on a node we
        // can no longer reach (the caller then writes it elsewhere).
        if far.regions().client(at.region).is_err() {
            return false;
        }
        self.kept_pages.fetch_sub(pages as u64, Ordering::Relaxed);
        true
    }

    // A copy that `reuse` refused stays kept until the caller drops it.
    fn drop_kept(&self, far: &FarMemory, at: SpanAddr, pages: u32, _token: u64) {
        self.kept_pages.fetch_sub(pages as u64, Ordering::Relaxed);
        far.pages().free(at.region, at.page, pages);
    }

    fn give_back(&self, far: &FarMemory) -> u64 {
        self.place.give_back_empty(far)
    }

    fn report(&self) -> SchemeReport {
        SchemeReport {
            kept_bytes: self.kept_pages.load(Ordering::Relaxed) * PAGE_SIZE as u64,
            ..SchemeReport::default()
        }
    }
}
