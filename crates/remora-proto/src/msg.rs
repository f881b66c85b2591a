//! Messages of the two services: memory node and manager.
//!
//! Message heads are postcard-encoded enums; bulk bytes travel as the frame's
//! raw payload (see [`crate::frame`]), so a span is never serialized.
//!
//! **The declaration order is the protocol.** Postcard writes an enum variant
//! as its index and a struct's fields in declaration order, with no names, so
//! reordering, inserting or removing a variant or a field (here or in
//! [`crate::cap`]) silently changes what every other build reads. Such a
//! change requires a bump of [`crate::frame::VERSION`], so that mixed builds
//! refuse each other at connect time instead of misreading each other.
//! `tests/golden.rs` pins the bytes of every variant of every message and
//! fails (or stops compiling, for a new variant) until it is updated with
//! the change.

use serde::{Deserialize, Serialize};

use crate::cap::{AdminKey, Cap, ComputeId, Epoch, NodeId, RegionId, Session, Token};

/// One range of a vectored request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    /// The region and the right to touch it.
    pub cap: Cap,
    /// Byte offset inside the region.
    pub offset: u64,
    /// Number of bytes.
    pub len: u32,
}

/// Requests a memory node serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemRequest {
    /// One-sided read of `len` bytes; the response payload holds them.
    Read {
        /// Region and right.
        cap: Cap,
        /// Offset in the region.
        offset: u64,
        /// Bytes to read.
        len: u32,
    },
    /// One-sided write of the request payload at `offset`.
    Write {
        /// Region and right.
        cap: Cap,
        /// Offset in the region.
        offset: u64,
    },
    /// Several reads in one request; the response payload is their bytes
    /// concatenated in order.
    ReadV {
        /// The ranges.
        ranges: Vec<Range>,
    },
    /// Several writes in one request; the request payload is their bytes
    /// concatenated in order. Either every range is checked and written, or
    /// none is (all capabilities and bounds are verified first).
    WriteV {
        /// The ranges.
        ranges: Vec<Range>,
    },
    /// Liveness probe.
    Ping,
    /// Offloaded reconstruction: rebuild erasure-code shard `want` of each
    /// row into this node's region `cap`, reading `k` surviving shards from
    /// the peers named in `sources` (with capabilities the owner delegated,
    /// normally read-only). Each row sits at the same offset in every region.
    Rebuild {
        /// The region to write (owner capability of a region on this node).
        cap: Cap,
        /// Data shards of the code.
        k: u8,
        /// Parity shards of the code.
        m: u8,
        /// The shard index to rebuild (0..k data, k..k+m parity).
        want: u8,
        /// Exactly k survivors: shard index, node address and capability.
        sources: Vec<RebuildSource>,
        /// The rows.
        rows: Vec<RebuildRow>,
    },
    /// From the manager: `region` now belongs to `owner`, opened by `token`
    /// in assignment `epoch`. The region starts zeroed, and capabilities of
    /// every earlier epoch stop working. A grant of an epoch older than the
    /// node has seen is refused with `RemoteError::StaleEpoch`.
    Grant {
        /// Proof the request comes from the manager.
        admin: AdminKey,
        /// The region.
        region: RegionId,
        /// Its new owner.
        owner: ComputeId,
        /// The owner's capability token.
        token: Token,
        /// The assignment's epoch.
        epoch: Epoch,
    },
    /// From the manager: `region` is free again; its contents are wiped and its
    /// token stops working. The region's epoch becomes `epoch` (if newer).
    Revoke {
        /// Proof the request comes from the manager.
        admin: AdminKey,
        /// The region.
        region: RegionId,
        /// The region's epoch from now on.
        epoch: Epoch,
    },
    /// Test-only fault injection (refused unless the daemon was built with
    /// the `fault-injection` feature).
    Fault {
        /// Proof the request comes from the manager or the test harness.
        admin: AdminKey,
        /// What to do.
        fault: Fault,
    },
    /// Phase one of a transaction that changes spanset members in place
    /// (remote compaction, ec-2pc): check `op` and stage it under `txn`
    /// without changing a byte; see [`TxnOp`] for the payload. Answered by
    /// [`MemResponse::Prepared`].
    Prepare {
        /// The transaction, named by the compute node that owns the regions.
        txn: TxnId,
        /// What to stage.
        op: TxnOp,
    },
    /// Phase two: apply everything staged under `txn` on this node, at once.
    /// Retrying a commit that already happened is answered `Committed` again.
    Commit {
        /// Any owner capability of a region on this node: proves the
        /// transaction's owner asks.
        cap: Cap,
        /// The transaction.
        txn: TxnId,
    },
    /// Drops everything staged under `txn` on this node.
    Abort {
        /// As for `Commit`.
        cap: Cap,
        /// The transaction.
        txn: TxnId,
    },
    /// Reads one spanset member and the generation it holds (see
    /// [`TxnOp`]); the payload of [`MemResponse::Member`] holds the bytes.
    ReadMember {
        /// Region and right (owner or read-only).
        cap: Cap,
        /// The member's offset.
        offset: u64,
        /// Bytes to read.
        len: u32,
    },
    /// How busy this node is ([`MemResponse::Load`]): compute nodes ask
    /// before choosing where compaction's parity deltas are computed.
    /// Served like a data request, so a paused node does not answer.
    Load,
    /// What this node holds ([`MemResponse::Stats`]): for operators and
    /// tests. Answered even while the node's lease has lapsed.
    Stats,
    /// Phase one of several changes under one transaction, as one
    /// [`MemRequest::Prepare`] per op in order but in one round trip: the
    /// payload is the ops' payloads one after another, and the answer,
    /// [`MemResponse::Prepared`], carries the deltas asked for
    /// (`return_delta`) one after another. A data node sends the shares of
    /// all its moves for one parity node as one of these. All or nothing:
    /// on a refusal, what the request staged is dropped.
    PrepareMany {
        /// The transaction.
        txn: TxnId,
        /// What to stage, at most [`MAX_PREPARE_MANY`].
        ops: Vec<TxnOp>,
    },
}

