//! Handing out regions: picking free ones across live memory nodes,
//! granting them (the grant is stored before the memory node hears of it),
//! and the admin calls that grant and revoke on a memory node.

use super::*;

/// Picks `count` free regions on live, non-draining nodes not in `exclude`;
/// with `distinct`, on `count` different nodes. Spreads over the nodes with
/// the most free regions.
fn pick(st: &State, count: u32, distinct: bool, exclude: &[NodeId]) -> Result<Vec<RegionId>, RemoteError> {
    let mut free: BTreeMap<NodeId, Vec<RegionId>> = BTreeMap::new();
    for (id, r) in &st.regions {
        if r.owner.is_none()
            && !exclude.contains(&r.node)
            && st.nodes.get(&r.node).is_some_and(|n| n.rec.state == NodeState::Alive)
        {
            free.entry(r.node).or_default().push(*id);
        }
    }
    let available = if distinct {
        free.len()
    } else {
        free.values().map(Vec::len).sum()
    };
    if available < count as usize {
        return Err(RemoteError::NoCapacity {
            wanted: count,
            available: available as u32,
        });
    }
    let mut out = Vec::with_capacity(count as usize);
    while out.len() < count as usize {
        let (&node, _) = free
            .iter()
            .max_by_key(|(n, v)| (v.len(), std::cmp::Reverse(**n)))
            .expect("checked capacity");
        let v = free.get_mut(&node).expect("present");
        out.push(v.remove(0));
        if distinct || v.is_empty() {
            free.remove(&node);
        }
    }
    Ok(out)
}

pub(crate) fn alloc(
    shared: &Shared,
    session: Session,
    count: u32,
    distinct: bool,
    mut exclude: Vec<NodeId>,
) -> Result<MgrResponse, RemoteError> {
    if count == 0 {
        return Ok(MgrResponse::Regions(Vec::new()));
    }
    // Reserve under the lock, grant on the memory nodes without it (a slow
    // node must not stall heartbeats), then commit.
    for _attempt in 0..3 {
        let (picked, ahead): (Vec<(RegionId, NodeId, Token, u64)>, Batch) = {
            let mut st = lock(&shared.state);
            check_session(&st, &session)?;
            let ids = pick(&st, count, distinct, &exclude)?;
            let mut ahead = Batch::default();
            let picked = ids
                .into_iter()
                .map(|id| {
                    let token = Token::random();
                    let r = st.regions.get_mut(&id).expect("picked from the table");
                    r.epoch += 1;
                    // Stored before the grant leaves: a manager restarted
                    // after it must not issue the same epoch again.
                    ahead.region(
                        id,
                        &RegionRec {
                            owner: None,
                            ..r.clone()
                        },
                    );
                    r.owner = Some((session.id, token));
                    (id, r.node, token, r.epoch)
                })
                .collect();
            (picked, ahead)
        };
        if let Err(e) = shared.store.commit(&ahead) {
            let mut st = lock(&shared.state);
            for (id, _, _, _) in &picked {
                if let Some(r) = st.regions.get_mut(id) {
                    r.owner = None;
                }
            }
            return Err(internal(e));
        }
        let mut failed = Vec::new();
        for (id, node, token, epoch) in &picked {
            if let Err(e) = admin_call(shared, *node, |c, k| c.grant(k, *id, session.id, *token, *epoch)) {
                tracing::warn!("grant of {id} on {node} failed: {e}");
                failed.push(*node);
            }
        }
        let mut st = lock(&shared.state);
        if failed.is_empty() {
            let mut b = Batch::default();
            for (id, _, _, _) in &picked {
                b.region(*id, &st.regions[id]);
            }
            if let Err(e) = shared.store.commit(&b) {
                for (id, _, _, _) in &picked {
                    if let Some(r) = st.regions.get_mut(id) {
                        r.owner = None;
                    }
                }
                return Err(internal(e));
            }
            tracing::info!(
                "allocated {count} regions to {}: {:?}",
                session.id,
                picked.iter().map(|p| p.0.0).collect::<Vec<_>>()
            );
            return Ok(MgrResponse::Regions(
                picked
                    .iter()
                    .filter_map(|(id, _, _, _)| grant_of(&st, *id, &st.regions[id]))
                    .collect(),
            ));
        }
        for (id, _, _, _) in &picked {
            if let Some(r) = st.regions.get_mut(id) {
                r.owner = None;
            }
        }
        exclude.extend(failed);
    }
    Err(RemoteError::Internal(
        "memory nodes did not accept the grants; try again".into(),
    ))
}

/// Calls an admin method on a memory node, reconnecting once if needed.
fn admin_call(
    shared: &Shared,
    node: NodeId,
    f: impl Fn(&MemNodeClient, Token) -> Result<(), remora_proto::RpcError>,
) -> Result<(), remora_proto::RpcError> {
    let (addr, key) = {
        let st = lock(&shared.state);
        let n = st
            .nodes
            .get(&node)
            .ok_or(remora_proto::RpcError::Remote(RemoteError::Unknown))?;
        (n.rec.addr.clone(), n.rec.admin)
    };
    let opts = ConnOptions {
        connect_timeout: Duration::from_millis(500),
        call_timeout: Duration::from_secs(1),
        stall_limit: Duration::from_secs(2),
        cluster_key: shared.cluster_key,
        tls: shared.tls.clone(),
    };
    let client = {
        let mut conns = lock(&shared.admin_conns);
        match conns.get(&node) {
            Some(c) if !c.conn().is_broken() => c.clone(),
            _ => {
                let c = MemNodeClient::connect_control(&addr, opts)?;
                conns.insert(node, c.clone());
                c
            }
        }
    };
    f(&client, key)
}

pub(crate) fn revoke(shared: &Shared, node: NodeId, region: RegionId, epoch: u64) {
    if let Err(e) = admin_call(shared, node, |c, k| c.revoke(k, region, epoch)) {
        tracing::warn!("revoking {region} on {node} failed: {e}");
    }
}
