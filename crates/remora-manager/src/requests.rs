//! Serving requests: reading them off a connection, the Raft group's
//! messages handed to the group, the rest answered from (or proposed to)
//! the replicated state, and status reports.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::frame::{FrameKind, FrameReader, MAX_PAYLOAD_LEN, ReadError};
use remora_proto::msg::{
    ClusterStatus, ComputeStatus, Event, ManagerRole, ManagerStatus, MemNodeStatus, MgrRequest, MgrResponse, NodeLoad,
    PeerTraffic, decode,
};
use remora_proto::server::{ConnGuard, Responder};
use remora_proto::{Cap, NodeState, RegionGrant, RegionId, RemoteError, Rights, RpcConn, Session, Stream, Token};

use crate::machine::{Command, Gone, Machine, Outcome, Region};
use crate::{Live, Seen, Shared, allocation, consensus, heartbeat_interval, lock, suspect};

pub(crate) fn serve(shared: &Arc<Shared>, sock: Stream, guard: ConnGuard) {
    let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let stall = guard.request_deadline();
    let out = match sock.try_clone().and_then(|s| Responder::new(s, stall)) {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!("connection from {peer}: {e}");
            return;
        }
    };
    let mut rd = FrameReader::new(sock, stall);
    loop {
        let hdr = match rd.next_header() {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(ReadError::Closed) => return,
            Err(e) => {
                tracing::warn!("closing connection from {peer}: {e}");
                return;
            }
        };
        if hdr.kind != FrameKind::Request || hdr.payload_len > MAX_PAYLOAD_LEN {
            tracing::warn!("closing connection from {peer}: unexpected frame {hdr:?}");
            return;
        }
        let read = rd
            .read_vec(hdr.head_len as usize)
            .map_err(|e| e.to_string())
            .and_then(|h| {
                let req: MgrRequest = decode(&h).map_err(|e| e.to_string())?;
                let body = match (&req, hdr.payload_len) {
                    (_, 0) => Vec::new(),
                    (MgrRequest::Raft { .. }, n) => rd.read_vec(n as usize).map_err(|e| e.to_string())?,
                    (_, n) => return Err(format!("a payload of {n} bytes on a request that takes none")),
                };
                Ok((req, body))
            });
        let (req, body) = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("closing connection from {peer}: {e}");
                return;
            }
        };
        let id = hdr.id;
        if let Err(e) = check(&req) {
            if out.err(id, &e).is_err() {
                return;
            }
            continue;
        }
        let sent = match req {
            MgrRequest::Raft { from, .. } if shared.isolation.cuts(from) => out.err(id, &RemoteError::Unavailable),
            MgrRequest::Raft { rpc, .. } => match consensus::network::serve(&shared.group, rpc, &body) {
                Ok(answer) => out.ok(id, &MgrResponse::Raft, &[&answer]),
                Err(e) => out.err(id, &RemoteError::BadRequest(e)),
            },
            // Probing takes up to the node's lease, and a long poll up to
            // its timeout: each on its own thread, so this connection keeps serving.
            MgrRequest::Suspect { session, node } => aside(shared, &out, id, "manager-suspect", move |s| {
                suspect::rule(s, session, node)
            }),
            MgrRequest::WaitEvents {
                session,
                after,
                timeout_ms,
            } => aside(shared, &out, id, "manager-poll", move |s| {
                wait_events(s, session, after, Duration::from_millis(timeout_ms.min(30_000) as u64))
            }),
            req => match handle(shared, req) {
                Ok(m) => out.ok(id, &m, &[]),
                Err(e) => out.err(id, &e),
            },
        };
        if let Err(e) = sent {
            tracing::debug!("reply to {peer} failed: {e}");
            return;
        }
    }
}

/// The longest name or address a request may carry (a compute node's
/// name, a memory node's address): they are kept in the replicated state.
pub(crate) const MAX_NAME_LEN: usize = 255;
/// The most regions one `Alloc` may ask for.
pub(crate) const MAX_ALLOC: u32 = 4096;
/// The most nodes an `Alloc` may exclude, and members an `Isolate` may name.
const MAX_LIST_LEN: usize = 4096;
/// Requests answered on threads of their own at once (`Suspect` probes,
/// `WaitEvents` long polls); more are refused with `Busy`.
pub(crate) const MAX_ASIDE: usize = 64;

