//! `remora bench micro`: the microbenchmark of the paper's §5.1 — a remotable
//! array of N fixed-size objects, a local budget of a fraction of it, and T
//! threads reading (and optionally writing) objects with Zipf skew.
//!
//! For each `--scheme` (`all`: every scheme of the runtime's table, `non-ft`
//! first; see `schemes.rs`) the benchmark connects a fresh runtime to one
//! local cluster of [`MEMNODES`] memory nodes (k + m + 1 with RS(4,2); more
//! if `--ec K+M` needs them; whatever the scheme, so every scheme runs on
//! the same machines; the death of a memory node is logged, never fatal)
//! and then:
//!
//! 1. **Fill.** Allocates N objects of `--object-size` bytes with the local
//!    budget already at `--local-ratio` of the data, so the far part is
//!    evicted while filling, then waits for eviction to settle. Object `i` at
//!    version `v` holds words derived from `(i, v)`; a shadow array holds the
//!    current version of each object.
//! 2. **Warm-up** (`--warmup`, not measured) and **measured run**
//!    (`--duration`). Each operation draws a rank from Zipf(`--zipf`) over
//!    `1..=N` (uniform for 0) and maps it through a fixed random permutation
//!    to an object index, so hot objects are scattered over spans rather than
//!    packed into a few. It then enters a deref scope, dereferences the object
//!    and checks every word against the shadow version; with probability
//!    `--write-ratio` it dereferences mutably instead, checks, and rewrites the
//!    object at the next version. Each object sits behind a reader-writer
//!    lock taken before the scope is entered, so a reader never sees a write
//!    in progress.
//!
//! Latency is measured **closed loop** by default: each of the T threads
//! times each of its operations from issue to completion and issues the next
//! at once, so the figures describe the system at the load T threads
//! generate (its saturation, with T ≥ cores), not at a chosen offered load.
//!
//! With `--open-loop RATE` (or `--sweep R1,R2,...`, one measured run per
//! rate) it is measured **open loop**, as Lancet prescribes: each thread
//! follows a Poisson arrival schedule of its own at RATE / T (exponential
//! gaps from a seeded generator), sleeps while it is ahead of it, and times
//! each operation from its *scheduled* start to its completion. A thread that
//! falls behind issues its next operation at once and never skips one, so a
//! stall shows up in the latency of every operation scheduled behind it
//! instead of hiding itself (coordinated omission). The operations scheduled
//! inside the measured window are the samples; those still unissued when the
//! window ends are recorded at their latency so far (a lower bound) and
//! counted. Throughput is what completed inside the window; below 95 % of the
//! arrivals scheduled in it, the system is reported saturated at that rate.
//!
//! Percentiles come with 95 % confidence intervals from order statistics
//! (Lancet eqs. 4.1–4.2, shared with `remora bench net`) and the sample
//! count. Those intervals assume independent samples, which queueing breaks;
//! the lag-1 autocorrelation of (log) latency in issue order is reported as
//! the independence check, and flagged when significant. Errors (an
//! operation that returned an error, or bytes that do not match) are
//! counted, never fatal.
//!
//! Runtime counters are deltas over the measured phase; levels (`remote
//! bytes used`, `live bytes`, `local bytes`) are averages of `Runtime::stats`
//! sampled every 100 ms during it.
//!
//! **The baseline.** `--scheme redis-cache:R` (`redis-cache` = R of 2) runs
//! the same workload, through the same worker loop (`worker.rs`: every store
//! behind a small `Store` trait), against what users run instead of far
//! memory: a bounded in-process cache of as many objects as the local budget
//! holds, write-through to a `redis-server` primary with R replicas on
//! loopback; `redis-cache:R+wait` adds `WAIT R` after every SET. See
//! `redis_cache.rs`. Without `redis-server` the scheme is skipped with
//! install instructions (`REMORA_REQUIRE_REDIS=1` makes that an error).
//!
//! **Alternating rounds.** With several stores at one load (the closed
//! loop or one `--open-loop` rate; no `--kill-at`), every store is filled first and then measured in
//! `--rounds` alternating windows while the others are paused
//! (`alternate.rs`), so every pair of stores gets a throughput ratio per
//! round, taken seconds apart; their medians are printed (`rounds.rs`).
//!
//! **Comparing schemes.** After the per-record tables, each figure Figure 5
//! and Table 2 compare (throughput, p50/p99/p99.9, reads per swap-in, bytes
//! written per byte evicted, far memory, misses per op) is divided by
//! `non-ft`'s from the same run at the same load (`ratios.rs`, also in the
//! JSON as `ratio_to_non_ft`). With `--sweep` each scheme's saturation is
//! found and compared, and p99 against offered load is drawn to `--plot`
//! (SVG; `sweep.rs`, `plot.rs`).
//!
//! **Miss ratios.** Each record keeps its measured access stream and
//! simulates an ideal LRU and an S3-FIFO cache of budget / slot bytes
//! objects over it (`cache_sim.rs`), printed beside its measured miss ratio
//! (remora: dereferences that waited for a swap-in; the baseline: cache
//! misses), so a policy's distance from an ideal one is read off one run.

