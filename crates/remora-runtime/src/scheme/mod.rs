//! Fault-tolerance schemes: how evicted spans are laid out in far memory and
//! read back. One file per scheme behind [`Scheme`], listed once in
//! [`SCHEMES`]:
//! - `non-ft`: one copy, no redundancy;
//! - `replication`: three copies on three distinct memory nodes;
//! - `ec-batch`: spansets of k spans plus m parity spans on k+m distinct
//!   memory nodes (paper §3.4.1), with remote compaction (§3.4.2) whose
//!   parity deltas the memory nodes compute while they have CPU to spare
//!   and the compute node otherwise;
//! - `ec-batch-local`, `ec-batch-remote`: `ec-batch` with compaction fixed
//!   in one mode: parity deltas computed by the compute node or by the
//!   memory nodes;
//! - `ec-split`: each span cut into k data fragments plus m parity
//!   fragments on k+m distinct memory nodes (Hydra; paper §3.4, Table 1),
//!   so a swap-in reads k fragments;
//! - `ec-2pc`: spansets of fixed slots like `ec-batch`, but a slot freed by
//!   a swap-in is refilled by a later swap-out, parity updated in place by
//!   two-phase commit (paper Table 1).
//!
//! What every scheme shares lives beside them: `read` (the whole read of a
//! far span: verify, read around, repair), `spanset` (k data plus m parity
//! members on a stripe group), `placement` (stripe groups on distinct
//! nodes, suspects, far space), `recovery` (rebuilding a dead node's
//! positions, joined on shutdown) and `shards` (reading k of k+m shards
//! around failures, writing a stripe).
//!
//! # Lock contract
//!
//! The runtime calls every method without holding any lock of its own
//! that another [`Scheme`] call could need, from any thread, concurrently.
//! A method may block on the network (up to the transport's timeouts) and
//! on the manager (up to `patience`); it never calls back into the runtime.
//! `read_copy`, `read_around` and `repair` of one span are never concurrent
//! with each other or with that span's `release`/`keep` (the caller holds
//! the far span's lock); `release`, `keep`, `reuse` and `drop_kept` never
//! touch the network.

mod ec_2pc;
mod ec_batch;
mod ec_split;
mod node_writes;
mod non_ft;
pub(crate) mod placement;
pub(crate) use placement::NO_REGION;
mod read;
pub(crate) mod recovery;
mod retry;
pub(crate) mod shards;
pub(crate) mod spanset;

use std::sync::Arc;
use std::time::Duration;

pub use ec_2pc::Ec2pc;
pub use ec_batch::EcBatch;
pub use ec_split::EcSplit;
pub use non_ft::NonFt;
pub use read::CopyRead;
pub(crate) use read::{Verified, read};
use remora_proto::NodeId;

use crate::error::{LossCause, RuntimeError};
pub use crate::far_memory::FarMemory;

/// Where a far span lives: region index and first page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanAddr {
    /// Region-table index.
    pub region: u16,
    /// First 8 KiB page inside the region.
    pub page: u32,
}

