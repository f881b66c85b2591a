//! Liveness, as the leader: declaring silent memory and compute nodes dead
//! (commands through the log), and revoking the regions taken from their
//! owners before they return to the pool.

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::{ComputeId, NodeId, NodeState, RegionId};

use crate::machine::{Command, Gone};
use crate::{Shared, allocation, lock};

/// Every tenth of the timeout, while this member leads.
pub(crate) fn monitor(shared: &Shared) {
    let tick = (shared.timeout / 10).max(Duration::from_millis(10));
    while !shared.stop.load(Ordering::Acquire) {
        thread::park_timeout(tick);
        if !shared.group.leads() {
            continue;
        }
        let now = Instant::now();
        let (dead_nodes, dead_computes) = {
            let st = shared.machine();
            let live = shared.live();
            let nodes: Vec<(NodeId, String)> = st
                .machine
                .nodes
                .iter()
                .filter(|(id, n)| n.state != NodeState::Dead && now - live.node_seen(**id) > shared.timeout)
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect();
            let computes: Vec<(ComputeId, String)> = st
                .machine
                .computes
                .iter()
                .filter(|(id, c)| {
                    c.rec.state == remora_proto::msg::ComputeState::Alive
                        && now - live.compute_seen(**id) > shared.timeout
                })
                .map(|(id, c)| (*id, c.rec.name.clone()))
                .collect();
            (nodes, computes)
        };
        for (id, addr) in dead_nodes {
            tracing::warn!(
                "memory node {id} at {addr} missed heartbeats for {:?}: declared dead",
                shared.timeout
            );
            match shared.propose(Command::NodeGone {
                node: id,
                why: Gone::Dead,
            }) {
                Ok(_) => {
                    lock(&shared.admin_conns).remove(&id);
                }
                Err(e) => tracing::warn!("declaring memory node {id} dead: {e}"),
            }
        }
        for (id, name) in dead_computes {
            tracing::warn!("compute node {id} ({name}) missed heartbeats: declared dead, freeing its regions");
            if let Err(e) = shared.propose(Command::ComputeDead { compute: id }) {
                tracing::warn!("declaring compute node {id} dead: {e}");
            }
        }
        release(shared);
    }
}

/// Revokes the regions taken from their owners (freed, or their owner
/// died) on their memory nodes, then returns them to the pool. Also
/// finishes what a previous leader began.
fn release(shared: &Shared) {
    let todo = shared.machine().machine.freeing();
    if todo.is_empty() {
        return;
    }
    let done: Vec<(RegionId, u64)> = todo
        .into_iter()
        .filter(|(region, node, epoch, live)| !*live || allocation::revoke(shared, *node, *region, *epoch))
        .map(|(region, _, epoch, _)| (region, epoch))
        .collect();
    let n = done.len();
    if n == 0 {
        return;
    }
    match shared.propose(Command::Released { regions: done }) {
        Ok(_) => tracing::info!("returned {n} regions taken from their owners to the pool"),
        Err(e) => tracing::warn!("returning regions to the pool: {e}"),
    }
}
