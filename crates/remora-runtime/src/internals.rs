//! Internals that benchmarks and fault-injection tests read: the local heap's
//! geometry and census. Behind the `internals` feature; not a stable API.

pub use crate::census::{CensusGroup, LocalCensus, SpanUse};
pub use crate::size_classes::{ClassIndex, PAGE_SIZE, SizeClass};
