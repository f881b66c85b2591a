//! `remora bench micro`: the microbenchmark of the paper's §5.1 — a remotable
//! array of N fixed-size objects, a local budget of a fraction of it, and T
//! threads reading (and optionally writing) objects with Zipf skew.
//!
//! For each `--scheme` the benchmark connects a fresh runtime to one local
//! cluster of [`MEMNODES`] memory nodes (k + m + 1 with RS(4,2), whatever the
//! scheme, so every scheme runs on the same machines; the death of a memory
//! node is logged, never fatal) and then:
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

mod open_loop;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::{SmallRng, StdRng};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use remora_cluster::{ClusterConfig, ClusterEvent, LocalCluster};
use remora_proto::{ByteSize, parse_duration};
use remora_runtime::size_classes::{PAGE_SIZE, SizeClass};
use remora_runtime::{RemBox, Runtime, RuntimeConfig, Stats};
use serde_json::{Value, json};

use self::open_loop::{Arrivals, Lag1, MAX_RATE, tight_timer_slack};
use crate::net::stats::Latency;

/// Memory nodes of the benchmark's cluster: k + m + 1 for RS(4,2), for every scheme.
pub const MEMNODES: usize = 7;
/// Region size of the benchmark's memory nodes.
const REGION_SIZE: u64 = 64 << 20;
/// How often the runtime's levels are sampled during the measured phase.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
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
/// Errors of each kind logged before the rest are only counted.
const LOG_ERRORS: u64 = 5;

/// Flags of `remora bench micro`.
#[derive(Debug, Clone, clap::Args)]
pub struct MicroArgs {
    /// Fault-tolerance schemes to run, one record each (repeat the flag or separate with commas).
    #[arg(long = "scheme", value_delimiter = ',', default_value = "non-ft")]
    pub schemes: Vec<String>,
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
    /// Seed of the permutation and of the threads' random streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Open loop: offer this many operations per second in total (Poisson arrivals, split evenly
    /// over the threads) and time each from its scheduled start; without it, closed loop.
    #[arg(long, value_name = "RATE", conflicts_with = "sweep")]
    pub open_loop: Option<f64>,
    /// Open loop at each of these offered rates in turn (ops/s, comma-separated), each for
    /// `--warmup` then `--duration`: one row per rate, latency against load.
    #[arg(long, value_delimiter = ',', value_name = "R1,R2,...")]
    pub sweep: Vec<f64>,
    /// Also write the results as JSON (`{"results":[...]}`, one record per scheme and rate) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl MicroArgs {
    /// The measured runs of each scheme: an offered rate (ops/s) each, `None` for the closed loop.
    pub fn loads(&self) -> Vec<Option<f64>> {
        if self.sweep.is_empty() {
            vec![self.open_loop]
        } else {
            self.sweep.iter().copied().map(Some).collect()
        }
    }
}

/// How objects of one size sit in local spans (TCMalloc size classes, with
/// the runtime's 8-byte object header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanLayout {
    /// The object's value size.
    pub object_size: usize,
    /// Bytes each object takes in its span (header included, rounded to its class).
    pub slot_bytes: usize,
    /// Bytes of each span.
    pub span_bytes: usize,
    /// Objects each span holds.
    pub objects_per_span: usize,
}

impl SpanLayout {
    /// The layout of objects whose value is `object_size` bytes.
    pub fn for_object(object_size: usize) -> Self {
        let need = object_size + 8;
        match SizeClass::for_size(need) {
            Some(c) => {
                let info = c.info();
                Self {
                    object_size,
                    slot_bytes: info.size(),
                    span_bytes: info.span_bytes(),
                    objects_per_span: info.objects(),
                }
            }
            None => {
                let bytes = need.div_ceil(PAGE_SIZE) * PAGE_SIZE;
                Self {
                    object_size,
                    slot_bytes: bytes,
                    span_bytes: bytes,
                    objects_per_span: 1,
                }
            }
        }
    }

    /// Span bytes that `n` objects occupy when packed.
    pub fn bytes_for(&self, n: u64) -> u64 {
        n.div_ceil(self.objects_per_span as u64) * self.span_bytes as u64
    }
}

/// The parameters every scheme's run shares.
struct Plan {
    n: u64,
    layout: SpanLayout,
    data_bytes: u64,
    budget: u64,
    budget_clamped: bool,
    perm: Vec<u32>,
}

/// What one measured run (one scheme at one load) measured.
struct Record {
    scheme: String,
    /// Offered rate of an open-loop run (ops/s in total); `None` for the closed loop.
    offered: Option<f64>,
    /// Measured operations issued (the samples, apart from `unissued`).
    ops: u64,
    reads: u64,
    writes: u64,
    /// Operations that completed inside the measured window.
    completed: u64,
    /// Open loop: arrivals scheduled inside the window.
    scheduled: u64,
    /// Open loop: arrivals of the window still unissued when it ended.
    unissued: u64,
    elapsed: Duration,
    lat: Latency,
    /// Open loop: how late a thread woke for an operation it was early for.
    late: Latency,
    lag: Lag1,
    op_errors: u64,
    wrong_bytes: u64,
    delta: Stats,
    avg_remote_used: f64,
    avg_live: f64,
    avg_local: f64,
    level_samples: u64,
    fill_time: Duration,
}

