//! The tables `remora bench micro` prints: throughput and memory, latency
//! with confidence intervals, miss ratios beside the simulated caches', and
//! remora's runtime figures. A figure that does not apply to a record's
//! store is printed as `-`.

use remora_proto::ByteSize;

use super::record::{Record, ci_us, mib, us};
use super::redis_cache::RedisFigures;
use super::{MicroArgs, Plan, schemes, threads_label};
use crate::net::stats::Latency;

/// An offered rate for display: `2000/s`, `0.5/s`, or `closed`.
pub(crate) fn load_label(offered: Option<f64>) -> String {
    match offered {
        Some(r) if r.fract() == 0.0 => format!("{r:.0}/s"),
        Some(r) => format!("{r}/s"),
        None => "closed".to_string(),
    }
}

/// A percentile with its 95 % confidence interval: `12.3 [12.1, 12.6]` (µs).
fn with_ci(l: &Latency, q: f64) -> String {
    let [lo, hi] = ci_us(l, q);
    let f = |x: f64| {
        if x < 1000.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.0}")
        }
    };
    format!("{} [{}, {}]", f(us(l, q)), f(lo), f(hi))
}

/// `x` with `prec` decimals, or `-`.
fn opt(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".to_string(), |x| format!("{x:.prec$}"))
}

