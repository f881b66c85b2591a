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
use std::time::Duration;

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

/// The refusal a client follows: to the leader if known.
pub(crate) fn not_leader(raft: &Raft) -> RemoteError {
    let m = raft.metrics().borrow().clone();
    let leader = m
        .current_leader
        .and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()));
    RemoteError::NotLeader { leader }
}

fn forward<E>(raft: &Raft, e: RaftError<u64, E>) -> RemoteError
where
    E: std::fmt::Display + std::fmt::Debug,
{
    match e {
        RaftError::APIError(_) => not_leader(raft),
        RaftError::Fatal(f) => RemoteError::Internal(format!("manager group member stopped: {f}")),
    }
}

/// Proposes a command and waits until it is applied here: its answer.
pub(crate) fn propose(rt: &tokio::runtime::Handle, raft: &Raft, p: Proposal) -> Answer {
    let r = rt.block_on(async { tokio::time::timeout(DECISION_TIMEOUT, raft.client_write(p)).await });
    match r {
        Ok(Ok(resp)) => resp.data,
        Ok(Err(e)) => Err(match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => RemoteError::NotLeader {
                leader: f.leader_node.map(|n| n.addr),
            },
            other => forward(raft, other),
        }),
        // It may still be applied: a retry with the same request number is answered once.
        Err(_) => Err(RemoteError::NotLeader { leader: None }),
    }
}

/// Confirms that this member still leads (a quorum answered it after the
/// call began) and has applied everything committed before: what it answers
/// next from its state is linearizable.
///
/// `unconfirmed` remembers the last failure (term and when), so that a
/// leader cut off from the others refuses at once for [`UNCONFIRMED_FOR`].
pub(crate) fn confirm_leader(
    rt: &tokio::runtime::Handle,
    raft: &Raft,
    unconfirmed: &std::sync::Mutex<Option<(u64, std::time::Instant)>>,
) -> Result<(), RemoteError> {
    let term = {
        let m = raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return Err(not_leader(raft));
        }
        m.current_term
    };
    if crate::lock(unconfirmed).is_some_and(|(t, at)| t == term && at.elapsed() < UNCONFIRMED_FOR) {
        return Err(RemoteError::NotLeader { leader: None });
    }
    let r = rt.block_on(async { tokio::time::timeout(CONFIRM_TIMEOUT, raft.ensure_linearizable()).await });
    let refused = match r {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => match e {
            RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => RemoteError::NotLeader {
                leader: f.leader_node.map(|n| n.addr),
            },
            other => forward(raft, other),
        },
        Err(_) => RemoteError::NotLeader { leader: None },
    };
    *crate::lock(unconfirmed) = Some((term, std::time::Instant::now()));
    Err(refused)
}

/// True if this member believes it leads (without asking a quorum).
pub(crate) fn leads(raft: &Raft) -> bool {
    raft.metrics().borrow().state == ServerState::Leader
}

/// This member's own row of `remora status`.
pub(crate) fn member_status(raft: &Raft, id: u64, addr: &str) -> ManagerStatus {
    let m = raft.metrics().borrow().clone();
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