/// Microseconds at quantile `q` of `l` (0 when empty).
fn us(l: &Latency, q: f64) -> f64 {
    if l.samples() == 0 { 0.0 } else { l.at(q) as f64 / 1000.0 }
}

/// The 95 % confidence interval of quantile `q` of `l`, in µs.
fn ci_us(l: &Latency, q: f64) -> [f64; 2] {
    let (lo, hi) = l.ci95(q);
    [lo as f64 / 1000.0, hi as f64 / 1000.0]
}

impl Record {
    fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn us(&self, q: f64) -> f64 {
        us(&self.lat, q)
    }

    /// Open loop: the operations completed in the window over the arrivals scheduled in it.
    fn achieved_fraction(&self) -> Option<f64> {
        self.offered
            .map(|_| self.completed as f64 / self.scheduled.max(1) as f64)
    }

    /// Open loop: whether less than 95 % of the offered load completed.
    fn saturated(&self) -> bool {
        self.achieved_fraction().is_some_and(|f| f < 0.95)
    }

    fn mode(&self) -> &'static str {
        if self.offered.is_some() {
            "open-loop"
        } else {
            "closed-loop"
        }
    }

    fn reads_per_swap_in(&self) -> Option<f64> {
        (self.delta.swap_ins > 0).then(|| self.delta.swap_in_reads as f64 / self.delta.swap_ins as f64)
    }

    fn to_json(&self, args: &MicroArgs, plan: &Plan) -> Value {
        let d = &self.delta;
        let h = &self.lat.hist;
        let open = self.offered.is_some();
        let mut v = json!({
            "scheme": self.scheme,
            "latency_mode": self.mode(),
            "closed_loop": !open,
            "open_loop_rate": self.offered,
            "throughput_ops": self.throughput(),
            "p50_us": self.us(0.5),
            "p90_us": self.us(0.9),
            "p99_us": self.us(0.99),
            "p999_us": self.us(0.999),
            "max_us": h.max() as f64 / 1000.0,
            "mean_us": h.mean() / 1000.0,
            "p50_ci95_us": ci_us(&self.lat, 0.5),
            "p99_ci95_us": ci_us(&self.lat, 0.99),
            "p999_ci95_us": ci_us(&self.lat, 0.999),
            "ci_level": 0.95,
            "samples": self.lat.samples(),
            "lag1_autocorr": self.lag.r(),
            "lag1_pairs": self.lag.pairs(),
            "samples_independent": !self.lag.dependent(),
            "ops": self.ops,
            "reads": self.reads,
            "writes": self.writes,
            "completed_in_window": self.completed,
            "measured_s": self.elapsed.as_secs_f64(),
            "errors": self.op_errors + self.wrong_bytes,
            "op_errors": self.op_errors,
            "wrong_bytes": self.wrong_bytes,
            "swap_ins": d.swap_ins,
            "swap_in_reads": d.swap_in_reads,
            "swap_outs": d.swap_outs,
            "evictions_aborted": d.evictions_aborted,
            "reads_per_swap_in": self.reads_per_swap_in(),
            "swap_ins_per_op": d.swap_ins as f64 / self.ops.max(1) as f64,
            "bytes_read_remote": d.bytes_read_remote,
            "bytes_written_remote": d.bytes_written_remote,
            "bytes_evicted_data": d.bytes_evicted_data,
            "remote_bytes_used": self.avg_remote_used,
            "live_bytes": self.avg_live,
            "local_bytes": self.avg_local,
            "level_samples": self.level_samples,
            "fill_s": self.fill_time.as_secs_f64(),
        });
        if open {
            let late = json!({
                "scheduled_ops": self.scheduled,
                "offered_ops_realized": self.scheduled as f64 / self.elapsed.as_secs_f64().max(1e-9),
                "achieved_fraction": self.achieved_fraction(),
                "saturated": self.saturated(),
                "unissued": self.unissued,
                "generator_late_samples": self.late.samples(),
                "generator_late_p50_us": us(&self.late, 0.5),
                "generator_late_p99_us": us(&self.late, 0.99),
            });
            if let (Value::Object(m), Value::Object(o)) = (&mut v, late) {
                m.extend(o);
            }
        }
        let params = json!({
            "objects": plan.n,
            "object_size": plan.layout.object_size,
            "slot_bytes": plan.layout.slot_bytes,
            "span_bytes": plan.layout.span_bytes,
            "objects_per_span": plan.layout.objects_per_span,
            "data_span_bytes": plan.data_bytes,
            "local_ratio": args.local_ratio,
            "local_budget_bytes": plan.budget,
            "local_budget_clamped": plan.budget_clamped,
            "zipf": args.zipf,
            "threads": args.threads,
            "duration_s": args.duration.as_secs_f64(),
            "warmup_s": args.warmup.as_secs_f64(),
            "write_ratio": args.write_ratio,
            "seed": args.seed,
            "memnodes": MEMNODES,
        });
        if let (Value::Object(m), Value::Object(p)) = (&mut v, params) {
            m.extend(p);
        }
        v
    }
}