pub(crate) fn print_report(args: &MicroArgs, plan: &Plan, records: &[Record], skipped: &[(String, String)]) {
    let l = &plan.layout;
    let open = records.iter().any(|r| r.run.offered.is_some());
    // Width of the scheme column.
    let w = records.iter().map(|r| r.scheme.len()).max().unwrap_or(0).max(10);
    println!("remora bench micro (paper §5.1)");
    println!(
        "  objects: {} x {} (slot {} B, {} per {} span) = {} of spans; local budget {} ({:.2} of it{}) = {} objects",
        plan.n,
        args.object_size,
        l.slot_bytes,
        l.objects_per_span,
        ByteSize(l.span_bytes as u64),
        ByteSize(plan.data_bytes),
        ByteSize(plan.budget),
        plan.budget as f64 / plan.data_bytes.max(1) as f64,
        if plan.budget_clamped {
            ", raised to 16 spans"
        } else {
            ""
        },
        plan.cache_objects
    );
    println!(
        "  access: Zipf {} over a random permutation, {:.0} % writes, {} threads, {:.1} s measured after {:.1} s warm-up",
        args.zipf,
        args.write_ratio * 100.0,
        args.threads,
        args.duration.as_secs_f64(),
        args.warmup.as_secs_f64()
    );
    if open {
        println!(
            "  latency is open-loop: Poisson arrivals at the offered rate split over {}, each op timed from its \
             scheduled start (a stall delays every op scheduled behind it)",
            threads_label(args.threads)
        );
    } else {
        println!("  latency is closed-loop (each thread issues its next op when one completes)");
    }
    if records.iter().any(|r| r.remora().is_some()) {
        println!("  remora schemes: a local cluster of {} memory nodes", plan.memnodes);
        let coded: Vec<&str> = records
            .iter()
            .filter(|r| schemes::info(&r.scheme).is_some_and(|i| i.erasure_coded))
            .map(|r| r.scheme.as_str())
            .fold(Vec::new(), |mut v, s| {
                if !v.contains(&s) {
                    v.push(s);
                }
                v
            });
        if !coded.is_empty() {
            println!(
                "  erasure code: RS({}, {}) for {}; late binding {}",
                plan.opts.k,
                plan.opts.m,
                coded.join(", "),
                if plan.opts.late_binding { "on" } else { "off" }
            );
        }
    }
    for (scheme, why) in skipped {
        println!("  {scheme}: SKIPPED: {why}");
    }
    if records.is_empty() {
        println!("  no scheme ran");
        return;
    }
    println!();
    println!(
        "{:<w$} {:>10} {:>12} {:>10} {:>10} {:>8} {:>10} {:>7} {:>11} {:>10} {:>9} {:>10}",
        "scheme",
        "load",
        "ops/s",
        "samples",
        "swap-ins",
        "rd/swin",
        "swap-outs",
        "errors",
        "remote MiB",
        "data MiB",
        "far/data",
        "local MiB"
    );
    for r in records {
        let f = r.remora();
        let count = |x: Option<u64>| x.map_or("-".to_string(), |x| x.to_string());
        println!(
            "{:<w$} {:>10} {:>12.0} {:>10} {:>10} {:>8} {:>10} {:>7} {:>11.1} {:>10.1} {:>9} {:>10.1}",
            r.scheme,
            load_label(r.run.offered),
            r.throughput(),
            r.run.lat.samples(),
            count(f.map(|f| f.delta.traffic.swap_ins)),
            opt(f.and_then(|f| f.reads_per_swap_in()), 2),
            count(f.map(|f| f.delta.traffic.swap_outs)),
            r.errors(),
            mib(r.far_bytes()),
            mib(r.data_bytes()),
            opt(r.far_over_data(), 2),
            mib(r.local_bytes())
        );
    }
    println!(
        "  remote: far memory in use (remora: remote bytes used; Redis: used_memory summed over its servers); \
         data: the data it holds (remora: live far data spans; Redis: the objects' bytes)"
    );
    for r in records {
        per_record_line(r);
    }

    println!();
    if args.sweep.is_none() {
        println!("latency in µs with 95 % confidence intervals (order statistics, Lancet eqs. 4.1-4.2)");
    } else {
        println!(
            "latency vs load: one row per offered rate; µs with 95 % confidence intervals (order statistics, \
             Lancet eqs. 4.1-4.2)"
        );
    }
    println!(
        "{:<w$} {:>10} {:>12} {:>7} {:>10} {:>24} {:>24} {:>24} {:>7}  state",
        "scheme", "offered", "achieved/s", "ach %", "samples", "p50 [95% CI]", "p99 [95% CI]", "p999 [95% CI]", "lag-1"
    );
    for r in records {
        let state = match r.run.offered {
            None => "closed loop",
            Some(_) if r.saturated() => "SATURATED",
            Some(_) => "keeps up",
        };
        println!(
            "{:<w$} {:>10} {:>12.0} {:>7} {:>10} {:>24} {:>24} {:>24} {:>7}  {}",
            r.scheme,
            load_label(r.run.offered),
            r.throughput(),
            opt(r.achieved_fraction().map(|f| f * 100.0), 1),
            r.run.lat.samples(),
            with_ci(&r.run.lat, 0.5),
            with_ci(&r.run.lat, 0.99),
            with_ci(&r.run.lat, 0.999),
            opt(r.run.lag.r(), 2),
            state
        );
    }
    for r in records {
        latency_notes(r);
    }

    println!();
    println!(
        "miss ratios: measured (remora: dereferences that waited for a swap-in; Redis: in-process cache misses) \
         beside an ideal LRU and S3-FIFO of {} objects (budget / slot bytes) simulated over the same measured \
         access stream, each warmed first by {} accesses of the same distribution",
        plan.cache_objects,
        records.first().map_or(0, |r| r.sim.warm_ops)
    );
    println!(
        "{:<w$} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>12} {:>12}",
        "scheme", "load", "ops", "measured", "ideal LRU", "S3-FIFO", "meas/LRU", "LRU-eq objs", "stream ops"
    );
    for r in records {
        println!(
            "{:<w$} {:>10} {:>10} {:>10.4} {:>10} {:>10} {:>9} {:>12} {:>12}",
            r.scheme,
            load_label(r.run.offered),
            r.run.ops,
            r.measured_miss_ratio(),
            opt(r.sim.lru_ratio(), 4),
            opt(r.sim.s3fifo_ratio(), 4),
            opt(r.over_lru(), 2),
            r.lru_equivalent().map_or_else(|| "-".to_string(), |c| c.to_string()),
            r.sim.trace_ops
        );
        if r.sim.dropped > 0 {
            println!(
                "  {}: the stream kept the first {} of {} measured ops; the simulated caches saw only those",
                r.scheme,
                r.sim.trace_ops,
                r.sim.trace_ops + r.sim.dropped
            );
        }
    }

    println!(
        "  LRU-eq objs: the smallest ideal LRU that misses no more often than measured on the same stream \
         (one pass of the stack algorithm); below the budget's {} objects, the store kept fewer objects, \
         or objects an LRU would not keep: compare with its cache objs or local objs below",
        plan.cache_objects
    );

    if records.iter().any(|r| r.redis().is_some()) {
        redis_table(records, w);
    }
    if !records.iter().any(|r| r.remora().is_some()) {
        return;
    }
    println!();
    println!("remora runtime figures over the measured phase (levels: averages of samples every 100 ms)");
    println!(
        "{:<w$} {:>10} {:>9} {:>8} {:>10} {:>12} {:>8} {:>10} {:>11} {:>9} {:>11} {:>9} {:>9}",
        "scheme",
        "load",
        "miss",
        "swin amp",
        "evict MB/s",
        "MB/busy-s",
        "wait %",
        "clean evs",
        "clean saved",
        "kept MiB",
        "local objs",
        "moved",
        "filtered"
    );
    for r in records {
        let f = r.remora();
        let count = |g: fn(&remora_runtime::Stats) -> u64| f.map_or("-".to_string(), |f| g(&f.delta).to_string());
        println!(
            "{:<w$} {:>10} {:>9} {:>8} {:>10} {:>12} {:>8} {:>10} {:>11} {:>9} {:>11} {:>9} {:>9}",
            r.scheme,
            load_label(r.run.offered),
            opt(f.map(|_| r.measured_miss_ratio()), 4),
            opt(f.and_then(|f| f.swap_in_amplification()), 2),
            opt(f.map(|f| f.evict_mib_s(r.run.elapsed)), 1),
            opt(f.and_then(|f| f.evict_mib_per_busy_s()), 1),
            opt(f.map(|f| f.room_wait_pct(args.threads, r.run.elapsed)), 2),
            count(|d| d.traffic.clean_evictions),
            opt(f.map(|f| mib(f.delta.traffic.clean_bytes_saved as f64)), 1),
            opt(f.map(|f| mib(f.avg_kept)), 1),
            opt(f.map(|f| f.avg_local_objects), 0),
            count(|d| d.local.objects_moved),
            count(|d| d.local.spans_filtered)
        );
    }
    println!(
        "  miss: deref misses / ops; swin amp: bytes swapped in / bytes of them used; evict: data evicted in MiB per \
         second measured and per second the eviction threads were busy; wait %: application time waiting for \
         local room; clean saved: MiB not written thanks to clean re-eviction; local objs: live objects in local \
         spans (average; compare with the ideal LRU's size above)"
    );
    let censuses: Vec<(&str, &super::census::CensusAvg)> = records
        .iter()
        .filter_map(|r| {
            r.remora()
                .and_then(|f| f.census.as_ref())
                .map(|c| (r.scheme.as_str(), c))
        })
        .collect();
    super::census::print(&censuses, w);
    compaction_table(records, w);
}

