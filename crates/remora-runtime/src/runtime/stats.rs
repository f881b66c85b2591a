//! The runtime's counters and the [`Stats`] snapshot benchmarks and tests read.
//!
//! [`Stats`] groups its figures by where they are counted: the local heap
//! and the threads working on it ([`LocalStats`]), the far memory held
//! ([`FarStats`]), the swap paths and the transport ([`TrafficStats`]),
//! failure detection ([`DetectionStats`]) and the fault-tolerance scheme
//! ([`SchemeStats`]). Most figures are counters, which only grow; the ones
//! documented as levels say how things are now and may fall.
//! [`Stats::since`] subtracts counters and keeps levels, for a phase's delta.

use serde::Serialize;

use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};

use super::Inner;

/// Counters and levels, for benchmarks and tests, grouped by where each is
/// counted. Serializes as one JSON object per group.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    /// The local heap, and the application, eviction and filtering threads' work on it.
    pub local: LocalStats,
    /// Far memory held from the manager and what it holds.
    pub far: FarStats,
    /// Spans moved each way and the requests that moved them.
    pub traffic: TrafficStats,
    /// Failure detection: memory nodes suspected, requests given up as overdue.
    pub detection: DetectionStats,
    /// The fault-tolerance scheme: spansets, compaction, recovery and repairs.
    pub scheme: SchemeStats,
}

/// The local heap and the threads working on it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LocalStats {
    /// Local bytes in spans now (a level).
    pub bytes: u64,
    /// Live objects now, local or far (a level); [`FarStats::objects`] of
    /// them are far.
    pub objects: u64,
    /// Dereferences that waited for a swap-in, their own or another thread's (misses).
    pub deref_misses: u64,
    /// Nanoseconds application threads spent waiting for local room, summed over threads.
    pub room_wait_ns: u64,
    /// Nanoseconds eviction threads spent evicting, summed over threads.
    pub evict_busy_ns: u64,
    /// Objects moved between local spans by filtering threads.
    pub objects_moved: u64,
    /// Of those, the ones moved into hot spans (the rest went to cold
    /// ones): a hot span a move filled is dirty, and written when it goes.
    pub objects_moved_hot: u64,
    /// Local spans filtering emptied and freed.
    pub spans_filtered: u64,
}

/// Far memory: what is held from the manager and what it holds. All levels
/// but `bytes_given_back`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FarStats {
    /// Far bytes allocated to spans now (a level).
    pub bytes_used: u64,
    /// Far bytes held from the manager now: every region, in use or not (a level).
    pub bytes_held: u64,
    /// Bytes of empty regions given back to the manager so far (a counter).
    pub bytes_given_back: u64,
    /// Far bytes of live data spans now (a level).
    pub live_bytes: u64,
    /// Live objects in far spans now; the rest of [`LocalStats::objects`]
    /// are local (a level).
    pub objects: u64,
    /// Far bytes held by holes (swapped-in spans parity still covers) now (a level).
    pub hole_bytes: u64,
    /// Far bytes held now by kept far copies of swapped-in clean spans (a level).
    pub kept_bytes: u64,
    /// Far bytes kept for good by stripe writes given up as overdue and
    /// never answered (the write might yet land; see
    /// [`DetectionStats::overdue_writes`]). A level: bytes held now, which
    /// only falls when their region goes with its node.
    pub stranded_bytes: u64,
}

/// Spans moved each way, counted on the swap paths, and the requests and
/// bytes that moved them, counted at the transport. All counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TrafficStats {
    /// Spans swapped in.
    pub swap_ins: u64,
    /// Read requests sent on the swap-in path (swap-ins and degraded reads;
    /// each fragment of a split span is one), counted at the transport.
    pub swap_in_reads: u64,
    /// Of the swap-ins, those that brought back only the object asked for
    /// ([`crate::Tuning::object_swap_in`]).
    pub object_swap_ins: u64,
    /// Bytes of spans swapped in (read whole, also for an object swap-in).
    pub swap_in_bytes: u64,
    /// Bytes of swapped-in objects dereferenced while their span was local;
    /// swap-in amplification is `swap_in_bytes / swap_in_used_bytes`.
    pub swap_in_used_bytes: u64,
    /// Spans swapped out.
    pub swap_outs: u64,
    /// Evictions abandoned because an application thread touched the span.
    pub evictions_aborted: u64,
    /// Bytes of whole data spans written out by swap-outs (clean re-evictions
    /// write nothing and are counted in `clean_bytes_saved` instead).
    pub bytes_evicted_data: u64,
    /// Spans re-evicted without a write: clean, their far copy kept.
    pub clean_evictions: u64,
    /// Bytes not written thanks to clean re-eviction.
    pub clean_bytes_saved: u64,
    /// Bytes read from memory nodes.
    pub bytes_read_remote: u64,
    /// Bytes written to memory nodes (swap-outs and repairs), counted at the transport.
    pub bytes_written_remote: u64,
    /// Write requests sent to memory nodes (plain and vectored), counted at
    /// the transport: a swap-out batch sends each node one.
    pub write_requests: u64,
    /// Transaction requests the compute node sent (prepare, commit, abort),
    /// counted at the transport.
    pub txn_requests: u64,
    /// Bytes of those requests' payloads and of the deltas returned.
    pub txn_bytes: u64,
}