/// The most ops one [`MemRequest::PrepareMany`] may carry.
pub const MAX_PREPARE_MANY: usize = 1024;

/// A transaction of one compute node, unique among its transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TxnId(pub u64);

/// A member of a spanset on this node, and the generation the caller
/// believes it holds.
///
/// **Generations.** Every member (a span-sized range at an offset of a
/// region) has a generation, 0 after a plain write of its bytes. A committed
/// transaction moves each member it changes from generation `gen` to
/// `gen + 1`, and a prepare that names another generation is refused, so a
/// retried or late change never applies twice or over a newer one, and a
/// reader can tell members of one spanset that agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The region and the right to change it.
    pub cap: Cap,
    /// The member's offset in the region.
    pub offset: u64,
    /// Its length.
    pub len: u32,
    /// The generation it must hold now.
    pub generation: u64,
}

/// A parity member a data node sends its share of a delta to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaTarget {
    /// The node holding it.
    pub addr: String,
    /// The member (its capability an apply-delta delegate).
    pub member: Member,
    /// The code coefficient `A_ij` the delta is multiplied by.
    pub coef: u8,
}

/// One staged change of a [`MemRequest::Prepare`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    /// Data node, compaction: replace member `to` with the `to.len` bytes at
    /// `from` on this node (the live span of the spanset being folded away).
    /// The node computes `delta = new xor old` next to the data and either
    /// returns it (`return_delta`: the response payload, `to.len` bytes) or
    /// sends `coef · delta` to each of `targets` as an `Apply` under the same
    /// transaction, answering only once every target has staged it.
    Move {
        /// The member to replace.
        to: Member,
        /// Capability of the source range's region (owner).
        from_cap: Cap,
        /// Offset of the source range.
        from: u64,
        /// Return the delta to the caller.
        return_delta: bool,
        /// Parity members to send `coef · delta` to.
        targets: Vec<DeltaTarget>,
    },
    /// Data node, ec-2pc: replace member `to` with the request payload;
    /// otherwise as `Move`.
    Put {
        /// The member to replace.
        to: Member,
        /// Return the delta to the caller.
        return_delta: bool,
        /// Parity members to send `coef · delta` to.
        targets: Vec<DeltaTarget>,
    },
    /// Parity node: xor the request payload (an already multiplied delta)
    /// into `to` at commit. Several applies to one member under one
    /// transaction add up and move its generation once.
    Apply {
        /// The member (owner or apply-delta capability).
        to: Member,
    },
}

