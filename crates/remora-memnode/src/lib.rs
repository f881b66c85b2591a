//! The remora memory-node daemon.
//!
//! A memory node lends part of its RAM to compute nodes. It carves its
//! capacity into fixed-size regions, registers them with the memory manager,
//! heartbeats, and serves one-sided `READ`/`WRITE` (and vectored forms) on
//! regions the manager granted — no application logic runs on that path.
//! Every data request carries a capability checked against the region's
//! grant (see [`remora_proto::cap`]).

#![forbid(unsafe_code)]

pub mod daemon;
mod fault;
pub mod in_process;
mod lease;
mod load;
mod mem;
mod peer_traffic;
mod rebuild;
mod region;
mod serve;
mod service;
mod txn;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::msg::{MgrRequest, MgrResponse};
use remora_proto::server::{Limits, Listener};
use remora_proto::{
    AdminKey, ClusterKey, ConnOptions, ManagerConn, NodeId, NodeState, Plane, RemoteError, RpcError, TlsConfig, Token,
};

use crate::fault::Faults;
use crate::region::RegionTable;

pub use in_process::{InProcessCluster, NodeHandle};
pub use load::cpu_time_of;

/// Default region size: 1 GiB, as in the paper.
pub const DEFAULT_REGION_SIZE: u64 = 1 << 30;

/// How a memory node is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// The manager's address.
    pub manager: String,
    /// Where to listen for data requests (`127.0.0.1:0` picks a port).
    pub listen: String,
    /// Address to register with the manager, if not the bound address.
    pub advertise: Option<String>,
    /// Bytes to lend.
    pub capacity: u64,
    /// Size of each region.
    pub region_size: u64,
    /// Secret shared with the manager for admin requests (random if `None`).
    pub admin_key: Option<AdminKey>,
    /// How long to keep trying to reach the manager at startup.
    pub manager_patience: Duration,
    /// The key every connection to this node must prove, and that this node
    /// proves to the manager and to peers; `None`: `--insecure-no-auth`.
    pub cluster_key: Option<ClusterKey>,
    /// TLS (`--tls`, `--tls-dir`): with [`remora_proto::TlsMode::Data`]
    /// every client must use it; with `Control` this node serves TLS (to
    /// the manager) and plain clients alike, and reaches the manager over
    /// TLS. `None`: plain TCP.
    pub tls: Option<TlsConfig>,
    /// Connections and deadlines ([`Limits`]).
    pub limits: Limits,
}

/// Why the daemon could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum MemNodeError {
    /// Bad configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Could not listen.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Could not talk to the manager.
    #[error("manager at {addr}: {source}")]
    Manager {
        /// The manager's address.
        addr: String,
        /// The cause.
        source: RpcError,
    },
}

/// State shared by the data path and the manager link.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) admin: AdminKey,
    pub(crate) regions: RegionTable,
    pub(crate) faults: Faults,
    /// Data is served only while the manager keeps acknowledging heartbeats.
    pub(crate) lease: lease::Lease,
    /// How busy this node is.
    pub(crate) cpu: load::CpuMeter,
    /// What this node sent to peers.
    pub(crate) peer: peer_traffic::PeerCounters,
    node_id: AtomicU64,
    draining: AtomicBool,
    stop: AtomicBool,
    pub(crate) conns: Mutex<Option<Arc<remora_proto::server::Conns>>>,
    /// Proved on connections to peers and the manager.
    pub(crate) cluster_key: Option<ClusterKey>,
    /// TLS settings for connections to peers and the manager.
    pub(crate) tls: Option<TlsConfig>,
    /// Connections to peers, for offloaded reconstruction.
    pub(crate) peers: Mutex<std::collections::HashMap<String, Arc<dyn remora_proto::MemTransport>>>,
}

impl Shared {
    /// This node's request handling, with `env` for what is the daemon's own.
    pub(crate) fn service<E>(&self, env: E) -> service::Service<'_, E> {
        service::Service {
            regions: &self.regions,
            lease: &self.lease,
            admin: &self.admin,
            peer: &self.peer,
            env,
        }
    }
}

/// A running memory node.
pub struct MemNode {
    cfg: Config,
    addr: String,
    shared: Arc<Shared>,
    listener: Listener,
    mgr: Arc<ManagerConn>,
    heartbeat: Option<thread::JoinHandle<()>>,
    cpu_meter: Option<thread::JoinHandle<()>>,
    populator: Option<mem::Populator>,
}