/// Failure detection on this compute node's own evidence. All counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DetectionStats {
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
}

/// The fault-tolerance scheme's figures: spansets written, compaction,
/// degraded reads, recovery and repairs. Levels: `short_spansets`,
/// `recovering`, `lost_positions`, `spansets_below_tolerance`,
/// `compaction_mode` and `memnode_cpu_permille`; the rest are counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SchemeStats {
    /// Spansets written (erasure-coded schemes).
    pub spansets_written: u64,
    /// Of those, partial ones: fewer than k data spans, so they cost
    /// (j+m)/j in bytes written instead of (k+m)/k.
    pub partial_spansets: u64,
    /// Spansets in a short stripe group now (one with an empty position), written
    /// with fewer than k data spans because fewer than k+m memory nodes were
    /// live: they tolerate m losses at a parity overhead of (k'+m)/k'. Once
    /// the group is given a node at its empty position they count as
    /// partial spansets of a full group, and fold into full ones (a level).
    pub short_spansets: u64,
    /// Swap-ins served by decoding from survivors.
    pub degraded_reads: u64,
    /// Bytes rebuilt on replacement regions after memory-node failures.
    pub reconstructed_bytes: u64,
    /// Seconds spent rebuilding, summed over recoveries.
    pub reconstruct_seconds: f64,
    /// Recoveries finished: node failures whose every stripe-group
    /// position was rebuilt (or found impossible to rebuild).
    pub recoveries: u64,
    /// Recoveries under way now: node failures with positions still to rebuild
    /// (a failed rebuild is retried, so this stays above 0 until they are; a level).
    pub recovering: u64,
    /// Rebuilds retried (a rebuilt shard failed its checksum, or a node failed mid-rebuild).
    pub rebuild_retries: u64,
    /// Stripe-group positions that can never be rebuilt (their group lost
    /// more members than parity covers); their spans answer `DataLost`. A
    /// level: a position lost stays lost.
    pub lost_positions: u64,
    /// Spansets below full tolerance now: in a stripe group with a lost
    /// position not yet rebuilt or re-striped, or with a member in doubt
    /// (a fold's commit never acknowledged) not yet repaired; 0 once
    /// recovery and repairs are done (a level).
    pub spansets_below_tolerance: u64,
    /// Far spans that failed their checksum and were rebuilt and rewritten.
    pub checksum_repairs: u64,
    /// Members left in doubt by a fold's unacknowledged commit, since
    /// rebuilt in place from the members that agree.
    pub doubt_repairs: u64,
    /// Far spans brought back to be written again on live nodes, because
    /// their stripe group lost a position with no node left to rebuild on.
    pub restriped_spans: u64,
    /// Compactions (folds of one spanset into another) committed.
    pub compactions: u64,
    /// Of those, in Local mode (the compute node combined parity deltas).
    pub compactions_local: u64,
    /// Of those, in Remote mode (memory nodes sent each other parity deltas).
    pub compactions_remote: u64,
    /// Switches between the two modes (adaptive compaction).
    pub compaction_switches: u64,
    /// The mode compaction folds in now (`"local"`, `"remote"`; `None`
    /// without compaction; a level).
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
    /// Nanoseconds compaction threads spent folding, summed over threads.
    pub compaction_busy_ns: u64,
}

impl Stats {
    /// The change from `earlier` to `self`, for a phase between two
    /// snapshots: counters are `self`'s minus `earlier`'s (0 rather than
    /// below, should `earlier` be the later snapshot after all), levels are
    /// `self`'s. Each group's doc says which of its figures are levels.
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            local: self.local.since(&earlier.local),
            far: self.far.since(&earlier.far),
            traffic: self.traffic.since(&earlier.traffic),
            detection: self.detection.since(&earlier.detection),
            scheme: self.scheme.since(&earlier.scheme),
        }
    }
}

/// A counter's growth from an earlier snapshot: 0 rather than below.
trait Growth {
    fn growth_since(self, earlier: Self) -> Self;
}

