//! Handing regions out and taking them back, as the leader: the decision
//! is a command applied through the log (the regions picked and their
//! epochs bumped, module `machine`), then the leader tells the memory nodes.
//! Telling them is idempotent, so a grant retried after a change of leader
//! (the same request number, answered from the log) is simply told again.

use std::time::Duration;

use remora_proto::msg::MgrResponse;
use remora_proto::{ConnOptions, MemNodeClient, NodeId, RegionId, RemoteError, Session, Token};

use crate::machine::{Command, Outcome};
use crate::requests::grant_of;
use crate::{Shared, lock};

/// Regions one request may ask for.
const MAX_ALLOC: u32 = 4096;

pub(crate) fn alloc(
    shared: &Shared,
    session: Session,
    seq: u64,
    count: u32,
    distinct: bool,
    mut exclude: Vec<NodeId>,
) -> Result<MgrResponse, RemoteError> {
    if count == 0 {
        return Ok(MgrResponse::Regions(Vec::new()));
    }
    if count > MAX_ALLOC {
        return Err(RemoteError::BadRequest(format!(
            "at most {MAX_ALLOC} regions per request"
        )));
    }
    for _attempt in 0..3 {
        let tokens = (0..count).map(|_| Token::random()).collect();
        let o = shared.propose(Command::Grant {
            session,
            seq,
            count,
            distinct,
            exclude: exclude.clone(),
            tokens,
        })?;
        let Outcome::Granted(granted) = o else {
            return Err(RemoteError::Internal(format!("grant answered {o:?}")));
        };
        let mut failed = Vec::new();
        for g in &granted {
            if let Err(e) = admin_call(shared, g.node, |c, k| {
                c.grant(k, g.region, session.id, g.token, g.epoch)
            }) {
                tracing::warn!("grant of {} on {} failed: {e}", g.region, g.node);
                failed.push(g.node);
            }
        }
        if failed.is_empty() {
            tracing::info!(
                "allocated {count} regions to {}: {:?}",
                session.id,
                granted.iter().map(|g| g.region.0).collect::<Vec<_>>()
            );
            let st = shared.machine();
            return Ok(MgrResponse::Regions(
                granted
                    .iter()
                    .filter_map(|g| {
                        let r = st.machine.regions.get(&g.region)?;
                        // Taken back meanwhile (its node died): not granted after all.
                        (r.owner == Some((session.id, g.token)) && r.epoch == g.epoch)
                            .then(|| grant_of(&st.machine, g.region, r))
                            .flatten()
                    })
                    .collect(),
            ));
        }
        shared.propose(Command::Ungrant {
            session,
            seq,
            regions: granted.iter().map(|g| (g.region, g.token)).collect(),
        })?;
        exclude.extend(failed);
    }
    Err(RemoteError::Internal(
        "memory nodes did not accept the grants; try again".into(),
    ))
}

pub(crate) fn free(shared: &Shared, session: Session, seq: u64, region: RegionId) -> Result<MgrResponse, RemoteError> {
    let o = shared.propose(Command::Free { session, seq, region })?;
    let Outcome::Freeing { node, region, epoch } = o else {
        return Err(RemoteError::Internal(format!("free answered {o:?}")));
    };
    // Revoked while still taken; if the revoke fails, the leader's
    // monitor tries again before the region goes back to the pool.
    if revoke(shared, node, region, epoch) {
        shared.propose(Command::Released {
            regions: vec![(region, epoch)],
        })?;
    }
    Ok(MgrResponse::Ok)
}

/// Calls an admin method on a memory node, reconnecting once if needed.
fn admin_call(
    shared: &Shared,
    node: NodeId,
    f: impl Fn(&MemNodeClient, Token) -> Result<(), remora_proto::RpcError>,
) -> Result<(), remora_proto::RpcError> {
    let (addr, key) = {
        let st = shared.machine();
        let n = st
            .machine
            .nodes
            .get(&node)
            .ok_or(remora_proto::RpcError::Remote(RemoteError::Unknown))?;
        (n.addr.clone(), n.admin)
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

/// Revokes `region` at `epoch` on `node`: true if the node confirmed it.
pub(crate) fn revoke(shared: &Shared, node: NodeId, region: RegionId, epoch: u64) -> bool {
    match admin_call(shared, node, |c, k| c.revoke(k, region, epoch)) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("revoking {region} on {node} failed: {e}");
            false
        }
    }
}