/// Runs the benchmark; see the module docs.
pub fn run(args: &MicroArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let layout = SpanLayout::for_object(usize::try_from(args.object_size.0)?);
    let n = args.objects;
    let data_bytes = layout.bytes_for(n);
    let wanted = (args.local_ratio * data_bytes as f64) as u64;
    let floor = 16 * layout.span_bytes as u64;
    let budget = wanted.max(floor);
    let plan = Plan {
        n,
        layout,
        data_bytes,
        budget,
        budget_clamped: budget != wanted,
        perm: permutation(n, args.seed),
    };
    if plan.budget_clamped {
        progress(format_args!(
            "local budget raised from {wanted} to {budget} bytes (16 spans): the runtime needs room to swap in"
        ));
    }

    // Far memory for every scheme's run (a finished run's regions are only
    // reclaimed after its heartbeat timeout) with room for 3x redundancy.
    let far_need = data_bytes.saturating_mul(3 * args.schemes.len() as u64);
    let per_node = far_need.div_ceil(MEMNODES as u64).div_ceil(REGION_SIZE) * REGION_SIZE + 2 * REGION_SIZE;
    let binary = std::env::current_exe().context("locating the remora binary")?;
    let mut cfg = ClusterConfig::new(&binary);
    cfg.memnodes = MEMNODES;
    cfg.region_size = REGION_SIZE;
    cfg.capacity = per_node;
    cfg.log_level = "warn".into();
    cfg.heartbeat_timeout = Duration::from_secs(5);
    progress(format_args!(
        "starting a local cluster: manager + {MEMNODES} memory nodes of {} ({} regions)",
        ByteSize(per_node),
        ByteSize(REGION_SIZE)
    ));
    let cluster = LocalCluster::start(cfg).context("starting the local cluster")?;
    if let Some(events) = cluster.events() {
        // A memory node dying is something to see in the log, not a reason to stop.
        let _ = thread::Builder::new().name("micro-events".into()).spawn(move || {
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

    let mut records = Vec::new();
    for scheme in &args.schemes {
        let r = match args.object_size.0 {
            64 => run_scheme::<8>(args, &plan, &cluster, scheme),
            128 => run_scheme::<16>(args, &plan, &cluster, scheme),
            256 => run_scheme::<32>(args, &plan, &cluster, scheme),
            512 => run_scheme::<64>(args, &plan, &cluster, scheme),
            1024 => run_scheme::<128>(args, &plan, &cluster, scheme),
            2048 => run_scheme::<256>(args, &plan, &cluster, scheme),
            4096 => run_scheme::<512>(args, &plan, &cluster, scheme),
            8192 => run_scheme::<1024>(args, &plan, &cluster, scheme),
            16384 => run_scheme::<2048>(args, &plan, &cluster, scheme),
            32768 => run_scheme::<4096>(args, &plan, &cluster, scheme),
            65536 => run_scheme::<8192>(args, &plan, &cluster, scheme),
            other => Err(anyhow!("unsupported object size {other}")),
        }
        .with_context(|| format!("scheme {scheme}"))?;
        records.extend(r);
    }
    drop(cluster);

    print_report(args, &plan, &records);
    if let Some(path) = &args.json {
        let v = json!({ "results": records.iter().map(|r| r.to_json(args, &plan)).collect::<Vec<_>>() });
        let text = serde_json::to_string_pretty(&v)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        progress(format_args!("results written to {}", path.display()));
    }
    Ok(())
}

fn check_args(args: &MicroArgs) -> anyhow::Result<()> {
    if !SUPPORTED_SIZES.contains(&args.object_size.0) {
        let list: Vec<String> = SUPPORTED_SIZES.iter().map(|&s| ByteSize(s).to_string()).collect();
        bail!(
            "unsupported --object-size {}: use one of {}",
            args.object_size,
            list.join(", ")
        );
    }
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
    if args.schemes.is_empty() {
        bail!("--scheme needs at least one scheme");
    }
    for rate in args.loads().into_iter().flatten() {
        if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE) {
            bail!("offered rates (--open-loop, --sweep) must be in (0, {MAX_RATE}] ops/s, got {rate}");
        }
    }
    for s in &args.schemes {
        if remora_runtime::scheme::by_name(s).is_none() {
            bail!("unknown scheme {s:?} (known: non-ft)");
        }
    }
    Ok(())
}

fn progress(msg: std::fmt::Arguments<'_>) {
    eprintln!("[bench micro] {msg}");
}

/// A fixed random permutation of `0..n`: rank `r` (1-based) maps to object `perm[r - 1]`.
fn permutation(n: u64, seed: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    p.shuffle(&mut StdRng::seed_from_u64(seed));
    p
}

pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of the words of object `index` at `version`.
pub(crate) fn base(index: u64, version: u64) -> u64 {
    splitmix(splitmix(index) ^ version.wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

fn word(base: u64, j: usize) -> u64 {
    base ^ (j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

pub(crate) fn fill<const W: usize>(obj: &mut [u64; W], base: u64) {
    for (j, w) in obj.iter_mut().enumerate() {
        *w = word(base, j);
    }
}

pub(crate) fn check<const W: usize>(obj: &[u64; W], base: u64) -> bool {
    obj.iter().enumerate().all(|(j, &w)| w == word(base, j))
}

fn bar(len: u64, prefix: &'static str, template: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    ProgressBar::new(len).with_style(style).with_prefix(prefix)
}

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;
/// A worker could not be started: the others stop at once.
const ABORT: u8 = 3;

/// One object of the array behind its lock.
type Cell<const W: usize> = RwLock<RemBox<[u64; W]>>;

/// The objects and their shadow versions.
struct Array<const W: usize> {
    cells: Vec<Cell<W>>,
    versions: Vec<AtomicU64>,
}

/// How one operation went.
enum Outcome {
    Ok,
    Error(remora_runtime::RuntimeError),
    Wrong { index: usize, version: u64 },
}

impl<const W: usize> Array<W> {
    fn read(&self, rt: &Runtime, i: usize) -> Outcome {
        let g = self.cells[i].read().unwrap_or_else(PoisonError::into_inner);
        let v = self.versions[i].load(Ordering::Acquire);
        let scope = rt.scope();
        let b: &RemBox<[u64; W]> = &g;
        match b.deref(&scope) {
            Ok(o) if check(o, base(i as u64, v)) => Outcome::Ok,
            Ok(_) => Outcome::Wrong { index: i, version: v },
            Err(e) => Outcome::Error(e),
        }
    }

    fn write(&self, rt: &Runtime, i: usize) -> Outcome {
        let mut g = self.cells[i].write().unwrap_or_else(PoisonError::into_inner);
        let v = self.versions[i].load(Ordering::Acquire);
        let scope = rt.scope();
        let b: &mut RemBox<[u64; W]> = &mut g;
        match b.deref_mut(&scope) {
            Ok(o) => {
                let ok = check(o, base(i as u64, v));
                fill(o, base(i as u64, v + 1));
                self.versions[i].store(v + 1, Ordering::Release);
                if ok {
                    Outcome::Ok
                } else {
                    Outcome::Wrong { index: i, version: v }
                }
            }
            Err(e) => Outcome::Error(e),
        }
    }
}

/// What one worker thread counted in the measured phase.
struct WorkerOut {
    lat: Latency,
    late: Latency,
    lag: Lag1,
    reads: u64,
    writes: u64,
    completed: u64,
    scheduled: u64,
    unissued: u64,
    op_errors: u64,
    wrong_bytes: u64,
}

impl WorkerOut {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            lat: Latency::new()?,
            late: Latency::new()?,
            lag: Lag1::default(),
            reads: 0,
            writes: 0,
            completed: 0,
            scheduled: 0,
            unissued: 0,
            op_errors: 0,
            wrong_bytes: 0,
        })
    }
}

/// The timeline of one measured run: the workers start at `start`, the
/// measured window is `measure..end` (in the open loop, of scheduled times).
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    measure: Instant,
    end: Instant,
}

/// What every worker thread of a run shares.
struct Ctx<'a, const W: usize> {
    rt: &'a Runtime,
    array: &'a Array<W>,
    perm: &'a [u32],
    zipf: Option<&'a Zipf<f64>>,
    write_ratio: f64,
    phase: &'a AtomicU8,
    live_ops: &'a AtomicU64,
    logged: &'a AtomicU64,
}

impl<const W: usize> Ctx<'_, W> {
    /// Draws an object and whether to write it, and runs the operation.
    fn op(&self, rng: &mut SmallRng) -> (usize, bool, Outcome) {
        let n = self.perm.len() as u64;
        let rank = match self.zipf {
            Some(z) => (z.sample(rng) as u64).clamp(1, n) - 1,
            None => rng.random_range(0..n),
        };
        let i = self.perm[rank as usize] as usize;
        let write = self.write_ratio > 0.0 && rng.random_bool(self.write_ratio);
        let res = if write {
            self.array.write(self.rt, i)
        } else {
            self.array.read(self.rt, i)
        };
        (i, write, res)
    }

    /// Counts a measured operation and its outcome.
    fn count(&self, out: &mut WorkerOut, i: usize, write: bool, res: Outcome) {
        if write {
            out.writes += 1;
        } else {
            out.reads += 1;
        }
        match res {
            Outcome::Ok => {}
            Outcome::Error(e) => {
                out.op_errors += 1;
                if self.logged.fetch_add(1, Ordering::Relaxed) < LOG_ERRORS {
                    tracing::warn!("object {i}: operation failed: {e}");
                }
            }
            Outcome::Wrong { index, version } => {
                out.wrong_bytes += 1;
                if self.logged.fetch_add(1, Ordering::Relaxed) < LOG_ERRORS {
                    tracing::warn!("object {index}: bytes differ from version {version}");
                }
            }
        }
    }

    /// Tells the progress bar about completed operations, 256 at a time.
    fn progress(&self, pending: &mut u64) {
        *pending += 1;
        if *pending == 256 {
            self.live_ops.fetch_add(*pending, Ordering::Relaxed);
            *pending = 0;
        }
    }

    /// Closed loop: the next operation as soon as one completes, timed from issue.
    fn closed(&self, seed: u64) -> anyhow::Result<WorkerOut> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out = WorkerOut::new()?;
        let mut pending = 0u64;
        loop {
            let ph = self.phase.load(Ordering::Relaxed);
            if ph >= STOP {
                break;
            }
            let t0 = Instant::now();
            let (i, write, res) = self.op(&mut rng);
            let dt = t0.elapsed();
            if ph != MEASURE {
                continue;
            }
            out.lat.record(dt);
            out.lag.push(dt);
            out.completed += 1;
            self.count(&mut out, i, write, res);
            self.progress(&mut pending);
        }
        Ok(out)
    }

    /// Open loop: operations at Poisson arrival times at `rate` per second,
    /// each timed from its scheduled start; see the module docs.
    fn open(&self, seed: u64, win: Window, rate: f64) -> anyhow::Result<WorkerOut> {
        tight_timer_slack();
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut arrivals = Arrivals::new(win.start, rate, splitmix(seed ^ 0x6F70_656E_6C6F_6F70))?;
        let mut out = WorkerOut::new()?;
        let mut pending = 0u64;
        while let Some(sched) = arrivals.next() {
            if sched >= win.end || self.phase.load(Ordering::Relaxed) == ABORT {
                break;
            }
            let mut now = Instant::now();
            if now >= win.end {
                // Out of time with arrivals of the window still due (behind
                // schedule): they count, at the latency they have so far.
                let mut s = sched;
                while s < win.end {
                    if s >= win.measure {
                        out.lat.record(now.saturating_duration_since(s));
                        out.scheduled += 1;
                        out.unissued += 1;
                    }
                    s = arrivals.next().unwrap_or(win.end);
                }
                break;
            }
            if sched > now {
                thread::sleep(sched - now);
                now = Instant::now();
                if sched >= win.measure {
                    out.late.record(now.saturating_duration_since(sched));
                }
            }
            let (i, write, res) = self.op(&mut rng);
            let done = Instant::now();
            if (win.measure..win.end).contains(&done) {
                out.completed += 1;
                self.progress(&mut pending);
            }
            if sched >= win.measure {
                let d = done.saturating_duration_since(sched);
                out.lat.record(d);
                out.lag.push(d);
                out.scheduled += 1;
                self.count(&mut out, i, write, res);
            }
        }
        Ok(out)
    }
}

