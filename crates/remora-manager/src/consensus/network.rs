//! The group's messages on the cluster transport.
//!
//! Each message is one [`MgrRequest::Raft`] request: its kind in the head,
//! the Raft library's request postcard-encoded in the payload (so a large
//! append or a snapshot is not bound by the head's size limit), and the
//! answer, `Result<response, error>` likewise, in the reply's payload. The
//! connections prove the cluster key (and use TLS) like every other.
//! Blocking calls run on the runtime's blocking pool.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::{Snapshot, SnapshotMeta, Vote};
use remora_proto::msg::{MgrRequest, MgrResponse, RaftRpc, decode};
use remora_proto::rpc::RpcConn;
use remora_proto::{ConnOptions, RpcError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Member, TypeConfig};

/// A whole snapshot as sent.
#[derive(Serialize, Deserialize)]
pub(crate) struct SnapshotBody {
    pub(crate) vote: Vote<u64>,
    pub(crate) meta: SnapshotMeta<u64, Member>,
    pub(crate) data: Vec<u8>,
}

/// Members this one is cut off from, until when (fault injection,
/// `MgrRequest::Isolate`): their messages are dropped both ways.
#[derive(Clone, Default)]
pub(crate) struct Isolation(Arc<std::sync::Mutex<Option<Cut>>>);

/// Members cut off, and until when.
type Cut = (Vec<u64>, std::time::Instant);

impl Isolation {
    /// Cuts `peers` off for `d`.
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) fn cut(&self, peers: Vec<u64>, d: Duration) {
        *crate::lock(&self.0) = Some((peers, std::time::Instant::now() + d));
    }

    /// True if messages to or from `peer` are dropped now.
    pub(crate) fn cuts(&self, peer: u64) -> bool {
        crate::lock(&self.0)
            .as_ref()
            .is_some_and(|(p, until)| p.contains(&peer) && std::time::Instant::now() < *until)
    }
}

/// Makes a connection per peer.
pub(crate) struct Network {
    /// This member's id.
    pub(crate) me: u64,
    /// Key and TLS of the cluster.
    pub(crate) opts: ConnOptions,
    pub(crate) isolation: Isolation,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &Member) -> Peer {
        Peer {
            me: self.me,
            target,
            addr: node.addr.clone(),
            opts: self.opts.clone(),
            conn: None,
            isolation: self.isolation.clone(),
        }
    }
}

/// The connection to one peer.
pub(crate) struct Peer {
    me: u64,
    target: u64,
    addr: String,
    opts: ConnOptions,
    conn: Option<Arc<RpcConn>>,
    isolation: Isolation,
}

/// Why a message did not arrive.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("{0}")]
    Rpc(#[from] RpcError),
    #[error("undecodable answer: {0}")]
    Decode(String),
}

impl Peer {
    async fn call<Req: Serialize, Resp: DeserializeOwned + Send + 'static>(
        &mut self,
        rpc: RaftRpc,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, SendError> {
        if self.isolation.cuts(self.target) {
            return Err(SendError::Rpc(RpcError::Connect {
                addr: self.addr.clone(),
                reason: "cut off by fault injection".into(),
            }));
        }
        let body = postcard::to_allocvec(req).map_err(|e| SendError::Decode(e.to_string()))?;
        let (conn, addr, mut opts, me) = (self.conn.take(), self.addr.clone(), self.opts.clone(), self.me);
        opts.connect_timeout = opts.connect_timeout.min(timeout);
        let done = tokio::task::spawn_blocking(move || -> Result<(Arc<RpcConn>, Vec<u8>), SendError> {
            let conn = match conn {
                Some(c) if !c.is_broken() => c,
                _ => RpcConn::connect(&addr, opts)?,
            };
            let t = conn.send(&MgrRequest::Raft { rpc, from: me }, &[&body])?;
            let reply = conn.wait(t, None, timeout)?;
            match decode::<MgrResponse>(&reply.head) {
                Ok(MgrResponse::Raft) => Ok((conn, reply.payload)),
                Ok(other) => Err(SendError::Decode(format!("{other:?}"))),
                Err(e) => Err(SendError::Decode(e.to_string())),
            }
        })
        .await
        .map_err(|e| SendError::Decode(e.to_string()))?;
        let (conn, payload) = done?;
        self.conn = Some(conn);
        postcard::from_bytes(&payload).map_err(|e| SendError::Decode(e.to_string()))
    }
}

