//! The manager's replicated state and the one function that changes it.
//!
//! Every member of the manager group holds a [`Machine`] and applies the
//! same [`Command`]s in the same (log) order, so every member holds the
//! same state. [`Machine::apply`] is therefore deterministic: it reads no
//! clock and draws no random number. What it needs of either travels in the
//! command, chosen by the leader that proposed it (the capability tokens of
//! a grant, a compute node's secret, the leader's clock in
//! [`Proposal::at_ms`]).
//!
//! Decisions are taken here, against the state as of the command's place in
//! the log, not against the proposer's possibly older view: a grant picks
//! its regions in `apply`, and a node declared dead twice is declared once.
//! Requests a compute node may retry (after a lost answer or a change of
//! leader) carry its request number, and the answer is remembered per
//! session ([`RECENT_KEPT`] of them), so a retried grant or free is applied
//! once and answered again with the first answer. Registrations carry a
//! number the client drew at random (it has no session yet), remembered
//! cluster-wide ([`REGISTRATIONS_KEPT`] of them).
//!
//! Liveness (when each node was last heard from) is not here: it is the
//! leader's own observation, and a new leader starts its own clock.

use std::collections::{BTreeMap, VecDeque};

use remora_proto::msg::{ComputeState, Event, EventKind};
use remora_proto::{AdminKey, ComputeId, NodeId, NodeState, RegionId, RemoteError, Session, Token};
use serde::{Deserialize, Serialize};

use crate::store::{ComputeRec, Loaded, Meta, NodeRec};

/// Events kept per compute node for it to collect.
pub(crate) const MAX_EVENTS_KEPT: usize = 4096;
/// Answers remembered per session for retried requests.
pub(crate) const RECENT_KEPT: usize = 64;
/// Answers remembered for retried registrations.
pub(crate) const REGISTRATIONS_KEPT: usize = 1024;
/// Regions one registration may offer: each is kept in memory and in the
/// store, so a node lends its memory in regions of at least
/// capacity / 65 536.
pub(crate) const MAX_REGIONS_PER_NODE: u64 = 1 << 16;

/// A region in the replicated state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Region {
    pub(crate) node: NodeId,
    pub(crate) size: u64,
    /// Owner and its capability token, if allocated.
    pub(crate) owner: Option<(ComputeId, Token)>,
    /// The epoch of the region's current assignment, bumped on every change
    /// of owner (see `remora_proto::cap`) in the same command that makes
    /// the change, so no grant of an epoch leaves before it is in the log.
    pub(crate) epoch: u64,
    /// Taken from its owner (freed, or the owner died) and being revoked on
    /// its memory node; not handed out again until [`Command::Released`].
    pub(crate) freeing: bool,
}

/// A compute node in the replicated state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Compute {
    pub(crate) rec: ComputeRec,
    pub(crate) events: VecDeque<Event>,
    pub(crate) next_seq: u64,
    /// Answers to its latest requests, by request number.
    pub(crate) recent: BTreeMap<u64, Outcome>,
}

/// The replicated state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) nodes: BTreeMap<NodeId, NodeRec>,
    pub(crate) regions: BTreeMap<RegionId, Region>,
    pub(crate) computes: BTreeMap<ComputeId, Compute>,
    pub(crate) meta: Meta,
    /// The leader's clock in the last command applied (milliseconds since
    /// the Unix epoch): the log's own notion of time.
    pub(crate) clock_ms: u64,
    /// A single manager's store was taken over (see [`Command::Import`]).
    pub(crate) imported: bool,
    /// Answers to the latest registrations, by request number, and the
    /// numbers in the order they came (the oldest forgotten first).
    pub(crate) registrations: BTreeMap<u64, Outcome>,
    pub(crate) registration_order: VecDeque<u64>,
}

/// A command with the leader's clock when it proposed it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Proposal {
    /// Milliseconds since the Unix epoch, on the proposing leader's clock.
    pub(crate) at_ms: u64,
    /// What to do.
    pub(crate) cmd: Command,
}

