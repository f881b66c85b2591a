//! In-process memory nodes behind the transport trait, for unit tests and
//! for injecting a fault at an exact step (in the spirit of redb's
//! crash-testing storage backend).
//!
//! An [`InProcessCluster`] holds memory nodes that live in this process and
//! stands in for the manager: it hands out regions ([`FarBackend`]) and
//! tells compute nodes when a node dies. A node serves the wire's
//! [`MemRequest`]s with the daemon's own capability checks
//! (`region`) and offloaded rebuild (`rebuild`), so a scheme
//! tested here speaks exactly the protocol it speaks to a real daemon. It
//! never replaces the tests against real processes; it adds the faults a
//! real process cannot be made to show at a precise moment:
//!
//! - [`NodeHandle::kill`]: the node dies; connections break, its memory is gone;
//! - [`NodeHandle::fail_next`]: the next requests break their connection;
//! - [`NodeHandle::set_delay`]: every reply comes late (past a caller's
//!   timeout, a call times out);
//! - [`NodeHandle::corrupt_reads`]: reads return bytes with a bit flipped;
//! - [`NodeHandle::die_after`]: the node dies in the middle of a later
//!   write, having stored only part of it;
//! - [`NodeHandle::die_at_txn`]: the node dies at a given step of the
//!   transactions it takes part in (before or after applying it).
//!
//! A node here shares its process with the compute node, so it cannot
//! measure its own CPU use: it reports the figure a test sets with
//! [`NodeHandle::set_cpu_permille`] (0, idle, until then).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use remora_proto::msg::{MemRequest, MemResponse, NodeLoad, PeerTraffic};
use remora_proto::rpc::Ticket;
use remora_proto::{
    Cap, ComputeId, Epoch, Event, EventKind, FarBackend, MemTransport, NodeId, NodeState, RegionGrant, RegionId,
    RemoteError, Rights, RpcError, SessionEvent, Token,
};

use crate::peer_traffic::PeerCounters;
use crate::region::RegionTable;
use crate::txn::TxnCtx;

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
        });
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

    fn connect(self: &Arc<Self>, addr: &str) -> Result<Arc<dyn MemTransport>, RpcError> {
        let node = self.node_by_addr(addr).ok_or_else(|| RpcError::Connect {
            addr: addr.to_string(),
            reason: "no such in-process node".into(),
        })?;
        if node.faults.dead.load(Ordering::Acquire) {
            return Err(RpcError::Connect {
                addr: addr.to_string(),
                reason: "connection refused (node is dead)".into(),
            });
        }
        let incarnation = node.faults.incarnation.load(Ordering::Acquire);
        Ok(Arc::new(Conn {
            node,
            sh: Arc::clone(self),
            incarnation,
            broken: AtomicBool::new(false),
            next: AtomicU64::new(1),
            done: Mutex::new(HashMap::new()),
        }))
    }
}