impl Growth for u64 {
    fn growth_since(self, earlier: u64) -> u64 {
        self.saturating_sub(earlier)
    }
}

impl Growth for f64 {
    fn growth_since(self, earlier: f64) -> f64 {
        (self - earlier).max(0.0)
    }
}

/// Gives each group its `since`, from one list of its counters (their
/// growth, by [`Growth`]) and one of its levels (the later snapshot's).
/// The struct literal it builds names every field listed and has no `..`,
/// so a field left out of both lists, or put in both, does not compile; nor
/// does a counter of a type without [`Growth`] (a mode, say). The unit test
/// `since_classes_every_figure_as_the_docs_do` checks the lists against the
/// levels the groups' docs name.
macro_rules! since {
    ($($group:ident { counters: [$($counter:ident),* $(,)?], levels: [$($level:ident),* $(,)?] $(,)? })*) => {$(
        impl $group {
            fn since(&self, e: &Self) -> Self {
                Self {
                    $($counter: self.$counter.growth_since(e.$counter),)*
                    $($level: self.$level,)*
                }
            }

            /// Every field, counter or level, set from `n` (for the tests).
            #[cfg(test)]
            fn filled(n: u32) -> Self {
                Self {
                    $($counter: tests::Fill::fill(n),)*
                    $($level: tests::Fill::fill(n),)*
                }
            }
        }
    )*};
}

since! {
    LocalStats {
        counters: [deref_misses, room_wait_ns, evict_busy_ns, objects_moved, objects_moved_hot, spans_filtered],
        levels: [bytes, objects],
    }
    FarStats {
        counters: [bytes_given_back],
        levels: [bytes_used, bytes_held, live_bytes, objects, hole_bytes, kept_bytes, stranded_bytes],
    }
    TrafficStats {
        counters: [
            swap_ins, swap_in_reads, object_swap_ins, swap_in_bytes, swap_in_used_bytes, swap_outs,
            evictions_aborted, bytes_evicted_data, clean_evictions, clean_bytes_saved, bytes_read_remote,
            bytes_written_remote, write_requests, txn_requests, txn_bytes,
        ],
        levels: [],
    }
    DetectionStats {
        counters: [suspicions, suspicions_cleared, overdue_reads, overdue_writes],
        levels: [],
    }
    SchemeStats {
        counters: [
            spansets_written, partial_spansets, degraded_reads, reconstructed_bytes, reconstruct_seconds,
            recoveries, rebuild_retries, checksum_repairs, doubt_repairs, restriped_spans, compactions,
            compactions_local, compactions_remote, compaction_switches, compactions_aborted,
            compacted_bytes_freed, compacted_dead_bytes, compaction_busy_ns,
        ],
        levels: [
            short_spansets, recovering, lost_positions, spansets_below_tolerance, compaction_mode,
            memnode_cpu_permille,
        ],
    }
}