/// Why a memory node leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Gone {
    /// It deregistered after draining.
    Left,
    /// The leader declared it dead (silent past its lease, or refusing
    /// connections).
    Dead,
}

/// A change of the replicated state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Command {
    /// A memory node offers `capacity / region_size` regions.
    RegisterNode {
        addr: String,
        capacity: u64,
        region_size: u64,
        admin: AdminKey,
        request: u64,
    },
    /// A memory node left or died: its regions leave the pool and their
    /// owners are told.
    NodeGone { node: NodeId, why: Gone },
    /// The live memory node at `addr` drains.
    Drain { addr: String },
    /// A compute node opens a session (its secret chosen by the leader).
    RegisterCompute { name: String, secret: Token, request: u64 },
    /// A compute node went silent: its regions are taken back.
    ComputeDead { compute: ComputeId },
    /// Grant `count` regions (one token each, chosen by the leader).
    Grant {
        session: Session,
        seq: u64,
        count: u32,
        distinct: bool,
        exclude: Vec<NodeId>,
        tokens: Vec<Token>,
    },
    /// A grant's memory nodes refused it: the regions go back to the pool
    /// and the request may be applied again.
    Ungrant {
        session: Session,
        seq: u64,
        regions: Vec<(RegionId, Token)>,
    },
    /// A compute node gives a region back: it is revoked, then released.
    Free {
        session: Session,
        seq: u64,
        region: RegionId,
    },
    /// Regions revoked on their memory nodes (at the epoch named) return
    /// to the pool.
    Released { regions: Vec<(RegionId, u64)> },
    /// Take over a single manager's store (the upgrade to a group): applied
    /// only to a state that has seen nothing else.
    Import(Box<Machine>),
}

/// One granted region, as applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Granted {
    pub(crate) region: RegionId,
    pub(crate) node: NodeId,
    pub(crate) token: Token,
    pub(crate) epoch: u64,
}

/// What applying a command decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// Nothing to report.
    Done,
    /// `RegisterNode`.
    NodeRegistered { node: NodeId, regions: Vec<RegionId> },
    /// `RegisterCompute`.
    ComputeRegistered(Session),
    /// `Grant`: deliver these to their memory nodes.
    Granted(Vec<Granted>),
    /// `Free`: revoke the region at `epoch` on `node`, then release it.
    Freeing { node: NodeId, region: RegionId, epoch: u64 },
}

/// The answer to a command: travels back from the state machine to the
/// request that proposed it.
pub(crate) type Answer = Result<Outcome, RemoteError>;

impl Machine {
    /// The state of a single manager's store, for [`Command::Import`].
    pub(crate) fn from_store(loaded: Loaded) -> Self {
        Self {
            nodes: loaded.nodes.into_iter().collect(),
            regions: loaded
                .regions
                .into_iter()
                .map(|(id, r)| {
                    (
                        id,
                        Region {
                            node: r.node,
                            size: r.size,
                            owner: r.owner,
                            epoch: r.epoch,
                            freeing: false,
                        },
                    )
                })
                .collect(),
            computes: loaded
                .computes
                .into_iter()
                .map(|(id, rec)| {
                    (
                        id,
                        Compute {
                            rec,
                            events: VecDeque::new(),
                            next_seq: 1,
                            recent: BTreeMap::new(),
                        },
                    )
                })
                .collect(),
            meta: loaded.meta,
            clock_ms: 0,
            imported: true,
            registrations: BTreeMap::new(),
            registration_order: VecDeque::new(),
        }
    }

    /// True if nothing was ever applied to it but blank entries.
    fn pristine(&self) -> bool {
        self.nodes.is_empty() && self.computes.is_empty() && self.meta == Meta::default()
    }