mod alternate;
mod cache_sim;
mod census;
mod layout;
mod manager_outage;
pub(crate) mod node_kill;
mod objects;
pub(crate) mod open_loop;
mod plot;
mod ratios;
mod record;
mod redis_cache;
pub(crate) mod redis_server;
mod remora_store;
mod report;
mod rounds;
mod schemes;
mod sweep;
mod timeline;
mod worker;

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::Zipf;
use remora_cluster::{ClusterConfig, ClusterEvent, LocalCluster};
use remora_proto::{ByteSize, parse_duration};
use remora_runtime::scheme::SchemeOptions;
use serde_json::json;

use self::cache_sim::SimMisses;
pub use self::layout::SpanLayout;
use self::objects::permutation;
pub(crate) use self::objects::{alloc_parallel, base, check, fill, join_all, splitmix};
use self::open_loop::MAX_RATE;
pub(crate) use self::plot::{Area, COLOURS, titled};
use self::record::{Figures, Record};
pub use self::schemes::Ec;
use self::schemes::Spec;
pub use self::sweep::Sweep;
use self::worker::Run;

/// Memory nodes of the benchmark's cluster: k + m + 1 for RS(4,2), for every
/// scheme (more when `--ec` asks for a wider code).
pub const MEMNODES: usize = 7;
/// Where `--sweep` draws its plot when `--plot` names no file.
pub const DEFAULT_PLOT: &str = "remora-micro-sweep.svg";
/// Region size of the benchmark's memory nodes: far memory is held in
/// stripe groups of k+m regions, so this sets the steps in which far memory
/// held can follow the data (96 MiB for RS(4,2)).
pub(crate) const REGION_SIZE: u64 = 16 << 20;
/// Object sizes the benchmark supports (each is a `[u64; size / 8]`).
pub const SUPPORTED_SIZES: [u64; 11] = [
    64,
    128,
    256,
    512,
    1 << 10,
    2 << 10,
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
];
/// Stack of the fill and worker threads (objects up to 64 KiB are built on it).
const STACK: usize = 8 << 20;

