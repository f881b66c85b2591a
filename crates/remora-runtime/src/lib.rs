//! The compute-node runtime of remora: the library applications use.
//!
//! Applications keep objects behind remotable pointers ([`RemBox`],
//! [`RemRc`], [`RemSlice`]) and dereference them inside a [`DerefScope`].
//! The runtime keeps hot objects in a bounded local heap of spans
//! (TCMalloc-style, paper §3.3) and evicts cold spans to memory nodes
//! through a fault-tolerance [`scheme`]; a dereference of a far object swaps
//! its span back in with one remote read.
//!
//! ```no_run
//! use remora_runtime::{Remotable, Runtime, RuntimeConfig};
//!
//! #[derive(Clone, Copy)]
//! struct Point { x: u64, y: u64 }
//! // SAFETY: plain integers, no pointers.
//! unsafe impl Remotable for Point {}
//!
//! # fn main() -> Result<(), remora_runtime::RuntimeError> {
//! let rt = Runtime::connect(RuntimeConfig::new("127.0.0.1:7400", 64 << 20))?;
//! let p = rt.alloc(Point { x: 1, y: 2 })?;
//! let scope = rt.scope();
//! assert_eq!(p.deref(&scope)?.y, 2);
//! # Ok(()) }
//! ```
//!
//! What an application uses is at the crate root: [`Runtime`] and its
//! [`RuntimeConfig`] (with [`Tuning`] for the background work), the pointers,
//! [`Remotable`], [`RuntimeError`], [`Stats`], the [`scheme`]s and the
//! [`eviction`] policies. Everything else is private; benchmarks and
//! fault-injection tests reach a few internals through the `internals`
//! feature (not a stable API).
//!
//! One module per paper concept (see `docs/design.md`): local memory
//! (`size_classes`, `page_heap`, `pagemap`, `span`, `central_freelist`,
//! `object_heap`); pointers (`pointer`, the Figure-2 word and its protocol;
//! `scope`, deref scopes and grace periods; `object`; `slots`); far memory
//! (`region_table`, `far_page_heap`, `far_page_map`, [`scheme`]); background
//! work (`runtime`'s evictor and filtering, [`eviction`] policies).
//!
//! Every structure is an instance; there are no globals.

#![deny(missing_docs)]

// Reached from outside only through `internals`.
#[cfg(any(test, feature = "internals"))]
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod census;
mod central_freelist;
mod detector;
mod error;
pub mod eviction;
mod far_memory;
mod far_page_heap;
mod far_page_map;
#[cfg(feature = "internals")]
pub mod internals;
mod loom;
#[cfg(all(test, loom))]
mod loom_models;
mod object;
mod object_heap;
mod page_heap;
mod pagemap;
mod pause_gate;
mod pointer;
mod region_table;
mod runtime;
pub mod scheme;
mod scope;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod size_classes;
mod slice;
mod slots;
mod span;
mod span_registry;
mod traffic;

pub use error::{LossCause, RuntimeError};
pub use object::{RemBox, RemRc, Remotable};
pub use runtime::{DerefScope, Runtime, RuntimeConfig, Stats, Tuning};
pub use slice::{HEADER_BYTES, MAX_OBJECT_BYTES, RemSlice};

/// The runtime's [`Stats`] and its groups, by where each figure is counted.
pub mod stats {
    pub use crate::runtime::stats::{DetectionStats, FarStats, LocalStats, SchemeStats, Stats, TrafficStats};
}

/// The README's example, compiled by `cargo test` (doctests) so it cannot
/// drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