/// What a scheme reports about redundancy and recovery.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchemeReport {
    /// Swap-ins served by decoding from survivors.
    pub degraded_reads: u64,
    /// Bytes rebuilt on replacement regions.
    pub reconstructed_bytes: u64,
    /// Time spent rebuilding, summed over recoveries.
    pub reconstruct_time: Duration,
    /// Recoveries finished: node failures whose every stripe-group
    /// position was rebuilt (or found impossible to rebuild).
    pub recoveries: u64,
    /// Recoveries under way: node failures with positions still to rebuild.
    pub recovering: u64,
    /// Far bytes held by holes (swapped-in spans whose bytes parity still covers).
    pub hole_bytes: u64,
    /// Corrupt far spans rewritten with verified bytes.
    pub repairs: u64,
    /// Stripe-group positions that can never be rebuilt: their group has
    /// fewer than k survivors. Their spans answer
    /// [`RuntimeError::DataLost`]; everything else keeps working.
    pub lost_positions: u64,
    /// Rebuild attempts that failed (e.g. a rebuilt shard failed its
    /// checksum because a survivor was corrupt) and were retried.
    pub rebuild_retries: u64,
    /// Far bytes held by kept copies of swapped-in clean spans.
    pub kept_bytes: u64,
    /// Far bytes kept for good by stripe writes given up as overdue and
    /// still unanswered at their call timeout: the write might yet land, so
    /// its pages are never reused (until the region goes with its node).
    pub stranded_bytes: u64,
    /// Spansets written with fewer than k data spans (a batch of j < k
    /// spans costs (j+m)/j, not (k+m)/k, in bytes written).
    pub partial_batches: u64,
    /// Spansets written, full or partial.
    pub batches: u64,
    /// Compactions committed.
    pub compactions: u64,
    /// Of those, in Local mode (parity deltas combined by the compute node).
    pub compactions_local: u64,
    /// Of those, in Remote mode (parity deltas sent between memory nodes).
    pub compactions_remote: u64,
    /// Switches between the modes (adaptive compaction: `ec-batch`).
    pub compaction_switches: u64,
    /// The mode folds run in now (`"local"` or `"remote"`); `None` for a
    /// scheme that does not compact.
    pub compaction_mode: Option<&'static str>,
    /// The busiest memory node's CPU use, in thousandths of a core, as
    /// adaptive compaction last polled it (0 before any poll, and for
    /// fixed modes, which do not poll).
    pub memnode_cpu_permille: u32,
    /// Compactions abandoned before their commit point.
    pub compactions_aborted: u64,
    /// Far bytes compaction gave back.
    pub compacted_bytes_freed: u64,
    /// Bytes of dead data spans (holes) folds did away with: the folded
    /// spanset's holes, given back, and the holes its spans now fill.
    pub compacted_dead_bytes: u64,
    /// Time compaction threads spent folding, summed over threads.
    pub compaction_busy: Duration,
    /// Spansets now below full tolerance: in a stripe group with a
    /// position lost and not yet rebuilt (or re-striped), or with a member
    /// in doubt not yet repaired.
    pub spansets_below_tolerance: u64,
    /// Members left in doubt by a fold's unacknowledged commit and since
    /// rebuilt in place.
    pub doubt_repairs: u64,
    /// Spansets now written short (fewer than k data positions, because
    /// fewer than k+m memory nodes were live): they tolerate m losses at a
    /// higher parity overhead.
    pub short_spansets: u64,
}

/// Why a memory node's spans must be recovered ([`Scheme::node_left`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Departure {
    /// The manager declared it dead: it never serves again.
    Died,
    /// A planned departure (`remora drain`, or a signal to the daemon): it
    /// serves what it holds until that has moved, then leaves.
    Draining,
}

/// A way of keeping evicted spans in far memory.
pub trait Scheme: Send + Sync {
    /// The scheme's name as given on the command line (`non-ft`, ...).
    fn name(&self) -> &'static str;

    /// Places and writes whole spans (each a multiple of 8 KiB, with its
    /// checksum in `sums`); returns where each landed once every byte (and
    /// any redundancy) is acknowledged.
    fn swap_out(&self, far: &FarMemory, spans: &[&[u8]], sums: &[u64]) -> Result<Vec<SpanAddr>, RuntimeError>;

    /// Spans one [`Scheme::swap_out`] should carry to fill a stripe: k for
    /// spansets of whole spans (fewer are padded, costing (j+m)/j), 1 for
    /// schemes without batches. The evictor gathers at least this many
    /// spans to write, where cold spans allow it.
    fn stripe_spans(&self) -> usize {
        1
    }

