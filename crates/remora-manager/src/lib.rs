//! The remora memory manager.
//!
//! One logically-centralized service (paper §3, §3.1) that memory nodes
//! register their regions with and compute nodes allocate regions from. It
//! tracks liveness by heartbeats: a memory node that goes silent is declared
//! dead, its regions leave the pool and every compute node holding one is
//! told; a compute node that goes silent has its regions revoked on the
//! memory nodes and returned to the pool. A draining memory node gets no new
//! allocations and its owners are told to move away.
//!
//! The paper assumes the manager does not fail, as a replicated state
//! machine; here it is one: a group of 1, 3 or 5 managers (a Raft group,
//! module `consensus`) applying the same commands (module `machine`) in the
//! same order. The leader serves; the others refuse with `NotLeader`, naming
//! it, and clients follow. Every change is in the log, on a majority's disks,
//! before it is answered; heartbeats are not: they are the leader's own
//! observations, and a new leader starts its clock afresh.
//!
//! Modules by job: `machine` is the replicated state and its commands,
//! `consensus` the Raft group (log, snapshots, messages), `allocation` hands
//! regions out and takes them back, `liveness` declares nodes dead and
//! reaps dead compute nodes' regions, `suspect` weighs a compute node's
//! report that a memory node failed it, `store` opens the member's file.

#![forbid(unsafe_code)]

mod allocation;
mod consensus;
pub mod daemon;
mod liveness;
mod machine;
mod store;
mod suspect;

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openraft::{LogId, StoredMembership};
use remora_proto::frame::{FrameKind, FrameReader, MAX_PAYLOAD_LEN, ReadError};
use remora_proto::msg::{
    ClusterStatus, ComputeStatus, Event, ManagerRole, ManagerStatus, MemNodeStatus, MgrRequest, MgrResponse, NodeLoad,
    PeerTraffic, decode,
};
use remora_proto::server::{ConnGuard, Listener, Responder};
use remora_proto::{
    Cap, ClusterKey, ComputeId, ConnOptions, MemNodeClient, NodeId, NodeState, Plane, RegionGrant, RegionId,
    RemoteError, Rights, RpcConn, Session, Stream, TlsConfig, Token,
};

use consensus::{Member, Raft};
use machine::{Command, Gone, Machine, Outcome, Proposal, Region};
use store::Store;
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
    /// memory nodes and the other managers in turn; `None` serves anyone
    /// (`--insecure-no-auth`).
    pub cluster_key: Option<ClusterKey>,
    /// TLS (`--tls`, `--tls-dir`): in any mode but off every client must
    /// use it, and the manager's own connections to memory nodes do.
    pub tls: Option<TlsConfig>,
    /// This manager's member id in its group.
    pub id: u64,
    /// Every member of the group, this one included, by id: the addresses
    /// the members reach each other at. Empty: a group of one.
    pub peers: BTreeMap<u64, String>,
    /// A snapshot is taken (and the log behind it purged) every this many
    /// log entries ([`DEFAULT_SNAPSHOT_EVERY`]).
    pub snapshot_every: u64,
}

/// Log entries between snapshots unless configured otherwise.
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 5000;

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
    /// The Raft group could not start.
    #[error("manager group: {0}")]
    Group(String),
}

/// The replicated state as this member has applied it.
pub(crate) struct Applied {
    pub(crate) machine: Machine,
    pub(crate) applied: Option<LogId<u64>>,
    pub(crate) membership: StoredMembership<u64, Member>,
}

/// The state machine's state, shared with the request handlers.
pub(crate) struct Replica {
    pub(crate) state: Mutex<Applied>,
    /// Notified after every apply (long polls for events wait on it).
    pub(crate) changed: Condvar,
}

/// When a memory node was last heard from, and what it said.
struct Seen {
    at: Instant,
    peer: PeerTraffic,
    load: NodeLoad,
}

