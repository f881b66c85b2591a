//! remora's test kit: what the integration tests of every crate share, so
//! no test defines its own copy.
//!
//! - [`objects`]: one family of verifiable objects ([`Words`], with the
//!   [`Obj`], [`Obj2K`] and [`Obj4K`] sizes), readable [`Text`] objects and
//!   a linked [`Node`]; every byte depends on (id, version), so a stale,
//!   misplaced, torn or corrupt copy never compares equal.
//! - [`pattern`](mod@pattern): byte patterns for raw region reads and writes.
//! - [`verify`](mod@verify): reading objects back and comparing them, and waiting on
//!   the runtime's stats.
//! - [`stats`](mod@stats): what a phase of a test did, as the change in the
//!   runtime's stats over it, the write amplification stats show, and
//!   waiting for far memory to be given back.
//! - [`workload`]: the skewed multi-threaded workload failure tests run
//!   while nodes die, a uniform one counted per 100 ms window, and a
//!   churning workload that makes compaction fold.
//! - [`in_process`]: a runtime on in-process memory nodes.
//! - `cluster` and `cli` (feature `processes`): a real cluster of child
//!   processes started from the `remora` binary, and runs of that binary.
//!
//! `env!("CARGO_BIN_EXE_remora")` exists only in the root package's own
//! integration tests, so everything that starts the binary takes its path
//! as a parameter; the root package's `tests/common/mod.rs` binds it once.

pub mod in_process;
pub mod objects;
pub mod pattern;
pub mod stats;
pub mod verify;
pub mod workload;

#[cfg(feature = "processes")]
pub mod cli;
#[cfg(feature = "processes")]
pub mod cluster;

pub use objects::{MARK, Node, Obj, Obj2K, Obj4K, Text, Words, obj, word};
pub use pattern::{assert_bytes_eq, fill_pattern, pattern};
pub use stats::{stats_delta, wait_far_given_back, write_amplification};
pub use verify::{recovered, verify, wait_stats, wait_until};
pub use workload::{Churn, Skewed, Uniform, access, skewed_worker};

/// One KiB, in the `usize` object sizes and budgets are given in.
pub const KIB: usize = 1 << 10;
/// One MiB, in the `usize` object sizes and budgets are given in.
pub const MIB: usize = 1 << 20;
