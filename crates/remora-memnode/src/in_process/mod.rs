//! In-process memory nodes behind the transport trait, for unit tests and
//! for injecting a fault at an exact step (in the spirit of redb's
//! crash-testing storage backend).
//!
//! An [`InProcessCluster`] holds memory nodes that live in this process and
//! stands in for the manager: it hands out regions ([`FarBackend`]) and
//! tells compute nodes when a node dies. A node answers the wire's
//! [`MemRequest`](remora_proto::msg::MemRequest)s through the daemon's own
//! request handling (`service`: lease, capability and admin checks, every
//! request kind), so a scheme tested here speaks exactly the protocol it
//! speaks to a real daemon, and is refused what a daemon refuses. It
//! never replaces the tests against real processes; it adds the faults a
//! real process cannot be made to show at a precise moment:
//!
//! - [`NodeHandle::kill`]: the node dies; connections break, its memory is gone;
//! - [`NodeHandle::fail_next`]: the next requests break their connection;
//! - [`NodeHandle::break_at_commit`]: from a later commit on, requests
//!   break their connection for a while (a node cut off mid-fold);
//! - [`NodeHandle::set_delay`]: every reply comes late (past a caller's
//!   timeout, a call times out);
//! - [`NodeHandle::corrupt_reads`]: reads return bytes with a bit flipped;
//! - [`NodeHandle::die_after`]: the node dies in the middle of a later
//!   write, having stored only part of it;
//! - [`NodeHandle::die_at_txn`]: the node dies at a given step of the
//!   transactions it takes part in (before or after applying it);
//! - [`NodeHandle::lapse_lease`]: the node's lease lapses, as a daemon's
//!   does when the manager stops acknowledging it, so it serves no data
//!   (until [`NodeHandle::renew_lease`]).
//! - [`NodeHandle::restart_empty`]: a new incarnation at the same address
//!   that holds none of its regions;
//! - [`NodeHandle::drain`]: a planned departure (no new regions; the
//!   owners are told), whose end [`NodeHandle::regions_lent`] shows.
//!
//! The switches are in `handle.rs`; the manager's part (`Backend`) here.
//!
//! A node here shares its process with the compute node, so it cannot
//! measure its own CPU use: it reports the figure a test sets with
//! [`NodeHandle::set_cpu_permille`] (0, idle, until then).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use remora_proto::{
    AdminKey, Cap, ComputeId, Epoch, FarBackend, MemTransport, NodeId, NodeState, RegionGrant, RegionId, RemoteError,
    Rights, RpcError, SessionEvent, Token,
};

use crate::lease::Lease;
use crate::peer_traffic::PeerCounters;
use crate::region::RegionTable;

mod conn;
mod handle;
#[cfg(test)]
mod tests;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The switches of one node.
/// A connection's call timeout unless a test sets another.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Faults {
    dead: AtomicBool,
    /// Bumped when the node dies: connections opened before stay broken.
    incarnation: AtomicU64,
    fail_next: AtomicU64,
    delay_us: AtomicU64,
    /// What connections to the node give as their call timeout.
    call_timeout_us: AtomicU64,
    corrupt_reads: AtomicBool,
    /// Data requests left before the node dies mid-request; negative: never.
    die_after: AtomicI64,
    /// Transaction requests (prepare, commit, abort) left before the node
    /// dies at one; negative: never.
    die_at_txn: AtomicI64,
    /// Whether it dies after applying that request (its reply is lost) or before.
    die_after_applying: AtomicBool,
    /// Commit requests left before the node's lease lapses at one (as when
    /// the manager goes down mid-fold); negative: never.
    lapse_at_commit: AtomicI64,
    /// Commit requests left before the node is cut off at one; negative:
    /// never.
    break_at_commit: AtomicI64,
    /// For how long it is cut off then, in microseconds.
    break_for_us: AtomicU64,
    /// Until when requests break their connection unserved.
    cut_until: Mutex<Option<std::time::Instant>>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            dead: AtomicBool::new(false),
            incarnation: AtomicU64::new(0),
            fail_next: AtomicU64::new(0),
            delay_us: AtomicU64::new(0),
            call_timeout_us: AtomicU64::new(DEFAULT_CALL_TIMEOUT.as_micros() as u64),
            corrupt_reads: AtomicBool::new(false),
            die_after: AtomicI64::new(-1),
            die_at_txn: AtomicI64::new(-1),
            die_after_applying: AtomicBool::new(false),
            lapse_at_commit: AtomicI64::new(-1),
            break_at_commit: AtomicI64::new(-1),
            break_for_us: AtomicU64::new(0),
            cut_until: Mutex::new(None),
        }
    }
}

