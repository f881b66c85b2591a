//! Ruling on a compute node's suspicion of a memory node.
//!
//! A compute node sees a failure first: a connection error, or a request
//! overdue well beyond what reads usually take. It reads around the node at
//! once and asks the manager to rule, so recovery need not wait for the full
//! heartbeat timeout. The manager probes the node itself (a fresh connection
//! and a ping), and:
//! - the node answers, or heartbeats after the suspicion began: **alive**,
//!   and the compute node stops reading around it;
//! - its port refuses connections: nothing serves there any more, so it is
//!   declared dead at once;
//! - it stays silent: it is declared dead only once its lease must have
//!   lapsed (no heartbeat for [`LEASE_INTERVALS`] intervals, two thirds of
//!   the heartbeat timeout) and at least [`MIN_SILENT_PROBES`] probes went
//!   unanswered. A paused or cut-off node has stopped serving by then, and a
//!   scheduling hiccup shorter than the lease never fences a live node;
//! - in the first heartbeat timeout after this manager took the lead, a
//!   node it has not heard from since is not declared dead: nodes that
//!   waited out the change of leader reconnect meanwhile.
//!
//! Only the leader rules, and a verdict of alive is given only once a
//! quorum still follows it.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::msg::{LEASE_INTERVALS, MgrResponse};
use remora_proto::{
    ClusterKey, ConnOptions, MemNodeClient, MemTransport, NodeId, NodeState, RemoteError, Session, TlsConfig,
};

use super::{Shared, heartbeat_interval, lock};
use crate::machine::{Command, Gone};

/// How long one probe may take (connect, hello and ping).
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// Pause between probes.
const PROBE_EVERY: Duration = Duration::from_millis(100);
/// Unanswered probes needed before a silent node is declared dead.
const MIN_SILENT_PROBES: u32 = 2;

/// What one probe of a node found.
#[derive(Debug, PartialEq)]
enum Probe {
    Answered,
    /// Nothing listens at the address: the process is gone.
    Refused,
    /// No answer in time (paused, cut off, or very slow).
    Silent,
}

fn probe(addr: &str, key: Option<ClusterKey>, tls: Option<TlsConfig>) -> Probe {
    let Some(sa): Option<SocketAddr> = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return Probe::Silent;
    };
    match TcpStream::connect_timeout(&sa, PROBE_TIMEOUT) {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Probe::Refused,
        Err(_) => return Probe::Silent,
        Ok(_) => {}
    }
    let opts = ConnOptions {
        connect_timeout: PROBE_TIMEOUT,
        call_timeout: PROBE_TIMEOUT,
        stall_limit: PROBE_TIMEOUT,
        cluster_key: key,
        tls,
    };
    match MemNodeClient::connect_control(addr, opts).and_then(|c| c.ping()) {
        Ok(()) => Probe::Answered,
        Err(_) => Probe::Silent,
    }
}

/// Rules on `session`'s suspicion of `node` (see the module docs). Blocks
/// for up to the node's lease, so it runs on its own thread.
pub(super) fn rule(shared: &Shared, session: Session, node: NodeId) -> Result<MgrResponse, RemoteError> {
    let start = Instant::now();
    let lease = Duration::from_millis(u64::from(heartbeat_interval(shared.timeout))) * LEASE_INTERVALS;
    let node_state = |shared: &Shared| -> Result<(NodeState, String), RemoteError> {
        let st = shared.machine();
        st.machine.check_session(&session)?;
        let n = st.machine.nodes.get(&node).ok_or(RemoteError::Unknown)?;
        Ok((n.state, n.addr.clone()))
    };
    shared.confirm_leader()?;
    let (state, addr) = node_state(shared)?;
    if state == NodeState::Dead {
        return Ok(MgrResponse::Verdict { alive: false });
    }
    let mut silent = 0;
    loop {
        let found = probe(&addr, shared.cluster_key, shared.tls.clone());
        if node_state(shared)?.0 == NodeState::Dead {
            return Ok(MgrResponse::Verdict { alive: false });
        }
        let (last_seen, since) = {
            let live = shared.live();
            (live.node_seen(node), live.since)
        };
        let heard = last_seen > start;
        let quiet_for = last_seen.elapsed();
        match found {
            Probe::Answered | Probe::Silent | Probe::Refused if heard || found == Probe::Answered => {
                let how = if found == Probe::Answered {
                    "it answers"
                } else {
                    "it heartbeats"
                };
                // Alive only as long as this member still leads.
                shared.confirm_leader()?;
                tracing::info!(
                    "compute node {} suspected memory node {node} at {addr}: {how}",
                    session.id
                );
                return Ok(MgrResponse::Verdict { alive: true });
            }
            // Just took over and not heard from since: the node may still
            // be reconnecting after the change (a refused port can be a
            // restarting daemon). Its heartbeats or the monitor decide once
            // a full timeout has passed since.
            _ if last_seen <= since && since.elapsed() < shared.timeout => {
                if shared.stop.load(Ordering::Acquire) {
                    return Err(RemoteError::Internal("the manager is shutting down".into()));
                }
                thread::sleep(PROBE_EVERY);
                continue;
            }
            Probe::Refused => {
                tracing::warn!(
                    "memory node {node} at {addr} refuses connections (suspected by compute node {}): declared dead",
                    session.id
                );
            }
            _ => {
                silent += 1;
                if silent < MIN_SILENT_PROBES || quiet_for < lease {
                    if shared.stop.load(Ordering::Acquire) {
                        return Err(RemoteError::Internal("the manager is shutting down".into()));
                    }
                    thread::sleep(PROBE_EVERY);
                    continue;
                }
                tracing::warn!(
                    "memory node {node} at {addr} silent for {quiet_for:?}, past its lease of {lease:?}, and \
                     unanswered to {silent} probes (suspected by compute node {}): declared dead",
                    session.id
                );
            }
        }
        shared.propose(Command::NodeGone { node, why: Gone::Dead })?;
        lock(&shared.admin_conns).remove(&node);
        return Ok(MgrResponse::Verdict { alive: false });
    }
}