/// Flags of `remora bench micro`.
#[derive(Debug, Clone, clap::Args)]
pub struct MicroArgs {
    /// Fault-tolerance schemes to run, one after another on one cluster (repeat the flag or
    /// separate with commas); `all` is every remora scheme, non-ft first.
    #[arg(long = "scheme", value_delimiter = ',', default_value = "non-ft")]
    pub schemes: Vec<String>,
    /// Erasure code K+M (k data, m parity spans) of the erasure-coded schemes; the cluster gets at
    /// least K+M+1 memory nodes.
    #[arg(long, default_value = "4+2", value_parser = schemes::parse_ec)]
    pub ec: Ec,
    /// Late binding for the schemes that support it (ec-split: read k+1 fragments, decode from the
    /// first k to arrive).
    #[arg(long)]
    pub late_binding: bool,
    /// Number of objects in the remotable array.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=u32::MAX as u64))]
    pub objects: u64,
    /// Size of each object (64B, 128B, ..., 64KiB: powers of two).
    #[arg(long, default_value = "1KiB")]
    pub object_size: ByteSize,
    /// Local memory budget as a fraction of the span bytes the data occupies (e.g. 0.5).
    #[arg(long, default_value_t = 0.5)]
    pub local_ratio: f64,
    /// Zipf skew of the accesses (0 = uniform; the paper's default is 0.99).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Application threads issuing operations.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// Length of the measured phase (e.g. 10s, 500ms, or a number of seconds).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured warm-up before the measured phase.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Fraction of operations that write (rewrite the object at a new version).
    #[arg(long, default_value_t = 0.0)]
    pub write_ratio: f64,
    /// Filtering threads of the remora runtime (default: the runtime's, 1; 0 turns filtering off).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub filtering_threads: Option<u32>,
    /// Eviction threads of the remora runtime (default: the runtime's, 2).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub eviction_threads: Option<u32>,
    /// Spans per eviction batch of the remora runtime (default: the runtime's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub eviction_batch: Option<u32>,
    /// Swap whole spans in, as the paper does, instead of only the object asked for (the
    /// runtime's default when filtering runs; `Tuning::object_swap_in`).
    #[arg(long)]
    pub span_swap_in: bool,
    /// Pause between the remora runtime's filtering rounds (default: the runtime's, 5 ms).
    #[arg(long, value_parser = parse_duration)]
    pub filter_interval: Option<Duration>,
    /// Local level (fraction of the budget) at which the remora runtime starts evicting
    /// (default: the runtime's, 0.97).
    #[arg(long, value_parser = parse_watermark)]
    pub high_watermark: Option<f64>,
    /// Local level the remora runtime's eviction brings memory back down to (default: the
    /// runtime's, 0.94).
    #[arg(long, value_parser = parse_watermark)]
    pub low_watermark: Option<f64>,
    /// Seed of the permutation and of the threads' random streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Open loop: offer this many operations per second in total (Poisson arrivals, split evenly
    /// over the threads) and time each from its scheduled start; without it, closed loop.
    #[arg(long, value_name = "RATE", conflicts_with = "sweep")]
    pub open_loop: Option<f64>,
    /// Open loop at each of these offered rates in turn (ops/s, comma-separated), each for
    /// `--warmup` then `--duration`: one row per rate, latency against load, each scheme's
    /// saturation, and a plot. `auto`: a closed-loop run of every scheme first, then 10 rates from
    /// 10 % to 120 % of the fastest one's throughput.
    #[arg(long, value_name = "R1,R2,...|auto", value_parser = sweep::parse_sweep)]
    pub sweep: Option<Sweep>,
    /// Where `--sweep` draws p99 latency against offered load, one line per scheme (SVG; default
    /// remora-micro-sweep.svg).
    #[arg(long, value_name = "FILE.svg", requires = "sweep")]
    pub plot: Option<PathBuf>,
    /// Draw throughput and far memory (held and used) over time, window by window, for every
    /// remora run to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
    /// Also count the local spans of every remora run by what they are doing (hot, cold, kept,
    /// pinned, listed with holes) at each 100 ms sample, and print the averages: where the local
    /// budget goes. Each count walks the spans under the registry's lock.
    #[arg(long)]
    pub census: bool,
    /// Also write the results as JSON (`{"results":[...]}`, one record per scheme and rate) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Compaction threads of the compacting schemes (ec-batch-local, ec-batch-remote); a list
    /// such as `0,2` runs each compacting scheme once per count, labelled `NAME:cN`. Default: the
    /// runtime's, 2.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(0..=16))]
    pub compaction_threads: Vec<u32>,
    /// With several stores (schemes, compaction-thread counts, the Redis
    /// baseline) at one load (the closed loop, or one `--open-loop` rate)
    /// without `--kill-at`: every store is
    /// filled first and paused, and measured in this many rounds, each
    /// giving every store a window of `--duration` ÷ rounds in turn (the
    /// order reversed every other round) while the others are paused; the
    /// median of each pair's per-round throughput ratios is reported beside
    /// the whole run's. Each store's first window warms up for `--warmup`
    /// or a window, whichever is longer.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Holes' share of the far data at which the compacting schemes start folding (they stop
    /// below half of it). Default: the runtime's, 0.25.
    #[arg(long, value_name = "SHARE")]
    pub compaction_trigger: Option<f64>,
    /// Kill -9 one memory node holding the scheme's far data this long into each redundant
    /// scheme's first measured run (each scheme kills a node of its own; the cluster gets one
    /// spare per scheme). Schemes without redundancy (`non-ft`) run without a kill.
    #[arg(long, value_parser = parse_duration)]
    pub kill_at: Option<Duration>,
    /// Memory nodes `--kill-at` kills at once (those holding the most of the scheme's data).
    /// With more than one, the cluster keeps its single spare per scheme, so fewer than k+m
    /// nodes live after the kill: `ec-batch` writes short spansets and re-stripes what it
    /// cannot rebuild
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub kill_count: u32,
    /// Memory nodes in the local cluster (default: enough for the schemes, plus one spare per
    /// scheme with `--kill-at`). `--memnodes 7 --kill-at 5s --kill-count 2` leaves `ec-batch`'s
    /// RS(4, 2) five live nodes
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub memnodes: Option<u32>,
    /// Managers in the local cluster; more than one run as a Raft group (3 survive losing one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub managers: u32,
    /// Kill -9 the manager this long into each remora scheme's first measured run, start it
    /// again `--manager-down` later on its port and data directory, and report how soon the
    /// throughput is back to 0.9x its level before the kill
    #[arg(long, value_parser = parse_duration)]
    pub kill_manager_at: Option<Duration>,
    /// How long the manager stays down with `--kill-manager-at`
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub manager_down: Duration,
}