/// A surviving shard a memory node reads during [`MemRequest::Rebuild`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildSource {
    /// Its shard index in the code.
    pub index: u8,
    /// The node holding it.
    pub addr: String,
    /// The capability to read it (delegated by the owner).
    pub cap: Cap,
}

/// One row of a [`MemRequest::Rebuild`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildRow {
    /// Where the rebuilt member goes in the rebuilding node's region.
    pub offset: u64,
    /// Length of the row (shards are zero-padded to it).
    pub row_len: u32,
    /// Where each source's member sits in its region, in `sources` order
    /// (members of one spanset need not share an offset).
    pub offsets: Vec<u64>,
    /// Bytes to read from each source, in `sources` order (0: all zero, no read).
    pub lens: Vec<u32>,
    /// Bytes of the rebuilt shard to write.
    pub out_len: u32,
}

/// A fault a memory node can be told to inject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// Stop serving data requests and heartbeats (as if SIGSTOPped) until `Resume`.
    /// Fault requests themselves are still served.
    Pause,
    /// Undo `Pause`, `Delay` and `DropReplies`.
    Resume,
    /// Delay each data reply by this many microseconds.
    Delay {
        /// Delay in microseconds.
        micros: u64,
    },
    /// Execute data requests but send no reply.
    DropReplies,
    /// Close every open connection except the one carrying this request.
    DropConnections,
    /// Flip every bit of `len` bytes at `offset` of `region`.
    Corrupt {
        /// The region.
        region: RegionId,
        /// Offset in the region.
        offset: u64,
        /// Bytes to corrupt.
        len: u32,
    },
    /// Burn CPU: `threads` threads spin for `millis` milliseconds (or until
    /// `Resume`), so the node's measured CPU use ([`NodeLoad`]) goes up for
    /// real while its data path keeps serving.
    Busy {
        /// Spinning threads (at most [`Fault::MAX_BUSY_THREADS`]).
        threads: u32,
        /// How long they spin.
        millis: u64,
    },
}

impl Fault {
    /// The most threads a `Busy` fault may spin (a typo must not fork-bomb
    /// the test machine).
    pub const MAX_BUSY_THREADS: u32 = 64;
}

/// How busy a memory node is, as it measures itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLoad {
    /// CPU time the memory-node process used over its last measuring window
    /// (about half a second), in thousandths of one core: 1000 is one core
    /// kept busy, 2000 two. 0 where the platform does not tell.
    pub cpu_permille: u32,
    /// Cores the process may run on.
    pub cores: u32,
}

/// Successful answers of a memory node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemResponse {
    /// Read data follows as payload.
    Data,
    /// The write (or vectored write) is in memory.
    Written,
    /// Answer to `Ping`.
    Pong,
    /// Answer to `Rebuild`: bytes written, and the checksum
    /// ([`crate::checksum::checksum`]) of each rebuilt row's written bytes,
    /// in request order, so the owner can verify without reading back.
    Rebuilt {
        /// Bytes of rebuilt shards written into the region.
        bytes: u64,
        /// One checksum per row.
        checksums: Vec<u64>,
    },
    /// The admin request was applied.
    Done,
    /// The operation is staged; for `return_delta` the payload holds the delta.
    Prepared,
    /// The transaction's changes on this node are applied.
    Committed,
    /// The transaction's staged changes on this node are dropped.
    Aborted,
    /// A member's bytes follow as payload; it holds `generation`.
    Member {
        /// Its generation.
        generation: u64,
    },
    /// Answer to `Load`.
    Load(NodeLoad),
    /// Answer to `Stats`.
    Stats(MemNodeStats),
}

