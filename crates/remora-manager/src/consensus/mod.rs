//! The manager group: a Raft group (openraft) replicating the [`Machine`].
//!
//! Module `storage` keeps each member's log, vote and snapshots in its redb
//! store; module `network` carries the group's messages over the cluster's
//! authenticated transport, as [`MgrRequest::Raft`] requests on the port
//! clients use. The group runs on a small tokio runtime of its own (the
//! rest of the manager is threads): handlers block on it for the one await
//! they need.
//!
//! [`MgrRequest::Raft`]: remora_proto::msg::MgrRequest::Raft

pub(crate) mod network;
pub(crate) mod storage;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use remora_proto::RemoteError;
use remora_proto::msg::{ManagerRole, ManagerStatus};

use crate::machine::{Answer, Proposal};

/// A member of the group as the log records it: its address.
pub(crate) type Member = BasicNode;

openraft::declare_raft_types!(
    /// The manager group's Raft types.
    pub(crate) TypeConfig:
        D = Proposal,
        R = Answer,
        Node = Member,
        SnapshotData = Vec<u8>,
);

/// A member's Raft handle.
pub(crate) type Raft = openraft::Raft<TypeConfig>;

/// The group's timing. A memory node's lease lasts two thirds of the
/// heartbeat timeout (2 s by default) from the send of its last renewal,
/// so a new leader must be elected and confirmed well inside 1.5 s. The
/// library's followers refuse votes for `election_timeout_max` after they
/// last heard from a leader (its lease), so a candidate whose timer fires
/// earlier is refused and tries again: a leader's death is followed by a
/// new one after one to two times `election_timeout_max`. Heartbeats every
/// 50 ms leave a busy two-core machine 400 ms before it deposes a live
/// leader.
pub(crate) fn config(snapshot_every: u64) -> openraft::Config {
    openraft::Config {
        cluster_name: "remora-managers".into(),
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
        install_snapshot_timeout: 2000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_every.max(1)),
        max_in_snapshot_log_to_keep: snapshot_every / 5,
        ..Default::default()
    }
}

/// How long a proposal or a leadership check may take before the request
/// is refused with `NotLeader` (the client asks again, perhaps elsewhere).
pub(crate) const DECISION_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a leader may take to hear from a quorum before it refuses a
/// lease renewal or a read: a leader cut off from the others must send its
/// memory nodes on to the new one well inside their lease.
pub(crate) const CONFIRM_TIMEOUT: Duration = Duration::from_millis(500);

/// After a leader failed to hear from a quorum, it refuses at once (without
/// asking again) for this long: the memory nodes and compute nodes it
/// serves go on to look for the new leader instead of waiting on it.
pub(crate) const UNCONFIRMED_FOR: Duration = Duration::from_secs(1);

/// The members named by `--peers`.
pub(crate) fn members(peers: &BTreeMap<u64, String>) -> BTreeMap<u64, Member> {
    peers
        .iter()
        .map(|(id, a)| (*id, BasicNode { addr: a.clone() }))
        .collect()
}

/// A member's handle on the group: its Raft, the runtime the group runs
/// on, and what it knows of its own lead. Every decision and every
/// leadership check goes through here.
pub(crate) struct Group {
    pub(crate) raft: Raft,
    pub(crate) rt: tokio::runtime::Handle,
    /// When this member last failed to confirm its lead, and in which
    /// term: a leader cut off from the others refuses at once for
    /// [`UNCONFIRMED_FOR`] instead of making each client wait out
    /// [`CONFIRM_TIMEOUT`].
    unconfirmed: Mutex<Option<(u64, Instant)>>,
}

impl Group {
    pub(crate) fn new(raft: Raft, rt: tokio::runtime::Handle) -> Self {
        Self {
            raft,
            rt,
            unconfirmed: Mutex::new(None),
        }
    }

    /// The current term.
    pub(crate) fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// True if this member believes it leads (without asking a quorum).
    pub(crate) fn leads(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// The refusal a client follows: to the leader if known.
    pub(crate) fn not_leader(&self) -> RemoteError {
        let m = self.raft.metrics().borrow().clone();
        let leader = m
            .current_leader
            .and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()));
        RemoteError::NotLeader { leader }
    }

    /// True while this leader failed to hear from a quorum in this term
    /// less than [`UNCONFIRMED_FOR`] ago.
    fn cut_off(&self, term: u64) -> bool {
        crate::lock(&self.unconfirmed).is_some_and(|(t, at)| t == term && at.elapsed() < UNCONFIRMED_FOR)
    }

    /// Proposes a command and waits until it is applied here: its answer.
    pub(crate) fn propose(&self, p: Proposal) -> Answer {
        if self.cut_off(self.term()) {
            return Err(RemoteError::NotLeader { leader: None });
        }
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(DECISION_TIMEOUT, self.raft.client_write(p)).await });
        match r {
            Ok(Ok(resp)) => resp.data,
            Ok(Err(e)) => Err(match e {
                RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => RemoteError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                },
                other => self.forward(other),
            }),
            // It may still be applied: a retry with the same request number is answered once.
            Err(_) => Err(RemoteError::NotLeader { leader: None }),
        }
    }

    /// Confirms that this member still leads (a quorum answered it after
    /// the call began) and has applied everything committed before: what it
    /// answers next from its state is linearizable.
    pub(crate) fn confirm_leader(&self) -> Result<(), RemoteError> {
        let term = {
            let m = self.raft.metrics().borrow().clone();
            if m.state != ServerState::Leader {
                return Err(self.not_leader());
            }
            m.current_term
        };
        if self.cut_off(term) {
            return Err(RemoteError::NotLeader { leader: None });
        }
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(CONFIRM_TIMEOUT, self.raft.ensure_linearizable()).await });
        let refused = match r {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => match e {
                RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => RemoteError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                },
                other => self.forward(other),
            },
            Err(_) => RemoteError::NotLeader { leader: None },
        };
        *crate::lock(&self.unconfirmed) = Some((term, Instant::now()));
        Err(refused)
    }

    fn forward<E>(&self, e: RaftError<u64, E>) -> RemoteError
    where
        E: std::fmt::Display + std::fmt::Debug,
    {
        match e {
            RaftError::APIError(_) => self.not_leader(),
            RaftError::Fatal(f) => RemoteError::Internal(format!("manager group member stopped: {f}")),
        }
    }

    /// This member's own row of `remora status`.
    pub(crate) fn member_status(&self, id: u64, addr: &str) -> ManagerStatus {
        let m = self.raft.metrics().borrow().clone();
        ManagerStatus {
            id,
            addr: addr.to_string(),
            role: match m.state {
                ServerState::Leader => ManagerRole::Leader,
                ServerState::Follower => ManagerRole::Follower,
                ServerState::Candidate => ManagerRole::Candidate,
                ServerState::Learner => ManagerRole::Learner,
                ServerState::Shutdown => ManagerRole::Shutdown,
            },
            term: m.current_term,
            last_applied: m.last_applied.map_or(0, |l| l.index),
            leader: m.current_leader,
        }
    }
}
