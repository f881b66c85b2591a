//! The runtime's typed errors.

use remora_proto::RpcError;

/// What can go wrong in the runtime. Never a panic.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    /// The manager has no more regions to give (on enough distinct nodes).
    #[error("far memory exhausted: {0}")]
    FarMemoryExhausted(String),
    /// A far span could not be read back and cannot be repaired.
    #[error("far data lost: {0}")]
    DataLost(String),
    /// Local memory could not be obtained from the OS.
    #[error("local memory: {0}")]
    LocalMemory(String),
    /// An object is larger than the runtime can place.
    #[error("object of {size} bytes is too large")]
    TooLarge {
        /// Its size.
        size: usize,
    },
    /// Eviction could not make room in time.
    #[error("local memory budget exceeded and eviction made no progress for {0:?}")]
    EvictionStalled(std::time::Duration),
    /// The manager or a memory node failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The manager declared this compute node dead (it missed heartbeats) and
    /// revoked its far memory: far objects are gone.
    #[error("the manager expired this compute node's session; its far memory was revoked")]
    SessionExpired,
    /// A setting makes no sense (unknown scheme, impossible code).
    #[error("configuration: {0}")]
    Config(String),
    /// The runtime is shutting down.
    #[error("runtime is shut down")]
    Shutdown,
}