/// What a memory node holds, as it reports itself ([`MemRequest::Stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemNodeStats {
    /// Regions it registered.
    pub regions: u64,
    /// Of those, ones granted to a compute node.
    pub granted: u64,
    /// Transactions with changes staged here (prepared, neither committed,
    /// aborted nor dropped by a revoke).
    pub staged_txns: u64,
    /// Writes (plain or vectored) executed with their reply dropped by fault
    /// injection (`Fault::DropReplies`), since the node started: their
    /// senders never learn they happened. Always 0 without fault injection.
    pub unanswered_writes: u64,
    /// Parity deltas this node has pushed to peers (remote compaction,
    /// ec-2pc) and not yet heard back about.
    pub deltas_in_flight: u64,
    /// Requests refused because their capability named another epoch than
    /// the region's (`RemoteError::StaleEpoch`), since the node registered.
    pub stale_refused: u64,
    /// Of those, parity deltas pushed by a peer memory node (apply-delta
    /// capabilities): late deltas of an owner that lost the region.
    pub stale_deltas_refused: u64,
    /// What this node has sent to peers since it started, as of this
    /// answer (heartbeats carry the same counters, a heartbeat late).
    pub peer: PeerTraffic,
}

/// Liveness state of a memory node as the manager sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeState {
    /// Heartbeating; its free regions can be allocated.
    Alive,
    /// Leaving: no new allocations; owners were told to move away.
    Draining,
    /// Missed heartbeats past the timeout (or deregistered); its regions are
    /// out of the pool.
    Dead,
}

impl NodeState {
    /// Lower-case name, as printed by `remora status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Alive => "alive",
            Self::Draining => "draining",
            Self::Dead => "dead",
        }
    }
}

/// Liveness state of a compute node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ComputeState {
    /// Heartbeating.
    Alive,
    /// Missed heartbeats past the timeout; its regions were freed.
    Dead,
}

impl ComputeState {
    /// Lower-case name, as printed by `remora status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Alive => "alive",
            Self::Dead => "dead",
        }
    }
}

/// A region allocated to a compute node, with what it needs to use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionGrant {
    /// The owner capability.
    pub cap: Cap,
    /// The memory node holding the region.
    pub node: NodeId,
    /// Where that node serves data requests.
    pub addr: String,
    /// Region size in bytes.
    pub size: u64,
    /// The node's state when this grant was listed.
    pub node_state: NodeState,
}

/// Something a compute node is told about asynchronously.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// A memory node holding some of this compute node's regions died; those
    /// regions are gone.
    NodeDead {
        /// The node.
        node: NodeId,
        /// Its address.
        addr: String,
        /// This compute node's regions on it.
        regions: Vec<RegionId>,
    },
    /// A memory node holding some of this compute node's regions is draining:
    /// stop placing new data there.
    NodeDraining {
        /// The node.
        node: NodeId,
        /// Its address.
        addr: String,
        /// This compute node's regions on it.
        regions: Vec<RegionId>,
    },
}

/// An event with its sequence number (per compute node, increasing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Sequence number; ask for events after the last one seen.
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
}

/// One memory node in a status report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemNodeStatus {
    /// Its id.
    pub id: NodeId,
    /// Its data address.
    pub addr: String,
    /// Its state.
    pub state: NodeState,
    /// Regions it registered.
    pub regions_total: u64,
    /// Of those, unallocated ones.
    pub regions_free: u64,
    /// Bytes it lends.
    pub capacity_bytes: u64,
    /// What it sent to other memory nodes, as of its last heartbeat.
    pub peer: PeerTraffic,
    /// How busy it was, as of its last heartbeat.
    pub load: NodeLoad,
}

/// What a memory node sent to other memory nodes since it started, by
/// purpose, counted where it is served. Network figures add these in, since
/// they cross the wire without passing through any compute node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerTraffic {
    /// Reads served to a peer rebuilding a lost member (requests made with
    /// a delegated, read-only capability).
    pub rebuild_reads: u64,
    /// Bytes those reads returned.
    pub rebuild_bytes: u64,
    /// Parity deltas received from a peer (a `TxnOp::Apply` made with a
    /// delegated apply-delta capability): remote compaction and ec-2pc.
    pub delta_applies: u64,
    /// Bytes of those deltas.
    pub delta_bytes: u64,
}

impl PeerTraffic {
    /// Bytes sent between memory nodes, whatever the purpose.
    pub fn bytes(&self) -> u64 {
        self.rebuild_bytes + self.delta_bytes
    }