#[derive(Debug)]
struct Node {
    id: NodeId,
    addr: String,
    regions: RegionTable,
    ids: Vec<RegionId>,
    faults: Faults,
    peer: PeerCounters,
    /// What it answers to `Load` (set by tests).
    cpu_permille: AtomicU32,
    /// Held from the start (the cluster is its manager); lapsed by tests.
    lease: Lease,
    /// Planned departure ([`NodeHandle::drain`]): no new regions here.
    draining: AtomicBool,
    /// Known to no one: the cluster grants through its own API, so admin
    /// requests on the wire are refused as a daemon refuses a wrong key.
    admin: AdminKey,
}

#[derive(Debug)]
struct Shared {
    region_size: u64,
    regions_per_node: usize,
    nodes: RwLock<Vec<Arc<Node>>>,
    /// Region → its owner, for regions handed out.
    owners: Mutex<HashMap<RegionId, ComputeId>>,
    /// Region → its epoch, bumped on every grant and free as the manager does.
    epochs: Mutex<HashMap<RegionId, Epoch>>,
    subscribers: Mutex<Vec<(ComputeId, Sender<SessionEvent>)>>,
    next_region: AtomicU64,
    next_compute: AtomicU64,
    next_event: AtomicU64,
}

/// A cluster of in-process memory nodes and the manager's part for them.
#[derive(Debug, Clone)]
pub struct InProcessCluster {
    sh: Arc<Shared>,
}

/// Test access to one in-process node's fault switches.
#[derive(Debug, Clone)]
pub struct NodeHandle {
    node: Arc<Node>,
    sh: Arc<Shared>,
}

impl InProcessCluster {
    /// `nodes` memory nodes of `regions_per_node` regions of `region_size` bytes.
    pub fn new(nodes: usize, regions_per_node: usize, region_size: u64) -> Self {
        let c = Self {
            sh: Arc::new(Shared {
                region_size,
                regions_per_node,
                nodes: RwLock::new(Vec::new()),
                owners: Mutex::new(HashMap::new()),
                epochs: Mutex::new(HashMap::new()),
                subscribers: Mutex::new(Vec::new()),
                next_region: AtomicU64::new(1),
                next_compute: AtomicU64::new(1),
                next_event: AtomicU64::new(1),
            }),
        };
        for _ in 0..nodes {
            c.add_node();
        }
        c
    }

    /// Adds a memory node (a spare to rebuild on); returns its handle.
    pub fn add_node(&self) -> NodeHandle {
        let mut nodes = self.sh.nodes.write().unwrap_or_else(|p| p.into_inner());
        let id = NodeId(nodes.len() as u64 + 1);
        let ids: Vec<RegionId> = (0..self.sh.regions_per_node)
            .map(|_| RegionId(self.sh.next_region.fetch_add(1, Ordering::Relaxed)))
            .collect();
        let regions = RegionTable::default();
        regions.replace(&ids, self.sh.region_size);
        let node = Arc::new(Node {
            id,
            addr: format!("in-process:{}", id.0),
            regions,
            ids,
            faults: Faults::default(),
            peer: PeerCounters::default(),
            cpu_permille: AtomicU32::new(0),
            lease: Lease::default(),
            draining: AtomicBool::new(false),
            admin: Token::random(),
        });
        node.lease.hold();
        nodes.push(Arc::clone(&node));
        NodeHandle {
            node,
            sh: Arc::clone(&self.sh),
        }
    }

    /// The node with id `id`.
    pub fn node(&self, id: NodeId) -> Option<NodeHandle> {
        let nodes = self.sh.nodes.read().unwrap_or_else(|p| p.into_inner());
        nodes.iter().find(|n| n.id == id).map(|n| NodeHandle {
            node: Arc::clone(n),
            sh: Arc::clone(&self.sh),
        })
    }

    /// Every node, in id order.
    pub fn nodes(&self) -> Vec<NodeHandle> {
        let nodes = self.sh.nodes.read().unwrap_or_else(|p| p.into_inner());
        nodes
            .iter()
            .map(|n| NodeHandle {
                node: Arc::clone(n),
                sh: Arc::clone(&self.sh),
            })
            .collect()
    }

    /// Registers a compute node: its regions and connections come from here.
    pub fn backend(&self) -> Arc<dyn FarBackend> {
        let id = ComputeId(self.sh.next_compute.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = mpsc::channel();
        lock(&self.sh.subscribers).push((id, tx));
        Arc::new(Backend {
            sh: Arc::clone(&self.sh),
            id,
            events: Mutex::new(Some(rx)),
        })
    }

    /// Regions handed out and not freed.
    pub fn regions_in_use(&self) -> usize {
        lock(&self.sh.owners).len()
    }
}

impl Shared {
    /// The next epoch of `region` (the manager's part).
    fn bump_epoch(&self, region: RegionId) -> Epoch {
        let mut e = lock(&self.epochs);
        let epoch = e.entry(region).or_insert(0);
        *epoch += 1;
        *epoch
    }