    /// Reads the span's own far copy at `at` into `dest` (its full
    /// length), or says it cannot be read now. The remote reads it takes
    /// are counted by the transport, not reported here. Only the read path
    /// (`scheme::read`) calls it: it verifies the bytes and decides to read
    /// around the copy.
    fn read_copy(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<CopyRead, RuntimeError>;

    /// Rebuilds the span at `at` from redundancy, without its own far copy
    /// (unreadable, or failed its checksum): a degraded read.
    fn read_around(&self, _far: &FarMemory, at: SpanAddr, _dest: &mut [u8]) -> Result<(), RuntimeError> {
        Err(RuntimeError::lost(at, LossCause::NoRedundancy { scheme: self.name() }))
    }

    /// Writes verified bytes over a corrupt far copy, so redundancy that
    /// covers it stays consistent.
    fn repair(&self, _far: &FarMemory, _at: SpanAddr, _good: &[u8]) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// The far copy at `at` (of `pages` pages) is no longer needed.
    fn release(&self, far: &FarMemory, at: SpanAddr, pages: u32);

    /// The span at `at` was swapped in and its local copy is clean: keep the
    /// far copy so the span can be re-evicted without a write. Returns a
    /// token for [`Scheme::reuse`] and [`Scheme::drop_kept`], or `None` if
    /// the copy was released instead (as by [`Scheme::release`]).
    ///
    /// The rule every scheme follows: a kept copy holds its far bytes but
    /// never keeps anything else alive (an EC row whose other members are
    /// gone is freed, cancelling the copy), and it is reported in
    /// [`SchemeReport::kept_bytes`], apart from live data and holes.
    fn keep(&self, far: &FarMemory, at: SpanAddr, pages: u32) -> Option<u64> {
        self.release(far, at, pages);
        None
    }

    /// Turns a kept copy back into the live far copy of its span (a clean
    /// re-eviction). False if the copy was cancelled meanwhile or should not
    /// be trusted: the caller then drops it ([`Scheme::drop_kept`]) and
    /// writes the span normally.
    fn reuse(&self, _far: &FarMemory, _at: SpanAddr, _pages: u32, _token: u64) -> bool {
        false
    }

    /// The local span changed or went away: its kept copy is not needed.
    fn drop_kept(&self, _far: &FarMemory, _at: SpanAddr, _pages: u32, _token: u64) {}

    /// Memory node `node` left or is leaving (`why`): recover what it held
    /// (in the background; [`Scheme::stop`] joins it). A draining node's
    /// spans are rebuilt elsewhere while it still serves them, and each of
    /// its regions is given back once nothing there is needed, so it can
    /// leave. Returns whether some of them must stay on it for now (the
    /// runtime asks again every second while it does). By default nothing
    /// is recovered or moved.
    fn node_left(&self, _far: &Arc<FarMemory>, _node: NodeId, _why: Departure) -> bool {
        false
    }

    /// The runtime is starting: start background work (compaction and
    /// scrubbing will), on threads [`Scheme::stop`] joins. Called once,
    /// before any other method; an error fails `Runtime::new`.
    fn start(&self, _far: &Arc<FarMemory>) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// The runtime is shutting down (or failed to start): stop background
    /// work and join it. Called once, after every other call has returned.
    fn stop(&self) {}

    /// Pauses (`true`) or resumes (`false`) background work that only
    /// reorganises far memory (compaction), returning once none is in
    /// flight. Recovery is never paused. Default: nothing to pause.
    fn pause(&self, _paused: bool) {}

    /// Gives regions that hold nothing back to the manager (keeping a
    /// spare); returns the bytes given back. Called now and then from a
    /// runtime thread with no lock held.
    fn give_back(&self, _far: &FarMemory) -> u64 {
        0
    }

    /// Far bytes allocated now: data, redundancy and holes.
    fn remote_bytes_used(&self, far: &FarMemory) -> u64 {
        far.used_bytes()
    }

    /// Redundancy and recovery counters.
    fn report(&self) -> SchemeReport {
        SchemeReport::default()
    }

    /// The region indices of each stripe group in use: every stripe of the
    /// scheme lies on one group's regions. Empty for a scheme without
    /// groups.
    fn stripe_groups(&self) -> Vec<Vec<u16>> {
        Vec::new()
    }
}

/// How to build a scheme: the erasure code and per-scheme switches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchemeOptions {
    /// Data spans (or fragments) per spanset, for erasure-coded schemes.
    pub k: usize,
    /// Parity spans (or fragments) per spanset.
    pub m: usize,
    /// `ec-split`: read k+1 fragments and decode from the first k to arrive.
    pub late_binding: bool,
    /// Compaction threads of the compacting schemes (`ec-batch`,
    /// `ec-batch-local`, `ec-batch-remote`); 0 turns compaction off.
    pub compaction_threads: usize,
    /// Holes' share of the data members' far pages at which compaction
    /// starts folding; it stops below half of it. Far memory then stays
    /// within about `(k+m)/k / (1 - trigger)` of the live data. 0: fold
    /// whenever a fold exists.
    pub compaction_trigger: f64,
}