    /// The sum over several nodes.
    pub fn sum(all: impl IntoIterator<Item = PeerTraffic>) -> PeerTraffic {
        all.into_iter().fold(PeerTraffic::default(), |a, b| PeerTraffic {
            rebuild_reads: a.rebuild_reads + b.rebuild_reads,
            rebuild_bytes: a.rebuild_bytes + b.rebuild_bytes,
            delta_applies: a.delta_applies + b.delta_applies,
            delta_bytes: a.delta_bytes + b.delta_bytes,
        })
    }
}

/// One compute node in a status report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeStatus {
    /// Its id.
    pub id: ComputeId,
    /// The name it registered with.
    pub name: String,
    /// Its state.
    pub state: ComputeState,
    /// Regions it holds.
    pub regions: u64,
}

/// The manager's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Memory nodes, by id.
    pub memory_nodes: Vec<MemNodeStatus>,
    /// Compute nodes, by id.
    pub compute_nodes: Vec<ComputeStatus>,
    /// The manager group, by member id, as the leader sees it (each member
    /// asked for its own role, term and applied index).
    pub managers: Vec<ManagerStatus>,
}

/// Requests the manager serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MgrRequest {
    /// A memory node offers `capacity / region_size` regions.
    RegisterMemNode {
        /// Address compute nodes reach it at.
        addr: String,
        /// Bytes offered.
        capacity: u64,
        /// Region size.
        region_size: u64,
        /// Secret for the manager's admin requests to it.
        admin: AdminKey,
        /// Drawn at random once per registration and repeated by its retries:
        /// a registration the manager group applied already (its answer lost,
        /// or its leader changed) is answered again, not applied twice.
        request: u64,
    },
    /// A memory node is alive.
    MemNodeHeartbeat {
        /// The node.
        node: NodeId,
        /// Proof of identity.
        admin: AdminKey,
        /// What it has sent to peers so far.
        peer: PeerTraffic,
        /// How busy it is.
        load: NodeLoad,
    },
    /// A drained memory node leaves: its regions are withdrawn from the pool.
    Deregister {
        /// The node.
        node: NodeId,
        /// Proof of identity.
        admin: AdminKey,
    },
    /// Operator or node: mark the node at `addr` draining.
    Drain {
        /// The node's data address as registered.
        addr: String,
    },
    /// A compute node opens a session.
    RegisterCompute {
        /// A name for status output.
        name: String,
        /// As in `RegisterMemNode`: the same number on every retry.
        request: u64,
    },
    /// A compute node is alive.
    ComputeHeartbeat {
        /// Its session.
        session: Session,
    },
    /// Allocate `count` regions; with `distinct`, each on a different memory node.
    Alloc {
        /// The compute node.
        session: Session,
        /// The session's request number: a retry (after a lost answer or a
        /// change of leader) repeats it and is applied once.
        seq: u64,
        /// How many regions.
        count: u32,
        /// Place them on `count` distinct memory nodes.
        distinct: bool,
        /// Memory nodes not to use (e.g. ones already in a stripe).
        exclude: Vec<NodeId>,
    },
    /// Give a region back.
    Free {
        /// The compute node.
        session: Session,
        /// The session's request number (see `Alloc`).
        seq: u64,
        /// The region.
        region: RegionId,
    },
    /// List the regions this compute node holds (after a reconnect).
    MyRegions {
        /// The compute node.
        session: Session,
    },
    /// Long poll: answer when there are events with `seq > after`, or after
    /// `timeout_ms` with none.
    WaitEvents {
        /// The compute node.
        session: Session,
        /// Last sequence number seen.
        after: u64,
        /// Longest wait.
        timeout_ms: u32,
    },
    /// The whole cluster's state.
    Status,
    /// A compute node's evidence that memory node `node` failed it (a
    /// connection error, or a request overdue): the manager probes the node
    /// itself and rules. It declares the node dead only once its lease must
    /// have lapsed (or its port refuses connections), so a scheduling
    /// hiccup never fences a live node.
    Suspect {
        /// The compute node.
        session: Session,
        /// The node it suspects.
        node: NodeId,
    },
    /// Manager to manager: one Raft message, its body (postcard of the
    /// Raft library's request) in the payload. Answered with
    /// [`MgrResponse::Raft`].
    Raft {
        /// Which message.
        rpc: RaftRpc,
        /// The sender's member id.
        from: u64,
    },
    /// This manager's own place in its group: answered by every member,
    /// leader or not.
    Member,
    /// Fault injection (daemons built with the `fault-injection` feature;
    /// others refuse with `Unsupported`): for `for_ms`, this manager drops
    /// every group message to and from the members `peers`, as if the
    /// network between them were cut. Clients still reach it.
    Isolate {
        /// The member ids cut off.
        peers: Vec<u64>,
        /// For how long.
        for_ms: u32,
    },
}