fn run_scheme<const W: usize>(
    args: &MicroArgs,
    plan: &Plan,
    cluster: &LocalCluster,
    scheme: &str,
) -> anyhow::Result<Vec<Record>> {
    let mut cfg = RuntimeConfig::new(cluster.manager_addr(), usize::try_from(plan.budget)?);
    cfg.name = format!("bench-micro-{scheme}");
    cfg.scheme = remora_runtime::scheme::by_name(scheme).ok_or_else(|| anyhow!("unknown scheme {scheme:?}"))?;
    let rt = Runtime::connect(cfg).context("connecting the runtime")?;

    // Fill.
    let n = plan.n;
    let threads = u64::from(args.threads);
    progress(format_args!(
        "[{scheme}] filling {n} objects of {} ({} of spans; local budget {})",
        args.object_size,
        ByteSize(plan.data_bytes),
        ByteSize(plan.budget)
    ));
    let pb = bar(
        n,
        "fill",
        "{prefix:>6} [{bar:30}] {pos}/{len} objects ({per_sec}, eta {eta})",
    );
    let fill_start = Instant::now();
    let chunk = n.div_ceil(threads);
    let parts: Vec<anyhow::Result<Vec<Cell<W>>>> = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (rt, pb) = (&rt, &pb);
                let range = (t * chunk).min(n)..((t + 1) * chunk).min(n);
                thread::Builder::new()
                    .name(format!("micro-fill-{t}"))
                    .stack_size(STACK)
                    .spawn_scoped(s, move || -> anyhow::Result<Vec<Cell<W>>> {
                        let mut out = Vec::with_capacity(range.clone().count());
                        for i in range {
                            let mut v = [0u64; W];
                            fill(&mut v, base(i, 0));
                            let b = rt.alloc(v).with_context(|| format!("allocating object {i} of {n}"))?;
                            out.push(RwLock::new(b));
                            if i % 1024 == 1023 {
                                pb.inc(1024);
                            }
                        }
                        Ok(out)
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(anyhow!("a fill thread panicked"))),
                Err(e) => Err(anyhow!("cannot start a fill thread: {e}")),
            })
            .collect()
    });
    let mut cells = Vec::with_capacity(n as usize);
    for p in parts {
        cells.extend(p?);
    }
    if let Err(e) = rt.wait_for_eviction(Duration::from_secs(60)) {
        tracing::warn!("eviction did not settle after the fill: {e}");
    }
    let fill_time = fill_start.elapsed();
    pb.finish_and_clear();
    let st = rt.stats();
    progress(format_args!(
        "[{scheme}] filled in {:.2} s: {} local, {} far in {} swap-outs",
        fill_time.as_secs_f64(),
        ByteSize(st.local_bytes),
        ByteSize(st.live_bytes),
        st.swap_outs
    ));
    let array = Array::<W> {
        cells,
        versions: (0..n).map(|_| AtomicU64::new(0)).collect(),
    };
    let zipf = if args.zipf > 0.0 {
        Some(Zipf::new(n as f64, args.zipf).map_err(|e| anyhow!("Zipf({}) over {n}: {e}", args.zipf))?)
    } else {
        None
    };

    // One measured run per load, each after its own warm-up.
    let mut records = Vec::new();
    for offered in args.loads() {
        let mut r = measure(args, plan, &rt, &array, zipf.as_ref(), offered).with_context(|| match offered {
            Some(rate) => format!("open loop at {rate} ops/s"),
            None => "closed loop".to_string(),
        })?;
        r.scheme = scheme.to_string();
        r.fill_time = fill_time;
        records.push(r);
    }
    // Free the objects (and their far copies) before the runtime goes.
    drop(array);
    drop(rt);
    Ok(records)
}