impl MemNode {
    /// Binds, registers with the manager and starts serving.
    pub fn start(cfg: Config) -> Result<Self, MemNodeError> {
        if cfg.region_size == 0 || cfg.region_size > isize::MAX as u64 {
            return Err(MemNodeError::Config("region size must be positive".into()));
        }
        if cfg.capacity < cfg.region_size {
            return Err(MemNodeError::Config(format!(
                "capacity ({} bytes) is smaller than one region ({} bytes)",
                cfg.capacity, cfg.region_size
            )));
        }
        let sock = TcpListener::bind(&cfg.listen).map_err(|source| MemNodeError::Listen {
            addr: cfg.listen.clone(),
            source,
        })?;
        let bound = sock.local_addr().map_err(|source| MemNodeError::Listen {
            addr: cfg.listen.clone(),
            source,
        })?;
        let addr = match &cfg.advertise {
            Some(a) => a.clone(),
            None if bound.ip().is_unspecified() => {
                return Err(MemNodeError::Config(format!(
                    "listening on {bound}: give --advertise with an address compute nodes can reach"
                )));
            }
            None => bound.to_string(),
        };
        let shared = Arc::new(Shared {
            admin: cfg.admin_key.unwrap_or_else(Token::random),
            regions: RegionTable::default(),
            faults: Faults::default(),
            lease: lease::Lease::default(),
            cpu: load::CpuMeter::default(),
            peer: Default::default(),
            node_id: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            conns: Mutex::new(None),
            peers: Mutex::new(std::collections::HashMap::new()),
            cluster_key: cfg.cluster_key,
            tls: cfg.tls.clone(),
        });
        let (populator, queue) = mem::Populator::start()
            .map_err(|e| MemNodeError::Config(format!("cannot spawn the populate thread: {e}")))?;
        shared.regions.populate_through(queue);
        let s2 = Arc::clone(&shared);
        let server_tls = cfg.tls.as_ref().map(|t| t.server(Plane::Data));
        let listener = Listener::start_with(
            sock,
            "memnode",
            cfg.cluster_key,
            server_tls,
            cfg.limits,
            move |stream, guard| serve::handle(&s2, stream, guard),
        )
        .map_err(|source| MemNodeError::Listen {
            addr: cfg.listen.clone(),
            source,
        })?;
        *shared.conns.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(listener.conns()));

        let mgr_err = |source| MemNodeError::Manager {
            addr: cfg.manager.clone(),
            source,
        };
        let start = Instant::now();
        let mgr = loop {
            match ManagerConn::connect(
                &cfg.manager,
                ConnOptions {
                    cluster_key: cfg.cluster_key,
                    tls: cfg.tls.clone(),
                    ..ConnOptions::default()
                },
            ) {
                Ok(m) => break Arc::new(m),
                // A manager of another protocol version will not change its mind.
                Err(e) if e.is_transport() && start.elapsed() < cfg.manager_patience => {
                    tracing::debug!("manager not reachable yet: {e}");
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(mgr_err(e)),
            }
        };
        let interval = register(&mgr, &shared, &addr, &cfg).map_err(mgr_err)?;
        let (s3, m3, addr3, cfg3) = (Arc::clone(&shared), Arc::clone(&mgr), addr.clone(), cfg.clone());
        let heartbeat = thread::Builder::new()
            .name("memnode-heartbeat".into())
            .spawn(move || heartbeat_loop(&s3, &m3, &addr3, &cfg3, interval))
            .map_err(|e| MemNodeError::Config(format!("cannot spawn heartbeat thread: {e}")))?;
        let s_cpu = Arc::clone(&shared);
        let cpu_meter = thread::Builder::new()
            .name("memnode-cpu".into())
            .spawn(move || s_cpu.cpu.run(&s_cpu.stop, thread::park_timeout))
            .map_err(|e| {
                shared.stop.store(true, Ordering::Release);
                heartbeat.thread().unpark();
                MemNodeError::Config(format!("cannot spawn the CPU meter thread: {e}"))
            })?;
        Ok(Self {
            cfg,
            addr,
            shared,
            listener,
            mgr,
            heartbeat: Some(heartbeat),
            cpu_meter: Some(cpu_meter),
            populator: Some(populator),
        })
    }

    /// The address compute nodes use.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The bound socket address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// The id the manager gave this node (changes if it is fenced and re-registers).
    pub fn node_id(&self) -> NodeId {
        NodeId(self.shared.node_id.load(Ordering::Acquire))
    }

    /// Number of regions and how many of them are granted to compute nodes.
    pub fn regions(&self) -> (usize, usize) {
        (self.shared.regions.len(), self.shared.regions.granted_count())
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.cfg.capacity
    }

