//! The compute-node runtime of remora: the library applications use.
//!
//! Applications keep objects behind remotable pointers ([`RemBox`],
//! [`RemRc`]) and dereference them inside a [`DerefScope`]. The runtime keeps
//! hot objects in a bounded local heap of spans (TCMalloc-style, paper §3.3)
//! and evicts cold spans to memory nodes through a fault-tolerance
//! [`scheme`]; a dereference of a far object swaps its whole span back in
//! with one remote read.
//!
//! One module per paper concept:
//! - local memory: [`size_classes`], [`page_heap`], [`pagemap`], [`span`],
//!   [`central_freelist`] (and [`LocalHeap`], the allocator on its own);
//! - pointers: [`mod@pointer`] (the Figure-2 word and its protocol), `scope`
//!   (deref scopes, grace periods), `object` (remotable pointers), `slots`;
//! - far memory: `region_table`, `far_page_heap`, `far_page_map`, [`scheme`];
//! - background work: [`eviction`] (policies behind a trait, CLOCK default).
//!
//! Every structure is an instance; there are no globals.

mod census;
pub mod central_freelist;
mod detector;
mod error;
pub mod eviction;
mod far_memory;
mod far_page_heap;
mod far_page_map;
mod local_heap;
mod loom;
mod object;
mod object_heap;
pub mod page_heap;
pub mod pagemap;
pub mod pause_gate;
pub mod pointer;
mod region_table;
mod runtime;
pub mod scheme;
mod scope;
pub mod size_classes;
mod slice;
mod slots;
pub mod span;
mod span_registry;
mod traffic;

pub use census::{CensusGroup, LocalCensus, SpanUse};
pub use error::{LossCause, RuntimeError};
pub use local_heap::{HeapUsage, LocalHeap};
pub use object::{RemBox, RemRc, Remotable};
pub use page_heap::PageHeapConfig;
pub use runtime::{DerefScope, Runtime, RuntimeConfig, Stats};
pub use slice::{HEADER_BYTES, MAX_OBJECT_BYTES, RemSlice};

/// The runtime's [`Stats`] and its groups, by where each figure is counted.
pub mod stats {
    pub use crate::runtime::stats::{DetectionStats, FarStats, LocalStats, SchemeStats, Stats, TrafficStats};
}

/// Why an allocation failed.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
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
    /// The alignment exceeds the 8 KiB page alignment of spans.
    #[error("alignment {align} exceeds the 8 KiB page")]
    UnsupportedAlignment {
        /// The alignment asked for.
        align: usize,
    },
}

/// Why a free was refused; the heap is unchanged when this is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FreeError {
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