/// Warm-up and one measured run at `offered` ops/s (open loop) or closed loop.
fn measure<const W: usize>(
    args: &MicroArgs,
    plan: &Plan,
    rt: &Runtime,
    array: &Array<W>,
    zipf: Option<&Zipf<f64>>,
    offered: Option<f64>,
) -> anyhow::Result<Record> {
    let threads = u64::from(args.threads);
    let phase = AtomicU8::new(WARMUP);
    let live_ops = AtomicU64::new(0);
    let logged = AtomicU64::new(0);
    let total_ms = (args.warmup + args.duration).as_millis() as u64;
    let pb = bar(total_ms, "run", "{prefix:>6} [{bar:30}] {msg}");
    if let Some(rate) = offered {
        progress(format_args!(
            "open loop: {rate} ops/s offered ({} at {} ops/s each, Poisson arrivals)",
            threads_label(args.threads),
            rate / threads as f64
        ));
    }
    // A few ms for the threads to start before the first arrival.
    let start = Instant::now() + Duration::from_millis(5);
    let win = Window {
        start,
        measure: start + args.warmup,
        end: start + args.warmup + args.duration,
    };
    let ctx = Ctx {
        rt,
        array,
        perm: &plan.perm,
        zipf,
        write_ratio: args.write_ratio,
        phase: &phase,
        live_ops: &live_ops,
        logged: &logged,
    };
    let (outs, measured) = thread::scope(|s| -> anyhow::Result<_> {
        let mut handles = Vec::new();
        for t in 0..threads {
            let ctx = &ctx;
            let seed = splitmix(args.seed ^ (t + 1).wrapping_mul(0xA076_1D64_78BD_642F));
            let h = thread::Builder::new()
                .name(format!("micro-{t}"))
                .stack_size(STACK)
                .spawn_scoped(s, move || -> anyhow::Result<WorkerOut> {
                    match offered {
                        Some(rate) => ctx.open(seed, win, rate / threads as f64),
                        None => ctx.closed(seed),
                    }
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    phase.store(ABORT, Ordering::Relaxed);
                    bail!("cannot start a worker thread: {e}");
                }
            }
        }
        // Warm-up.
        loop {
            let now = Instant::now();
            if now >= win.measure {
                break;
            }
            pb.set_position(now.saturating_duration_since(start).as_millis() as u64);
            pb.set_message("warm-up");
            thread::sleep(SAMPLE_EVERY.min(win.measure - now));
        }
        // Measured phase: sample the levels every SAMPLE_EVERY.
        let s0 = rt.stats();
        let t0 = Instant::now();
        phase.store(MEASURE, Ordering::Relaxed);
        // The open loop's window is fixed in advance; the closed loop's starts now.
        let end = if offered.is_some() { win.end } else { t0 + args.duration };
        let mut levels = Levels::default();
        let mut next = t0 + SAMPLE_EVERY;
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            thread::sleep(next.min(end).saturating_duration_since(now));
            next += SAMPLE_EVERY;
            let st = rt.stats();
            levels.add(&st);
            let el = t0.elapsed().as_secs_f64().max(1e-9);
            pb.set_position((args.warmup + t0.elapsed()).as_millis() as u64);
            let done = live_ops.load(Ordering::Relaxed) as f64 / el;
            let swap_ins = (st.swap_ins - s0.swap_ins) as f64 / el;
            pb.set_message(match offered {
                Some(rate) => format!("{done:.0} of {rate} ops/s offered, {swap_ins:.0} swap-ins/s"),
                None => format!("{done:.0} ops/s, {swap_ins:.0} swap-ins/s"),
            });
        }
        phase.store(STOP, Ordering::Relaxed);
        let elapsed = if offered.is_some() { args.duration } else { t0.elapsed() };
        let s1 = rt.stats();
        let outs: Vec<anyhow::Result<WorkerOut>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a worker thread panicked"))))
            .collect();
        Ok((outs, (elapsed, delta(&s0, &s1), levels)))
    })?;
    pb.finish_and_clear();
    let (elapsed, delta, levels) = measured;
    let mut all = WorkerOut::new()?;
    for o in outs {
        let o = o?;
        all.lat
            .hist
            .add(&o.lat.hist)
            .map_err(|e| anyhow!("merging histograms: {e:?}"))?;
        all.late
            .hist
            .add(&o.late.hist)
            .map_err(|e| anyhow!("merging histograms: {e:?}"))?;
        all.lag.merge(&o.lag);
        all.reads += o.reads;
        all.writes += o.writes;
        all.completed += o.completed;
        all.scheduled += o.scheduled;
        all.unissued += o.unissued;
        all.op_errors += o.op_errors;
        all.wrong_bytes += o.wrong_bytes;
    }
    let k = levels.n.max(1) as f64;
    Ok(Record {
        scheme: String::new(),
        offered,
        ops: all.reads + all.writes,
        reads: all.reads,
        writes: all.writes,
        completed: all.completed,
        scheduled: all.scheduled,
        unissued: all.unissued,
        elapsed,
        lat: all.lat,
        late: all.late,
        lag: all.lag,
        op_errors: all.op_errors,
        wrong_bytes: all.wrong_bytes,
        delta,
        avg_remote_used: levels.remote_used as f64 / k,
        avg_live: levels.live as f64 / k,
        avg_local: levels.local as f64 / k,
        level_samples: levels.n,
        fill_time: Duration::ZERO,
    })
}

