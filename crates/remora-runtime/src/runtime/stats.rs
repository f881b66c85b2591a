//! The runtime's counters and the [`Stats`] snapshot benchmarks and tests read.

use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};

use super::Inner;

/// Counters and levels, for benchmarks and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Spans swapped in.
    pub swap_ins: u64,
    /// Read requests sent on the swap-in path (swap-ins and degraded reads;
    /// each fragment of a split span is one), counted at the transport.
    pub swap_in_reads: u64,
    /// Spans swapped out.
    pub swap_outs: u64,
    /// Evictions abandoned because an application thread touched the span.
    pub evictions_aborted: u64,
    /// Bytes of whole data spans written out by swap-outs (clean re-evictions
    /// write nothing and are counted in `clean_bytes_saved` instead).
    pub bytes_evicted_data: u64,
    /// Bytes read from memory nodes.
    pub bytes_read_remote: u64,
    /// Bytes written to memory nodes (swap-outs and repairs), counted at the transport.
    pub bytes_written_remote: u64,
    /// Write requests sent to memory nodes (plain and vectored), counted at
    /// the transport: a swap-out batch sends each node one.
    pub write_requests: u64,
    /// Far bytes allocated to spans now.
    pub remote_bytes_used: u64,
    /// Far bytes held from the manager now: every region, in use or not.
    pub far_bytes_held: u64,
    /// Bytes of empty regions given back to the manager so far.
    pub far_bytes_given_back: u64,
    /// Far bytes of live data spans now.
    pub live_bytes: u64,
    /// Local bytes in spans now.
    pub local_bytes: u64,
    /// Live objects.
    pub objects: u64,
    /// Live objects in far spans (the rest are local).
    pub far_objects: u64,
    /// Swap-ins served by decoding from survivors.
    pub degraded_reads: u64,
    /// Memory nodes suspected on this compute node's own evidence (a
    /// connection error, or a read overdue); each is put to the manager.
    pub suspicions: u64,
    /// Of those, ones the manager found alive (its probe was answered).
    pub suspicions_cleared: u64,
    /// Reads given up as overdue (read around instead) before the call
    /// timeout, by the bound derived from measured read latency.
    pub overdue_reads: u64,
    /// Stripe writes given up as overdue (the stripe placed again without
    /// that node) before the call timeout.
    pub overdue_writes: u64,
    /// Bytes rebuilt on replacement regions after memory-node failures.
    pub reconstructed_bytes: u64,
    /// Seconds spent rebuilding, summed over recoveries.
    pub reconstruct_seconds: f64,
    /// Recoveries finished: node failures whose every stripe-group
    /// position was rebuilt (or found impossible to rebuild).
    pub recoveries: u64,
    /// Recoveries under way: node failures with positions still to rebuild
    /// (a failed rebuild is retried, so this stays above 0 until they are).
    pub recovering: u64,
    /// Far bytes held by holes (swapped-in spans parity still covers).
    pub hole_bytes: u64,
    /// Far bytes kept for good by stripe writes given up as overdue and
    /// never answered (the write might yet land; see `overdue_writes`).
    pub stranded_bytes: u64,
    /// Far spans that failed their checksum and were rebuilt and rewritten.
    pub checksum_repairs: u64,
    /// Stripe-group positions that can never be rebuilt (their group lost
    /// more members than parity covers); their spans answer `DataLost`.
    pub lost_positions: u64,
    /// Rebuilds retried (a rebuilt shard failed its checksum, or a node failed mid-rebuild).
    pub rebuild_retries: u64,
    /// Spansets below full tolerance now: in a stripe group with a lost
    /// position not yet rebuilt or re-striped, or with a member in doubt
    /// (a fold's commit never acknowledged) not yet repaired; 0 once
    /// recovery and repairs are done.
    pub spansets_below_tolerance: u64,
    /// Members left in doubt by a fold's unacknowledged commit, since
    /// rebuilt in place from the members that agree.
    pub doubt_repairs: u64,
    /// Spansets in a short stripe group (one with an empty position), written
    /// with fewer than k data spans because fewer than k+m memory nodes were
    /// live: they tolerate m losses at a parity overhead of (k'+m)/k'. Once
    /// the group is given a node at its empty position they count as
    /// partial spansets of a full group, and fold into full ones.
    pub short_spansets: u64,
    /// Far spans brought back to be written again on live nodes, because
    /// their stripe group lost a position with no node left to rebuild on.
    pub restriped_spans: u64,
    /// Dereferences that waited for a swap-in, their own or another thread's (misses).
    pub deref_misses: u64,
    /// Of the swap-ins, those that brought back only the object asked for
    /// ([`crate::Tuning::object_swap_in`]).
    pub object_swap_ins: u64,
    /// Bytes of spans swapped in (read whole, also for an object swap-in).
    pub swap_in_bytes: u64,
    /// Bytes of swapped-in objects dereferenced while their span was local;
    /// swap-in amplification is `swap_in_bytes / swap_in_used_bytes`.
    pub swap_in_used_bytes: u64,
    /// Nanoseconds application threads spent waiting for local room, summed over threads.
    pub room_wait_ns: u64,
    /// Nanoseconds eviction threads spent evicting, summed over threads.
    pub evict_busy_ns: u64,
    /// Spans re-evicted without a write: clean, their far copy kept.
    pub clean_evictions: u64,
    /// Bytes not written thanks to clean re-eviction.
    pub clean_bytes_saved: u64,
    /// Far bytes held now by kept far copies of swapped-in clean spans (a level).
    pub kept_bytes: u64,
    /// Objects moved between local spans by filtering threads.
    pub objects_moved: u64,
    /// Of those, the ones moved into hot spans (the rest went to cold
    /// ones): a hot span a move filled is dirty, and written when it goes.
    pub objects_moved_hot: u64,
    /// Local spans filtering emptied and freed.
    pub spans_filtered: u64,
    /// Spansets written (erasure-coded schemes).
    pub spansets_written: u64,
    /// Of those, partial ones: fewer than k data spans, so they cost
    /// (j+m)/j in bytes written instead of (k+m)/k.
    pub partial_spansets: u64,
    /// Compactions (folds of one spanset into another) committed.
    pub compactions: u64,
    /// Of those, in Local mode (the compute node combined parity deltas).
    pub compactions_local: u64,
    /// Of those, in Remote mode (memory nodes sent each other parity deltas).
    pub compactions_remote: u64,
    /// Switches between the two modes (adaptive compaction).
    pub compaction_switches: u64,
    /// The mode compaction folds in now (`"local"`, `"remote"`; `None`
    /// without compaction).
    pub compaction_mode: Option<&'static str>,
    /// The busiest memory node's CPU use (thousandths of a core) at
    /// adaptive compaction's last poll of the loads (a level; 0 if never).
    pub memnode_cpu_permille: u32,
    /// Compactions abandoned (a prepare failed) and aborted.
    pub compactions_aborted: u64,
    /// Far bytes compaction gave back (the folded spansets' members).
    pub compacted_bytes_freed: u64,
    /// Dead data spans (holes) folds did away with, in bytes: the folded
    /// spanset's holes and the holes its spans now fill.
    pub compacted_dead_bytes: u64,
    /// Transaction requests the compute node sent (prepare, commit, abort)
    /// and their bytes both ways (deltas), counted at the transport.
    pub txn_requests: u64,
    /// Bytes of those requests' payloads and of the deltas returned.
    pub txn_bytes: u64,
    /// Nanoseconds compaction threads spent folding, summed over threads.
    pub compaction_busy_ns: u64,
}