    fn node_by_addr(&self, addr: &str) -> Option<Arc<Node>> {
        let nodes = self.nodes.read().unwrap_or_else(|p| p.into_inner());
        nodes.iter().find(|n| n.addr == addr).cloned()
    }
}

impl Node {
    fn die(&self) {
        self.faults.dead.store(true, Ordering::Release);
        self.faults.incarnation.fetch_add(1, Ordering::AcqRel);
        // Its memory is gone: nothing it held may be read again.
        for id in &self.ids {
            let _ = self.regions.revoke(*id, 0);
        }
    }

    fn is_dead(&self) -> bool {
        self.faults.dead.load(Ordering::Acquire)
    }
}

/// A compute node's session with an in-process cluster.
struct Backend {
    sh: Arc<Shared>,
    id: ComputeId,
    events: Mutex<Option<Receiver<SessionEvent>>>,
}

impl FarBackend for Backend {
    fn id(&self) -> ComputeId {
        self.id
    }

    fn alloc(&self, count: u32, distinct: bool, exclude: &[NodeId]) -> Result<Vec<RegionGrant>, RpcError> {
        let nodes: Vec<Arc<Node>> = self.sh.nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
        let mut owners = lock(&self.sh.owners);
        // Free regions per live, allowed node, the emptiest node first (as the manager does).
        let mut free: Vec<(Arc<Node>, Vec<RegionId>)> = nodes
            .into_iter()
            .filter(|n| !n.is_dead() && !n.draining.load(Ordering::Acquire) && !exclude.contains(&n.id))
            .map(|n| {
                let f: Vec<RegionId> = n.ids.iter().copied().filter(|r| !owners.contains_key(r)).collect();
                (n, f)
            })
            .filter(|(_, f)| !f.is_empty())
            .collect();
        free.sort_by_key(|(n, f)| (std::cmp::Reverse(f.len()), n.id));
        let available: usize = if distinct {
            free.len()
        } else {
            free.iter().map(|(_, f)| f.len()).sum()
        };
        if available < count as usize {
            return Err(RpcError::Remote(RemoteError::NoCapacity {
                wanted: count,
                available: available as u32,
            }));
        }
        let mut picked: Vec<(Arc<Node>, RegionId)> = Vec::with_capacity(count as usize);
        if distinct {
            for (n, f) in free.iter().take(count as usize) {
                picked.push((Arc::clone(n), f[0]));
            }
        } else {
            'outer: for (n, f) in &free {
                for r in f {
                    if picked.len() == count as usize {
                        break 'outer;
                    }
                    picked.push((Arc::clone(n), *r));
                }
            }
        }
        let mut grants = Vec::with_capacity(picked.len());
        for (n, r) in picked {
            let token = Token::random();
            let epoch = self.sh.bump_epoch(r);
            n.regions.grant(r, self.id, token, epoch).map_err(RpcError::Remote)?;
            owners.insert(r, self.id);
            grants.push(RegionGrant {
                cap: Cap {
                    region: r,
                    rights: Rights::ReadWrite,
                    token,
                    epoch,
                },
                node: n.id,
                addr: n.addr.clone(),
                size: self.sh.region_size,
                node_state: NodeState::Alive,
            });
        }
        Ok(grants)
    }

    fn free(&self, region: RegionId) -> Result<(), RpcError> {
        let owner = lock(&self.sh.owners).remove(&region);
        if owner != Some(self.id) {
            if let Some(o) = owner {
                lock(&self.sh.owners).insert(region, o);
            }
            return Err(RpcError::Remote(RemoteError::BadRequest(format!(
                "{region} is not held by {}",
                self.id
            ))));
        }
        let nodes = self.sh.nodes.read().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = nodes.iter().find(|n| n.regions.get(region).is_ok()) {
            let _ = n.regions.revoke(region, self.sh.bump_epoch(region));
        }
        Ok(())
    }

    fn take_events(&self) -> Option<Receiver<SessionEvent>> {
        lock(&self.events).take()
    }

    fn connect(&self, addr: &str) -> Result<Arc<dyn MemTransport>, RpcError> {
        self.sh.connect(addr)
    }

    /// In process there is no manager to ask: a node is dead once killed.
    fn confirm(&self, node: NodeId) -> Result<bool, RpcError> {
        let nodes = self.sh.nodes.read().unwrap_or_else(|p| p.into_inner());
        Ok(nodes.iter().any(|n| n.id == node && !n.is_dead()))
    }
}