/// Refuses a request whose sizes exceed what the manager stores or
/// computes for one request, before anything is proposed.
fn check(req: &MgrRequest) -> Result<(), RemoteError> {
    let too_long = |what: &str, len: usize, max: usize| {
        Err(RemoteError::BadRequest(format!(
            "{what} of {len} exceeds the limit of {max}"
        )))
    };
    match req {
        MgrRequest::RegisterMemNode { addr, .. } | MgrRequest::Drain { addr } if addr.len() > MAX_NAME_LEN => {
            too_long("an address", addr.len(), MAX_NAME_LEN)
        }
        MgrRequest::RegisterCompute { name, .. } if name.len() > MAX_NAME_LEN => {
            too_long("a name", name.len(), MAX_NAME_LEN)
        }
        MgrRequest::Alloc { count, .. } if *count > MAX_ALLOC => {
            too_long("a count", *count as usize, MAX_ALLOC as usize)
        }
        MgrRequest::Alloc { exclude, .. } if exclude.len() > MAX_LIST_LEN => {
            too_long("an exclusion list", exclude.len(), MAX_LIST_LEN)
        }
        MgrRequest::Isolate { peers, .. } if peers.len() > MAX_LIST_LEN => {
            too_long("a member list", peers.len(), MAX_LIST_LEN)
        }
        _ => Ok(()),
    }
}