/// What the leader observes itself: not replicated. A new leader starts
/// with none of it and its own clock: it declares no node dead before a
/// full heartbeat timeout has passed since it took over.
struct Live {
    /// The term it leads in (0: not leading).
    term: u64,
    /// When it took over.
    since: Instant,
    nodes: HashMap<NodeId, Seen>,
    computes: HashMap<ComputeId, Instant>,
}

impl Live {
    fn node_seen(&self, n: NodeId) -> Instant {
        self.nodes.get(&n).map_or(self.since, |s| s.at)
    }
    fn compute_seen(&self, c: ComputeId) -> Instant {
        self.computes.get(&c).copied().unwrap_or(self.since)
    }
}

struct Shared {
    replica: Arc<Replica>,
    live: Mutex<Live>,
    raft: Raft,
    rt: tokio::runtime::Handle,
    /// This member's id and address.
    id: u64,
    addr: String,
    timeout: Duration,
    stop: AtomicBool,
    admin_conns: Mutex<HashMap<NodeId, MemNodeClient>>,
    cluster_key: Option<ClusterKey>,
    tls: Option<TlsConfig>,
    /// Members cut off by fault injection.
    isolation: consensus::network::Isolation,
    /// When this member last failed to confirm its lead, and in which term.
    unconfirmed: Mutex<Option<(u64, Instant)>>,
}

impl Shared {
    /// Proposes `cmd` to the group and waits for its answer.
    fn propose(&self, cmd: Command) -> machine::Answer {
        // A leader that just failed to hear from a quorum would only time out.
        let term = self.raft.metrics().borrow().current_term;
        if lock(&self.unconfirmed).is_some_and(|(t, at)| t == term && at.elapsed() < consensus::UNCONFIRMED_FOR) {
            return Err(RemoteError::NotLeader { leader: None });
        }
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        consensus::propose(&self.rt, &self.raft, Proposal { at_ms, cmd })
    }

    /// Confirms leadership (see [`consensus::confirm_leader`]).
    fn confirm_leader(&self) -> Result<(), RemoteError> {
        consensus::confirm_leader(&self.rt, &self.raft, &self.unconfirmed)
    }

    fn machine(&self) -> MutexGuard<'_, Applied> {
        lock(&self.replica.state)
    }

    /// The leader's observations, started afresh if it took over since.
    fn live(&self) -> MutexGuard<'_, Live> {
        let term = self.raft.metrics().borrow().current_term;
        let mut l = lock(&self.live);
        if l.term != term {
            *l = Live {
                term,
                since: Instant::now(),
                nodes: HashMap::new(),
                computes: HashMap::new(),
            };
        }
        l
    }

    fn conn_options(&self, timeout: Duration) -> ConnOptions {
        ConnOptions {
            connect_timeout: timeout,
            call_timeout: timeout,
            stall_limit: timeout * 2,
            cluster_key: self.cluster_key,
            tls: self.tls.clone(),
        }
    }
}