/// The workload in a line, for plot subtitles.
fn workload_label(args: &MicroArgs, plan: &Plan) -> String {
    format!(
        "{} objects of {}, local ratio {}, Zipf {}, {:.0} % writes, {}",
        plan.n,
        args.object_size,
        args.local_ratio,
        args.zipf,
        args.write_ratio * 100.0,
        threads_label(args.threads),
    )
}

impl MicroArgs {
    /// The measured runs of each scheme: an offered rate (ops/s) each, `None`
    /// for the closed loop (`--sweep auto` starts with one).
    pub fn loads(&self) -> Vec<Option<f64>> {
        match &self.sweep {
            None => vec![self.open_loop],
            Some(Sweep::Auto) => vec![None],
            Some(Sweep::Rates(r)) => r.iter().copied().map(Some).collect(),
        }
    }

    /// The schemes to run, `all` expanded.
    pub fn scheme_names(&self) -> Vec<String> {
        schemes::expand(&self.schemes, &self.compaction_threads)
    }

    /// The file `--sweep` draws to.
    pub fn plot_path(&self) -> Option<PathBuf> {
        self.sweep
            .as_ref()
            .map(|_| self.plot.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_PLOT)))
    }
}

/// The parameters every scheme's run shares.
struct Plan {
    n: u64,
    layout: SpanLayout,
    data_bytes: u64,
    budget: u64,
    budget_clamped: bool,
    /// Objects the local budget holds (budget / slot bytes): the size of the
    /// Redis baseline's cache and of the simulated caches.
    cache_objects: u64,
    perm: Vec<u32>,
    /// Memory nodes of the cluster.
    memnodes: usize,
    /// What every remora scheme is built with.
    opts: SchemeOptions,
    /// The measured runs of each scheme (see [`MicroArgs::loads`]).
    loads: Vec<Option<f64>>,
}