/// Answers one request from a thread of its own, at most [`MAX_ASIDE`] at
/// once.
fn aside(
    shared: &Arc<Shared>,
    out: &Responder,
    id: u64,
    name: &str,
    f: impl FnOnce(&Shared) -> Result<MgrResponse, RemoteError> + Send + 'static,
) -> std::io::Result<()> {
    /// A place among the requests answered aside; given back when dropped.
    struct Place(Arc<Shared>);
    impl Drop for Place {
        fn drop(&mut self) {
            self.0.aside.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let place = Place(Arc::clone(shared));
    if shared.aside.fetch_add(1, Ordering::AcqRel) >= MAX_ASIDE {
        return out.err(
            id,
            &RemoteError::Busy(format!("{MAX_ASIDE} probes and long polls already under way")),
        );
    }
    let o = out.clone();
    let spawned = thread::Builder::new().name(name.into()).spawn(move || {
        let _ = match f(&place.0) {
            Ok(m) => o.ok(id, &m, &[]),
            Err(e) => o.err(id, &e),
        };
        drop(place);
    });
    match spawned {
        Ok(_) => Ok(()),
        Err(e) => out.err(id, &RemoteError::Internal(e.to_string())),
    }
}

fn handle(shared: &Shared, req: MgrRequest) -> Result<MgrResponse, RemoteError> {
    match req {
        MgrRequest::RegisterMemNode {
            addr,
            capacity,
            region_size,
            admin,
            request,
        } => {
            let o = shared.propose(Command::RegisterNode {
                addr: addr.clone(),
                capacity,
                region_size,
                admin,
                request,
            })?;
            let Outcome::NodeRegistered { node, regions } = o else {
                return Err(RemoteError::Internal(format!("registration answered {o:?}")));
            };
            shared.live().nodes.insert(
                node,
                Seen {
                    at: Instant::now(),
                    peer: PeerTraffic::default(),
                    load: NodeLoad::default(),
                },
            );
            tracing::info!(
                "memory node {node} registered at {addr}: {} regions of {region_size} bytes",
                regions.len()
            );
            Ok(MgrResponse::MemNodeRegistered {
                node,
                regions,
                heartbeat_interval_ms: heartbeat_interval(shared.timeout),
            })
        }
        MgrRequest::MemNodeHeartbeat {
            node,
            admin,
            peer,
            load,
        } => {
            // Renewing a lease is a promise that no other leader has taken
            // over: a quorum must still follow this one.
            shared.confirm_leader()?;
            let state = {
                let st = shared.machine();
                let n = st.machine.nodes.get(&node).ok_or(RemoteError::Unknown)?;
                if !n.admin.ct_eq(&admin) {
                    return Err(RemoteError::Unauthorized);
                }
                if n.state == NodeState::Dead {
                    return Err(RemoteError::Fenced);
                }
                n.state
            };
            shared.live().nodes.insert(
                node,
                Seen {
                    at: Instant::now(),
                    peer,
                    load,
                },
            );
            Ok(MgrResponse::HeartbeatAck { state })
        }
        MgrRequest::Deregister { node, admin } => {
            let addr = {
                let st = shared.machine();
                let n = st.machine.nodes.get(&node).ok_or(RemoteError::Unknown)?;
                if !n.admin.ct_eq(&admin) {
                    return Err(RemoteError::Unauthorized);
                }
                n.addr.clone()
            };
            shared.propose(Command::NodeGone { node, why: Gone::Left })?;
            lock(&shared.admin_conns).remove(&node);
            tracing::info!("memory node {node} at {addr} deregistered");
            Ok(MgrResponse::Ok)
        }
        MgrRequest::Drain { addr } => {
            shared.propose(Command::Drain { addr: addr.clone() })?;
            tracing::info!("memory node at {addr} is draining");
            Ok(MgrResponse::Ok)
        }
        MgrRequest::RegisterCompute { name, request } => {
            let o = shared.propose(Command::RegisterCompute {
                name: name.clone(),
                secret: Token::random(),
                request,
            })?;
            let Outcome::ComputeRegistered(session) = o else {
                return Err(RemoteError::Internal(format!("registration answered {o:?}")));
            };
            shared.live().computes.insert(session.id, Instant::now());
            tracing::info!("compute node {} ({name}) registered", session.id);
            Ok(MgrResponse::ComputeRegistered {
                session,
                heartbeat_interval_ms: heartbeat_interval(shared.timeout),
                incarnation: shared.machine().machine.meta.incarnation,
            })
        }
        MgrRequest::ComputeHeartbeat { session } => {
            shared.confirm_leader()?;
            shared.machine().machine.check_session(&session)?;
            shared.live().computes.insert(session.id, Instant::now());
            Ok(MgrResponse::Ok)
        }
        MgrRequest::Alloc {
            session,
            seq,
            count,
            distinct,
            exclude,
        } => allocation::alloc(shared, session, seq, count, distinct, exclude),
        MgrRequest::Free { session, seq, region } => allocation::free(shared, session, seq, region),
        MgrRequest::MyRegions { session } => {
            shared.confirm_leader()?;
            let st = shared.machine();
            let m = &st.machine;
            m.check_session(&session)?;
            Ok(MgrResponse::Regions(
                m.regions
                    .iter()
                    .filter(|(_, r)| !r.freeing && r.owner.map(|(c, _)| c) == Some(session.id))
                    .filter_map(|(id, r)| grant_of(m, *id, r))
                    .collect(),
            ))
        }
        MgrRequest::Status => {
            shared.confirm_leader()?;
            let mut s = status(&shared.machine().machine, &shared.live());
            s.managers = managers(shared);
            Ok(MgrResponse::Status(s))
        }
        MgrRequest::Member => Ok(MgrResponse::Member(shared.group.member_status(shared.id, &shared.addr))),
        MgrRequest::Isolate { peers, for_ms } => isolate(shared, peers, for_ms),
        MgrRequest::WaitEvents { .. } | MgrRequest::Suspect { .. } | MgrRequest::Raft { .. } => {
            Err(RemoteError::BadRequest("answered on its own path".into()))
        }
    }
}

#[cfg(feature = "fault-injection")]
fn isolate(shared: &Shared, peers: Vec<u64>, for_ms: u32) -> Result<MgrResponse, RemoteError> {
    tracing::warn!("fault injection: cut off from members {peers:?} for {for_ms} ms");
    shared.isolation.cut(peers, Duration::from_millis(u64::from(for_ms)));
    Ok(MgrResponse::Ok)
}

#[cfg(not(feature = "fault-injection"))]
fn isolate(_: &Shared, _: Vec<u64>, _: u32) -> Result<MgrResponse, RemoteError> {
    Err(RemoteError::Unsupported(
        "fault injection (build with --features fault-injection)".into(),
    ))
}

/// Every member's row of `remora status`, each asked for its own.
fn managers(shared: &Shared) -> Vec<ManagerStatus> {
    let members: Vec<(u64, String)> = shared
        .machine()
        .membership
        .membership()
        .nodes()
        .map(|(id, n)| (*id, n.addr.clone()))
        .collect();
    let opts = shared.conn_options(Duration::from_millis(300));
    members
        .into_iter()
        .map(|(id, addr)| {
            if id == shared.id {
                return shared.group.member_status(id, &shared.addr);
            }
            let asked = RpcConn::connect(&addr, opts.clone()).and_then(|c| {
                let t = c.send(&MgrRequest::Member, &[])?;
                let r = c.wait(t, None, opts.call_timeout)?;
                decode::<MgrResponse>(&r.head).map_err(|e| remora_proto::RpcError::Unexpected(e.to_string()))
            });
            match asked {
                Ok(MgrResponse::Member(m)) => m,
                _ => ManagerStatus {
                    id,
                    addr,
                    role: ManagerRole::Unreachable,
                    term: 0,
                    last_applied: 0,
                    leader: None,
                },
            }
        })
        .collect()
}

pub(crate) fn grant_of(m: &Machine, id: RegionId, r: &Region) -> Option<RegionGrant> {
    let (_, token) = r.owner?;
    let n = m.nodes.get(&r.node)?;
    Some(RegionGrant {
        cap: Cap {
            region: id,
            rights: Rights::ReadWrite,
            token,
            epoch: r.epoch,
        },
        node: r.node,
        addr: n.addr.clone(),
        size: r.size,
        node_state: n.state,
    })
}

fn wait_events(shared: &Shared, session: Session, after: u64, timeout: Duration) -> Result<MgrResponse, RemoteError> {
    if !shared.group.leads() {
        return Err(shared.group.not_leader());
    }
    let deadline = Instant::now() + timeout;
    let mut st = shared.machine();
    loop {
        let c = st.machine.check_session(&session)?;
        let events: Vec<Event> = c.events.iter().filter(|e| e.seq > after).cloned().collect();
        let now = Instant::now();
        if !events.is_empty() || now >= deadline || shared.stop.load(Ordering::Acquire) {
            return Ok(MgrResponse::Events {
                incarnation: st.machine.meta.incarnation,
                events,
            });
        }
        st = shared
            .replica
            .changed
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

pub(crate) fn status(m: &Machine, live: &Live) -> ClusterStatus {
    ClusterStatus {
        memory_nodes: m
            .nodes
            .iter()
            .map(|(id, n)| {
                let seen = live.nodes.get(id);
                MemNodeStatus {
                    id: *id,
                    addr: n.addr.clone(),
                    state: n.state,
                    regions_total: n.regions.len() as u64,
                    regions_free: if n.state == NodeState::Dead {
                        0
                    } else {
                        n.regions
                            .iter()
                            .filter(|r| m.regions.get(r).is_some_and(|r| r.owner.is_none() && !r.freeing))
                            .count() as u64
                    },
                    capacity_bytes: n.capacity,
                    peer: seen.map(|s| s.peer).unwrap_or_default(),
                    load: seen.map(|s| s.load).unwrap_or_default(),
                }
            })
            .collect(),
        compute_nodes: m
            .computes
            .iter()
            .map(|(id, c)| ComputeStatus {
                id: *id,
                name: c.rec.name.clone(),
                state: c.rec.state,
                regions: m
                    .regions
                    .values()
                    .filter(|r| r.owner.map(|(o, _)| o) == Some(*id))
                    .count() as u64,
            })
            .collect(),
        managers: Vec::new(),
    }
}