/// Sums of sampled levels.
#[derive(Default)]
struct Levels {
    n: u64,
    remote_used: u128,
    live: u128,
    local: u128,
}

impl Levels {
    fn add(&mut self, st: &Stats) {
        self.n += 1;
        self.remote_used += u128::from(st.remote_bytes_used);
        self.live += u128::from(st.live_bytes);
        self.local += u128::from(st.local_bytes);
    }
}

/// Counters of `b` minus those of `a` (levels are taken from `b`).
fn delta(a: &Stats, b: &Stats) -> Stats {
    Stats {
        swap_ins: b.swap_ins - a.swap_ins,
        swap_in_reads: b.swap_in_reads - a.swap_in_reads,
        swap_outs: b.swap_outs - a.swap_outs,
        evictions_aborted: b.evictions_aborted - a.evictions_aborted,
        bytes_evicted_data: b.bytes_evicted_data - a.bytes_evicted_data,
        bytes_read_remote: b.bytes_read_remote - a.bytes_read_remote,
        bytes_written_remote: b.bytes_written_remote - a.bytes_written_remote,
        deref_misses: b.deref_misses - a.deref_misses,
        swap_in_bytes: b.swap_in_bytes - a.swap_in_bytes,
        swap_in_used_bytes: b.swap_in_used_bytes - a.swap_in_used_bytes,
        room_wait_ns: b.room_wait_ns - a.room_wait_ns,
        evict_busy_ns: b.evict_busy_ns - a.evict_busy_ns,
        clean_evictions: b.clean_evictions - a.clean_evictions,
        clean_bytes_saved: b.clean_bytes_saved - a.clean_bytes_saved,
        objects_moved: b.objects_moved - a.objects_moved,
        spans_filtered: b.spans_filtered - a.spans_filtered,
        ..b.clone()
    }
}

fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

/// An offered rate for display: `2000/s`, `0.5/s`, or `closed`.
fn load_label(offered: Option<f64>) -> String {
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

/// `1 thread`, `2 threads`.
fn threads_label(t: u32) -> String {
    if t == 1 {
        "1 thread".to_string()
    } else {
        format!("{t} threads")
    }
}

fn print_report(args: &MicroArgs, plan: &Plan, records: &[Record]) {
    let l = &plan.layout;
    let open = records.iter().any(|r| r.offered.is_some());
    println!("remora bench micro (paper §5.1)");
    println!(
        "  objects: {} x {} (slot {} B, {} per {} span) = {} of spans; local budget {} ({:.2} of it{})",
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
        }
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
            "  cluster: {MEMNODES} memory nodes; latency is open-loop: Poisson arrivals at the offered rate split over \
             {}, each op timed from its scheduled start (a stall delays every op scheduled behind it)",
            threads_label(args.threads)
        );
    } else {
        println!(
            "  cluster: {MEMNODES} memory nodes; latency is closed-loop (each thread issues its next op when one completes)"
        );
    }
    println!();
    println!(
        "{:<10} {:>10} {:>12} {:>10} {:>10} {:>8} {:>10} {:>7} {:>11} {:>10} {:>10}",
        "scheme",
        "load",
        "ops/s",
        "samples",
        "swap-ins",
        "rd/swin",
        "swap-outs",
        "errors",
        "remote MiB",
        "live MiB",
        "local MiB"
    );
    for r in records {
        println!(
            "{:<10} {:>10} {:>12.0} {:>10} {:>10} {:>8} {:>10} {:>7} {:>11.1} {:>10.1} {:>10.1}",
            r.scheme,
            load_label(r.offered),
            r.throughput(),
            r.lat.samples(),
            r.delta.swap_ins,
            r.reads_per_swap_in().map_or("-".to_string(), |x| format!("{x:.2}")),
            r.delta.swap_outs,
            r.op_errors + r.wrong_bytes,
            mib(r.avg_remote_used),
            mib(r.avg_live),
            mib(r.avg_local)
        );
    }
    for r in records {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        println!(
            "  {} ({}): {} reads, {} writes; {:.3} swap-ins per op; remote read {:.0} MiB/s, written {:.0} MiB/s; \
             {} evictions aborted; fill took {:.2} s",
            r.scheme,
            load_label(r.offered),
            r.reads,
            r.writes,
            r.delta.swap_ins as f64 / r.ops.max(1) as f64,
            mib(r.delta.bytes_read_remote as f64) / secs,
            mib(r.delta.bytes_written_remote as f64) / secs,
            r.delta.evictions_aborted,
            r.fill_time.as_secs_f64()
        );
        if r.op_errors + r.wrong_bytes > 0 {
            println!(
                "  {}: {} operations failed and {} returned wrong bytes (see the log)",
                r.scheme, r.op_errors, r.wrong_bytes
            );
        }
    }

    println!();
    if args.sweep.is_empty() {
        println!("latency in µs with 95 % confidence intervals (order statistics, Lancet eqs. 4.1-4.2)");
    } else {
        println!(
            "latency vs load: one row per offered rate; µs with 95 % confidence intervals (order statistics, \
             Lancet eqs. 4.1-4.2)"
        );
    }
    println!(
        "{:<10} {:>10} {:>12} {:>7} {:>10} {:>24} {:>24} {:>24} {:>7}  state",
        "scheme", "offered", "achieved/s", "ach %", "samples", "p50 [95% CI]", "p99 [95% CI]", "p999 [95% CI]", "lag-1"
    );
    for r in records {
        let state = match r.offered {
            None => "closed loop",
            Some(_) if r.saturated() => "SATURATED",
            Some(_) => "keeps up",
        };
        println!(
            "{:<10} {:>10} {:>12.0} {:>7} {:>10} {:>24} {:>24} {:>24} {:>7}  {}",
            r.scheme,
            load_label(r.offered),
            r.throughput(),
            r.achieved_fraction()
                .map_or("-".to_string(), |f| format!("{:.1}", f * 100.0)),
            r.lat.samples(),
            with_ci(&r.lat, 0.5),
            with_ci(&r.lat, 0.99),
            with_ci(&r.lat, 0.999),
            r.lag.r().map_or("-".to_string(), |x| format!("{x:.2}")),
            state
        );
    }
    for r in records {
        let who = match r.offered {
            Some(_) => format!("  {} at {}", r.scheme, load_label(r.offered)),
            None => format!("  {} (closed loop)", r.scheme),
        };
        if let Some(rate) = r.offered {
            if r.saturated() {
                println!(
                    "{who}: saturated: {:.0} ops/s completed, {:.1} % of the {} arrivals scheduled in the window \
                     ({rate} ops/s offered); latencies at this load grow with the run's length",
                    r.throughput(),
                    r.achieved_fraction().unwrap_or(0.0) * 100.0,
                    r.scheduled
                );
            }
            if r.unissued > 0 {
                println!(
                    "{who}: {} ops scheduled in the window were still unissued at its end; they are in the \
                     percentiles at their latency so far (a lower bound)",
                    r.unissued
                );
            }
            if r.late.samples() > 0 {
                println!(
                    "{who}: generator woke {:.1} µs (p50) / {:.1} µs (p99) after an op's scheduled time when ahead \
                     of schedule ({} times); included in the latencies",
                    us(&r.late, 0.5),
                    us(&r.late, 0.99),
                    r.late.samples()
                );
            }
        }
        if r.lag.dependent() {
            println!(
                "{who}: lag-1 autocorrelation {:.2} over {} pairs is significant: neighbouring latencies depend on \
                 each other, so the intervals (which assume independent samples) are too narrow",
                r.lag.r().unwrap_or(0.0),
                r.lag.pairs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_size_classes() {
        let l = SpanLayout::for_object(4096);
        assert_eq!((l.slot_bytes, l.span_bytes, l.objects_per_span), (4736, 24576, 5));
        let l = SpanLayout::for_object(1024);
        assert_eq!((l.slot_bytes, l.span_bytes, l.objects_per_span), (1152, 16384, 14));
        let l = SpanLayout::for_object(64);
        assert_eq!((l.slot_bytes, l.objects_per_span), (80, 102));
        let l = SpanLayout::for_object(1 << 20);
        assert_eq!((l.span_bytes, l.objects_per_span), ((1 << 20) + PAGE_SIZE, 1));
        assert_eq!(SpanLayout::for_object(4096).bytes_for(11), 3 * 24576);
    }

    #[test]
    fn words_depend_on_index_and_version() {
        let mut a = [0u64; 8];
        fill(&mut a, base(3, 0));
        assert!(check(&a, base(3, 0)));
        assert!(!check(&a, base(3, 1)));
        assert!(!check(&a, base(4, 0)));
        let p = permutation(1000, 7);
        let mut s = p.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<u32>>());
    }
}
