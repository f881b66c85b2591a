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
mod requests;
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
use remora_proto::msg::{ClusterStatus, MgrRequest, MgrResponse, NodeLoad, PeerTraffic, decode};
use remora_proto::server::{Limits, Listener};
use remora_proto::{ClusterKey, ComputeId, ConnOptions, MemNodeClient, NodeId, Plane, RemoteError, RpcConn, TlsConfig};

use consensus::{Member, Raft};
use machine::{Command, Machine, Proposal};
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
    /// Connections and deadlines ([`Limits`]).
    pub limits: Limits,
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
    group: consensus::Group,
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
    /// Requests answered on threads of their own right now
    /// ([`requests::MAX_ASIDE`]).
    aside: std::sync::atomic::AtomicUsize,
}

impl Shared {
    /// Proposes `cmd` to the group and waits for its answer.
    fn propose(&self, cmd: Command) -> machine::Answer {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.group.propose(Proposal { at_ms, cmd })
    }

    /// Confirms leadership (see [`consensus::Group::confirm_leader`]).
    fn confirm_leader(&self) -> Result<(), RemoteError> {
        self.group.confirm_leader()
    }

    fn machine(&self) -> MutexGuard<'_, Applied> {
        lock(&self.replica.state)
    }

    /// The leader's observations, started afresh if it took over since.
    fn live(&self) -> MutexGuard<'_, Live> {
        let term = self.group.term();
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
            group: consensus::Group::new(raft, rt.clone()),
            id: cfg.id,
            addr,
            timeout: cfg.heartbeat_timeout,
            stop: AtomicBool::new(false),
            admin_conns: Mutex::new(HashMap::new()),
            cluster_key: cfg.cluster_key,
            tls: cfg.tls.clone(),
            isolation,
            aside: Default::default(),
        });
        let s2 = Arc::clone(&shared);
        let server_tls = cfg.tls.as_ref().map(|t| t.server(Plane::Control));
        let listener = Listener::start_with(
            sock,
            "manager",
            cfg.cluster_key,
            server_tls,
            cfg.limits,
            move |stream, guard| requests::serve(&s2, stream, guard),
        )
        .map_err(|source| ManagerError::Listen {
            addr: cfg.listen.clone(),
            source,
        })?;
        let initializes = !restarted && cfg.id == *members.keys().next().expect("one member at least");
        if restarted {
            tracing::info!(
                "manager {} restarted: rejoining its group with the log and snapshot in {}",
                cfg.id,
                cfg.data_dir.display()
            );
        } else if initializes {
            if let Some(other) = group_exists(&members, cfg.id, &opts) {
                tracing::warn!(
                    "manager {}: empty store, but member {other} already belongs to a formed group: joining it \
                     instead of forming a new one",
                    cfg.id
                );
            } else {
                rt.block_on(shared.group.raft.initialize(consensus::members(&members)))
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
        let mut s = requests::status(&self.shared.machine().machine, &lock(&self.shared.live));
        s.managers = vec![self.shared.group.member_status(self.shared.id, &self.shared.addr)];
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
            let _ = rt.block_on(self.shared.group.raft.shutdown());
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
pub(crate) fn heartbeat_interval(timeout: Duration) -> u32 {
    (timeout.as_millis() / 6).clamp(10, 1000) as u32
}
