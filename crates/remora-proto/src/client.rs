//! Typed clients: the memory node's data path and the manager's control path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::cap::{AdminKey, ComputeId, Epoch, NodeId, RegionId, Session, Token};
use crate::msg::{
    ClusterStatus, Event, Fault, MemNodeStats, MemRequest, MemResponse, MgrRequest, MgrResponse, RegionGrant,
    RemoteError,
};
use crate::rpc::{ConnOptions, RpcConn, RpcError, Ticket};
use crate::tls::Plane;
use crate::transport::MemTransport;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn unexpected<T: std::fmt::Debug>(what: T) -> RpcError {
    RpcError::Unexpected(format!("{what:?}"))
}

/// A connection to one memory node's data path.
#[derive(Clone)]
pub struct MemNodeClient {
    conn: Arc<RpcConn>,
}

impl std::fmt::Debug for MemNodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemNodeClient({})", self.conn.peer())
    }
}

impl MemNodeClient {
    /// Connects to the memory node at `addr`.
    pub fn connect(addr: &str, opts: ConnOptions) -> Result<Self, RpcError> {
        Ok(Self {
            conn: RpcConn::connect_on(addr, opts, Plane::Data)?,
        })
    }

    /// Connects to the memory node at `addr` for the manager's own calls
    /// (grants, revocations, probes): encrypted whenever TLS is on at all,
    /// since they carry region tokens.
    pub fn connect_control(addr: &str, opts: ConnOptions) -> Result<Self, RpcError> {
        Ok(Self {
            conn: RpcConn::connect_on(addr, opts, Plane::Control)?,
        })
    }

    /// The underlying connection.
    pub fn conn(&self) -> &Arc<RpcConn> {
        &self.conn
    }

    /// Admin: grant `region` to `owner` in assignment `epoch`.
    pub fn grant(
        &self,
        admin: AdminKey,
        region: RegionId,
        owner: ComputeId,
        token: Token,
        epoch: Epoch,
    ) -> Result<(), RpcError> {
        self.admin(MemRequest::Grant {
            admin,
            region,
            owner,
            token,
            epoch,
        })
    }

    /// Admin: revoke and wipe `region`, which enters `epoch`.
    pub fn revoke(&self, admin: AdminKey, region: RegionId, epoch: Epoch) -> Result<(), RpcError> {
        self.admin(MemRequest::Revoke { admin, region, epoch })
    }

