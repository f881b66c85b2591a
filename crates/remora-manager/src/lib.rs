//! The remora memory manager.
//!
//! One logically-centralized service (paper §3, §3.1) that memory nodes
//! register their regions with and compute nodes allocate regions from. It
//! tracks liveness by heartbeats: a memory node that goes silent is declared
//! dead, its regions leave the pool and every compute node holding one is
//! told; a compute node that goes silent has its regions revoked on the
//! memory nodes and returned to the pool. A draining memory node gets no new
//! allocations and its owners are told to move away. All assignments live in
//! an embedded store (module `store`, redb) and survive a restart.
//!
//! Modules by job: `allocation` hands regions out, `liveness` declares
//! nodes dead and reaps dead compute nodes' regions, `suspect` weighs a
//! compute node's report that a memory node failed it, `store` persists.

#![forbid(unsafe_code)]

mod allocation;
pub mod daemon;
mod liveness;
mod store;
mod suspect;

use allocation::{alloc, revoke};
use liveness::{monitor, node_gone, notify_owners};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::frame::{FrameKind, FrameReader, ReadError};
use remora_proto::msg::{
    ClusterStatus, ComputeState, ComputeStatus, Event, EventKind, MemNodeStatus, MgrRequest, MgrResponse, NodeLoad,
    PeerTraffic, decode,
};
use remora_proto::server::{ConnGuard, Listener, Responder};
use remora_proto::{
    Cap, ClusterKey, ComputeId, ConnOptions, MemNodeClient, NodeId, NodeState, Plane, RegionGrant, RegionId,
    RemoteError, Rights, Session, Stream, TlsConfig, Token,
};

use store::{Batch, ComputeRec, Meta, NodeRec, RegionRec, Store};
pub use store::{SCHEMA_VERSION, StoreError};

/// How the manager is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen.
    pub listen: String,
    /// Directory of the embedded store.
    pub data_dir: PathBuf,
    /// A node silent for this long is declared dead.
    pub heartbeat_timeout: Duration,
    /// Every connection must prove this key, and the manager proves it to
    /// memory nodes in turn; `None` serves anyone (`--insecure-no-auth`).
    pub cluster_key: Option<ClusterKey>,
    /// TLS (`--tls`, `--tls-dir`): in any mode but off every client must
    /// use it, and the manager's own connections to memory nodes do.
    pub tls: Option<TlsConfig>,
}

/// Why the manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Could not listen.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Bad configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}

struct Node {
    rec: NodeRec,
    last_seen: Instant,
    /// As of its last heartbeat (not persisted: a statistic).
    peer: PeerTraffic,
    /// Its CPU use as of its last heartbeat (likewise).
    load: NodeLoad,
}

struct Compute {
    rec: ComputeRec,
    last_seen: Instant,
    events: VecDeque<Event>,
    next_seq: u64,
}

struct State {
    nodes: BTreeMap<NodeId, Node>,
    regions: BTreeMap<RegionId, RegionRec>,
    computes: BTreeMap<ComputeId, Compute>,
    meta: Meta,
}

struct Shared {
    state: Mutex<State>,
    events_cv: Condvar,
    store: Store,
    timeout: Duration,
    /// When this manager process started: it declares no memory node it has
    /// not heard from since dead before a full heartbeat timeout has passed
    /// (nodes loaded from the store start with `last_seen` at this instant),
    /// so nodes that were waiting out its outage can reconnect and renew.
    started: Instant,
    incarnation: u64,
    stop: AtomicBool,
    admin_conns: Mutex<HashMap<NodeId, MemNodeClient>>,
    cluster_key: Option<ClusterKey>,
    tls: Option<TlsConfig>,
}