/// The Raft messages managers exchange (see [`MgrRequest::Raft`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRpc {
    /// Append entries (and the leader's heartbeat).
    Append,
    /// Request a vote.
    Vote,
    /// Install a whole snapshot.
    Snapshot,
}

/// A manager's role in its Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ManagerRole {
    /// Serves requests and replicates.
    Leader,
    /// Replicates; forwards clients to the leader.
    Follower,
    /// Standing for election.
    Candidate,
    /// Replicates without a vote.
    Learner,
    /// Stopped.
    Shutdown,
    /// Did not answer the leader's question.
    Unreachable,
}

/// One member of the manager group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerStatus {
    /// Its member id (`--id`).
    pub id: u64,
    /// Its address.
    pub addr: String,
    /// Its role.
    pub role: ManagerRole,
    /// Its current term.
    pub term: u64,
    /// The index of the last log entry it applied.
    pub last_applied: u64,
    /// Whom it follows.
    pub leader: Option<u64>,
}

/// Heartbeat intervals a memory node's lease lasts from a heartbeat's send:
/// the node stops serving once that much time passes without a renewal, and
/// the manager relies on it before declaring a silent node dead.
pub const LEASE_INTERVALS: u32 = 4;

impl MgrRequest {
    /// A fresh number for a registration's `request`, drawn at random (the
    /// client has no session yet to count in).
    pub fn registration_number() -> u64 {
        rand::random()
    }
}

/// Successful answers of the manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MgrResponse {
    /// Answer to `RegisterMemNode`.
    MemNodeRegistered {
        /// The node's id.
        node: NodeId,
        /// Ids of its regions, in offset order.
        regions: Vec<RegionId>,
        /// How often to heartbeat.
        heartbeat_interval_ms: u32,
    },
    /// Answer to a heartbeat.
    HeartbeatAck {
        /// The node's state.
        state: NodeState,
    },
    /// Answer to `RegisterCompute`.
    ComputeRegistered {
        /// The session.
        session: Session,
        /// How often to heartbeat.
        heartbeat_interval_ms: u32,
        /// The manager's incarnation (see [`MgrResponse::Events`]).
        incarnation: u64,
    },
    /// Answer to `Alloc` and `MyRegions`.
    Regions(Vec<RegionGrant>),
    /// Answer to `WaitEvents`.
    Events {
        /// Changes whenever the manager restarts; a client that sees it change
        /// re-reads its regions with `MyRegions`.
        incarnation: u64,
        /// Events after the requested sequence number.
        events: Vec<Event>,
    },
    /// Answer to `Status`.
    Status(ClusterStatus),
    /// Done.
    Ok,
    /// Answer to `Suspect`: the manager's verdict on the node.
    Verdict {
        /// True if the node answered the manager's probe (the suspicion
        /// was wrong); false if it is dead (declared now or before).
        alive: bool,
    },
    /// Answer to `Raft`: the body (postcard of the Raft library's answer)
    /// is in the payload.
    Raft,
    /// Answer to `Member`.
    Member(ManagerStatus),
}