/// Runs the benchmark; see the module docs.
pub fn run(args: &MicroArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let names = args.scheme_names();
    let layout = SpanLayout::for_object(usize::try_from(args.object_size.0)?);
    let n = args.objects;
    let data_bytes = layout.bytes_for(n);
    let wanted = (args.local_ratio * data_bytes as f64) as u64;
    let floor = 16 * layout.span_bytes as u64;
    let budget = wanted.max(floor);
    let mut plan = Plan {
        n,
        layout,
        data_bytes,
        budget,
        budget_clamped: budget != wanted,
        cache_objects: (budget / layout.slot_bytes as u64).max(1),
        perm: permutation(n, args.seed),
        memnodes: match args.memnodes {
            Some(n) => n as usize,
            None => schemes::memnodes(&names, args.ec) + if args.kill_at.is_some() { names.len() } else { 0 },
        },
        opts: schemes::options(args.ec, args.late_binding, args.compaction_trigger),
        loads: args.loads(),
    };
    if plan.budget_clamped {
        progress(format_args!(
            "local budget raised from {wanted} to {budget} bytes (16 spans): the runtime needs room to swap in"
        ));
    }

    let specs = names
        .iter()
        .map(|s| Spec::parse(s).ok_or_else(|| anyhow!("unknown scheme {s:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;

    // The Redis baseline needs redis-server: without it, say how to get it
    // and run the other schemes (or fail, if REMORA_REQUIRE_REDIS asks to).
    let mut skipped = Vec::new();
    let mut redis_bin = None;
    if specs.iter().any(|s| matches!(s, Spec::Redis(_))) {
        match redis_server::locate() {
            Ok(bin) => redis_bin = Some(bin),
            Err(why) => {
                let msg = format!("{why}; {}", redis_server::INSTALL_HINT);
                if redis_server::required() {
                    bail!(
                        "the redis-cache scheme needs redis-server ({}=1 makes its absence an error): {msg}",
                        redis_server::REQUIRE_ENV
                    );
                }
                eprintln!("[bench micro] redis-cache SKIPPED: {msg}");
                for (name, s) in names.iter().zip(&specs) {
                    if matches!(s, Spec::Redis(_)) {
                        skipped.push((name.clone(), msg.clone()));
                    }
                }
            }
        }
    }

    // Far memory for every run at once (a finished run's regions are only
    // reclaimed after its heartbeat timeout): `--sweep auto` fills twice.
    let auto = matches!(args.sweep, Some(Sweep::Auto));
    let far_need = names
        .iter()
        .filter(|s| schemes::info(s).is_some())
        .map(|s| schemes::far_factor(s, args.ec))
        .sum::<u64>()
        .saturating_mul(if auto { 2 } else { 1 })
        .saturating_mul(data_bytes);
    let cluster = if far_need > 0 {
        Some(start_cluster_for(far_need, plan.memnodes, args.managers as usize)?)
    } else {
        None
    };
    let run_all = |plan: &Plan| -> anyhow::Result<Vec<Record>> {
        // One load (closed loop, or one open-loop rate) without a kill:
        // several stores alternate in rounds (see `alternate.rs`);
        // otherwise each runs alone at every load.
        let pair = plan.loads.len() == 1 && args.kill_at.is_none() && args.kill_manager_at.is_none() && names.len() > 1;
        if pair {
            let mut stores: Vec<Box<dyn alternate::Contestant + '_>> = Vec::new();
            for name in &names {
                let made = match (Spec::parse(name), &cluster, &redis_bin) {
                    (Some(Spec::Remora(_)), Some(cluster), _) => vec![remora_contestant(args, plan, cluster, name)?],
                    (Some(Spec::Redis(replicas)), _, Some(bin)) => redis_cache::contestants(args, plan, bin, replicas)?,
                    _ => continue,
                };
                stores.extend(made);
            }
            return alternate::run(args, plan, stores, plan.loads[0]);
        }
        let mut records: Vec<Record> = Vec::new();
        for name in &names {
            let r = match (Spec::parse(name), &cluster, &redis_bin) {
                (Some(Spec::Remora(_)), Some(cluster), _) => run_remora(args, plan, cluster, name),
                (Some(Spec::Redis(replicas)), _, Some(bin)) => redis_cache::run_scheme(args, plan, bin, replicas),
                _ => continue,
            }
            .with_context(|| format!("scheme {name}"))?;
            records.extend(r);
        }
        Ok(records)
    };
    let mut records = run_all(&plan)?;
    if auto {
        let fastest = records.iter().map(Record::throughput).fold(0.0, f64::max);
        if fastest < 1.0 {
            bail!("--sweep auto: no scheme completed an operation per second in the closed loop; give rates instead");
        }
        let rates = sweep::auto_rates(fastest);
        let list: Vec<String> = rates.iter().map(f64::to_string).collect();
        progress(format_args!(
            "--sweep auto: fastest closed loop {fastest:.0} ops/s; sweeping {}",
            list.join(",")
        ));
        plan.loads = rates.into_iter().map(Some).collect();
        records.extend(run_all(&plan)?);
    }
    drop(cluster);

    report::print_report(args, &plan, &records, &skipped);
    ratios::print(&records);
    rounds::print(&records);
    let summary = args.sweep.as_ref().and_then(|_| sweep::Summary::of(&records));
    let mut plot = None;
    if let (Some(s), Some(path)) = (&summary, args.plot_path()) {
        s.print();
        let subtitle = format!(
            "{}, {:.1} s per rate; RS({},{}); \
             dashed: saturation (highest rate with >= 95 % of the load done); x: did not keep up",
            workload_label(args, &plan),
            args.duration.as_secs_f64(),
            plan.opts.k,
            plan.opts.m
        );
        plot::write(&path, s, &subtitle)?;
        progress(format_args!("sweep plot written to {}", path.display()));
        plot = Some(path);
    }
    let runs: Vec<(&str, &[timeline::Point])> = records
        .iter()
        .filter_map(|r| match &r.figures {
            Figures::Remora(f) => Some((r.scheme.as_str(), f.timeline.as_slice())),
            Figures::Redis(_) => None,
        })
        .collect();
    if !runs.is_empty() {
        timeline::print_drift(&runs, args.duration.as_secs_f64());
    }
    if let Some(path) = &args.timeline {
        let subtitle = format!("{}, windows of 100 ms", workload_label(args, &plan));
        timeline::write(path, &runs, &subtitle)?;
        progress(format_args!("timeline written to {}", path.display()));
    }
    if let Some(path) = &args.json {
        let results: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                let mut v = r.to_json(args, &plan);
                if let Some(m) = v.as_object_mut() {
                    m.insert("ratio_to_non_ft".into(), ratios::to_json(r, &records));
                    m.insert("rounds".into(), rounds::to_json(r, &records));
                }
                v
            })
            .collect();
        let v = json!({
            "results": results,
            "kill_at_s": args.kill_at.map(|d| d.as_secs_f64()),
            "kill_count": args.kill_at.map(|_| args.kill_count),
            "kill_manager_at_s": args.kill_manager_at.map(|d| d.as_secs_f64()),
            "manager_down_s": args.kill_manager_at.map(|_| args.manager_down.as_secs_f64()),
            "skipped": skipped.iter().map(|(s, why)| json!({ "scheme": s, "reason": why })).collect::<Vec<_>>(),
            "sweep": summary.as_ref().map(|s| s.to_json(plot.as_deref())),
        });
        let text = serde_json::to_string_pretty(&v)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        progress(format_args!("results written to {}", path.display()));
    }
    Ok(())
}

/// The local cluster of [`MEMNODES`] nodes `bench drain` runs its schemes
/// on, with far room for `schemes` runs at 3x redundancy each.
pub(crate) fn start_cluster(data_bytes: u64, schemes: u64, managers: usize) -> anyhow::Result<LocalCluster> {
    start_cluster_for(data_bytes.saturating_mul(3 * schemes), MEMNODES, managers)
}

/// A local cluster of `memnodes` memory nodes with `far_need` bytes of far
/// memory in all, spread evenly, plus two spare regions per node.
pub(crate) fn start_cluster_for(far_need: u64, memnodes: usize, managers: usize) -> anyhow::Result<LocalCluster> {
    let per_node = far_need.div_ceil(memnodes as u64).div_ceil(REGION_SIZE) * REGION_SIZE + 2 * REGION_SIZE;
    let binary = std::env::current_exe().context("locating the remora binary")?;
    let mut cfg = ClusterConfig::new(&binary);
    cfg.memnodes = memnodes;
    cfg.managers = managers;
    cfg.region_size = REGION_SIZE;
    cfg.capacity = per_node;
    cfg.log_level = "warn".into();
    cfg.heartbeat_timeout = Duration::from_secs(5);
    progress(format_args!(
        "starting a local cluster: manager + {memnodes} memory nodes of {} ({} regions)",
        ByteSize(per_node),
        ByteSize(REGION_SIZE)
    ));
    let cluster = LocalCluster::start(cfg).context("starting the local cluster")?;
    if let Some(events) = cluster.events() {
        // A memory node dying is something to see in the log, not a reason to stop.
        let _ = thread::Builder::new().name("bench-events".into()).spawn(move || {
            for ev in events {
                match ev {
                    ClusterEvent::Exited { name, status, expected } if !expected => {
                        tracing::warn!("{name} exited during the benchmark ({status}); carrying on");
                    }
                    _ => {}
                }
            }
        });
    }
    Ok(cluster)
}

/// Calls `$f::<W>($args...)` with `[u64; W]` the object type of `--object-size`.
macro_rules! by_object_size {
    ($size:expr, $m:ident :: $f:ident, ($($a:expr),*)) => {
        match $size {
            64 => $m::$f::<8>($($a),*),
            128 => $m::$f::<16>($($a),*),
            256 => $m::$f::<32>($($a),*),
            512 => $m::$f::<64>($($a),*),
            1024 => $m::$f::<128>($($a),*),
            2048 => $m::$f::<256>($($a),*),
            4096 => $m::$f::<512>($($a),*),
            8192 => $m::$f::<1024>($($a),*),
            16384 => $m::$f::<2048>($($a),*),
            32768 => $m::$f::<4096>($($a),*),
            65536 => $m::$f::<8192>($($a),*),
            other => Err(anyhow!("unsupported object size {other}")),
        }
    };
}

/// Runs a remora scheme alone at every load.
fn run_remora(args: &MicroArgs, plan: &Plan, cluster: &LocalCluster, scheme: &str) -> anyhow::Result<Vec<Record>> {
    by_object_size!(
        args.object_size.0,
        remora_store::run_scheme,
        (args, plan, cluster, scheme)
    )
}

/// A remora scheme filled and paused, to alternate with other stores.
fn remora_contestant<'a>(
    args: &MicroArgs,
    plan: &Plan,
    cluster: &'a LocalCluster,
    scheme: &str,
) -> anyhow::Result<Box<dyn alternate::Contestant + 'a>> {
    by_object_size!(
        args.object_size.0,
        remora_store::contestant,
        (args, plan, cluster, scheme)
    )
    .with_context(|| format!("scheme {scheme}"))
}

