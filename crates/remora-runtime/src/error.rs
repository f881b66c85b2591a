//! The runtime's typed errors.

use remora_proto::RpcError;

use crate::scheme::SpanAddr;

/// What can go wrong in the runtime. Never a panic. New kinds of failure
/// may be added, so a `match` needs a catch-all arm.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The manager has no more regions to give (on enough distinct nodes).
    #[error("far memory exhausted: {0}")]
    FarMemoryExhausted(String),
    /// Far data could not be read back and cannot be repaired. Only the
    /// span named is gone: every other object keeps working, and dropping
    /// an object of a lost span frees it without reading it.
    #[error("far data lost{}: {cause}", lost_at(.span, .object))]
    DataLost {
        /// The far span whose bytes are gone (`None`: the loss is not one
        /// span's, e.g. a whole stripe-group position that cannot be rebuilt).
        span: Option<SpanAddr>,
        /// The object of that span the caller asked for (its index in the
        /// span), when the loss surfaced through a dereference.
        object: Option<u16>,
        /// Why it cannot be read.
        cause: LossCause,
    },
    /// Far data that is not lost could not be reached for the runtime's
    /// whole `outage_deadline`: the manager is down and the memory nodes'
    /// leases have lapsed, or too few members of a spanset answer while
    /// none of them was declared dead. Nothing is lost; a later try may work.
    #[error("far memory unavailable{} for {waited:?}: {why}", lost_at(.span, .object))]
    Unavailable {
        /// The far span that could not be read, if the wait was for one.
        span: Option<SpanAddr>,
        /// The object of that span the caller asked for.
        object: Option<u16>,
        /// What was waited for.
        why: String,
        /// How long the operation waited.
        waited: std::time::Duration,
    },
    /// Local memory (or a thread) could not be obtained from the OS.
    #[error("local memory: {0}")]
    LocalMemory(String),
    /// The erasure codec refused to encode a spanset (its arguments did not
    /// fit the code): a defect, not a failure of the cluster. Nothing was
    /// written; the spans stay local.
    #[error("erasure code: {0}")]
    Codec(#[from] remora_ec::EcError),
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
    /// A stripe group lost a position and no live memory node outside the
    /// group is left to rebuild it on (fewer than k+m live nodes): its
    /// spans are written again as shorter spansets on the live nodes
    /// instead. Seen in recovery's logs, never by a read or a write.
    #[error("no live memory node outside stripe group {group} to rebuild it on")]
    NoDistinctNode {
        /// The stripe group.
        group: usize,
    },
}

/// Why far data is lost. More causes may be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LossCause {
    /// More members of its stripe group's stripes died than parity covers:
    /// a decode needs `needed` and only `survivors` are alive. Final: a
    /// memory node the manager declared dead never serves its data again.
    #[error("stripe group {group} has {survivors} surviving members of the {needed} a decode needs")]
    TooFewSurvivors {
        /// The stripe group.
        group: usize,
        /// Its members still alive (declared dead ones excluded).
        survivors: usize,
        /// k: members a decode needs.
        needed: usize,
    },
    /// Its far copy failed its checksum and so did every reconstruction.
    #[error("its far copy and its reconstruction both failed their checksums")]
    Corrupt,
    /// Its only copy is on a memory node that is gone.
    #[error("{scheme} keeps no redundancy and its memory node is unreachable")]
    NoRedundancy {
        /// The scheme.
        scheme: &'static str,
    },
    /// Anything else (bookkeeping that no longer names the span, a decode
    /// the codec refused), described.
    #[error("{0}")]
    Other(String),
}

fn lost_at(span: &Option<SpanAddr>, object: &Option<u16>) -> String {
    match (span, object) {
        (Some(s), Some(o)) => format!(" (object {o} of span r{}:p{})", s.region, s.page),
        (Some(s), None) => format!(" (span r{}:p{})", s.region, s.page),
        (None, Some(o)) => format!(" (object {o})"),
        (None, None) => String::new(),
    }
}

impl RuntimeError {
    /// Far data lost: the span at `span` (if one) for `cause`.
    pub(crate) fn lost(span: impl Into<Option<SpanAddr>>, cause: LossCause) -> Self {
        Self::DataLost {
            span: span.into(),
            object: None,
            cause,
        }
    }

    /// Far data unreachable for now (not lost) at `span`, for the reason
    /// `why`; the read path waits it out up to the outage deadline.
    pub(crate) fn unavailable(span: impl Into<Option<SpanAddr>>, why: String) -> Self {
        Self::Unavailable {
            span: span.into(),
            object: None,
            why,
            waited: std::time::Duration::ZERO,
        }
    }

    /// Far data lost for a reason only words describe.
    pub(crate) fn lost_because(span: impl Into<Option<SpanAddr>>, why: String) -> Self {
        Self::lost(span, LossCause::Other(why))
    }

    /// Names the span and object a loss surfaced through (kept if the
    /// error already names them); other errors pass unchanged.
    pub(crate) fn naming(self, at: SpanAddr, object: u16) -> Self {
        match self {
            Self::DataLost { span, object: o, cause } => Self::DataLost {
                span: span.or(Some(at)),
                object: o.or(Some(object)),
                cause,
            },
            Self::Unavailable {
                span,
                object: o,
                why,
                waited,
            } => Self::Unavailable {
                span: span.or(Some(at)),
                object: o.or(Some(object)),
                why,
                waited,
            },
            other => other,
        }
    }

    /// Whether the error is a loss that no retry can undo: too few members
    /// of the stripe group survive.
    pub(crate) fn is_final_loss(&self) -> bool {
        matches!(
            self,
            Self::DataLost {
                cause: LossCause::TooFewSurvivors { .. },
                ..
            }
        )
    }
}

/// Why an allocation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AllocError {
    /// A new span would take the bytes in spans past the configured budget; the runtime is
    /// expected to evict before this happens.
    #[error("local memory budget exceeded: {requested} more bytes with {in_use} of {limit} in use")]
    BudgetExceeded {
        /// Bytes of the span that was needed.
        requested: usize,
        /// Bytes in spans at the time.
        in_use: usize,
        /// The budget.
        limit: usize,
    },
    /// The OS refused memory.
    #[error("mmap of {bytes} bytes failed")]
    Map {
        /// Bytes asked for.
        bytes: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The OS placed a mapping beyond the 48 bits the page map covers.
    #[error("mapping at {addr:#x} lies beyond the page map's 48-bit address range")]
    AddressOutOfRange {
        /// Where the mapping landed.
        addr: usize,
    },
    /// The size cannot be represented as a span.
    #[error("an allocation of {size} bytes is too large")]
    TooLarge {
        /// Bytes asked for.
        size: usize,
    },
}

/// Why a free was refused; the heap is unchanged when this is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FreeError {
    /// The address is not inside an in-use span of this heap (or of the list's class).
    #[error("{0:#x} is not in an in-use span of this heap")]
    UnknownPointer(usize),
    /// The address is inside a span but not at the start of an object.
    #[error("{0:#x} is not the start of an object")]
    NotObjectStart(usize),
    /// The object is already free.
    #[error("{0:#x} is already free")]
    DoubleFree(usize),
}