    /// What the node holds (regions, grants, staged transactions).
    pub fn stats(&self) -> Result<MemNodeStats, RpcError> {
        match self.conn.call::<_, MemResponse>(&MemRequest::Stats, &[], None)?.0 {
            MemResponse::Stats(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Test support: inject a fault (the daemon needs the `fault-injection` feature).
    pub fn fault(&self, admin: AdminKey, fault: Fault) -> Result<(), RpcError> {
        self.admin(MemRequest::Fault { admin, fault })
    }

    fn admin(&self, req: MemRequest) -> Result<(), RpcError> {
        let (r, _) = self.conn.call::<_, MemResponse>(&req, &[], None)?;
        if r == MemResponse::Done {
            Ok(())
        } else {
            Err(unexpected(r))
        }
    }
}

impl MemTransport for MemNodeClient {
    fn peer(&self) -> &str {
        self.conn.peer()
    }

    fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }

    fn close(&self) {
        self.conn.close();
    }

    fn call_timeout(&self) -> Duration {
        self.conn.options().call_timeout
    }

    fn send(&self, req: &MemRequest, payload: &[&[u8]]) -> Result<Ticket, RpcError> {
        self.conn.send(req, payload)
    }

    fn wait(&self, t: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<MemResponse, RpcError> {
        let r = self.conn.wait(t, dest, timeout)?;
        crate::msg::decode(&r.head).map_err(|e| RpcError::Unexpected(e.to_string()))
    }

    fn wait_keeping(&self, t: Ticket, dest: Option<&mut [u8]>, timeout: Duration) -> Result<MemResponse, RpcError> {
        let r = self.conn.wait_keeping(t, dest, timeout)?;
        crate::msg::decode(&r.head).map_err(|e| RpcError::Unexpected(e.to_string()))
    }
}

/// A connection to the manager group that follows its leader.
///
/// It is given every manager's address (`a,b,c`; one address is a group of
/// one). A follower refuses with [`RemoteError::NotLeader`] naming the
/// leader, and the call goes there at once; while an election is under way
/// (no leader named) it asks again every [`ELECTION_POLL`] until the call's
/// deadline. A manager that cannot be reached is passed over for the next
/// one. The connection also reconnects after a manager restarts.
pub struct ManagerConn {
    addrs: Vec<String>,
    opts: ConnOptions,
    cur: Mutex<Target>,
}

struct Target {
    /// The manager asked first: the last one that answered or was named leader.
    addr: String,
    conn: Option<Arc<RpcConn>>,
}

/// How often a call asks again while the manager group elects a leader.
pub const ELECTION_POLL: Duration = Duration::from_millis(50);

impl ManagerConn {
    /// Connects to the manager group at `addrs` (comma-separated), to the
    /// first manager that accepts.
    pub fn connect(addrs: &str, opts: ConnOptions) -> Result<Self, RpcError> {
        let addrs: Vec<String> = addrs
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        let Some(first) = addrs.first().cloned() else {
            return Err(RpcError::Connect {
                addr: String::new(),
                reason: "no manager address given".into(),
            });
        };
        let me = Self {
            addrs,
            opts,
            cur: Mutex::new(Target {
                addr: first,
                conn: None,
            }),
        };
        me.current()?;
        Ok(me)
    }

    /// The address of the manager asked first (the leader, as far as known).
    pub fn addr(&self) -> String {
        lock(&self.cur).addr.clone()
    }

    /// Every manager's address.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The connection to the current target, or to the next manager that
    /// accepts one (each tried once).
    fn current(&self) -> Result<Arc<RpcConn>, RpcError> {
        let mut t = lock(&self.cur);
        if let Some(conn) = t.conn.as_ref() {
            if !conn.is_broken() {
                return Ok(Arc::clone(conn));
            }
        }
        t.conn = None;
        let start = self.addrs.iter().position(|a| *a == t.addr);
        let order = std::iter::once(t.addr.clone())
            .chain((1..self.addrs.len()).map(|i| self.addrs[(start.unwrap_or(0) + i) % self.addrs.len()].clone()));
        let mut last = None;
        for addr in order {
            match RpcConn::connect(&addr, self.opts.clone()) {
                Ok(conn) => {
                    t.addr = addr;
                    t.conn = Some(Arc::clone(&conn));
                    return Ok(conn);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one address"))
    }

    /// Moves on from `failed`, the connection a call just used: to `addr`
    /// (named leader) or, with `None`, to the next manager. Calls share the
    /// connection, so one that another call has already moved on from is
    /// left as it is (closing it would fail the calls on the new one).
    fn retarget(&self, failed: Option<&Arc<RpcConn>>, addr: Option<String>) {
        let mut t = lock(&self.cur);
        let moved_on = match (&t.conn, failed) {
            (Some(cur), Some(f)) => !Arc::ptr_eq(cur, f),
            (None, Some(_)) => true,
            (_, None) => false,
        };
        if moved_on {
            return;
        }
        if let Some(c) = t.conn.take() {
            c.close();
        }
        t.addr = match addr {
            Some(a) => a,
            None => {
                let i = self.addrs.iter().position(|a| *a == t.addr).map_or(0, |i| i + 1);
                self.addrs[i % self.addrs.len()].clone()
            }
        };
    }

    /// Breaks the current connection, so calls in flight on it fail now
    /// instead of at their timeout (a session shutting down). A call that
    /// is connecting meanwhile keeps its connection.
    pub fn close(&self) {
        if let Ok(t) = self.cur.try_lock() {
            if let Some(conn) = t.conn.as_ref() {
                conn.close();
            }
        }
    }

    /// One attempt (following the leader), reconnecting first if the last
    /// connection broke.
    pub fn call(&self, req: &MgrRequest) -> Result<MgrResponse, RpcError> {
        self.call_timeout(req, self.opts.call_timeout)
    }

    /// One attempt with a specific reply deadline, following the leader:
    /// redirects and elections are waited out within `timeout`; a manager
    /// that fails is passed over for the next one when there is another.
    pub fn call_timeout(&self, req: &MgrRequest, timeout: Duration) -> Result<MgrResponse, RpcError> {
        let deadline = Instant::now() + timeout;
        let mut failed = 0;
        loop {
            let mut used = None;
            let result = self.current().and_then(|conn| {
                used = Some(Arc::clone(&conn));
                let t = conn.send(req, &[])?;
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                let reply = conn.wait(t, None, left)?;
                crate::msg::decode(&reply.head).map_err(|e| RpcError::Unexpected(e.to_string()))
            });
            match result {
                Err(RpcError::Remote(RemoteError::NotLeader { leader })) if Instant::now() < deadline => {
                    if leader.is_none() {
                        thread::sleep(ELECTION_POLL.min(deadline.saturating_duration_since(Instant::now())));
                    }
                    self.retarget(used.as_ref(), leader);
                }
                // Another manager may lead now: each is asked once. (A
                // connect error means none accepted a connection.)
                Err(e @ (RpcError::Broken { .. } | RpcError::Timeout { .. }))
                    if self.addrs.len() > 1 && failed + 1 < self.addrs.len() =>
                {
                    failed += 1;
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    self.retarget(used.as_ref(), None);
                }
                other => return other,
            }
        }
    }

    /// Retries transport failures (the manager restarting) until `patience`
    /// runs out. Only for idempotent requests.
    pub fn call_retrying(&self, req: &MgrRequest, patience: Duration) -> Result<MgrResponse, RpcError> {
        let start = Instant::now();
        loop {
            match self.call(req) {
                Err(e)
                    if (e.is_transport() || matches!(e, RpcError::Remote(RemoteError::NotLeader { .. })))
                        && start.elapsed() < patience =>
                {
                    thread::sleep(ELECTION_POLL);
                }
                other => return other,
            }
        }
    }

    /// The cluster's state.
    pub fn status(&self) -> Result<ClusterStatus, RpcError> {
        match self.call(&MgrRequest::Status)? {
            MgrResponse::Status(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Marks the memory node registered at `addr` draining.
    pub fn drain(&self, addr: &str) -> Result<(), RpcError> {
        match self.call(&MgrRequest::Drain { addr: addr.to_string() })? {
            MgrResponse::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

/// What a compute session reports to its owner besides manager events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// An event from the manager.
    Manager(Event),
    /// The manager restarted (or was unreachable and came back): re-read the
    /// regions with [`ComputeSession::my_regions`].
    Resync,
    /// The manager declared this compute node dead: its regions are gone.
    Expired,
}

struct SessionShared {
    mgr: ManagerConn,
    session: Session,
    stop: AtomicBool,
    heartbeats_suspended: AtomicBool,
    interval_ms: AtomicU64,
    /// The number of the session's next `Alloc` or `Free`.
    next_seq: AtomicU64,
}

/// A compute node's session with the manager: registration, heartbeats in
/// the background, region allocation, and a channel of events (memory node
/// died or is draining, for regions this node holds).
pub struct ComputeSession {
    shared: Arc<SessionShared>,
    events: Mutex<Option<Receiver<SessionEvent>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl ComputeSession {
    /// Registers with the manager at `addr` under `name` and starts heartbeating.
    pub fn open(addr: &str, name: &str, opts: ConnOptions) -> Result<Self, RpcError> {
        let mgr = ManagerConn::connect(addr, opts)?;
        let (session, interval, incarnation) = match mgr.call(&MgrRequest::RegisterCompute {
            name: name.to_string(),
            request: MgrRequest::registration_number(),
        })? {
            MgrResponse::ComputeRegistered {
                session,
                heartbeat_interval_ms,
                incarnation,
            } => (session, heartbeat_interval_ms, incarnation),
            other => return Err(unexpected(other)),
        };
        let shared = Arc::new(SessionShared {
            mgr,
            session,
            stop: AtomicBool::new(false),
            heartbeats_suspended: AtomicBool::new(false),
            interval_ms: AtomicU64::new(interval as u64),
            next_seq: AtomicU64::new(1),
        });
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::new();
        let s = Arc::clone(&shared);
        let tx2 = tx.clone();
        threads.push(
            thread::Builder::new()
                .name("remora-heartbeat".into())
                .spawn(move || heartbeat_loop(&s, &tx2))
                .map_err(|e| RpcError::Unexpected(e.to_string()))?,
        );
        let s = Arc::clone(&shared);
        threads.push(
            thread::Builder::new()
                .name("remora-events".into())
                .spawn(move || event_loop(&s, &tx, incarnation))
                .map_err(|e| RpcError::Unexpected(e.to_string()))?,
        );
        Ok(Self {
            shared,
            events: Mutex::new(Some(rx)),
            threads,
        })
    }

    /// This compute node's id.
    pub fn id(&self) -> ComputeId {
        self.shared.session.id
    }

    /// Takes the event channel (once).
    pub fn take_events(&self) -> Option<Receiver<SessionEvent>> {
        lock(&self.events).take()
    }

    /// Allocates `count` regions, on distinct memory nodes if `distinct`,
    /// avoiding the nodes in `exclude`. In a group of managers it is asked
    /// again (the same request, applied once) while the group changes
    /// leader; a lone manager's outage is the caller's to wait out.
    pub fn alloc(&self, count: u32, distinct: bool, exclude: &[NodeId]) -> Result<Vec<RegionGrant>, RpcError> {
        let req = MgrRequest::Alloc {
            session: self.shared.session,
            seq: self.shared.next_seq.fetch_add(1, Ordering::Relaxed),
            count,
            distinct,
            exclude: exclude.to_vec(),
        };
        let answer = if self.shared.mgr.addrs().len() > 1 {
            self.shared.mgr.call_retrying(&req, Duration::from_secs(10))?
        } else {
            self.shared.mgr.call(&req)?
        };
        match answer {
            MgrResponse::Regions(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Frees a region.
    pub fn free(&self, region: RegionId) -> Result<(), RpcError> {
        let req = MgrRequest::Free {
            session: self.shared.session,
            seq: self.shared.next_seq.fetch_add(1, Ordering::Relaxed),
            region,
        };
        match self.shared.mgr.call_retrying(&req, Duration::from_secs(5))? {
            MgrResponse::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// The regions this node holds, as the manager records them.
    pub fn my_regions(&self) -> Result<Vec<RegionGrant>, RpcError> {
        let req = MgrRequest::MyRegions {
            session: self.shared.session,
        };
        match self.shared.mgr.call_retrying(&req, Duration::from_secs(5))? {
            MgrResponse::Regions(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Reports memory node `node` as suspected and waits for the manager's
    /// verdict: true if the node is alive after all. The manager may take
    /// up to the node's lease to rule, so this blocks that long.
    pub fn suspect(&self, node: NodeId) -> Result<bool, RpcError> {
        let req = MgrRequest::Suspect {
            session: self.shared.session,
            node,
        };
        let interval = Duration::from_millis(self.shared.interval_ms.load(Ordering::Relaxed).max(10));
        // The lease, the probes' own timeouts, and room for a busy manager.
        let patience = interval * (crate::msg::LEASE_INTERVALS + 2) + Duration::from_secs(5);
        match self.shared.mgr.call_timeout(&req, patience)? {
            MgrResponse::Verdict { alive } => Ok(alive),
            other => Err(unexpected(other)),
        }
    }

    /// The manager connection, for status queries.
    pub fn manager(&self) -> &ManagerConn {
        &self.shared.mgr
    }

    /// Stops sending heartbeats while keeping the session object: lets tests
    /// show what the manager does with a compute node that went silent.
    pub fn suspend_heartbeats(&self) {
        self.shared.heartbeats_suspended.store(true, Ordering::Release);
    }
}

impl Drop for ComputeSession {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // A heartbeat or an event wait to a manager that hangs would
        // otherwise hold the drop up for its call timeout.
        self.shared.mgr.close();
        for t in self.threads.drain(..) {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn heartbeat_loop(s: &SessionShared, tx: &Sender<SessionEvent>) {
    // A manager outage fails every heartbeat: one line when it starts,
    // summaries, and one when it ends.
    let failures = crate::Repeated::new("manager reachable", "heartbeats missed");
    while !s.stop.load(Ordering::Acquire) {
        if !s.heartbeats_suspended.load(Ordering::Acquire) {
            match s.mgr.call(&MgrRequest::ComputeHeartbeat { session: s.session }) {
                Ok(_) => {
                    failures.ok();
                }
                Err(RpcError::Remote(RemoteError::Unknown | RemoteError::Fenced)) => {
                    let _ = tx.send(SessionEvent::Expired);
                    return;
                }
                // Shutting down closed the connection under the call.
                Err(_) if s.stop.load(Ordering::Acquire) => return,
                Err(e) => {
                    failures.fail(format_args!("heartbeat to manager {} failed: {e}", s.mgr.addr()));
                }
            }
        }
        thread::park_timeout(Duration::from_millis(s.interval_ms.load(Ordering::Relaxed)));
    }
}

fn event_loop(s: &SessionShared, tx: &Sender<SessionEvent>, first_incarnation: u64) {
    let mut after = 0u64;
    let mut incarnation = Some(first_incarnation);
    while !s.stop.load(Ordering::Acquire) {
        let req = MgrRequest::WaitEvents {
            session: s.session,
            after,
            timeout_ms: 200,
        };
        match s.mgr.call_timeout(&req, Duration::from_secs(5)) {
            Ok(MgrResponse::Events {
                incarnation: inc,
                events,
            }) => {
                if incarnation.is_some_and(|i| i != inc) {
                    // The manager restarted: sequence numbers start over.
                    after = 0;
                    if tx.send(SessionEvent::Resync).is_err() {
                        return;
                    }
                }
                incarnation = Some(inc);
                for e in events {
                    after = after.max(e.seq);
                    if tx.send(SessionEvent::Manager(e)).is_err() {
                        return;
                    }
                }
            }
            Ok(_) => {}
            Err(RpcError::Remote(RemoteError::Unknown)) => return,
            Err(_) => thread::park_timeout(Duration::from_millis(100)),
        }
    }
}