/// Counters the runtime's paths bump (relaxed: they are statistics).
#[derive(Default)]
pub(super) struct Counters {
    pub(super) swap_ins: AtomicU64,
    pub(super) swap_outs: AtomicU64,
    pub(super) aborted: AtomicU64,
    pub(super) evicted_bytes: AtomicU64,
    pub(super) deref_misses: AtomicU64,
    pub(super) object_swap_ins: AtomicU64,
    pub(super) swap_in_bytes: AtomicU64,
    pub(super) swap_in_used_bytes: AtomicU64,
    pub(super) room_wait_ns: AtomicU64,
    pub(super) evict_busy_ns: AtomicU64,
    pub(super) clean_evictions: AtomicU64,
    pub(super) clean_bytes_saved: AtomicU64,
    pub(super) objects_moved: AtomicU64,
    pub(super) objects_moved_hot: AtomicU64,
    pub(super) spans_filtered: AtomicU64,
    pub(super) given_back: AtomicU64,
}

impl Inner {
    pub(super) fn stats(&self) -> Stats {
        let (_, live) = self.far_map.totals();
        let t = &self.far.traffic();
        let rep = self.scheme.report();
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(StdOrdering::Relaxed);
        let (suspicions, suspicions_cleared) = self.far.detector().suspects.counts();
        Stats {
            degraded_reads: rep.degraded_reads,
            suspicions,
            suspicions_cleared,
            overdue_reads: self.far.detector().reads.overdue(),
            overdue_writes: self.far.detector().writes.overdue(),
            reconstructed_bytes: rep.reconstructed_bytes,
            reconstruct_seconds: rep.reconstruct_time.as_secs_f64(),
            recoveries: rep.recoveries,
            recovering: rep.recovering,
            hole_bytes: rep.hole_bytes,
            stranded_bytes: rep.stranded_bytes,
            spansets_written: rep.batches,
            partial_spansets: rep.partial_batches,
            compactions: rep.compactions,
            compactions_local: rep.compactions_local,
            compactions_remote: rep.compactions_remote,
            compaction_switches: rep.compaction_switches,
            compaction_mode: rep.compaction_mode,
            memnode_cpu_permille: rep.memnode_cpu_permille,
            compactions_aborted: rep.compactions_aborted,
            compacted_bytes_freed: rep.compacted_bytes_freed,
            compacted_dead_bytes: rep.compacted_dead_bytes,
            txn_requests: t.txn_requests.load(StdOrdering::Relaxed),
            txn_bytes: t.txn_bytes.load(StdOrdering::Relaxed),
            compaction_busy_ns: rep.compaction_busy.as_nanos() as u64,
            checksum_repairs: rep.repairs,
            rebuild_retries: rep.rebuild_retries,
            lost_positions: rep.lost_positions,
            spansets_below_tolerance: rep.spansets_below_tolerance,
            doubt_repairs: rep.doubt_repairs,
            short_spansets: rep.short_spansets,
            restriped_spans: self.far.restripe_counts().1,
            swap_ins: self.counters.swap_ins.load(StdOrdering::Relaxed),
            swap_in_reads: t.swap_reads.load(StdOrdering::Relaxed),
            write_requests: t.writes.load(StdOrdering::Relaxed),
            swap_outs: self.counters.swap_outs.load(StdOrdering::Relaxed),
            evictions_aborted: self.counters.aborted.load(StdOrdering::Relaxed),
            bytes_evicted_data: self.counters.evicted_bytes.load(StdOrdering::Relaxed),
            bytes_read_remote: t.bytes_read.load(StdOrdering::Relaxed),
            bytes_written_remote: t.bytes_written.load(StdOrdering::Relaxed),
            remote_bytes_used: self.scheme.remote_bytes_used(&self.far),
            far_bytes_held: self.far.held_bytes(),
            far_bytes_given_back: get(&c.given_back),
            live_bytes: live,
            local_bytes: self.heap.bytes_in_use() as u64,
            objects: self.slots.in_use() as u64,
            far_objects: self.far_map.objects(),
            deref_misses: get(&c.deref_misses),
            object_swap_ins: get(&c.object_swap_ins),
            swap_in_bytes: get(&c.swap_in_bytes),
            swap_in_used_bytes: get(&c.swap_in_used_bytes),
            room_wait_ns: get(&c.room_wait_ns),
            evict_busy_ns: get(&c.evict_busy_ns),
            clean_evictions: get(&c.clean_evictions),
            clean_bytes_saved: get(&c.clean_bytes_saved),
            kept_bytes: rep.kept_bytes,
            objects_moved: get(&c.objects_moved),
            objects_moved_hot: get(&c.objects_moved_hot),
            spans_filtered: get(&c.spans_filtered),
        }
    }
}