/// A running manager.
pub struct Manager {
    shared: Arc<Shared>,
    listener: Listener,
    monitor: Option<thread::JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

const MAX_EVENTS_KEPT: usize = 4096;

impl Manager {
    /// Opens the store, binds and starts serving.
    pub fn start(cfg: Config) -> Result<Self, ManagerError> {
        if cfg.heartbeat_timeout < Duration::from_millis(100) {
            return Err(ManagerError::Config("heartbeat timeout must be at least 100ms".into()));
        }
        let store = Store::open(&cfg.data_dir)?;
        let loaded = store.load()?;
        let mut meta = loaded.meta;
        meta.incarnation += 1;
        let now = Instant::now();
        let state = State {
            nodes: loaded
                .nodes
                .into_iter()
                .map(|(id, rec)| {
                    (
                        id,
                        Node {
                            rec,
                            last_seen: now,
                            peer: PeerTraffic::default(),
                            load: NodeLoad::default(),
                        },
                    )
                })
                .collect(),
            regions: loaded.regions.into_iter().collect(),
            computes: loaded
                .computes
                .into_iter()
                .map(|(id, rec)| {
                    (
                        id,
                        Compute {
                            rec,
                            last_seen: now,
                            events: VecDeque::new(),
                            next_seq: 1,
                        },
                    )
                })
                .collect(),
            meta,
        };
        store.commit(Batch::default().meta(meta))?;
        tracing::info!(
            "manager state loaded from {}: {} memory nodes, {} regions ({} allocated), {} compute nodes; incarnation {}",
            cfg.data_dir.display(),
            state.nodes.len(),
            state.regions.len(),
            state.regions.values().filter(|r| r.owner.is_some()).count(),
            state.computes.len(),
            meta.incarnation
        );
        let sock = TcpListener::bind(&cfg.listen).map_err(|source| ManagerError::Listen {
            addr: cfg.listen.clone(),
            source,
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            events_cv: Condvar::new(),
            store,
            timeout: cfg.heartbeat_timeout,
            started: now,
            incarnation: meta.incarnation,
            stop: AtomicBool::new(false),
            admin_conns: Mutex::new(HashMap::new()),
            cluster_key: cfg.cluster_key,
            tls: cfg.tls.clone(),
        });
        let s2 = Arc::clone(&shared);
        let server_tls = cfg.tls.as_ref().map(|t| t.server(Plane::Control));
        let listener = Listener::start_tls(sock, "manager", cfg.cluster_key, server_tls, move |stream, guard| {
            serve(&s2, stream, guard)
        })
        .map_err(|source| ManagerError::Listen {
            addr: cfg.listen.clone(),
            source,
        })?;
        let s3 = Arc::clone(&shared);
        let monitor = thread::Builder::new()
            .name("manager-monitor".into())
            .spawn(move || monitor(&s3))
            .map_err(|e| ManagerError::Config(format!("cannot spawn monitor: {e}")))?;
        Ok(Self {
            shared,
            listener,
            monitor: Some(monitor),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.listener.local_addr()
    }

    /// The cluster's state as `remora status` shows it.
    pub fn status(&self) -> ClusterStatus {
        status(&lock(&self.shared.state))
    }

    /// Stops serving.
    pub fn shutdown(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.events_cv.notify_all();
        if let Some(m) = self.monitor.take() {
            m.thread().unpark();
            let _ = m.join();
        }
        self.listener.stop();
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// How often memory nodes heartbeat: a sixth of the timeout. A memory node's
/// lease lasts four intervals from a heartbeat's send (two thirds of the
/// timeout), so it stops serving before this manager may declare it dead.
fn heartbeat_interval(timeout: Duration) -> u32 {
    (timeout.as_millis() / 6).clamp(10, 1000) as u32
}

fn serve(shared: &Arc<Shared>, sock: Stream, _guard: ConnGuard) {
    let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let stall = Duration::from_secs(30);
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
        if hdr.kind != FrameKind::Request || hdr.payload_len != 0 {
            tracing::warn!("closing connection from {peer}: unexpected frame {hdr:?}");
            return;
        }
        let req: MgrRequest = match rd
            .read_vec(hdr.head_len as usize)
            .map_err(|e| e.to_string())
            .and_then(|h| decode(&h).map_err(|e| e.to_string()))
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("closing connection from {peer}: {e}");
                return;
            }
        };
        let id = hdr.id;
        if let MgrRequest::Suspect { session, node } = req {
            // Probing takes up to the node's lease: its own thread, so this
            // connection keeps serving.
            let (s, o) = (Arc::clone(shared), out.clone());
            let spawned = thread::Builder::new().name("manager-suspect".into()).spawn(move || {
                let _ = match suspect::rule(&s, session, node) {
                    Ok(m) => o.ok(id, &m, &[]),
                    Err(e) => o.err(id, &e),
                };
            });
            if let Err(e) = spawned {
                let _ = out.err(id, &RemoteError::Internal(e.to_string()));
            }
            continue;
        }
        if let MgrRequest::WaitEvents {
            session,
            after,
            timeout_ms,
        } = req
        {
            // Long poll: answered from its own thread so this connection keeps serving.
            let (s, o) = (Arc::clone(shared), out.clone());
            let spawned = thread::Builder::new().name("manager-poll".into()).spawn(move || {
                let r = wait_events(&s, session, after, Duration::from_millis(timeout_ms.min(30_000) as u64));
                let _ = match r {
                    Ok(m) => o.ok(id, &m, &[]),
                    Err(e) => o.err(id, &e),
                };
            });
            if let Err(e) = spawned {
                let _ = out.err(id, &RemoteError::Internal(e.to_string()));
            }
            continue;
        }
        let res = handle(shared, req);
        let sent = match res {
            Ok(m) => out.ok(id, &m, &[]),
            Err(e) => out.err(id, &e),
        };
        if let Err(e) = sent {
            tracing::debug!("reply to {peer} failed: {e}");
            return;
        }
    }
}

fn internal(e: StoreError) -> RemoteError {
    tracing::error!("{e}");
    RemoteError::Internal(e.to_string())
}

fn check_session(st: &State, s: &Session) -> Result<(), RemoteError> {
    let c = st.computes.get(&s.id).ok_or(RemoteError::Unknown)?;
    if !c.rec.secret.ct_eq(&s.secret) {
        return Err(RemoteError::Unauthorized);
    }
    if c.rec.state == ComputeState::Dead {
        return Err(RemoteError::Unknown);
    }
    Ok(())
}

fn handle(shared: &Shared, req: MgrRequest) -> Result<MgrResponse, RemoteError> {
    match req {
        MgrRequest::RegisterMemNode {
            addr,
            capacity,
            region_size,
            admin,
        } => register_node(shared, addr, capacity, region_size, admin),
        MgrRequest::MemNodeHeartbeat {
            node,
            admin,
            peer,
            load,
        } => {
            let mut st = lock(&shared.state);
            let n = st.nodes.get_mut(&node).ok_or(RemoteError::Unknown)?;
            if !n.rec.admin.ct_eq(&admin) {
                return Err(RemoteError::Unauthorized);
            }
            if n.rec.state == NodeState::Dead {
                return Err(RemoteError::Fenced);
            }
            n.last_seen = Instant::now();
            n.peer = peer;
            n.load = load;
            Ok(MgrResponse::HeartbeatAck { state: n.rec.state })
        }
        MgrRequest::Deregister { node, admin } => {
            let mut st = lock(&shared.state);
            let n = st.nodes.get(&node).ok_or(RemoteError::Unknown)?;
            if !n.rec.admin.ct_eq(&admin) {
                return Err(RemoteError::Unauthorized);
            }
            tracing::info!("memory node {node} at {} deregistered", n.rec.addr);
            node_gone(shared, &mut st, node).map_err(internal)?;
            Ok(MgrResponse::Ok)
        }
        MgrRequest::Drain { addr } => {
            let mut st = lock(&shared.state);
            let (id, n) = st
                .nodes
                .iter_mut()
                .find(|(_, n)| n.rec.addr == addr && n.rec.state != NodeState::Dead)
                .ok_or_else(|| RemoteError::BadRequest(format!("no live memory node registered at {addr}")))?;
            let id = *id;
            if n.rec.state == NodeState::Draining {
                return Ok(MgrResponse::Ok);
            }
            n.rec.state = NodeState::Draining;
            let rec = n.rec.clone();
            shared.store.commit(Batch::default().node(id, &rec)).map_err(internal)?;
            tracing::info!("memory node {id} at {addr} is draining");
            notify_owners(&mut st, &rec, |regions| EventKind::NodeDraining {
                node: id,
                addr: rec.addr.clone(),
                regions,
            });
            shared.events_cv.notify_all();
            Ok(MgrResponse::Ok)
        }
        MgrRequest::RegisterCompute { name } => {
            let mut st = lock(&shared.state);
            st.meta.next_compute += 1;
            let id = ComputeId(st.meta.next_compute);
            let rec = ComputeRec {
                name,
                secret: Token::random(),
                state: ComputeState::Alive,
            };
            shared
                .store
                .commit(Batch::default().compute(id, &rec).meta(st.meta))
                .map_err(internal)?;
            tracing::info!("compute node {id} ({}) registered", rec.name);
            let session = Session { id, secret: rec.secret };
            st.computes.insert(
                id,
                Compute {
                    rec,
                    last_seen: Instant::now(),
                    events: VecDeque::new(),
                    next_seq: 1,
                },
            );
            Ok(MgrResponse::ComputeRegistered {
                session,
                heartbeat_interval_ms: heartbeat_interval(shared.timeout),
                incarnation: shared.incarnation,
            })
        }
        MgrRequest::ComputeHeartbeat { session } => {
            let mut st = lock(&shared.state);
            check_session(&st, &session)?;
            if let Some(c) = st.computes.get_mut(&session.id) {
                c.last_seen = Instant::now();
            }
            Ok(MgrResponse::Ok)
        }
        MgrRequest::Alloc {
            session,
            count,
            distinct,
            exclude,
        } => alloc(shared, session, count, distinct, exclude),
        MgrRequest::Free { session, region } => {
            let (node, epoch) = {
                let mut st = lock(&shared.state);
                check_session(&st, &session)?;
                let r = st
                    .regions
                    .get_mut(&region)
                    .ok_or(RemoteError::NoSuchRegion { region })?;
                if r.owner.map(|(c, _)| c) != Some(session.id) {
                    return Err(RemoteError::BadCapability { region });
                }
                r.epoch += 1;
                (r.node, r.epoch)
            };
            // Revoke while the region is still owned, so it cannot be handed
            // to someone else before the old contents and token are gone.
            revoke(shared, node, region, epoch);
            let mut st = lock(&shared.state);
            if let Some(r) = st.regions.get_mut(&region) {
                if r.owner.map(|(c, _)| c) == Some(session.id) {
                    r.owner = None;
                    let rec = r.clone();
                    shared
                        .store
                        .commit(Batch::default().region(region, &rec))
                        .map_err(internal)?;
                }
            }
            Ok(MgrResponse::Ok)
        }
        MgrRequest::MyRegions { session } => {
            let st = lock(&shared.state);
            check_session(&st, &session)?;
            Ok(MgrResponse::Regions(
                st.regions
                    .iter()
                    .filter(|(_, r)| r.owner.map(|(c, _)| c) == Some(session.id))
                    .filter_map(|(id, r)| grant_of(&st, *id, r))
                    .collect(),
            ))
        }
        MgrRequest::WaitEvents { .. } => Err(RemoteError::BadRequest("long poll handled elsewhere".into())),
        MgrRequest::Status => Ok(MgrResponse::Status(status(&lock(&shared.state)))),
        MgrRequest::Suspect { .. } => Err(RemoteError::BadRequest("Suspect is answered on its own thread".into())),
    }
}

fn grant_of(st: &State, id: RegionId, r: &RegionRec) -> Option<RegionGrant> {
    let (_, token) = r.owner?;
    let n = st.nodes.get(&r.node)?;
    Some(RegionGrant {
        cap: Cap {
            region: id,
            rights: Rights::ReadWrite,
            token,
            epoch: r.epoch,
        },
        node: r.node,
        addr: n.rec.addr.clone(),
        size: r.size,
        node_state: n.rec.state,
    })
}

fn register_node(
    shared: &Shared,
    addr: String,
    capacity: u64,
    region_size: u64,
    admin: Token,
) -> Result<MgrResponse, RemoteError> {
    if region_size == 0 || capacity < region_size {
        return Err(RemoteError::BadRequest("capacity must hold at least one region".into()));
    }
    let count = capacity / region_size;
    if count > 1 << 20 {
        return Err(RemoteError::BadRequest(
            "too many regions (use a larger region size)".into(),
        ));
    }
    let mut st = lock(&shared.state);
    // A node registering again at an address whose old incarnation still
    // counts as live has restarted: whatever the old one held is gone.
    let stale: Vec<NodeId> = st
        .nodes
        .iter()
        .filter(|(_, n)| n.rec.addr == addr && n.rec.state != NodeState::Dead)
        .map(|(id, _)| *id)
        .collect();
    for id in stale {
        tracing::warn!("memory node at {addr} re-registered: its previous incarnation {id} is dead");
        node_gone(shared, &mut st, id).map_err(internal)?;
    }
    st.meta.next_node += 1;
    let node = NodeId(st.meta.next_node);
    let first = st.meta.next_region + 1;
    st.meta.next_region += count;
    let regions: Vec<RegionId> = (first..first + count).map(RegionId).collect();
    let rec = NodeRec {
        addr: addr.clone(),
        capacity,
        region_size,
        admin,
        state: NodeState::Alive,
        regions: regions.clone(),
    };
    let mut b = Batch::default();
    b.node(node, &rec).meta(st.meta);
    let rrec = RegionRec {
        node,
        size: region_size,
        owner: None,
        epoch: 0,
    };
    for r in &regions {
        b.region(*r, &rrec);
    }
    shared.store.commit(&b).map_err(internal)?;
    for r in &regions {
        st.regions.insert(*r, rrec.clone());
    }
    st.nodes.insert(
        node,
        Node {
            rec,
            last_seen: Instant::now(),
            peer: PeerTraffic::default(),
            load: NodeLoad::default(),
        },
    );
    tracing::info!("memory node {node} registered at {addr}: {count} regions of {region_size} bytes");
    Ok(MgrResponse::MemNodeRegistered {
        node,
        regions,
        heartbeat_interval_ms: heartbeat_interval(shared.timeout),
    })
}

fn wait_events(shared: &Shared, session: Session, after: u64, timeout: Duration) -> Result<MgrResponse, RemoteError> {
    let deadline = Instant::now() + timeout;
    let mut st = lock(&shared.state);
    loop {
        check_session(&st, &session)?;
        let events: Vec<Event> = st.computes[&session.id]
            .events
            .iter()
            .filter(|e| e.seq > after)
            .cloned()
            .collect();
        let now = Instant::now();
        if !events.is_empty() || now >= deadline || shared.stop.load(Ordering::Acquire) {
            return Ok(MgrResponse::Events {
                incarnation: shared.incarnation,
                events,
            });
        }
        st = shared
            .events_cv
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

fn status(st: &State) -> ClusterStatus {
    ClusterStatus {
        memory_nodes: st
            .nodes
            .iter()
            .map(|(id, n)| MemNodeStatus {
                id: *id,
                addr: n.rec.addr.clone(),
                state: n.rec.state,
                regions_total: n.rec.regions.len() as u64,
                regions_free: if n.rec.state == NodeState::Dead {
                    0
                } else {
                    n.rec
                        .regions
                        .iter()
                        .filter(|r| st.regions.get(r).is_some_and(|r| r.owner.is_none()))
                        .count() as u64
                },
                capacity_bytes: n.rec.capacity,
                peer: n.peer,
                load: n.load,
            })
            .collect(),
        compute_nodes: st
            .computes
            .iter()
            .map(|(id, c)| ComputeStatus {
                id: *id,
                name: c.rec.name.clone(),
                state: c.rec.state,
                regions: st
                    .regions
                    .values()
                    .filter(|r| r.owner.map(|(o, _)| o) == Some(*id))
                    .count() as u64,
            })
            .collect(),
    }
}