impl Default for SchemeOptions {
    /// RS(4, 2), as in the paper.
    fn default() -> Self {
        Self {
            k: 4,
            m: 2,
            late_binding: false,
            compaction_threads: 2,
            compaction_trigger: 0.25,
        }
    }
}

/// One entry of the scheme table.
pub struct SchemeInfo {
    /// The name on the command line.
    pub name: &'static str,
    /// What it is, in a line.
    pub about: &'static str,
    /// Whether `--ec K+M` applies to it.
    pub erasure_coded: bool,
    /// Whether it survives the loss of a memory node (reads around it and
    /// rebuilds what it held).
    pub redundant: bool,
    /// Whether it runs compaction threads (`SchemeOptions::compaction_threads`).
    pub compacts: bool,
    make: fn(&SchemeOptions) -> Result<Box<dyn Scheme>, RuntimeError>,
}

/// Every scheme, in the order `--scheme all` runs them.
pub const SCHEMES: &[SchemeInfo] = &[
    SchemeInfo {
        name: "non-ft",
        about: "one copy, no redundancy",
        erasure_coded: false,
        compacts: false,
        redundant: false,
        make: |_| Ok(Box::new(NonFt::default())),
    },
    SchemeInfo {
        name: "replication",
        about: "three copies on three distinct memory nodes",
        erasure_coded: false,
        compacts: false,
        redundant: true,
        make: |_| Ok(Box::new(EcBatch::replication(3)?)),
    },
    SchemeInfo {
        name: "ec-batch",
        about: "RS(k,m) spansets of whole spans; a swap-in is one read; compaction adapts to memory-node CPU",
        erasure_coded: true,
        compacts: true,
        redundant: true,
        make: |o| {
            Ok(Box::new(EcBatch::compacting(
                "ec-batch",
                o.k,
                o.m,
                ec_batch::Policy::Adaptive,
                o.compaction_threads,
                o.compaction_trigger,
            )?))
        },
    },
    SchemeInfo {
        name: "ec-batch-local",
        about: "ec-batch with compaction; the compute node computes parity deltas",
        erasure_coded: true,
        compacts: true,
        redundant: true,
        make: |o| {
            Ok(Box::new(EcBatch::compacting(
                "ec-batch-local",
                o.k,
                o.m,
                ec_batch::Policy::Fixed(ec_batch::Mode::Local),
                o.compaction_threads,
                o.compaction_trigger,
            )?))
        },
    },
    SchemeInfo {
        name: "ec-batch-remote",
        about: "ec-batch with compaction; memory nodes send parity deltas to each other (2PC)",
        erasure_coded: true,
        compacts: true,
        redundant: true,
        make: |o| {
            Ok(Box::new(EcBatch::compacting(
                "ec-batch-remote",
                o.k,
                o.m,
                ec_batch::Policy::Fixed(ec_batch::Mode::Remote),
                o.compaction_threads,
                o.compaction_trigger,
            )?))
        },
    },
    SchemeInfo {
        name: "ec-split",
        about: "RS(k,m) fragments of each span (Hydra); a swap-in is k reads",
        erasure_coded: true,
        compacts: false,
        redundant: true,
        make: |o| Ok(Box::new(EcSplit::new(o.k, o.m, o.late_binding)?)),
    },
    SchemeInfo {
        name: "ec-2pc",
        about: "RS(k,m) spansets whose freed slots are refilled, parity updated by 2PC",
        erasure_coded: true,
        compacts: false,
        redundant: true,
        make: |o| Ok(Box::new(Ec2pc::new(o.k, o.m)?)),
    },
];

/// Makes scheme `name` with `opts`.
pub fn make(name: &str, opts: &SchemeOptions) -> Result<Box<dyn Scheme>, RuntimeError> {
    let info = SCHEMES.iter().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<&str> = SCHEMES.iter().map(|s| s.name).collect();
        RuntimeError::Config(format!("unknown scheme {name:?} (known: {})", names.join(", ")))
    })?;
    (info.make)(opts)
}

/// Picks a scheme by name with the default options (erasure-coded schemes
/// use RS(4,2)).
pub fn by_name(name: &str) -> Option<Box<dyn Scheme>> {
    make(name, &SchemeOptions::default()).ok()
}