impl Inner {
    pub(super) fn stats(&self) -> Stats {
        let (_, live) = self.far_map.totals();
        let t = &self.far.traffic();
        let rep = self.scheme.report();
        let c = self.counters.read();
        let get = |a: &AtomicU64| a.load(StdOrdering::Relaxed);
        let (suspicions, suspicions_cleared) = self.far.detector().suspects.counts();
        Stats {
            local: LocalStats {
                bytes: self.heap.bytes_in_use() as u64,
                objects: self.slots.in_use() as u64,
                deref_misses: c.deref_misses,
                room_wait_ns: c.room_wait_ns,
                evict_busy_ns: c.evict_busy_ns,
                objects_moved: c.objects_moved,
                objects_moved_hot: c.objects_moved_hot,
                spans_filtered: c.spans_filtered,
            },
            far: FarStats {
                bytes_used: self.scheme.remote_bytes_used(&self.far),
                bytes_held: self.far.held_bytes(),
                bytes_given_back: c.given_back,
                live_bytes: live,
                objects: self.far_map.objects(),
                hole_bytes: rep.hole_bytes,
                kept_bytes: rep.kept_bytes,
                stranded_bytes: rep.stranded_bytes,
            },
            traffic: TrafficStats {
                swap_ins: c.swap_ins,
                swap_in_reads: get(&t.swap_reads),
                object_swap_ins: c.object_swap_ins,
                swap_in_bytes: c.swap_in_bytes,
                swap_in_used_bytes: c.swap_in_used_bytes,
                swap_outs: c.swap_outs,
                evictions_aborted: c.aborted,
                bytes_evicted_data: c.evicted_bytes,
                clean_evictions: c.clean_evictions,
                clean_bytes_saved: c.clean_bytes_saved,
                bytes_read_remote: get(&t.bytes_read),
                bytes_written_remote: get(&t.bytes_written),
                write_requests: get(&t.writes),
                txn_requests: get(&t.txn_requests),
                txn_bytes: get(&t.txn_bytes),
            },
            detection: DetectionStats {
                suspicions,
                suspicions_cleared,
                overdue_reads: self.far.detector().reads.overdue(),
                overdue_writes: self.far.detector().writes.overdue(),
            },
            scheme: SchemeStats {
                spansets_written: rep.batches,
                partial_spansets: rep.partial_batches,
                short_spansets: rep.short_spansets,
                degraded_reads: rep.degraded_reads,
                reconstructed_bytes: rep.reconstructed_bytes,
                reconstruct_seconds: rep.reconstruct_time.as_secs_f64(),
                recoveries: rep.recoveries,
                recovering: rep.recovering,
                rebuild_retries: rep.rebuild_retries,
                lost_positions: rep.lost_positions,
                spansets_below_tolerance: rep.spansets_below_tolerance,
                checksum_repairs: rep.repairs,
                doubt_repairs: rep.doubt_repairs,
                restriped_spans: self.far.restripe_counts().1,
                compactions: rep.compactions,
                compactions_local: rep.compactions_local,
                compactions_remote: rep.compactions_remote,
                compaction_switches: rep.compaction_switches,
                compaction_mode: rep.compaction_mode,
                memnode_cpu_permille: rep.memnode_cpu_permille,
                compactions_aborted: rep.compactions_aborted,
                compacted_bytes_freed: rep.compacted_bytes_freed,
                compacted_dead_bytes: rep.compacted_dead_bytes,
                compaction_busy_ns: rep.compaction_busy.as_nanos() as u64,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A figure set from a small number, for [`Stats::filled`].
    pub(super) trait Fill {
        fn fill(n: u32) -> Self;
    }

    impl Fill for u64 {
        fn fill(n: u32) -> u64 {
            n.into()
        }
    }

    impl Fill for u32 {
        fn fill(n: u32) -> u32 {
            n
        }
    }

    impl Fill for f64 {
        fn fill(n: u32) -> f64 {
            n.into()
        }
    }

    impl Fill for Option<&'static str> {
        fn fill(n: u32) -> Self {
            Some(["zero", "one", "two", "three"][n as usize])
        }
    }

    impl Stats {
        /// Every figure of every group set from `n`.
        fn filled(n: u32) -> Stats {
            Stats {
                local: LocalStats::filled(n),
                far: FarStats::filled(n),
                traffic: TrafficStats::filled(n),
                detection: DetectionStats::filled(n),
                scheme: SchemeStats::filled(n),
            }
        }
    }

    /// The levels, as the groups' docs list them (`group.figure`); every other figure is a counter.
    const LEVELS: &str = "local.bytes local.objects far.bytes_used far.bytes_held far.live_bytes far.objects \
        far.hole_bytes far.kept_bytes far.stranded_bytes scheme.short_spansets scheme.recovering \
        scheme.lost_positions scheme.spansets_below_tolerance scheme.compaction_mode scheme.memnode_cpu_permille";

    /// Two snapshots with every counter grown and every level moved (some up, some down).
    fn pair() -> (Stats, Stats) {
        let mut a = Stats::default();
        a.local.bytes = 1000;
        a.local.objects = 50;
        a.local.deref_misses = 3;
        a.local.evict_busy_ns = 10;
        a.far.bytes_used = 4096;
        a.far.bytes_given_back = 8192;
        a.far.stranded_bytes = 16;
        a.traffic.swap_ins = 5;
        a.traffic.bytes_written_remote = 700;
        a.traffic.write_requests = 2;
        a.detection.overdue_writes = 1;
        a.scheme.spansets_written = 4;
        a.scheme.reconstruct_seconds = 1.5;
        a.scheme.recovering = 1;
        a.scheme.lost_positions = 2;
        a.scheme.compaction_mode = Some("local");
        a.scheme.memnode_cpu_permille = 900;
        let mut b = a.clone();
        b.local.bytes = 600;
        b.local.objects = 70;
        b.local.deref_misses = 10;
        b.local.evict_busy_ns = 25;
        b.far.bytes_used = 2048;
        b.far.bytes_given_back = 12288;
        b.far.stranded_bytes = 32;
        b.traffic.swap_ins = 9;
        b.traffic.bytes_written_remote = 1000;
        b.traffic.write_requests = 7;
        b.detection.overdue_writes = 4;
        b.scheme.spansets_written = 6;
        b.scheme.reconstruct_seconds = 2.0;
        b.scheme.recovering = 0;
        b.scheme.lost_positions = 3;
        b.scheme.compaction_mode = Some("remote");
        b.scheme.memnode_cpu_permille = 300;
        (a, b)
    }

    #[test]
    fn since_subtracts_counters_and_keeps_levels() {
        let (a, b) = pair();
        let d = b.since(&a);
        // Counters: the growth between the snapshots.
        assert_eq!(d.local.deref_misses, 7);
        assert_eq!(d.local.evict_busy_ns, 15);
        assert_eq!(d.far.bytes_given_back, 4096);
        assert_eq!(d.traffic.swap_ins, 4);
        assert_eq!(d.traffic.bytes_written_remote, 300);
        assert_eq!(d.traffic.write_requests, 5);
        assert_eq!(d.detection.overdue_writes, 3);
        assert_eq!(d.scheme.spansets_written, 2);
        assert_eq!(d.scheme.reconstruct_seconds, 0.5);
        // Levels: the later snapshot's, whether they rose or fell.
        assert_eq!(d.local.bytes, 600);
        assert_eq!(d.local.objects, 70);
        assert_eq!(d.far.bytes_used, 2048);
        assert_eq!(d.far.stranded_bytes, 32);
        assert_eq!(d.scheme.recovering, 0);
        assert_eq!(d.scheme.lost_positions, 3);
        assert_eq!(d.scheme.compaction_mode, Some("remote"));
        assert_eq!(d.scheme.memnode_cpu_permille, 300);
        // Counters that did not move are 0.
        assert_eq!(d.traffic.swap_outs, 0);
        assert_eq!(d.scheme.compactions, 0);
    }

    #[test]
    fn since_itself_leaves_only_levels() {
        let (_, b) = pair();
        let mut want = Stats::default();
        want.local.bytes = 600;
        want.local.objects = 70;
        want.far.bytes_used = 2048;
        want.far.stranded_bytes = 32;
        want.scheme.lost_positions = 3;
        want.scheme.compaction_mode = Some("remote");
        want.scheme.memnode_cpu_permille = 300;
        assert_eq!(b.since(&b), want);
    }

    #[test]
    fn since_saturates_when_snapshots_are_swapped() {
        let (a, b) = pair();
        let d = a.since(&b);
        assert_eq!(d.traffic.swap_ins, 0);
        assert_eq!(d.far.bytes_given_back, 0);
        assert_eq!(d.scheme.reconstruct_seconds, 0.0);
        // Levels are still the receiver's.
        assert_eq!(d.local.bytes, 1000);
        assert_eq!(d.scheme.compaction_mode, Some("local"));
    }

    /// Every figure of every group moved from 1 to 3: the levels (as
    /// [`LEVELS`] lists them) come out 3, every counter 2, so a figure
    /// `since!` classes wrongly fails here, whichever way round.
    #[test]
    fn since_classes_every_figure_as_the_docs_do() {
        let json = |s: Stats| serde_json::to_value(s).unwrap();
        let d = json(Stats::filled(3).since(&Stats::filled(1)));
        let (later, grown) = (json(Stats::filled(3)), json(Stats::filled(2)));
        for level in LEVELS.split_whitespace() {
            let (group, name) = level.split_once('.').unwrap();
            assert!(d[group].get(name).is_some(), "{level} is not a figure");
        }
        for (group, figures) in d.as_object().unwrap() {
            for (name, v) in figures.as_object().unwrap() {
                let level = LEVELS.split_whitespace().any(|l| l == format!("{group}.{name}"));
                let (want, class) = match level {
                    true => (&later[group][name], "a level"),
                    false => (&grown[group][name], "a counter"),
                };
                assert_eq!(v, want, "{group}.{name} should be {class}");
            }
        }
    }

    #[test]
    fn serializes_one_object_per_group() {
        let (_, b) = pair();
        let v = serde_json::to_value(&b).unwrap();
        let mut groups: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        groups.sort_unstable();
        assert_eq!(groups, ["detection", "far", "local", "scheme", "traffic"]);
        assert_eq!(v["local"]["bytes"], 600);
        assert_eq!(v["far"]["bytes_given_back"], 12288);
        assert_eq!(v["traffic"]["bytes_written_remote"], 1000);
        assert_eq!(v["detection"]["overdue_writes"], 4);
        assert_eq!(v["scheme"]["compaction_mode"], "remote");
        assert_eq!(v["scheme"]["reconstruct_seconds"], 2.0);
        assert_eq!(v["far"].as_object().unwrap().len(), 8);
        assert_eq!(v["traffic"].as_object().unwrap().len(), 15);
    }
}