/// Simulates LRU and S3-FIFO over a finished run's access stream (and frees
/// it), each warmed first by a stream of the same distribution.
fn simulate(args: &MicroArgs, plan: &Plan, scheme: &str, run: &mut Run, zipf: Option<&Zipf<f64>>) -> SimMisses {
    let trace = std::mem::take(&mut run.trace);
    let t0 = Instant::now();
    let seed = splitmix(args.seed ^ 0x7761_726D_5F75_7073);
    let warm_stream = || {
        let mut rng = SmallRng::seed_from_u64(seed);
        move || worker::draw(&plan.perm, zipf, &mut rng) as u32
    };
    let sim = cache_sim::simulate(&trace, run.trace_dropped, plan.cache_objects, plan.n, warm_stream);
    progress(format_args!(
        "[{scheme}] simulated LRU and S3-FIFO of {} objects, and LRU at every size, over {} ops (after {} warm-up accesses) in {:.1} s",
        plan.cache_objects,
        trace.len(),
        sim.warm_ops,
        t0.elapsed().as_secs_f64()
    ));
    sim
}

/// Refuses an `--object-size` the benchmarks have no object type for.
pub(crate) fn check_object_size(size: ByteSize) -> anyhow::Result<()> {
    if !SUPPORTED_SIZES.contains(&size.0) {
        let list: Vec<String> = SUPPORTED_SIZES.iter().map(|&s| ByteSize(s).to_string()).collect();
        bail!("unsupported --object-size {size}: use one of {}", list.join(", "));
    }
    Ok(())
}

