//! The runtime's background threads: eviction, and the manager's notices
//! (whose thread also gives empty regions back now and then).

use std::collections::HashSet;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::NodeId;

use super::Inner;
use crate::scheme::Departure;

/// How often empty regions are given back to the manager.
const GIVE_BACK_EVERY: Duration = Duration::from_secs(1);

/// Turns the manager's notices into recovery, and gives empty regions back.
pub(super) fn notice_loop(
    weak: &std::sync::Weak<Inner>,
    events: &std::sync::mpsc::Receiver<remora_proto::SessionEvent>,
) {
    let mut last_give_back = Instant::now();
    // Draining nodes some of whose spans could not move yet (their stripe
    // group had lost m positions): asked about again every second.
    let mut draining: HashSet<NodeId> = HashSet::new();
    loop {
        let ev = match events.recv_timeout(Duration::from_millis(100)) {
            Ok(ev) => ev,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => match weak.upgrade() {
                Some(inner) if !inner.lifecycle.stopping() => {
                    if last_give_back.elapsed() >= GIVE_BACK_EVERY {
                        inner.give_back_empty();
                        draining.retain(|&n| inner.scheme.node_left(&inner.far, n, Departure::Draining));
                        last_give_back = Instant::now();
                    }
                    continue;
                }
                _ => return,
            },
            Err(_) => return,
        };
        let Some(inner) = weak.upgrade() else { return };
        match ev {
            remora_proto::SessionEvent::Manager(e) => match e.kind {
                remora_proto::EventKind::NodeDead { node, addr, regions } => {
                    tracing::warn!(
                        "memory node {node} at {addr} died, holding {} of our regions",
                        regions.len()
                    );
                    draining.remove(&node);
                    inner.far.declare_dead(node);
                    inner.far.regions().sever(&addr);
                    inner.scheme.node_left(&inner.far, node, Departure::Died);
                }
                remora_proto::EventKind::NodeDraining { node, addr, regions } => {
                    tracing::info!(
                        "memory node {node} at {addr} is draining, holding {} of our regions: moving them",
                        regions.len()
                    );
                    if inner.scheme.node_left(&inner.far, node, Departure::Draining) {
                        draining.insert(node);
                    }
                }
            },
            remora_proto::SessionEvent::Resync => tracing::info!("manager restarted"),
            remora_proto::SessionEvent::Expired => {
                inner.lifecycle.expire();
                tracing::error!("the manager declared this compute node dead: far memory is gone")
            }
        }
    }
}

/// Puts each suspected memory node to the manager (see `crate::detector`):
/// an alive verdict lifts the suspicion; a dead one arrives as a `NodeDead`
/// notice too, which starts recovery.
pub(super) fn confirm_loop(weak: &std::sync::Weak<Inner>) {
    loop {
        let node = {
            let Some(inner) = weak.upgrade() else { return };
            if inner.lifecycle.stopping() {
                return;
            }
            match inner
                .far
                .detector()
                .suspects
                .next_to_confirm(Duration::from_millis(100))
            {
                Some(n) => n,
                None => continue,
            }
        };
        // The verdict may take the node's lease: no strong reference
        // meanwhile, so a runtime dropped now is not kept alive by it.
        let backend = match weak.upgrade() {
            Some(inner) => Arc::clone(inner.far.backend()),
            None => return,
        };
        let verdict = backend.confirm(node);
        let Some(inner) = weak.upgrade() else { return };
        let suspects = &inner.far.detector().suspects;
        match verdict {
            Ok(alive) => {
                if alive {
                    tracing::info!(
                        "memory node {node} failed us, but the manager finds it alive: reading from it again"
                    );
                } else {
                    tracing::warn!("the manager confirms memory node {node} dead");
                }
                suspects.ruled(node, alive);
            }
            Err(e) => {
                tracing::debug!("asking the manager about {node}: {e}");
                suspects.unasked(node);
            }
        }
    }
}

/// How often an eviction thread drops kept far copies whose span went away.
const KEPT_SWEEP_EVERY: Duration = Duration::from_millis(200);

pub(super) fn eviction_loop(weak: &std::sync::Weak<Inner>) {
    let mut last_sweep = Instant::now();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.lifecycle.stopping() {
            return;
        }
        if last_sweep.elapsed() >= KEPT_SWEEP_EVERY {
            inner.sweep_kept();
            last_sweep = Instant::now();
        }
        if inner.heap.bytes_in_use() as u64 > inner.pressure.high_bytes() {
            let mut stuck = 0;
            while (inner.heap.bytes_in_use() as u64) > inner.pressure.low_bytes() && !inner.lifecycle.stopping() {
                let n = inner.evict_round();
                if n > 0 {
                    inner.pressure.progressed();
                    stuck = 0;
                } else {
                    stuck += 1;
                    if stuck > 3 {
                        break;
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
        while inner.queued_cold_due() && !inner.lifecycle.stopping() {
            if inner.evict_queued_round() == 0 {
                break;
            }
        }
        // Spans to re-stripe come back a batch at a time while there is
        // room, and go out again with the cold ones.
        let restriping = inner.restripe_round() > 0;
        // Sleep until kicked. Announce the sleep, then look at the level
        // again: a kick between the two sees us idle (both sides SeqCst).
        inner.pressure.idle(Duration::from_millis(100), || {
            inner.heap.bytes_in_use() as u64 > inner.pressure.high_bytes() || restriping || inner.lifecycle.stopping()
        });
    }
}

impl Inner {
    /// Whether a batch of spans the filter queued as cold should go now,
    /// below the high watermark: above the low one, they would otherwise
    /// fill the band between the two until the next round, and hot objects
    /// would get only the low watermark's worth of local memory.
    pub(super) fn queued_cold_due(&self) -> bool {
        self.heap.bytes_in_use() as u64 > self.pressure.low_bytes() && self.heap.cold_queued() >= self.pressure.batch()
    }

    /// Hands the scheme's empty regions back to the manager.
    pub(super) fn give_back_empty(&self) -> u64 {
        let bytes = self.scheme.give_back(&self.far);
        self.counters.gave_back(bytes);
        bytes
    }
}