fn rpc_error<E: std::error::Error>(e: SendError) -> RPCError<u64, Member, E> {
    match &e {
        SendError::Rpc(RpcError::Connect { .. }) => RPCError::Unreachable(Unreachable::new(&e)),
        _ => RPCError::Network(NetworkError::new(&e)),
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, Member, RaftError<u64>>> {
        let r: Result<AppendEntriesResponse<u64>, RaftError<u64>> = self
            .call(RaftRpc::Append, &rpc, option.hard_ttl())
            .await
            .map_err(rpc_error)?;
        r.map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.target, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, Member, RaftError<u64>>> {
        let r: Result<VoteResponse<u64>, RaftError<u64>> = self
            .call(RaftRpc::Vote, &rpc, option.hard_ttl())
            .await
            .map_err(rpc_error)?;
        r.map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.target, e)))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<u64>,
        snapshot: Snapshot<TypeConfig>,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<u64>, StreamingError<TypeConfig, Fatal<u64>>> {
        let body = SnapshotBody {
            vote,
            meta: snapshot.meta,
            data: *snapshot.snapshot,
        };
        let r: Result<SnapshotResponse<u64>, Fatal<u64>> = self
            .call(RaftRpc::Snapshot, &body, option.hard_ttl())
            .await
            .map_err(|e| match &e {
                SendError::Rpc(RpcError::Connect { .. }) => StreamingError::Unreachable(Unreachable::new(&e)),
                _ => StreamingError::Network(NetworkError::new(&e)),
            })?;
        r.map_err(|e| StreamingError::RemoteError(openraft::error::RemoteError::new(self.target, e)))
    }
}

/// Serves one message from a peer: the encoded answer for the reply's payload.
pub(crate) fn serve(group: &super::Group, rpc: RaftRpc, body: &[u8]) -> Result<Vec<u8>, String> {
    let (rt, raft) = (&group.rt, &group.raft);
    fn enc<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
        postcard::to_allocvec(v).map_err(|e| e.to_string())
    }
    match rpc {
        RaftRpc::Append => {
            let req: AppendEntriesRequest<TypeConfig> = postcard::from_bytes(body).map_err(|e| e.to_string())?;
            enc(&rt.block_on(raft.append_entries(req)))
        }
        RaftRpc::Vote => {
            let req: VoteRequest<u64> = postcard::from_bytes(body).map_err(|e| e.to_string())?;
            enc(&rt.block_on(raft.vote(req)))
        }
        RaftRpc::Snapshot => {
            let b: SnapshotBody = postcard::from_bytes(body).map_err(|e| e.to_string())?;
            let snap = Snapshot {
                meta: b.meta,
                snapshot: Box::new(b.data),
            };
            enc(&rt.block_on(raft.install_full_snapshot(b.vote, snap)))
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    use super::*;
    use crate::machine::{Command, Proposal};

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The group's messages are part of the protocol: their bytes are
    /// pinned, so a change of the Raft library's encoding (or of a
    /// command's) is seen here and needs a new protocol version.
    #[test]
    fn raft_messages_golden_bytes() {
        let log_id = LogId::new(CommittedLeaderId::new(3, 2), 10);
        let vote = VoteRequest {
            vote: Vote::new(3, 2),
            last_log_id: Some(log_id),
        };
        assert_eq!(
            hex(&postcard::to_allocvec(&vote).unwrap()),
            "03 02 00 | 01 03 02 0a".replace([' ', '|'], "")
        );
        let append = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 2),
            prev_log_id: Some(log_id),
            entries: vec![Entry {
                log_id: LogId::new(CommittedLeaderId::new(3, 2), 11),
                payload: EntryPayload::Normal(Proposal {
                    at_ms: 300,
                    cmd: Command::Drain { addr: "h:9".into() },
                }),
            }],
            leader_commit: Some(log_id),
        };
        assert_eq!(
            hex(&postcard::to_allocvec(&append).unwrap()),
            "03 02 01 | 01 03 02 0a | 01 03 02 0b 01 ac02 02 03683a39 | 01 03 02 0a".replace([' ', '|'], "")
        );
        let answer: Result<VoteResponse<u64>, RaftError<u64>> = Ok(VoteResponse {
            vote: Vote::new(4, 1),
            vote_granted: true,
            last_log_id: None,
        });
        assert_eq!(
            hex(&postcard::to_allocvec(&answer).unwrap()),
            "00 | 04 01 00 | 01 | 00".replace([' ', '|'], "")
        );
    }
}
