//! remora's wire protocol and the clients that speak it.
//!
//! A compute node, the memory manager and memory nodes talk over TCP with
//! length-prefixed binary frames ([`frame`]): a fixed little-endian header
//! with a request id, a postcard-encoded message head ([`msg`]) and raw
//! payload bytes. Many requests may be in flight per connection and replies
//! may come back in any order ([`rpc`]). Data requests carry capabilities
//! ([`cap`]) that the manager issues per region and compute node. Every
//! connection proves the cluster key ([`auth`]) and may run over mutually
//! authenticated TLS ([`tls`]), below the frames and unchanged by them.

#![forbid(unsafe_code)]

pub mod auth;
pub mod cap;
pub mod checksum;
pub mod client;
pub mod frame;
pub mod msg;
pub mod repeated;
pub mod rpc;
pub mod secret;
pub mod server;
pub mod size;
pub mod tls;
pub mod transport;

pub use auth::{AuthError, ClusterKey};
pub use cap::{AdminKey, Cap, ComputeId, Epoch, NodeId, RegionId, Rights, Session, Token};
pub use client::{ComputeSession, ManagerConn, MemNodeClient, SessionEvent};
pub use msg::{
    ClusterStatus, DeltaTarget, Event, EventKind, Fault, LEASE_INTERVALS, MemNodeStats, Member, NodeLoad, NodeState,
    Range, RebuildRow, RebuildSource, RegionGrant, RemoteError, TxnId, TxnOp,
};
pub use repeated::Repeated;
pub use rpc::{ConnOptions, RpcConn, RpcError};
pub use size::{ByteSize, parse_duration};
pub use tls::{Plane, Stream, TlsConfig, TlsMode};
pub use transport::{FarBackend, MemTransport, TcpBackend};