    /// Applies one command (see the module docs).
    pub(crate) fn apply(&mut self, p: Proposal) -> Answer {
        self.clock_ms = self.clock_ms.max(p.at_ms);
        match p.cmd {
            Command::RegisterNode {
                addr,
                capacity,
                region_size,
                admin,
                request,
            } => self.registration(request, |m| m.register_node(addr, capacity, region_size, admin)),
            Command::NodeGone { node, .. } => {
                self.node_gone(node);
                Ok(Outcome::Done)
            }
            Command::Drain { addr } => self.drain(&addr),
            Command::RegisterCompute { name, secret, request } => self.registration(request, |m| {
                m.meta.next_compute += 1;
                let id = ComputeId(m.meta.next_compute);
                m.computes.insert(
                    id,
                    Compute {
                        rec: ComputeRec {
                            name,
                            secret,
                            state: ComputeState::Alive,
                        },
                        events: VecDeque::new(),
                        next_seq: 1,
                        recent: BTreeMap::new(),
                    },
                );
                Ok(Outcome::ComputeRegistered(Session { id, secret }))
            }),
            Command::ComputeDead { compute } => {
                let Some(c) = self.computes.get_mut(&compute) else {
                    return Ok(Outcome::Done);
                };
                c.rec.state = ComputeState::Dead;
                c.events.clear();
                c.recent.clear();
                for r in self.regions.values_mut() {
                    if r.owner.is_some_and(|(o, _)| o == compute) && !r.freeing {
                        // The revoke is a reassignment: from here on the
                        // dead node's capabilities, and deltas its peers
                        // still push for it, are refused as stale.
                        r.epoch += 1;
                        r.freeing = true;
                    }
                }
                Ok(Outcome::Done)
            }
            Command::Grant {
                session,
                seq,
                count,
                distinct,
                exclude,
                tokens,
            } => self.grant(session, seq, count, distinct, &exclude, &tokens),
            Command::Ungrant { session, seq, regions } => {
                for (id, token) in regions {
                    if let Some(r) = self.regions.get_mut(&id) {
                        if r.owner == Some((session.id, token)) && !r.freeing {
                            r.owner = None;
                        }
                    }
                }
                if let Some(c) = self.computes.get_mut(&session.id) {
                    c.recent.remove(&seq);
                }
                Ok(Outcome::Done)
            }
            Command::Free { session, seq, region } => self.free(session, seq, region),
            Command::Released { regions } => {
                for (id, epoch) in regions {
                    if let Some(r) = self.regions.get_mut(&id) {
                        if r.freeing && r.epoch == epoch {
                            r.owner = None;
                            r.freeing = false;
                        }
                    }
                }
                Ok(Outcome::Done)
            }
            Command::Import(m) => {
                if !self.imported && self.pristine() {
                    let clock = self.clock_ms;
                    *self = *m;
                    self.imported = true;
                    self.clock_ms = clock;
                }
                Ok(Outcome::Done)
            }
        }
    }

    /// Checks a compute node's session.
    pub(crate) fn check_session(&self, s: &Session) -> Result<&Compute, RemoteError> {
        let c = self.computes.get(&s.id).ok_or(RemoteError::Unknown)?;
        if !c.rec.secret.ct_eq(&s.secret) {
            return Err(RemoteError::Unauthorized);
        }
        if c.rec.state == ComputeState::Dead {
            return Err(RemoteError::Unknown);
        }
        Ok(c)
    }

    fn remember(&mut self, session: ComputeId, seq: u64, o: &Outcome) {
        if let Some(c) = self.computes.get_mut(&session) {
            c.recent.insert(seq, o.clone());
            while c.recent.len() > RECENT_KEPT {
                c.recent.pop_first();
            }
        }
    }