impl NodeHandle {
    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.node.id
    }

    /// Where its data path "listens".
    pub fn addr(&self) -> &str {
        &self.node.addr
    }

    /// Kills the node: every connection breaks, its memory is gone. With
    /// `notify`, every compute node holding one of its regions is told at
    /// once, as the manager would after its heartbeat timeout.
    pub fn kill(&self, notify: bool) {
        self.node.die();
        if notify {
            self.declare_dead();
        }
    }

    /// Tells the compute nodes holding regions here that the node is dead
    /// (the manager's verdict), and takes its regions out of the pool.
    pub fn declare_dead(&self) {
        let mut by_owner: HashMap<ComputeId, Vec<RegionId>> = HashMap::new();
        {
            let mut owners = lock(&self.sh.owners);
            for r in &self.node.ids {
                if let Some(o) = owners.remove(r) {
                    by_owner.entry(o).or_default().push(*r);
                }
            }
        }
        let subs = lock(&self.sh.subscribers);
        for (owner, regions) in by_owner {
            for (id, tx) in subs.iter() {
                if *id == owner {
                    let ev = Event {
                        seq: self.sh.next_event.fetch_add(1, Ordering::Relaxed),
                        kind: EventKind::NodeDead {
                            node: self.node.id,
                            addr: self.node.addr.clone(),
                            regions: regions.clone(),
                        },
                    };
                    let _ = tx.send(SessionEvent::Manager(ev));
                }
            }
        }
    }

    /// The next `n` data requests break their connection (the node lives).
    pub fn fail_next(&self, n: u64) {
        self.node.faults.fail_next.store(n, Ordering::Release);
    }

    /// Every reply comes `d` late.
    pub fn set_delay(&self, d: Duration) {
        self.node.faults.delay_us.store(d.as_micros() as u64, Ordering::Release);
    }

    /// Connections to the node give `d` as their call timeout (10 s by
    /// default), so a test can outlast it without waiting 10 s.
    pub fn set_call_timeout(&self, d: Duration) {
        self.node
            .faults
            .call_timeout_us
            .store(d.as_micros() as u64, Ordering::Release);
    }

    /// Reads return their bytes with the first bit flipped.
    pub fn corrupt_reads(&self, on: bool) {
        self.node.faults.corrupt_reads.store(on, Ordering::Release);
    }

    /// The node dies while serving the data request after the next `n`: a
    /// write then stores only the first half of its bytes.
    pub fn die_after(&self, n: u64) {
        self.node.faults.die_after.store(n as i64, Ordering::Release);
    }

    /// The node dies at its transaction request number `n` (0: the next
    /// prepare, commit or abort it serves), before applying it, or after
    /// applying it with the reply lost (`after_applying`).
    pub fn die_at_txn(&self, n: u64, after_applying: bool) {
        let f = &self.node.faults;
        f.die_after_applying.store(after_applying, Ordering::Release);
        f.die_at_txn.store(n as i64, Ordering::Release);
    }

    /// The CPU use the node reports from now on, in thousandths of a core
    /// (see [`NodeLoad`]), standing in for a busy or idle memory node.
    pub fn set_cpu_permille(&self, permille: u32) {
        self.node.cpu_permille.store(permille, Ordering::Release);
    }

    /// What this node has sent to peers so far.
    pub fn peer_traffic(&self) -> PeerTraffic {
        self.node.peer.snapshot()
    }

    /// Transactions with changes staged on this node (prepared, neither
    /// committed nor aborted).
    pub fn staged_transactions(&self) -> usize {
        self.node.regions.txns.staged()
    }

    /// Whether the node is dead.
    pub fn is_dead(&self) -> bool {
        self.node.faults.dead.load(Ordering::Acquire)
    }

    /// Bytes of region `region` at `offset` (for tests that look at what a
    /// node holds); `None` if the region is not here or not granted.
    pub fn peek(&self, region: RegionId, offset: u64, len: usize) -> Option<Vec<u8>> {
        let r = self.node.regions.get(region).ok()?;
        let g = r.read();
        g.mem.get(offset as usize..offset as usize + len).map(<[u8]>::to_vec)
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

    /// What a transaction request works with; peers are this cluster's nodes.
    fn txn_ctx<'a>(
        &'a self,
        sh: &'a Arc<Shared>,
    ) -> TxnCtx<'a, impl Fn(&str) -> Result<Arc<dyn MemTransport>, RemoteError> + 'a> {
        TxnCtx {
            regions: &self.regions,
            peer: move |addr: &str| {
                sh.connect(addr)
                    .map_err(|e| RemoteError::Internal(format!("peer {addr}: {e}")))
            },
            counters: &self.peer,
        }
    }

    fn serve(&self, sh: &Arc<Shared>, req: &MemRequest, payload: &[u8]) -> Result<(MemResponse, Vec<u8>), RemoteError> {
        match req {
            MemRequest::Read { cap, offset, len } => {
                let region = self.regions.get(cap.region)?;
                let g = region.read();
                let range = g.check(&region, cap, false, *offset, *len as u64)?;
                self.peer.served_read(cap.rights, *len as u64);
                Ok((MemResponse::Data, g.mem[range].to_vec()))
            }
            MemRequest::ReadV { ranges } => {
                let mut out = Vec::new();
                for r in ranges {
                    let region = self.regions.get(r.cap.region)?;
                    let g = region.read();
                    let range = g.check(&region, &r.cap, false, r.offset, r.len as u64)?;
                    out.extend_from_slice(&g.mem[range]);
                }
                self.peer.served_read_v(ranges, out.len() as u64);
                Ok((MemResponse::Data, out))
            }
            MemRequest::Write { cap, offset } => {
                let region = self.regions.get(cap.region)?;
                let mut g = region.write();
                let range = g.check(&region, cap, true, *offset, payload.len() as u64)?;
                g.mem[range.clone()].copy_from_slice(payload);
                g.wrote(&range);
                Ok((MemResponse::Written, Vec::new()))
            }
            MemRequest::WriteV { ranges } => {
                let total: u64 = ranges.iter().map(|r| r.len as u64).sum();
                if total != payload.len() as u64 {
                    return Err(RemoteError::BadRequest(format!(
                        "ranges total {total} bytes but the payload has {}",
                        payload.len()
                    )));
                }
                for r in ranges {
                    let region = self.regions.get(r.cap.region)?;
                    region.read().check(&region, &r.cap, true, r.offset, r.len as u64)?;
                }
                let mut at = 0;
                for r in ranges {
                    let region = self.regions.get(r.cap.region)?;
                    let mut g = region.write();
                    let range = g.check(&region, &r.cap, true, r.offset, r.len as u64)?;
                    g.mem[range.clone()].copy_from_slice(&payload[at..at + r.len as usize]);
                    g.wrote(&range);
                    at += r.len as usize;
                }
                Ok((MemResponse::Written, Vec::new()))
            }
            MemRequest::Ping => Ok((MemResponse::Pong, Vec::new())),
            MemRequest::Load => Ok((
                MemResponse::Load(NodeLoad {
                    cpu_permille: self.cpu_permille.load(Ordering::Acquire),
                    cores: 1,
                }),
                Vec::new(),
            )),
            MemRequest::Rebuild {
                cap,
                k,
                m,
                want,
                sources,
                rows,
            } => {
                let peer = |addr: &str| {
                    sh.connect(addr)
                        .map_err(|e| RemoteError::Internal(format!("peer {addr}: {e}")))
                };
                let (bytes, checksums) =
                    crate::rebuild::rebuild(&self.regions, &peer, *cap, *k, *m, *want, sources, rows)?;
                Ok((MemResponse::Rebuilt { bytes, checksums }, Vec::new()))
            }
            MemRequest::PrepareMany { txn, ops } => {
                let deltas = self.txn_ctx(sh).prepare_many(*txn, ops, payload)?;
                Ok((MemResponse::Prepared, deltas))
            }
            MemRequest::Prepare { txn, op } => {
                let delta = self.txn_ctx(sh).prepare(*txn, op, payload)?;
                Ok((MemResponse::Prepared, delta.unwrap_or_default()))
            }
            MemRequest::Commit { cap, txn } => {
                self.txn_ctx(sh).commit(cap, *txn)?;
                Ok((MemResponse::Committed, Vec::new()))
            }
            MemRequest::Abort { cap, txn } => {
                self.txn_ctx(sh).abort(cap, *txn)?;
                Ok((MemResponse::Aborted, Vec::new()))
            }
            MemRequest::ReadMember { cap, offset, len } => {
                let (generation, bytes) = self.txn_ctx(sh).read_member(cap, *offset, *len)?;
                self.peer.served_read(cap.rights, u64::from(*len));
                Ok((MemResponse::Member { generation }, bytes))
            }
            MemRequest::Stats => {
                let stats = remora_proto::MemNodeStats {
                    deltas_in_flight: self.peer.deltas_in_flight(),
                    peer: self.peer.snapshot(),
                    ..self.regions.stats()
                };
                Ok((MemResponse::Stats(stats), Vec::new()))
            }
            MemRequest::Grant { .. } | MemRequest::Revoke { .. } | MemRequest::Fault { .. } => Err(
                RemoteError::Unsupported("admin requests: an in-process cluster grants through its own API".into()),
            ),
        }
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
            .filter(|n| !n.is_dead() && !exclude.contains(&n.id))
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

/// A served request waiting for its caller.
struct Done {
    result: Result<(MemResponse, Vec<u8>), RpcError>,
    ready_at: Instant,
}

/// A connection to an in-process node. Each request is served when it is
/// sent; its reply waits for [`MemTransport::wait`] (after any injected delay).
struct Conn {
    node: Arc<Node>,
    sh: Arc<Shared>,
    incarnation: u64,
    broken: AtomicBool,
    next: AtomicU64,
    done: Mutex<HashMap<u64, Done>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InProcessConn({})", self.node.addr)
    }
}