    /// Planned departure: asks the manager to mark this node draining (owners
    /// are told to move their data away). Serving continues.
    pub fn drain(&self) -> Result<(), RpcError> {
        self.shared.draining.store(true, Ordering::Release);
        self.mgr.call_retrying(
            &MgrRequest::Drain {
                addr: self.addr.clone(),
            },
            Duration::from_secs(5),
        )?;
        Ok(())
    }

    /// Withdraws this node's regions from the manager and stops serving.
    pub fn shutdown(mut self) {
        self.stop_inner(true);
    }

    fn stop_inner(&mut self, deregister: bool) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.faults.stop_busy();
        for h in [self.heartbeat.take(), self.cpu_meter.take()].into_iter().flatten() {
            h.thread().unpark();
            let _ = h.join();
        }
        self.shared.regions.stop_populating();
        if let Some(p) = self.populator.take() {
            p.join();
        }
        if deregister {
            let req = MgrRequest::Deregister {
                node: self.node_id(),
                admin: self.shared.admin,
            };
            if let Err(e) = self.mgr.call(&req) {
                tracing::warn!("could not deregister from the manager: {e}");
            }
        }
        self.listener.stop();
    }
}

impl Drop for MemNode {
    fn drop(&mut self) {
        self.stop_inner(false);
    }
}

/// Registers this node's capacity and installs the regions the manager named.
fn register(mgr: &ManagerConn, shared: &Shared, addr: &str, cfg: &Config) -> Result<Duration, RpcError> {
    let req = MgrRequest::RegisterMemNode {
        addr: addr.to_string(),
        capacity: cfg.capacity,
        region_size: cfg.region_size,
        admin: shared.admin,
        request: MgrRequest::registration_number(),
    };
    let sent = Instant::now();
    match mgr.call_retrying(&req, cfg.manager_patience)? {
        MgrResponse::MemNodeRegistered {
            node,
            regions,
            heartbeat_interval_ms,
        } => {
            shared.regions.replace(&regions, cfg.region_size);
            shared.node_id.store(node.0, Ordering::Release);
            let interval = Duration::from_millis(heartbeat_interval_ms.max(10) as u64);
            shared.lease.renew(sent, interval);
            tracing::info!(
                "registered with manager {} as {node}: {} regions of {} bytes",
                mgr.addr(),
                regions.len(),
                cfg.region_size
            );
            Ok(interval)
        }
        other => Err(RpcError::Unexpected(format!("{other:?}"))),
    }
}

fn heartbeat_loop(shared: &Shared, mgr: &ManagerConn, addr: &str, cfg: &Config, mut interval: Duration) {
    let mut last_ok = Instant::now();
    // Every heartbeat of a manager outage fails: one line when the lease
    // lapses, summaries, and one when the manager answers again.
    let lapsed = remora_proto::Repeated::new(
        "manager reachable, lease renewed",
        "heartbeats failed after the lease lapsed",
    );
    while !shared.stop.load(Ordering::Acquire) {
        thread::park_timeout(interval);
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        if shared.faults.is_paused() {
            continue;
        }
        let req = MgrRequest::MemNodeHeartbeat {
            node: NodeId(shared.node_id.load(Ordering::Acquire)),
            admin: shared.admin,
            peer: shared.peer.snapshot(),
            load: shared.cpu.load(),
        };
        let sent = Instant::now();
        match mgr.call(&req) {
            Ok(MgrResponse::HeartbeatAck { state }) => {
                last_ok = Instant::now();
                shared.lease.renew(sent, interval);
                lapsed.ok();
                if state == NodeState::Draining && !shared.draining.swap(true, Ordering::AcqRel) {
                    tracing::info!("manager marked this node draining");
                }
            }
            Ok(other) => tracing::warn!("unexpected heartbeat answer {other:?}"),
            Err(RpcError::Remote(RemoteError::Fenced | RemoteError::Unknown)) => {
                // The manager gave up on us (we were paused or partitioned):
                // whatever we hold may be stale. Wipe and start over as a new node.
                tracing::warn!("fenced by the manager: wiping all regions and registering again");
                shared.lease.expire();
                shared.regions.replace(&[], cfg.region_size);
                match register(mgr, shared, addr, cfg) {
                    Ok(i) => interval = i,
                    Err(e) => tracing::error!("re-registration failed: {e}"),
                }
            }
            Err(e) => {
                if last_ok.elapsed() > interval * lease::LEASE_INTERVALS {
                    lapsed.fail(format_args!(
                        "manager unreachable for {} s ({e}): lease lapsed, serving no data until it is renewed",
                        last_ok.elapsed().as_secs()
                    ));
                }
            }
        }
    }
}