/// What compaction did, for the schemes that compact (paper Table 2).
fn compaction_table(records: &[Record], w: usize) {
    let compacting = |r: &&Record| schemes::info(&r.scheme).is_some_and(|i| i.compacts);
    if !records.iter().any(|r| compacting(&r)) {
        return;
    }
    println!();
    println!("compaction over the measured phase (paper Table 2)");
    println!(
        "{:<w$} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>9} {:>10} {:>9} {:>11}",
        "scheme",
        "load",
        "folds",
        "local",
        "remote",
        "switches",
        "aborted",
        "freed MiB",
        "dead MiB",
        "net MiB",
        "net/dead",
        "peer MiB",
        "cpu %",
        "memnode %"
    );
    for r in records.iter().filter(compacting) {
        let Some(f) = r.remora() else { continue };
        let d = &f.delta;
        println!(
            "{:<w$} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>9} {:>10.1} {:>9.1} {:>11}",
            r.scheme,
            load_label(r.run.offered),
            d.scheme.compactions,
            d.scheme.compactions_local,
            d.scheme.compactions_remote,
            d.scheme.compaction_switches,
            d.scheme.compactions_aborted,
            mib(d.scheme.compacted_bytes_freed as f64),
            mib(d.scheme.compacted_dead_bytes as f64),
            mib(f.compaction_bytes() as f64),
            opt(f.compaction_bytes_per_dead(), 2),
            mib(f.peer_delta_bytes as f64),
            100.0 * d.scheme.compaction_busy_ns as f64 / r.run.elapsed.as_nanos().max(1) as f64,
            // Only adaptive compaction polls the memory nodes' load.
            if d.scheme.compaction_switches > 0 || d.scheme.memnode_cpu_permille > 0 {
                format!("{:.1}", d.scheme.memnode_cpu_permille as f64 / 10.0)
            } else {
                "-".to_string()
            }
        );
    }
    println!(
        "  local, remote: folds in each mode (ec-batch folds Remote until its busiest memory node uses half a \
         core, then Local until they all calm down); switches: mode changes; freed: far bytes folds gave back; \
         dead: holes the folds did away with (the folded spansets' holes, and the holes their moved spans fill); net: bytes compaction moved (deltas to and from the compute \
         node, and between memory nodes, counted at the transport and where received); peer: of those, between \
         memory nodes; cpu %: compaction threads' busy time on the compute node, in % of one core; memnode %: \
         the busiest memory node's own CPU use at ec-batch's last poll, in % of one core (-: not polled)"
    );
}