impl Conn {
    fn broken(&self, reason: &str) -> RpcError {
        self.broken.store(true, Ordering::Release);
        RpcError::Broken {
            addr: self.node.addr.clone(),
            reason: reason.into(),
        }
    }

    fn gone(&self) -> bool {
        self.node.is_dead() || self.node.faults.incarnation.load(Ordering::Acquire) != self.incarnation
    }

    /// Serves `req`, with the node's faults applied.
    fn serve(&self, req: &MemRequest, payload: &[u8]) -> Result<(MemResponse, Vec<u8>), RpcError> {
        let f = &self.node.faults;
        let data = matches!(
            req,
            MemRequest::Read { .. } | MemRequest::ReadV { .. } | MemRequest::Write { .. } | MemRequest::WriteV { .. }
        );
        if data && f.die_after.load(Ordering::Acquire) >= 0 && f.die_after.fetch_sub(1, Ordering::AcqRel) == 0 {
            // Dies mid-request: a write gets half its bytes stored first.
            if let MemRequest::Write { cap, offset } = req {
                let half = &payload[..payload.len() / 2];
                let _ = self.node.serve(
                    &self.sh,
                    &MemRequest::Write {
                        cap: *cap,
                        offset: *offset,
                    },
                    half,
                );
            }
            self.node.die();
            return Err(self.broken("node died mid-request"));
        }
        let txn = matches!(
            req,
            MemRequest::Prepare { .. }
                | MemRequest::PrepareMany { .. }
                | MemRequest::Commit { .. }
                | MemRequest::Abort { .. }
        );
        if txn && f.die_at_txn.load(Ordering::Acquire) >= 0 && f.die_at_txn.fetch_sub(1, Ordering::AcqRel) == 0 {
            if f.die_after_applying.load(Ordering::Acquire) {
                let _ = self.node.serve(&self.sh, req, payload);
            }
            self.node.die();
            return Err(self.broken("node died at a transaction step"));
        }
        if f.fail_next.load(Ordering::Acquire) > 0
            && f.fail_next
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(self.broken("injected connection failure"));
        }
        let (resp, mut bytes) = self.node.serve(&self.sh, req, payload).map_err(RpcError::Remote)?;
        if resp == MemResponse::Data && f.corrupt_reads.load(Ordering::Acquire) {
            if let Some(b) = bytes.first_mut() {
                *b ^= 1;
            }
        }
        Ok((resp, bytes))
    }
}

