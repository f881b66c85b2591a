//! Connections to an in-process node: each request is served when it is
//! sent, through the same [`Service`] as the daemon's; the faults a test
//! switched on act around it, at the step they name.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remora_proto::msg::{Fault, MemRequest, MemResponse, NodeLoad};
use remora_proto::rpc::Ticket;
use remora_proto::{MemTransport, RemoteError, RpcError};

use super::{Node, Shared, lock};
use crate::service::{ConnError, Env, Service, Wire};

impl Shared {
    pub(super) fn connect(self: &Arc<Self>, addr: &str) -> Result<Arc<dyn MemTransport>, RpcError> {
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

impl Node {
    /// Serves `req` as the daemon would. The outer error is what would end
    /// a daemon's connection (a malformed request).
    fn serve(
        &self,
        sh: &Arc<Shared>,
        req: &MemRequest,
        payload: &[u8],
    ) -> Result<Result<(MemResponse, Vec<u8>), RemoteError>, ConnError> {
        let service = Service {
            regions: &self.regions,
            lease: &self.lease,
            admin: &self.admin,
            peer: &self.peer,
            env: InCluster { node: self, sh },
        };
        let mut wire = InMemory {
            payload,
            at: 0,
            reply: None,
        };
        service.handle(&mut wire, req)?;
        // Every path of `handle` that returns Ok has replied; an in-process
        // wire never drops a reply.
        Ok(wire
            .reply
            .unwrap_or_else(|| Err(RemoteError::Internal("the node sent no reply".into()))))
    }
}

/// One request's bytes, in memory: the in-process node's wire. A reply's
/// payload is copied out (the daemon sends it from region memory instead).
struct InMemory<'p> {
    payload: &'p [u8],
    /// Payload bytes consumed so far.
    at: usize,
    reply: Option<Result<(MemResponse, Vec<u8>), RemoteError>>,
}

impl Wire for InMemory<'_> {
    fn payload_len(&self) -> usize {
        self.payload.len()
    }

    fn read_payload(&mut self, dst: &mut [u8]) -> Result<(), ConnError> {
        let src = self
            .at
            .checked_add(dst.len())
            .and_then(|end| self.payload.get(self.at..end))
            .ok_or_else(|| ConnError::Protocol("payload shorter than the request says".into()))?;
        dst.copy_from_slice(src);
        self.at += dst.len();
        Ok(())
    }

    fn with_payload<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<R, ConnError> {
        let rest = &self.payload[self.at..];
        self.at = self.payload.len();
        Ok(f(rest))
    }

    fn skip_payload(&mut self) -> Result<(), ConnError> {
        self.at = self.payload.len();
        Ok(())
    }

    /// Its faults act around the request instead, in [`Conn::serve`].
    fn before_data(&mut self, _req: &MemRequest) {}

    fn ok(&mut self, resp: MemResponse, payload: &[&[u8]]) -> Result<bool, ConnError> {
        self.reply = Some(Ok((resp, payload.concat())));
        Ok(true)
    }

    fn err(&mut self, e: &RemoteError) -> Result<(), ConnError> {
        self.reply = Some(Err(e.clone()));
        Ok(())
    }
}

/// An in-process node's surroundings: peers are the cluster's nodes, its
/// load is what a test set, and its faults are switched through
/// [`super::NodeHandle`], not by requests.
struct InCluster<'a> {
    node: &'a Node,
    sh: &'a Arc<Shared>,
}

impl Env for InCluster<'_> {
    fn peer(&self, addr: &str) -> Result<Arc<dyn MemTransport>, RemoteError> {
        self.sh
            .connect(addr)
            .map_err(|e| RemoteError::Internal(format!("peer {addr}: {e}")))
    }

    /// It shares its process with the compute node, so it cannot measure
    /// its own CPU use: it reports what the test set.
    fn load(&self) -> NodeLoad {
        NodeLoad {
            cpu_permille: self.node.cpu_permille.load(Ordering::Acquire),
            cores: 1,
        }
    }

    /// No in-process fault drops a reply alone: a lost reply breaks the connection.
    fn unanswered_writes(&self) -> u64 {
        0
    }

    /// A pause would block the caller's own thread (requests are served on
    /// it), and the in-process switches must act at exact steps, so they
    /// are set through the node's handle.
    fn fault(&self, _fault: Fault) -> Result<(), RemoteError> {
        Err(RemoteError::Unsupported(
            "fault requests: an in-process node's faults are switched through its NodeHandle".into(),
        ))
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
        if matches!(req, MemRequest::Commit { .. })
            && f.lapse_at_commit.load(Ordering::Acquire) >= 0
            && f.lapse_at_commit.fetch_sub(1, Ordering::AcqRel) == 0
        {
            self.node.lease.expire();
        }
        if matches!(req, MemRequest::Commit { .. })
            && f.break_at_commit.load(Ordering::Acquire) >= 0
            && f.break_at_commit.fetch_sub(1, Ordering::AcqRel) == 0
        {
            let d = Duration::from_micros(f.break_for_us.load(Ordering::Acquire));
            *lock(&f.cut_until) = Some(Instant::now() + d);
        }
        if f.break_for_us.load(Ordering::Acquire) > 0 && lock(&f.cut_until).is_some_and(|t| Instant::now() < t) {
            return Err(self.broken("injected: the node is cut off"));
        }
        if f.fail_next.load(Ordering::Acquire) > 0
            && f.fail_next
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(self.broken("injected connection failure"));
        }
        let served = self
            .node
            .serve(&self.sh, req, payload)
            .map_err(|e| self.broken(&format!("the node closed the connection: {e}")))?;
        // A node that died while serving (another caller killed it) sends
        // no reply, as a dead daemon cannot: what it computed may have met
        // regions its death had already revoked.
        if self.gone() {
            return Err(self.broken("node died while serving"));
        }
        let (resp, mut bytes) = served.map_err(RpcError::Remote)?;
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
