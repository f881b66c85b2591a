//! What one measured run (one scheme at one load) of `remora bench micro`
//! measured, and its JSON form. Fields that do not apply to a store (swap-ins
//! for the Redis baseline, cache hits for remora) are `null`.

use std::time::Duration;

use remora_runtime::Stats;
use serde_json::{Value, json};

use super::cache_sim::SimMisses;
use super::redis_cache::RedisFigures;
use super::sweep::KEEP_UP;
use super::worker::Run;
use super::{MicroArgs, Plan, schemes};
use crate::net::stats::Latency;

/// One record: a scheme at one load.
pub(crate) struct Record {
    pub(crate) scheme: String,
    pub(crate) fill_time: Duration,
    pub(crate) run: Run,
    pub(crate) figures: Figures,
    /// Ideal LRU and S3-FIFO over the run's access stream.
    pub(crate) sim: SimMisses,
    /// Throughput of each round's window, in the order they ran, when the
    /// run was measured in alternating rounds (`--rounds`); else empty.
    pub(crate) rounds: Vec<f64>,
}

/// The figures only one kind of store has.
pub(crate) enum Figures {
    Remora(Box<RemoraFigures>),
    Redis(RedisFigures),
}

/// remora's runtime counters over the measured phase.
pub(crate) struct RemoraFigures {
    /// Counters: deltas over the measured phase; levels: as at its end.
    pub(crate) delta: Stats,
    pub(crate) avg_remote_used: f64,
    pub(crate) avg_live: f64,
    pub(crate) avg_local: f64,
    pub(crate) avg_kept: f64,
    /// Live objects in local spans.
    pub(crate) avg_local_objects: f64,
    pub(crate) level_samples: u64,
    /// Bytes memory nodes sent each other (rebuilds) over the run and its
    /// warm-up, as their heartbeats reported them to the manager.
    pub(crate) peer_bytes: u64,
    /// Of those, parity deltas data nodes sent parity nodes (remote compaction).
    pub(crate) peer_delta_bytes: u64,
    /// Throughput and far memory, window by window.
    pub(crate) timeline: Vec<super::timeline::Point>,
    /// With `--census`: the local spans by use, averaged over the samples.
    pub(crate) census: Option<super::census::CensusAvg>,
}

impl RemoraFigures {
    pub(crate) fn reads_per_swap_in(&self) -> Option<f64> {
        let d = &self.delta;
        (d.traffic.swap_ins > 0).then(|| d.traffic.swap_in_reads as f64 / d.traffic.swap_ins as f64)
    }

    /// Bytes that crossed the network over the measured phase: read and
    /// written by the compute node (counted at its transport) plus what
    /// memory nodes sent each other (counted where served).
    pub(crate) fn network_bytes(&self) -> u64 {
        let d = &self.delta;
        d.traffic.bytes_read_remote + d.traffic.bytes_written_remote + d.traffic.txn_bytes + self.peer_bytes
    }

    /// Bytes compaction moved over the network (deltas to and from the
    /// compute node, and between memory nodes).
    pub(crate) fn compaction_bytes(&self) -> u64 {
        self.delta.traffic.txn_bytes + self.peer_delta_bytes
    }

    /// Compaction bytes per byte of dead data spans compaction freed (the
    /// paper: about one span-sized transfer per dead span).
    pub(crate) fn compaction_bytes_per_dead(&self) -> Option<f64> {
        let d = &self.delta;
        (d.scheme.compacted_dead_bytes > 0)
            .then(|| self.compaction_bytes() as f64 / d.scheme.compacted_dead_bytes as f64)
    }

    /// Bytes written to memory nodes per byte of data spans evicted: what
    /// the scheme's redundancy costs in writes (1 without any).
    pub(crate) fn write_amplification(&self) -> Option<f64> {
        let d = &self.delta;
        (d.traffic.bytes_evicted_data > 0)
            .then(|| d.traffic.bytes_written_remote as f64 / d.traffic.bytes_evicted_data as f64)
    }

    /// Bytes of spans swapped in per byte of them dereferenced while local.
    pub(crate) fn swap_in_amplification(&self) -> Option<f64> {
        let d = &self.delta;
        (d.traffic.swap_in_used_bytes > 0).then(|| d.traffic.swap_in_bytes as f64 / d.traffic.swap_in_used_bytes as f64)
    }

    /// Data evicted per second of the measured phase, MiB/s.
    pub(crate) fn evict_mib_s(&self, elapsed: Duration) -> f64 {
        mib(self.delta.traffic.bytes_evicted_data as f64) / elapsed.as_secs_f64().max(1e-9)
    }

