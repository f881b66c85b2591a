//! Liveness: declaring silent memory nodes dead and telling the owners of
//! their regions, and reaping the regions of dead compute nodes.

use super::*;

/// Queues an event for every compute node holding regions of `node`.
pub(crate) fn notify_owners(st: &mut State, rec: &NodeRec, make: impl Fn(Vec<RegionId>) -> EventKind) {
    let mut by_owner: BTreeMap<ComputeId, Vec<RegionId>> = BTreeMap::new();
    for r in &rec.regions {
        if let Some((owner, _)) = st.regions.get(r).and_then(|r| r.owner) {
            by_owner.entry(owner).or_default().push(*r);
        }
    }
    for (owner, regions) in by_owner {
        if let Some(c) = st.computes.get_mut(&owner) {
            let seq = c.next_seq;
            c.next_seq += 1;
            c.events.push_back(Event {
                seq,
                kind: make(regions),
            });
            while c.events.len() > MAX_EVENTS_KEPT {
                c.events.pop_front();
            }
        }
    }
}

/// A memory node died or left: its regions leave the pool and owners are told.
pub(crate) fn node_gone(shared: &Shared, st: &mut State, id: NodeId) -> Result<(), StoreError> {
    let Some(n) = st.nodes.get_mut(&id) else { return Ok(()) };
    n.rec.state = NodeState::Dead;
    let rec = n.rec.clone();
    notify_owners(st, &rec, |regions| EventKind::NodeDead {
        node: id,
        addr: rec.addr.clone(),
        regions,
    });
    let mut b = Batch::default();
    b.node(id, &rec);
    for r in &rec.regions {
        if let Some(reg) = st.regions.get_mut(r) {
            if reg.owner.take().is_some() {
                reg.epoch += 1;
            }
            b.region(*r, reg);
        }
    }
    shared.store.commit(&b)?;
    lock(&shared.admin_conns).remove(&id);
    shared.events_cv.notify_all();
    Ok(())
}

/// Declares silent nodes dead, every tenth of the timeout.
pub(crate) fn monitor(shared: &Shared) {
    let tick = (shared.timeout / 10).max(Duration::from_millis(10));
    while !shared.stop.load(Ordering::Acquire) {
        thread::park_timeout(tick);
        let now = Instant::now();
        {
            let mut st = lock(&shared.state);
            let dead_nodes: Vec<NodeId> = st
                .nodes
                .iter()
                .filter(|(_, n)| n.rec.state != NodeState::Dead && now - n.last_seen > shared.timeout)
                .map(|(id, _)| *id)
                .collect();
            for id in dead_nodes {
                tracing::warn!(
                    "memory node {id} at {} missed heartbeats for {:?}: declared dead",
                    st.nodes[&id].rec.addr,
                    shared.timeout
                );
                if let Err(e) = node_gone(shared, &mut st, id) {
                    tracing::error!("{e}");
                }
            }
            let dead_computes: Vec<ComputeId> = st
                .computes
                .iter()
                .filter(|(_, c)| c.rec.state == ComputeState::Alive && now - c.last_seen > shared.timeout)
                .map(|(id, _)| *id)
                .collect();
            for id in dead_computes {
                let c = st.computes.get_mut(&id).expect("listed");
                c.rec.state = ComputeState::Dead;
                let rec = c.rec.clone();
                tracing::warn!(
                    "compute node {id} ({}) missed heartbeats: declared dead, freeing its regions",
                    rec.name
                );
                if let Err(e) = shared.store.commit(Batch::default().compute(id, &rec)) {
                    tracing::error!("{e}");
                }
            }
        }
        reap(shared);
    }
}

/// Frees the regions still held by dead compute nodes: revoke on the memory
/// node first, then return to the pool. Also finishes a reap that a manager
/// crash interrupted, since the dead state is stored before the regions move.
fn reap(shared: &Shared) {
    let todo: Vec<(RegionId, NodeId, ComputeId, bool, u64)> = {
        let mut st = lock(&shared.state);
        let st = &mut *st;
        st.regions
            .iter_mut()
            .filter_map(|(id, r)| {
                let (owner, _) = r.owner?;
                let dead = st
                    .computes
                    .get(&owner)
                    .is_none_or(|c| c.rec.state == ComputeState::Dead);
                let node_live = st.nodes.get(&r.node).is_some_and(|n| n.rec.state != NodeState::Dead);
                if !dead {
                    return None;
                }
                // The revoke is a reassignment: from here on the dead
                // node's capabilities, and deltas its peers still push for
                // it, are refused as stale.
                r.epoch += 1;
                Some((*id, r.node, owner, node_live, r.epoch))
            })
            .collect()
    };
    if todo.is_empty() {
        return;
    }
    for (region, node, _, live, epoch) in &todo {
        if *live {
            revoke(shared, *node, *region, *epoch);
        }
    }
    let mut st = lock(&shared.state);
    let mut b = Batch::default();
    for (region, _, owner, _, _) in &todo {
        if let Some(r) = st.regions.get_mut(region) {
            if r.owner.map(|(o, _)| o) == Some(*owner) {
                r.owner = None;
                b.region(*region, r);
            }
        }
    }
    if let Err(e) = shared.store.commit(&b) {
        tracing::error!("{e}");
    }
    tracing::info!("returned {} regions of dead compute nodes to the pool", todo.len());
}