fn check_args(args: &MicroArgs) -> anyhow::Result<()> {
    check_object_size(args.object_size)?;
    if !(args.local_ratio.is_finite() && args.local_ratio > 0.0) {
        bail!(
            "--local-ratio must be a positive number (fraction of the data kept local), got {}",
            args.local_ratio
        );
    }
    if !(args.zipf.is_finite() && args.zipf >= 0.0) {
        bail!("--zipf must be a number >= 0 (0 = uniform), got {}", args.zipf);
    }
    if !(0.0..=1.0).contains(&args.write_ratio) {
        bail!("--write-ratio must be between 0 and 1, got {}", args.write_ratio);
    }
    if args.duration.is_zero() {
        bail!("--duration must be positive");
    }
    let names = args.scheme_names();
    if names.is_empty() {
        bail!("--scheme needs at least one scheme");
    }
    for rate in args.loads().into_iter().flatten() {
        if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE) {
            bail!("offered rates (--open-loop, --sweep) must be in (0, {MAX_RATE}] ops/s, got {rate}");
        }
    }
    for s in &names {
        if Spec::parse(s).is_none() {
            bail!("unknown scheme {s:?} (known: {})", schemes::known());
        }
    }
    schemes::check_builds(
        &names,
        &schemes::options(args.ec, args.late_binding, args.compaction_trigger),
    )
    .map_err(|e| anyhow!(e))?;
    Ok(())
}

fn progress(msg: std::fmt::Arguments<'_>) {
    eprintln!("[bench micro] {msg}");
}

fn bar(len: u64, prefix: &'static str, template: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    ProgressBar::new(len).with_style(style).with_prefix(prefix)
}

/// `1 thread`, `2 threads`.
fn threads_label(t: u32) -> String {
    if t == 1 {
        "1 thread".to_string()
    } else {
        format!("{t} threads")
    }
}

/// A watermark: a fraction of the local budget in (0, 1].
fn parse_watermark(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not a fraction of the budget in (0, 1]"))
    }
}