impl MemTransport for Conn {
    fn peer(&self) -> &str {
        &self.node.addr
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire) || self.gone()
    }

    fn close(&self) {
        self.broken.store(true, Ordering::Release);
    }

    fn call_timeout(&self) -> Duration {
        Duration::from_micros(self.node.faults.call_timeout_us.load(Ordering::Acquire))
    }

    fn send(&self, req: &MemRequest, payload: &[&[u8]]) -> Result<Ticket, RpcError> {
        if self.is_broken() {
            return Err(self.broken("node is dead"));
        }
        let joined: Vec<u8>;
        let payload: &[u8] = match payload {
            [] => &[],
            [one] => one,
            many => {
                joined = many.concat();
                &joined
            }
        };
        let result = self.serve(req, payload);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let delay = Duration::from_micros(self.node.faults.delay_us.load(Ordering::Acquire));
        lock(&self.done).insert(
            id,
            Done {
                result,
                ready_at: Instant::now() + delay,
            },
        );
        Ok(Ticket::from_raw(id))
    }

    fn wait(&self, t: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<MemResponse, RpcError> {
        self.wait_for(t, dest, timeout, false)
    }

    fn wait_keeping(&self, t: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<MemResponse, RpcError> {
        self.wait_for(t, dest, timeout, true)
    }
}

impl Conn {
    /// Waits for request `t`; with `keep`, a timeout leaves it in flight.
    fn wait_for(
        &self,
        t: Ticket,
        dest: Option<&mut [u8]>,
        timeout: Duration,
        keep: bool,
    ) -> Result<MemResponse, RpcError> {
        let done = lock(&self.done)
            .remove(&t.raw())
            .ok_or_else(|| RpcError::Unexpected(format!("no request {} in flight", t.raw())))?;
        let now = Instant::now();
        if done.ready_at > now {
            let late = done.ready_at - now;
            if late > timeout {
                std::thread::sleep(timeout);
                if keep {
                    lock(&self.done).insert(t.raw(), done);
                }
                return Err(RpcError::Timeout {
                    addr: self.node.addr.clone(),
                    after: timeout,
                });
            }
            std::thread::sleep(late);
        }
        let (resp, bytes) = done.result?;
        match dest {
            Some(d) if d.len() == bytes.len() => d.copy_from_slice(&bytes),
            Some(d) => {
                return Err(RpcError::Unexpected(format!(
                    "payload of {} bytes for a buffer of {}",
                    bytes.len(),
                    d.len()
                )));
            }
            None if !bytes.is_empty() => {
                return Err(RpcError::Unexpected("a reply payload with no buffer for it".into()));
            }
            None => {}
        }
        Ok(resp)
    }
}