/// A running manager.
pub struct Manager {
    shared: Arc<Shared>,
    listener: Listener,
    monitor: Option<thread::JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Manager {
    /// Opens the store, binds, joins (or forms) the group and starts serving.
    pub fn start(cfg: Config) -> Result<Self, ManagerError> {
        if cfg.heartbeat_timeout < Duration::from_millis(100) {
            return Err(ManagerError::Config("heartbeat timeout must be at least 100ms".into()));
        }
        if !cfg.peers.is_empty() && !cfg.peers.contains_key(&cfg.id) {
            return Err(ManagerError::Config(format!(
                "--peers names members {:?} but not this one (--id {})",
                cfg.peers.keys().collect::<Vec<_>>(),
                cfg.id
            )));
        }
        let mut store = Store::open(&cfg.data_dir)?;
        let sock = TcpListener::bind(&cfg.listen).map_err(|source| ManagerError::Listen {
            addr: cfg.listen.clone(),
            source,
        })?;
        let bound = sock.local_addr().map_err(|source| ManagerError::Listen {
            addr: cfg.listen.clone(),
            source,
        })?;
        let members = if cfg.peers.is_empty() {
            BTreeMap::from([(cfg.id, bound.to_string())])
        } else {
            cfg.peers.clone()
        };
        let addr = members[&cfg.id].clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("manager-raft")
            .enable_all()
            .build()
            .map_err(|e| ManagerError::Group(format!("cannot start its runtime: {e}")))?;
        let rt = runtime.handle().clone();
        let replica = Arc::new(Replica {
            state: Mutex::new(Applied {
                machine: Machine::default(),
                applied: None,
                membership: StoredMembership::default(),
            }),
            changed: Condvar::new(),
        });
        let group_err = |e: &dyn std::fmt::Display| ManagerError::Group(e.to_string());
        let log = consensus::storage::LogStore::new(store.db());
        let restarted = log.has_state().map_err(|e| group_err(&e))?;
        let sm = consensus::storage::StateMachine::open(store.db(), Arc::clone(&replica)).map_err(|e| group_err(&e))?;
        let opts = ConnOptions {
            connect_timeout: Duration::from_millis(300),
            call_timeout: Duration::from_secs(1),
            stall_limit: Duration::from_secs(2),
            cluster_key: cfg.cluster_key,
            tls: cfg.tls.clone(),
        };
        let isolation = consensus::network::Isolation::default();
        let network = consensus::network::Network {
            me: cfg.id,
            opts: opts.clone(),
            isolation: isolation.clone(),
        };
        let raft_cfg = Arc::new(
            consensus::config(cfg.snapshot_every)
                .validate()
                .map_err(|e| group_err(&e))?,
        );
        let raft = rt
            .block_on(Raft::new(cfg.id, raft_cfg, network, log, sm))
            .map_err(|e| group_err(&e))?;
        let shared = Arc::new(Shared {
            replica,
            live: Mutex::new(Live {
                term: 0,
                since: Instant::now(),
                nodes: HashMap::new(),
                computes: HashMap::new(),
            }),
            raft,
            rt: rt.clone(),
            id: cfg.id,
            addr,
            timeout: cfg.heartbeat_timeout,
            stop: AtomicBool::new(false),
            admin_conns: Mutex::new(HashMap::new()),
            cluster_key: cfg.cluster_key,
            tls: cfg.tls.clone(),
            isolation,
            unconfirmed: Mutex::new(None),
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
        let initializes = !restarted && cfg.id == *members.keys().next().expect("one member at least");
        if restarted {
            let m = shared.raft.metrics().borrow().clone();
            tracing::info!(
                "manager {} restarted: rejoining its group (term {}, last log index {:?}, {} members)",
                cfg.id,
                m.current_term,
                m.last_log_index,
                m.membership_config.membership().nodes().count()
            );
        } else if initializes {
            if let Some(other) = group_exists(&members, cfg.id, &opts) {
                tracing::warn!(
                    "manager {}: empty store, but member {other} already belongs to a formed group: joining it \
                     instead of forming a new one",
                    cfg.id
                );
            } else {
                rt.block_on(shared.raft.initialize(consensus::members(&members)))
                    .map_err(|e| group_err(&e))?;
                tracing::info!("manager {} formed a group of {}: {:?}", cfg.id, members.len(), members);
            }
        } else {
            tracing::info!(
                "manager {} joins the group {:?}: member {} forms it",
                cfg.id,
                members,
                members.keys().next().expect("one member")
            );
        }
        if let Some(legacy) = store.legacy().cloned() {
            if initializes || restarted {
                if let Err(e) = take_over(&shared, &mut store, legacy) {
                    tracing::warn!("{e}; the next start tries again");
                }
            } else {
                tracing::warn!(
                    "manager {}: {} holds a single manager's state, but member {} forms this group: left unread",
                    cfg.id,
                    cfg.data_dir.display(),
                    members.keys().next().expect("one member")
                );
            }
        }
        let s3 = Arc::clone(&shared);
        let monitor = thread::Builder::new()
            .name("manager-monitor".into())
            .spawn(move || liveness::monitor(&s3))
            .map_err(|e| ManagerError::Config(format!("cannot spawn monitor: {e}")))?;
        Ok(Self {
            shared,
            listener,
            monitor: Some(monitor),
            runtime: Some(runtime),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.listener.local_addr()
    }

    /// The cluster's state as this member has applied it.
    pub fn status(&self) -> ClusterStatus {
        let mut s = status(&self.shared.machine().machine, &lock(&self.shared.live));
        s.managers = vec![consensus::member_status(
            &self.shared.raft,
            self.shared.id,
            &self.shared.addr,
        )];
        s
    }

    /// Stops serving.
    pub fn shutdown(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.replica.changed.notify_all();
        if let Some(m) = self.monitor.take() {
            m.thread().unpark();
            let _ = m.join();
        }
        self.listener.stop();
        if let Some(rt) = self.runtime.take() {
            let _ = rt.block_on(self.shared.raft.shutdown());
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Asks the other members whether a group already exists (one has a
/// term): a member whose store was lost must not form a second one.
fn group_exists(members: &BTreeMap<u64, String>, me: u64, opts: &ConnOptions) -> Option<u64> {
    members.iter().filter(|(id, _)| **id != me).find_map(|(id, addr)| {
        let conn = RpcConn::connect(addr, opts.clone()).ok()?;
        let t = conn.send(&MgrRequest::Member, &[]).ok()?;
        let r = conn.wait(t, None, opts.call_timeout).ok()?;
        match decode::<MgrResponse>(&r.head) {
            Ok(MgrResponse::Member(m)) if m.term > 0 => Some(*id),
            _ => None,
        }
    })
}

/// Takes over a single manager's store (see `store`): proposed once this
/// member leads (within 30 s), then the old tables go.
fn take_over(shared: &Shared, store: &mut Store, legacy: store::Loaded) -> Result<(), ManagerError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut m = Machine::from_store(legacy);
    // Its clients saw events numbered by the old manager: a new
    // incarnation tells them to re-read their regions.
    m.meta.incarnation += 1;
    let (nodes, regions) = (m.nodes.len(), m.regions.len());
    loop {
        match shared.propose(Command::Import(Box::new(m.clone()))) {
            Ok(_) => break,
            Err(RemoteError::NotLeader { .. }) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                return Err(ManagerError::Group(format!(
                    "taking over the single manager's store: {e}"
                )));
            }
        }
    }
    store.finish_import()?;
    tracing::info!("took over a single manager's store: {nodes} memory nodes, {regions} regions");
    Ok(())
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
        let sent = match req {
            MgrRequest::Raft { from, .. } if shared.isolation.cuts(from) => out.err(id, &RemoteError::Unavailable),
            MgrRequest::Raft { rpc, .. } => match consensus::network::serve(&shared.rt, &shared.raft, rpc, &body) {
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

/// Answers one request from a thread of its own.
fn aside(
    shared: &Arc<Shared>,
    out: &Responder,
    id: u64,
    name: &str,
    f: impl FnOnce(&Shared) -> Result<MgrResponse, RemoteError> + Send + 'static,
) -> std::io::Result<()> {
    let (s, o) = (Arc::clone(shared), out.clone());
    let spawned = thread::Builder::new().name(name.into()).spawn(move || {
        let _ = match f(&s) {
            Ok(m) => o.ok(id, &m, &[]),
            Err(e) => o.err(id, &e),
        };
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
        } => {
            let o = shared.propose(Command::RegisterNode {
                addr: addr.clone(),
                capacity,
                region_size,
                admin,
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
        MgrRequest::RegisterCompute { name } => {
            let o = shared.propose(Command::RegisterCompute {
                name: name.clone(),
                secret: Token::random(),
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
        MgrRequest::Member => Ok(MgrResponse::Member(consensus::member_status(
            &shared.raft,
            shared.id,
            &shared.addr,
        ))),
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
                return consensus::member_status(&shared.raft, id, &shared.addr);
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

fn grant_of(m: &Machine, id: RegionId, r: &Region) -> Option<RegionGrant> {
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
    if !consensus::leads(&shared.raft) {
        return Err(consensus::not_leader(&shared.raft));
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

fn status(m: &Machine, live: &Live) -> ClusterStatus {
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