/// A typed error sent back in an error frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RemoteError {
    /// The capability does not open the region (wrong, missing, revoked token,
    /// or a read-only capability used to write).
    #[error("capability refused for region {region}")]
    BadCapability {
        /// The region.
        region: RegionId,
    },
    /// No such region on this node.
    #[error("no region {region} here")]
    NoSuchRegion {
        /// The region.
        region: RegionId,
    },
    /// The range falls outside the region.
    #[error("range {offset}+{len} outside region {region} of {size} bytes")]
    OutOfBounds {
        /// The region.
        region: RegionId,
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Region size.
        size: u64,
    },
    /// The request was well-framed but makes no sense.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Admin key or session secret did not match.
    #[error("not authorized")]
    Unauthorized,
    /// The manager no longer considers this node alive: it must wipe its
    /// regions and register again.
    #[error("node fenced: declared dead by the manager")]
    Fenced,
    /// The manager does not know this node or session.
    #[error("unknown node or session")]
    Unknown,
    /// Not enough free regions (on enough distinct nodes).
    #[error("out of far memory: wanted {wanted} regions, {available} available")]
    NoCapacity {
        /// Requested.
        wanted: u32,
        /// Could be given.
        available: u32,
    },
    /// The daemon was built without this feature.
    #[error("not supported by this daemon: {0}")]
    Unsupported(String),
    /// The node does not serve data now: its lease with the manager lapsed
    /// (paused, partitioned or fenced, it must not answer from regions the
    /// manager may have handed elsewhere), or fault injection paused it. Its
    /// data is not lost; readers read around it.
    #[error("node unavailable")]
    Unavailable,
    /// Something failed inside the server.
    #[error("internal error: {0}")]
    Internal(String),
    /// A member does not hold the generation a transaction expects (it was
    /// changed since, or the request is a late retry).
    #[error("member {region}+{offset} holds generation {found}, not {expected}")]
    StaleGeneration {
        /// The region.
        region: RegionId,
        /// The member's offset.
        offset: u64,
        /// The generation the request named.
        expected: u64,
        /// The generation it holds.
        found: u64,
    },
    /// Another transaction has staged a change of this member.
    #[error("member {region}+{offset} is staged by another transaction")]
    TxnConflict {
        /// The region.
        region: RegionId,
        /// The member's offset.
        offset: u64,
    },
    /// No such transaction is staged here (never prepared, aborted, or
    /// dropped when its regions were revoked).
    #[error("no staged transaction {0}")]
    UnknownTxn(u64),
    /// The capability was issued in another assignment of the region than
    /// the current one (see [`crate::cap`], epochs): its holder lost the
    /// region (or a peer acts for an owner that did). Never served.
    #[error("region {region}: capability of epoch {presented}, but the region is in epoch {current}")]
    StaleEpoch {
        /// The region.
        region: RegionId,
        /// The epoch the request named.
        presented: Epoch,
        /// The region's epoch on this node.
        current: Epoch,
    },
    /// This manager does not lead its group: ask `leader` (a manager
    /// address), or, when it names none (an election is under way), any
    /// manager again shortly.
    #[error("not the manager group's leader (leader: {leader:?})")]
    NotLeader {
        /// The leader's address, if known.
        leader: Option<String>,
    },
    /// The server is at one of its limits (connections, requests waiting
    /// for a thread): try again later, or elsewhere.
    #[error("server busy: {0}")]
    Busy(String),
}

/// Encodes a message head.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    postcard::to_allocvec(msg).expect("in-memory serialization of a plain message cannot fail")
}

/// Decodes a message head from untrusted bytes.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, crate::frame::FrameError> {
    postcard::from_bytes(bytes).map_err(|e| crate::frame::FrameError::BadHead(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cap::Rights;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip() {
        let cap = Cap {
            region: RegionId(3),
            rights: Rights::ReadWrite,
            token: Token::random(),
            epoch: 9,
        };
        let m = MemRequest::ReadV {
            ranges: vec![Range {
                cap,
                offset: 8192,
                len: 4096,
            }],
        };
        assert_eq!(decode::<MemRequest>(&encode(&m)).unwrap(), m);
        let e = RemoteError::OutOfBounds {
            region: RegionId(1),
            offset: 2,
            len: 3,
            size: 4,
        };
        assert_eq!(decode::<RemoteError>(&encode(&e)).unwrap(), e);
    }

    proptest! {
        #[test]
        fn arbitrary_heads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<MemRequest>(&bytes);
            let _ = decode::<MgrRequest>(&bytes);
            let _ = decode::<MgrResponse>(&bytes);
            let _ = decode::<RemoteError>(&bytes);
        }
    }
}