/// The Redis baseline's own figures.
fn redis_table(records: &[Record], w: usize) {
    println!();
    if let Some(f) = records.iter().find_map(|r| r.redis()) {
        println!(
            "redis-cache:R: an in-process quick_cache of {} objects in front of redis-server {} (a primary and R \
             replicas on loopback), write-through; +wait: WAIT R after every SET",
            f.cache_capacity, f.version
        );
    }
    println!(
        "{:<w$} {:>10} {:>8} {:>6} {:>10} {:>12} {:>12} {:>11} {:>10} {:>11}",
        "scheme", "load", "replicas", "wait", "hit ratio", "hits", "misses", "cache objs", "used MiB", "short WAITs"
    );
    for r in records {
        let f = r.redis();
        let int = |g: fn(&RedisFigures) -> u64| f.map_or("-".to_string(), |f| g(f).to_string());
        println!(
            "{:<w$} {:>10} {:>8} {:>6} {:>10} {:>12} {:>12} {:>11} {:>10} {:>11}",
            r.scheme,
            load_label(r.run.offered),
            int(|f| u64::from(f.replicas)),
            f.map_or("-", |f| if f.wait { "yes" } else { "no" }),
            opt(f.and_then(RedisFigures::hit_ratio), 4),
            int(|f| f.hits),
            int(|f| f.misses),
            opt(f.map(|f| f.avg_cache_objects), 0),
            opt(f.map(|f| mib(f.avg_used_memory)), 1),
            int(|f| f.short_waits)
        );
    }
    println!(
        "  cache objs: objects cached (average); used MiB: Redis used_memory summed over the primary and its \
         replicas (average); short WAITs: writes fewer than R replicas acknowledged in time (counted as errors)"
    );
}

/// The per-record line under the first table.
fn per_record_line(r: &Record) {
    let secs = r.run.elapsed.as_secs_f64().max(1e-9);
    if let Some(f) = r.remora() {
        println!(
            "  {} ({}): {} reads, {} writes; {:.3} swap-ins per op; remote read {:.0} MiB/s, written {:.0} MiB/s; \
             {} evictions aborted; fill took {:.2} s",
            r.scheme,
            load_label(r.run.offered),
            r.run.reads,
            r.run.writes,
            f.delta.traffic.swap_ins as f64 / r.run.ops.max(1) as f64,
            mib(f.delta.traffic.bytes_read_remote as f64) / secs,
            mib(f.delta.traffic.bytes_written_remote as f64) / secs,
            f.delta.traffic.evictions_aborted,
            r.fill_time.as_secs_f64()
        );
    }
    if let Some(f) = r.redis() {
        println!(
            "  {} ({}): {} reads, {} writes; {} cache misses ({:.3} per op); {} replica(s){}; used_memory {:.1} MiB \
             over {} servers; fill took {:.2} s",
            r.scheme,
            load_label(r.run.offered),
            r.run.reads,
            r.run.writes,
            f.misses,
            r.measured_miss_ratio(),
            f.replicas,
            if f.wait {
                ", WAIT after every SET"
            } else {
                ", asynchronous"
            },
            mib(f.avg_used_memory),
            f.pids.len(),
            r.fill_time.as_secs_f64()
        );
        if f.info_errors > 0 {
            println!(
                "  {}: {} INFO requests failed while sampling used_memory; the average undercounts",
                r.scheme, f.info_errors
            );
        }
    }
    if r.errors() > 0 {
        println!(
            "  {}: {} operations failed and {} returned wrong bytes (see the log)",
            r.scheme, r.run.op_errors, r.run.wrong_bytes
        );
    }
}

/// Open-loop and independence notes under the latency table.
fn latency_notes(r: &Record) {
    let run = &r.run;
    let who = match run.offered {
        Some(_) => format!("  {} at {}", r.scheme, load_label(run.offered)),
        None => format!("  {} (closed loop)", r.scheme),
    };
    if let Some(rate) = run.offered {
        if r.saturated() {
            println!(
                "{who}: saturated: {:.0} ops/s completed, {:.1} % of the {} arrivals scheduled in the window \
                 ({rate} ops/s offered); latencies at this load grow with the run's length",
                r.throughput(),
                r.achieved_fraction().unwrap_or(0.0) * 100.0,
                run.scheduled
            );
        }
        if run.unissued > 0 {
            println!(
                "{who}: {} ops scheduled in the window were still unissued at its end; they are in the \
                 percentiles at their latency so far (a lower bound)",
                run.unissued
            );
        }
        if run.late.samples() > 0 {
            println!(
                "{who}: generator woke {:.1} µs (p50) / {:.1} µs (p99) after an op's scheduled time when ahead \
                 of schedule ({} times); included in the latencies",
                us(&run.late, 0.5),
                us(&run.late, 0.99),
                run.late.samples()
            );
        }
    }
    if run.lag.dependent() {
        println!(
            "{who}: lag-1 autocorrelation {:.2} over {} pairs is significant: neighbouring latencies depend on \
             each other, so the intervals (which assume independent samples) are too narrow",
            run.lag.r().unwrap_or(0.0),
            run.lag.pairs()
        );
    }
}