    /// Applies a registration once: a retry (same `request`) gets the
    /// first answer, with the session or node the first one created.
    fn registration(&mut self, request: u64, register: impl FnOnce(&mut Self) -> Answer) -> Answer {
        if let Some(o) = self.registrations.get(&request) {
            return Ok(o.clone());
        }
        let o = register(self)?;
        self.registrations.insert(request, o.clone());
        self.registration_order.push_back(request);
        while self.registration_order.len() > REGISTRATIONS_KEPT {
            if let Some(old) = self.registration_order.pop_front() {
                self.registrations.remove(&old);
            }
        }
        Ok(o)
    }

    fn register_node(&mut self, addr: String, capacity: u64, region_size: u64, admin: AdminKey) -> Answer {
        if region_size == 0 || capacity < region_size {
            return Err(RemoteError::BadRequest("capacity must hold at least one region".into()));
        }
        let count = capacity / region_size;
        if count > MAX_REGIONS_PER_NODE {
            return Err(RemoteError::BadRequest(
                "too many regions (use a larger region size)".into(),
            ));
        }
        // A node registering again at an address whose old incarnation
        // still counts as live has restarted: whatever the old one held is gone.
        let stale: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.addr == addr && n.state != NodeState::Dead)
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            tracing::warn!("memory node at {addr} re-registered: its previous incarnation {id} is dead");
            self.node_gone(id);
        }
        self.meta.next_node += 1;
        let node = NodeId(self.meta.next_node);
        let first = self.meta.next_region + 1;
        self.meta.next_region += count;
        let regions: Vec<RegionId> = (first..first + count).map(RegionId).collect();
        for r in &regions {
            self.regions.insert(
                *r,
                Region {
                    node,
                    size: region_size,
                    owner: None,
                    epoch: 0,
                    freeing: false,
                },
            );
        }
        self.nodes.insert(
            node,
            NodeRec {
                addr,
                capacity,
                region_size,
                admin,
                state: NodeState::Alive,
                regions: regions.clone(),
            },
        );
        Ok(Outcome::NodeRegistered { node, regions })
    }

    /// A memory node died or left: its regions leave the pool and owners are told.
    fn node_gone(&mut self, id: NodeId) {
        let Some(n) = self.nodes.get_mut(&id) else { return };
        if n.state == NodeState::Dead {
            return;
        }
        n.state = NodeState::Dead;
        let (addr, regions) = (n.addr.clone(), n.regions.clone());
        self.notify_owners(&regions, |regions| EventKind::NodeDead {
            node: id,
            addr: addr.clone(),
            regions,
        });
        for r in &regions {
            if let Some(reg) = self.regions.get_mut(r) {
                if reg.owner.take().is_some() {
                    reg.epoch += 1;
                }
                reg.freeing = false;
            }
        }
    }

    fn drain(&mut self, addr: &str) -> Answer {
        let (id, n) = self
            .nodes
            .iter_mut()
            .find(|(_, n)| n.addr == addr && n.state != NodeState::Dead)
            .ok_or_else(|| RemoteError::BadRequest(format!("no live memory node registered at {addr}")))?;
        if n.state == NodeState::Draining {
            return Ok(Outcome::Done);
        }
        n.state = NodeState::Draining;
        let (id, addr, regions) = (*id, n.addr.clone(), n.regions.clone());
        self.notify_owners(&regions, |regions| EventKind::NodeDraining {
            node: id,
            addr: addr.clone(),
            regions,
        });
        Ok(Outcome::Done)
    }

    /// Queues an event for every compute node holding some of `regions`.
    fn notify_owners(&mut self, regions: &[RegionId], make: impl Fn(Vec<RegionId>) -> EventKind) {
        let mut by_owner: BTreeMap<ComputeId, Vec<RegionId>> = BTreeMap::new();
        for r in regions {
            if let Some((owner, _)) = self.regions.get(r).and_then(|r| r.owner) {
                by_owner.entry(owner).or_default().push(*r);
            }
        }
        for (owner, regions) in by_owner {
            if let Some(c) = self.computes.get_mut(&owner) {
                let seq = c.next_seq;
                c.next_seq += 1;
                c.events.push_back(Event {
                    seq,
                    kind: make(regions),
                });
                while c.events.len() > MAX_EVENTS_KEPT {
                    c.events.pop_front();
                }
            }
        }
    }

    fn grant(
        &mut self,
        session: Session,
        seq: u64,
        count: u32,
        distinct: bool,
        exclude: &[NodeId],
        tokens: &[Token],
    ) -> Answer {
        if let Some(o) = self.check_session(&session)?.recent.get(&seq) {
            return Ok(o.clone());
        }
        if tokens.len() != count as usize {
            return Err(RemoteError::BadRequest("a token per region".into()));
        }
        let ids = self.pick(count, distinct, exclude)?;
        let granted: Vec<Granted> = ids
            .into_iter()
            .zip(tokens)
            .map(|(id, token)| {
                let r = self.regions.get_mut(&id).expect("picked from the table");
                r.epoch += 1;
                r.owner = Some((session.id, *token));
                Granted {
                    region: id,
                    node: r.node,
                    token: *token,
                    epoch: r.epoch,
                }
            })
            .collect();
        let o = Outcome::Granted(granted);
        self.remember(session.id, seq, &o);
        Ok(o)
    }

    fn free(&mut self, session: Session, seq: u64, region: RegionId) -> Answer {
        if let Some(o) = self.check_session(&session)?.recent.get(&seq) {
            return Ok(o.clone());
        }
        let r = self
            .regions
            .get_mut(&region)
            .ok_or(RemoteError::NoSuchRegion { region })?;
        if r.owner.map(|(c, _)| c) != Some(session.id) || r.freeing {
            return Err(RemoteError::BadCapability { region });
        }
        // Revoked while still taken, so it cannot be handed to someone else
        // before the old contents and token are gone.
        r.epoch += 1;
        r.freeing = true;
        let o = Outcome::Freeing {
            node: r.node,
            region,
            epoch: r.epoch,
        };
        self.remember(session.id, seq, &o);
        Ok(o)
    }

    /// Picks `count` free regions on live, non-draining nodes not in
    /// `exclude`; with `distinct`, on `count` different nodes. Spreads over
    /// the nodes with the most free regions.
    fn pick(&self, count: u32, distinct: bool, exclude: &[NodeId]) -> Result<Vec<RegionId>, RemoteError> {
        let mut free: BTreeMap<NodeId, VecDeque<RegionId>> = BTreeMap::new();
        for (id, r) in &self.regions {
            if r.owner.is_none()
                && !r.freeing
                && !exclude.contains(&r.node)
                && self.nodes.get(&r.node).is_some_and(|n| n.state == NodeState::Alive)
            {
                free.entry(r.node).or_default().push_back(*id);
            }
        }
        let available = if distinct {
            free.len()
        } else {
            free.values().map(VecDeque::len).sum()
        };
        if available < count as usize {
            return Err(RemoteError::NoCapacity {
                wanted: count,
                available: available as u32,
            });
        }
        let mut out = Vec::with_capacity(count as usize);
        while out.len() < count as usize {
            let (&node, _) = free
                .iter()
                .max_by_key(|(n, v)| (v.len(), std::cmp::Reverse(**n)))
                .expect("checked capacity");
            let v = free.get_mut(&node).expect("present");
            out.push(v.pop_front().expect("non-empty"));
            if distinct || v.is_empty() {
                free.remove(&node);
            }
        }
        Ok(out)
    }

    /// Regions taken from their owners and not yet revoked: `(region,
    /// node, epoch, node live)`.
    pub(crate) fn freeing(&self) -> Vec<(RegionId, NodeId, u64, bool)> {
        self.regions
            .iter()
            .filter(|(_, r)| r.freeing)
            .map(|(id, r)| {
                let live = self.nodes.get(&r.node).is_some_and(|n| n.state != NodeState::Dead);
                (*id, r.node, r.epoch, live)
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