    /// Data evicted per second the eviction threads were busy, MiB/s.
    pub(crate) fn evict_mib_per_busy_s(&self) -> Option<f64> {
        let d = &self.delta;
        (d.local.evict_busy_ns > 0)
            .then(|| mib(d.traffic.bytes_evicted_data as f64) / (d.local.evict_busy_ns as f64 / 1e9))
    }

    /// Share of the application threads' time spent waiting for local room, in %.
    pub(crate) fn room_wait_pct(&self, threads: u32, elapsed: Duration) -> f64 {
        let total = f64::from(threads) * elapsed.as_nanos() as f64;
        100.0 * self.delta.local.room_wait_ns as f64 / total.max(1.0)
    }
}

pub(crate) fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

/// Microseconds at quantile `q` of `l` (0 when empty).
pub(crate) fn us(l: &Latency, q: f64) -> f64 {
    if l.samples() == 0 { 0.0 } else { l.at(q) as f64 / 1000.0 }
}

/// The 95 % confidence interval of quantile `q` of `l`, in µs.
pub(crate) fn ci_us(l: &Latency, q: f64) -> [f64; 2] {
    let (lo, hi) = l.ci95(q);
    [lo as f64 / 1000.0, hi as f64 / 1000.0]
}

/// Adds the entries of object `b` to object `a`.
fn extend(a: &mut Value, b: Value) {
    if let (Value::Object(m), Value::Object(o)) = (a, b) {
        m.extend(o);
    }
}

impl Record {
    pub(crate) fn throughput(&self) -> f64 {
        self.run.throughput()
    }

    pub(crate) fn us(&self, q: f64) -> f64 {
        us(&self.run.lat, q)
    }

    /// CPU µs (this process and the store's servers) per completed operation.
    pub(crate) fn cpu_us_per_op(&self) -> Option<f64> {
        let cpu = self.run.cpu?;
        Some(cpu.as_secs_f64() * 1e6 / self.run.completed.max(1) as f64)
    }

    /// Cores kept busy on average in the measured phase (this process and the store's servers).
    pub(crate) fn cpu_cores(&self) -> Option<f64> {
        Some(self.run.cpu?.as_secs_f64() / self.run.elapsed.as_secs_f64().max(1e-9))
    }

    /// Open loop: the operations completed in the window over the arrivals scheduled in it.
    pub(crate) fn achieved_fraction(&self) -> Option<f64> {
        self.run
            .offered
            .map(|_| self.run.completed as f64 / self.run.scheduled.max(1) as f64)
    }

    /// Open loop: whether less than [`KEEP_UP`] (95 %) of the offered load completed.
    pub(crate) fn saturated(&self) -> bool {
        self.achieved_fraction().is_some_and(|f| f < KEEP_UP)
    }

    fn mode(&self) -> &'static str {
        if self.run.offered.is_some() {
            "open-loop"
        } else {
            "closed-loop"
        }
    }

    pub(crate) fn errors(&self) -> u64 {
        self.run.op_errors + self.run.wrong_bytes
    }

    pub(crate) fn remora(&self) -> Option<&RemoraFigures> {
        match &self.figures {
            Figures::Remora(f) => Some(f),
            Figures::Redis(_) => None,
        }
    }

    pub(crate) fn redis(&self) -> Option<&RedisFigures> {
        match &self.figures {
            Figures::Redis(f) => Some(f),
            Figures::Remora(_) => None,
        }
    }

    /// Operations that missed the local memory (remora: dereferences that
    /// waited for a swap-in; the baseline: in-process cache misses).
    pub(crate) fn measured_misses(&self) -> u64 {
        match &self.figures {
            Figures::Remora(f) => f.delta.local.deref_misses,
            Figures::Redis(f) => f.misses,
        }
    }

    pub(crate) fn measured_miss_ratio(&self) -> f64 {
        self.measured_misses() as f64 / self.run.ops.max(1) as f64
    }

    /// The fewest objects an ideal LRU needs to miss no more often than
    /// this store did on the same stream.
    pub(crate) fn lru_equivalent(&self) -> Option<u64> {
        self.sim.lru_equivalent(self.measured_miss_ratio())
    }

    /// The measured miss ratio over the ideal LRU's.
    pub(crate) fn over_lru(&self) -> Option<f64> {
        self.sim
            .lru_ratio()
            .filter(|&l| l > 0.0)
            .map(|l| self.measured_miss_ratio() / l)
    }

    /// Far memory in use, bytes (average over the measured phase).
    pub(crate) fn far_bytes(&self) -> f64 {
        match &self.figures {
            Figures::Remora(f) => f.avg_remote_used,
            Figures::Redis(f) => f.avg_used_memory,
        }
    }

    /// Bytes of data the far memory holds (average over the measured phase).
    pub(crate) fn data_bytes(&self) -> f64 {
        match &self.figures {
            Figures::Remora(f) => f.avg_live,
            Figures::Redis(f) => f.data_bytes as f64,
        }
    }

    /// Local bytes in use (average over the measured phase).
    pub(crate) fn local_bytes(&self) -> f64 {
        match &self.figures {
            Figures::Remora(f) => f.avg_local,
            Figures::Redis(f) => f.avg_cache_objects * f.object_size as f64,
        }
    }

    /// Samples the level averages are over.
    pub(crate) fn level_samples(&self) -> u64 {
        match &self.figures {
            Figures::Remora(f) => f.level_samples,
            Figures::Redis(f) => f.level_samples,
        }
    }

    /// Far memory over the data it holds.
    pub(crate) fn far_over_data(&self) -> Option<f64> {
        (self.data_bytes() > 0.0).then(|| self.far_bytes() / self.data_bytes())
    }

    pub(crate) fn to_json(&self, args: &MicroArgs, plan: &Plan) -> Value {
        let run = &self.run;
        let h = &run.lat.hist;
        let open = run.offered.is_some();
        let mut v = json!({
            "scheme": self.scheme,
            "store": match self.figures {
                Figures::Remora(_) => "remora",
                Figures::Redis(_) => "redis-cache",
            },
            "latency_mode": self.mode(),
            "closed_loop": !open,
            "open_loop_rate": run.offered,
            "throughput_ops": self.throughput(),
            "p50_us": self.us(0.5),
            "p90_us": self.us(0.9),
            "p99_us": self.us(0.99),
            "p999_us": self.us(0.999),
            "max_us": h.max() as f64 / 1000.0,
            "mean_us": h.mean() / 1000.0,
            "p50_ci95_us": ci_us(&run.lat, 0.5),
            "p99_ci95_us": ci_us(&run.lat, 0.99),
            "p999_ci95_us": ci_us(&run.lat, 0.999),
            "ci_level": 0.95,
            "samples": run.lat.samples(),
            "lag1_autocorr": run.lag.r(),
            "lag1_pairs": run.lag.pairs(),
            "samples_independent": !run.lag.dependent(),
            "ops": run.ops,
            "reads": run.reads,
            "writes": run.writes,
            "completed_in_window": run.completed,
            "measured_s": run.elapsed.as_secs_f64(),
            "errors": self.errors(),
            "op_errors": run.op_errors,
            "wrong_bytes": run.wrong_bytes,
            "fill_s": self.fill_time.as_secs_f64(),
            "cpu_us_per_op": self.cpu_us_per_op(),
            "cpu_cores": self.cpu_cores(),
        });
        extend(&mut v, self.memory_json());
        extend(&mut v, self.remora_json(args));
        extend(&mut v, self.redis_json());
        // The code and switches the scheme was built with (null where none apply).
        let ec = schemes::info(&self.scheme).is_some_and(|i| i.erasure_coded);
        extend(
            &mut v,
            json!({
                "ec": ec.then(|| format!("{}+{}", plan.opts.k, plan.opts.m)),
                "ec_k": ec.then_some(plan.opts.k),
                "ec_m": ec.then_some(plan.opts.m),
                "late_binding": self.remora().map(|_| plan.opts.late_binding),
            }),
        );
        if open {
            extend(
                &mut v,
                json!({
                    "scheduled_ops": run.scheduled,
                    "offered_ops_realized": run.scheduled as f64 / run.elapsed.as_secs_f64().max(1e-9),
                    "achieved_fraction": self.achieved_fraction(),
                    "saturated": self.saturated(),
                    "unissued": run.unissued,
                    "generator_late_samples": run.late.samples(),
                    "generator_late_p50_us": us(&run.late, 0.5),
                    "generator_late_p99_us": us(&run.late, 0.99),
                }),
            );
        }
        extend(
            &mut v,
            json!({
                "objects": plan.n,
                "object_size": plan.layout.object_size,
                "slot_bytes": plan.layout.slot_bytes,
                "span_bytes": plan.layout.span_bytes,
                "objects_per_span": plan.layout.objects_per_span,
                "data_span_bytes": plan.data_bytes,
                "local_ratio": args.local_ratio,
                "local_budget_bytes": plan.budget,
                "local_budget_clamped": plan.budget_clamped,
                "local_budget_objects": plan.cache_objects,
                "zipf": args.zipf,
                "threads": args.threads,
                "duration_s": args.duration.as_secs_f64(),
                "warmup_s": args.warmup.as_secs_f64(),
                "write_ratio": args.write_ratio,
                "seed": args.seed,
                "memnodes": plan.memnodes,
            }),
        );
        v
    }

    /// Memory and miss-ratio figures every store has.
    fn memory_json(&self) -> Value {
        json!({
            "remote_bytes_used": self.far_bytes(),
            "level_samples": self.level_samples(),
            "far_data_bytes": self.data_bytes(),
            "far_over_data": self.far_over_data(),
            "local_bytes": self.local_bytes(),
            "measured_misses": self.measured_misses(),
            "measured_miss_ratio": self.measured_miss_ratio(),
            "sim_capacity_objects": self.sim.capacity,
            "sim_trace_ops": self.sim.trace_ops,
            "sim_trace_dropped": self.sim.dropped,
            "sim_warmup": "a stream of the same distribution (own seed) until full, then 4 capacities more",
            "sim_warmup_ops": self.sim.warm_ops,
            "lru_misses": self.sim.lru,
            "lru_miss_ratio": self.sim.lru_ratio(),
            "s3fifo_misses": self.sim.s3fifo,
            "s3fifo_miss_ratio": self.sim.s3fifo_ratio(),
            "measured_over_lru": self.over_lru(),
            "lru_equivalent_objects": self.lru_equivalent(),
        })
    }

    /// The Redis baseline's figures (all `null` for other stores).
    fn redis_json(&self) -> Value {
        let Some(f) = self.redis() else {
            return json!({
                "redis_replicas": null, "redis_wait": null, "redis_version": null, "redis_servers": null,
                "redis_pids": null, "redis_ports": null, "redis_used_memory": null,
                "redis_info_errors": null, "cache_capacity_objects": null, "cache_hits": null,
                "cache_misses": null, "cache_hit_ratio": null, "cache_objects": null, "short_waits": null,
            });
        };
        json!({
            "redis_replicas": f.replicas,
            "redis_wait": f.wait,
            "redis_version": f.version,
            "redis_servers": f.pids.len(),
            "redis_pids": f.pids,
            "redis_ports": f.ports,
            "redis_used_memory": f.avg_used_memory,
            "redis_info_errors": f.info_errors,
            "cache_capacity_objects": f.cache_capacity,
            "cache_hits": f.hits,
            "cache_misses": f.misses,
            "cache_hit_ratio": f.hit_ratio(),
            "cache_objects": f.avg_cache_objects,
            "short_waits": f.short_waits,
        })
    }

    /// remora's runtime figures (all `null` for other stores): the runtime's
    /// own counters over the measured phase as `stats` (its groups, as
    /// [`Stats::since`] gives them: counters the phase's, levels as at its
    /// end), and beside them the figures derived from them.
    fn remora_json(&self, args: &MicroArgs) -> Value {
        let Some(f) = self.remora() else {
            return json!({
                "stats": null, "reads_per_swap_in": null, "swap_ins_per_op": null, "live_bytes": null,
                "miss_ratio": null, "swap_in_amplification": null, "evict_mib_s": null, "evict_mib_per_busy_s": null,
                "evict_busy_s": null, "room_wait_pct": null, "write_amplification": null, "misses_per_op": null,
                "peer_bytes": null, "compaction_bytes": null, "compaction_busy_s": null, "network_bytes": null,
                "kept_bytes": null, "local_objects": null, "far_bytes_held": null, "timeline": null, "census": null,
            });
        };
        let d = &f.delta;
        let elapsed = self.run.elapsed;
        let timeline = json!({
            "t_s": f.timeline.iter().map(|p| p.t).collect::<Vec<_>>(),
            "ops_per_s": f.timeline.iter().map(|p| p.ops_per_s).collect::<Vec<_>>(),
            "far_used_bytes": f.timeline.iter().map(|p| p.far_used).collect::<Vec<_>>(),
            "far_held_bytes": f.timeline.iter().map(|p| p.far_held).collect::<Vec<_>>(),
        });
        json!({
            "stats": d,
            "reads_per_swap_in": f.reads_per_swap_in(),
            "swap_ins_per_op": d.traffic.swap_ins as f64 / self.run.ops.max(1) as f64,
            "write_amplification": f.write_amplification(),
            "misses_per_op": self.measured_miss_ratio(),
            "peer_bytes": f.peer_bytes,
            "compaction_bytes": f.compaction_bytes(),
            "compaction_busy_s": d.scheme.compaction_busy_ns as f64 / 1e9,
            "network_bytes": f.network_bytes(),
            "live_bytes": f.avg_live,
            "miss_ratio": self.measured_miss_ratio(),
            "swap_in_amplification": f.swap_in_amplification(),
            "evict_mib_s": f.evict_mib_s(elapsed),
            "evict_busy_s": d.local.evict_busy_ns as f64 / 1e9,
            "evict_mib_per_busy_s": f.evict_mib_per_busy_s(),
            "room_wait_pct": f.room_wait_pct(args.threads, elapsed),
            "kept_bytes": f.avg_kept,
            "local_objects": f.avg_local_objects,
            "far_bytes_held": f.timeline.last().map(|p| p.far_held),
            "timeline": timeline,
            "census": f.census.as_ref().map(super::census::CensusAvg::json),
        })
    }
}
