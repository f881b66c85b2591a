//! `remora bench runtime`: the runtime's two basic costs, each next to a
//! baseline measured in the same run, as ratios.
//!
//! 1. **Local-hit dereference vs a plain `&T`.** `--objects` `RemBox<u64>`s,
//!    all local (the budget holds them all), are summed inside one deref
//!    scope; the baselines sum the same values through a `Vec<Box<u64>>` (a
//!    pointer per value, like a `RemBox`) and a plain `&[u64]`. Both a
//!    sequential pass and a pass in a fixed random order are timed. Each side
//!    runs `--passes` times, the sides taking turns pass by pass; the median
//!    pass gives ns/op. Every element goes through `std::hint::black_box`
//!    (so no loop is vectorized away), every sum is checked, and the runtime
//!    must report no swap-in. Goal: remora / `Box` ≤ 3×.
//! 2. **Span swap-in vs a raw READ of the same size.** Objects of each
//!    `--swap-sizes` size are allocated, then, round after round, the budget
//!    is dropped to nothing until every span is far and raised again (so no
//!    eviction runs while timing), and the first object of each span is
//!    dereferenced: each dereference swaps in exactly one span (checked with
//!    the runtime's swap-in counter; a sample that did not is discarded and
//!    counted). Each is paired with a `MemNodeClient::read` of one span's
//!    bytes at a random page of a region granted to a separate session on the
//!    same cluster; which of the two goes first alternates. Every object read
//!    is checked. Goal: swap-in / READ ≤ 1.3× at p50 and p99.
//!
//! Latency is closed loop: one request in flight, which is what a single
//! dereference costs.
//!
//! Both parts also count this process's context switches (`getrusage`
//! `ru_nvcsw` / `ru_nivcsw`, all threads, runtime threads included; the
//! memory nodes are other processes) over the timed operations of each side
//! separately, and report them per operation: on two cores a wake-up and a
//! context switch cost as much as the loopback round trip itself. A
//! local hit should cause none.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::net::pin;
use anyhow::{Context, anyhow, bail};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use remora_cluster::{ClusterConfig, LocalCluster};
use remora_proto::{ByteSize, ComputeSession, MemNodeClient, MemTransport};
use remora_runtime::internals::PAGE_SIZE;
use remora_runtime::{RemBox, Runtime, RuntimeConfig};
use serde_json::{Value, json};

use crate::micro::{SUPPORTED_SIZES, SpanLayout, base, check, fill};

/// Goal of the local-hit comparison: remora's ns/op over `Vec<Box<u64>>`'s.
const GOAL_LOCAL_RATIO: f64 = 3.0;
/// Goal of the swap-in comparison: swap-in latency over raw READ latency.
const GOAL_SWAP_RATIO: f64 = 1.3;
/// Region size of the benchmark's memory nodes.
const REGION_SIZE: u64 = 64 << 20;

/// Flags of `remora bench runtime`.
#[derive(Debug, Clone, clap::Args)]
pub struct RuntimeArgs {
    /// Object counts of the local-hit comparison, comma-separated (small fits in cache, large does not).
    #[arg(long, value_delimiter = ',', default_value = "4096,1000000")]
    pub objects: Vec<u64>,
    /// Timed passes per side, order and count in the local-hit comparison (the median is reported).
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub passes: u32,
    /// Object sizes of the swap-in comparison, comma-separated (64B..64KiB, powers of two).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB")]
    pub swap_sizes: Vec<ByteSize>,
    /// Swap-in samples per size (as many raw READs are timed).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub samples: u64,
    /// Spans swapped in per round (between two forced evictions).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub round: u64,
    /// Memory nodes of the local cluster.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub memnodes: u32,
    /// Managers in the local cluster; more than one run as a Raft group (3 survive losing one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub managers: u32,
    /// CPU pinning: `split` runs this process's threads on one CPU and the memory nodes on
    /// another, so every READ (raw or swap-in) wakes its server on the other CPU, as with a
    /// remote node; `none` leaves placement to the scheduler, which makes the raw-READ
    /// baseline swing by 2x between runs on a two-CPU machine.
    #[arg(long, value_enum, default_value_t = Pin::Split)]
    pub pin: Pin,
    /// Skip the local-hit comparison.
    #[arg(long)]
    pub no_local: bool,
    /// Skip the swap-in comparison.
    #[arg(long)]
    pub no_swap: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// How the benchmark's threads are placed on CPUs; see `--pin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pin {
    /// This process on one CPU, the memory nodes on another.
    Split,
    /// No pinning.
    None,
}

/// The first two CPUs this process may use.
fn two_cpus() -> anyhow::Result<(usize, usize)> {
    let cpus = pin::allowed_cpus().context("reading this process's CPU affinity")?;
    match cpus.as_slice() {
        [a, b, ..] => Ok((*a, *b)),
        _ => bail!("--pin split needs two CPUs, this process may use {cpus:?} (try --pin none)"),
    }
}

/// Pins every thread of process `pid` to `cpu`; returns how many.
fn pin_process(pid: u32, cpu: usize) -> anyhow::Result<usize> {
    pin::pin_threads(&pid.to_string(), cpu, |_| true).with_context(|| format!("pinning the threads of process {pid}"))
}

fn progress(msg: std::fmt::Arguments<'_>) {
    eprintln!("[bench runtime] {msg}");
}

fn check_args(args: &RuntimeArgs) -> anyhow::Result<()> {
    if !args.no_local {
        if args.objects.is_empty() {
            bail!("--objects needs at least one count");
        }
        for &n in &args.objects {
            if n == 0 || n > u64::from(u32::MAX) {
                bail!("--objects {n}: each count must be between 1 and {}", u32::MAX);
            }
        }
    }
    if !args.no_swap {
        if args.swap_sizes.is_empty() {
            bail!("--swap-sizes needs at least one size");
        }
        for s in &args.swap_sizes {
            if !SUPPORTED_SIZES.contains(&s.0) {
                let list: Vec<String> = SUPPORTED_SIZES.iter().map(|&s| ByteSize(s).to_string()).collect();
                bail!("unsupported --swap-sizes entry {s}: use one of {}", list.join(", "));
            }
        }
    }
    Ok(())
}

/// Context switches of this process (all its threads).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Switches {
    /// Voluntary: a thread blocked (waiting for a reply, a lock, a sleep).
    voluntary: u64,
    /// Involuntary: a thread was preempted.
    involuntary: u64,
}

impl Switches {
    /// The counts so far (zero if `getrusage` fails, which it does not for `RUSAGE_SELF`).
    fn now() -> Self {
        // SAFETY: `rusage` is a plain C struct of integers and timevals; all
        // zeroes is a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, writable `rusage` that getrusage fills in
        // (and keeps no pointer to); RUSAGE_SELF is a valid `who`.
        let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        if r != 0 {
            return Self::default();
        }
        Self {
            voluntary: u64::try_from(ru.ru_nvcsw).unwrap_or(0),
            involuntary: u64::try_from(ru.ru_nivcsw).unwrap_or(0),
        }
    }

    /// Adds the switches since `before` (taken with [`Switches::now`]).
    fn add_since(&mut self, before: Switches) {
        let now = Self::now();
        self.voluntary += now.voluntary.saturating_sub(before.voluntary);
        self.involuntary += now.involuntary.saturating_sub(before.involuntary);
    }

    /// Voluntary and involuntary switches per operation over `ops` operations.
    fn per_op(&self, ops: u64) -> (f64, f64) {
        let n = ops.max(1) as f64;
        (self.voluntary as f64 / n, self.involuntary as f64 / n)
    }
}

/// One row of the local-hit comparison (ns per element, median pass).
struct LocalRow {
    objects: u64,
    order: &'static str,
    remora_ns: f64,
    box_ns: f64,
    slice_ns: f64,
    /// Context switches during the timed remora passes.
    remora_cs: Switches,
    /// Context switches during the timed `Box` passes.
    box_cs: Switches,
    /// Element reads of each side's timed passes.
    ops: u64,
}

impl LocalRow {
    fn to_json(&self, passes: u32) -> Value {
        let (rv, ri) = self.remora_cs.per_op(self.ops);
        let (bv, bi) = self.box_cs.per_op(self.ops);
        json!({
            "objects": self.objects,
            "order": self.order,
            "passes": passes,
            "remora_ns_per_op": self.remora_ns,
            "box_ns_per_op": self.box_ns,
            "slice_ns_per_op": self.slice_ns,
            "ratio_vs_box": self.remora_ns / self.box_ns,
            "ratio_vs_slice": self.remora_ns / self.slice_ns,
            "goal_ratio_vs_box": GOAL_LOCAL_RATIO,
            "timed_ops_per_side": self.ops,
            "remora_voluntary_cs": self.remora_cs.voluntary,
            "remora_involuntary_cs": self.remora_cs.involuntary,
            "remora_voluntary_cs_per_op": rv,
            "remora_involuntary_cs_per_op": ri,
            "box_voluntary_cs_per_op": bv,
            "box_involuntary_cs_per_op": bi,
        })
    }
}

/// One row of the swap-in comparison.
struct SwapRow {
    layout: SpanLayout,
    swap: Histogram<u64>,
    raw: Histogram<u64>,
    /// Context switches during the timed swap-ins that were kept.
    swap_cs: Switches,
    /// Context switches during the timed raw READs.
    raw_cs: Switches,
    discarded: u64,
    errors: u64,
    rounds: u64,
}

impl SwapRow {
    fn us(h: &Histogram<u64>, q: f64) -> f64 {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(q) as f64 / 1000.0
        }
    }

    fn ratio(&self, q: f64) -> f64 {
        Self::us(&self.swap, q) / Self::us(&self.raw, q).max(1e-9)
    }

    /// (voluntary, involuntary) context switches per swap-in and per raw READ.
    fn switches(&self) -> ((f64, f64), (f64, f64)) {
        (self.swap_cs.per_op(self.swap.len()), self.raw_cs.per_op(self.raw.len()))
    }

    fn to_json(&self) -> Value {
        let l = &self.layout;
        let ((sv, si), (rv, ri)) = self.switches();
        json!({
            "object_size": l.object_size,
            "slot_bytes": l.slot_bytes,
            "span_bytes": l.span_bytes,
            "objects_per_span": l.objects_per_span,
            "swap_in_samples": self.swap.len(),
            "raw_read_samples": self.raw.len(),
            "swap_in_p50_us": Self::us(&self.swap, 0.5),
            "swap_in_p99_us": Self::us(&self.swap, 0.99),
            "swap_in_p999_us": Self::us(&self.swap, 0.999),
            "swap_in_mean_us": self.swap.mean() / 1000.0,
            "raw_read_p50_us": Self::us(&self.raw, 0.5),
            "raw_read_p99_us": Self::us(&self.raw, 0.99),
            "raw_read_p999_us": Self::us(&self.raw, 0.999),
            "raw_read_mean_us": self.raw.mean() / 1000.0,
            "ratio_p50": self.ratio(0.5),
            "ratio_p99": self.ratio(0.99),
            "goal_ratio": GOAL_SWAP_RATIO,
            "swap_in_voluntary_cs": self.swap_cs.voluntary,
            "swap_in_involuntary_cs": self.swap_cs.involuntary,
            "swap_in_voluntary_cs_per_op": sv,
            "swap_in_involuntary_cs_per_op": si,
            "swap_in_cs_per_op": sv + si,
            "raw_read_voluntary_cs": self.raw_cs.voluntary,
            "raw_read_involuntary_cs": self.raw_cs.involuntary,
            "raw_read_voluntary_cs_per_op": rv,
            "raw_read_involuntary_cs_per_op": ri,
            "raw_read_cs_per_op": rv + ri,
            "discarded": self.discarded,
            "errors": self.errors,
            "rounds": self.rounds,
        })
    }
}

/// Runs the benchmark; see the module docs.
pub fn run(args: &RuntimeArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let started = Instant::now();
    let binary = std::env::current_exe().context("locating the remora binary")?;
    let mut cfg = ClusterConfig::new(&binary);
    cfg.memnodes = args.memnodes as usize;
    cfg.managers = args.managers as usize;
    cfg.region_size = REGION_SIZE;
    // Each size's run keeps at most one round of spans far, plus the raw region.
    let largest = args.swap_sizes.iter().map(|s| s.0).max().unwrap_or(0);
    let far = SpanLayout::for_object(usize::try_from(largest)?).span_bytes as u64 * args.round;
    cfg.capacity = (far.div_ceil(REGION_SIZE) + 4) * REGION_SIZE;
    cfg.log_level = "warn".into();
    cfg.heartbeat_timeout = Duration::from_secs(5);
    progress(format_args!(
        "starting a local cluster: manager + {} memory node(s)",
        args.memnodes
    ));
    let cluster = LocalCluster::start(cfg).context("starting the local cluster")?;
    let cpus = match args.pin {
        Pin::Split => {
            let (me, servers) = two_cpus()?;
            for m in cluster.memnodes() {
                pin_process(m.pid, servers)?;
            }
            // Threads started from here on (runtime, connections) inherit this.
            pin::pin_current(me).context("pinning the benchmark thread")?;
            Some((me, servers))
        }
        Pin::None => None,
    };

    let local = if args.no_local {
        Vec::new()
    } else {
        local_hits(args, &cluster)?
    };
    let mut swaps = Vec::new();
    if !args.no_swap {
        let session = ComputeSession::open(cluster.manager_addr(), "bench-runtime-raw", cluster.conn_options())
            .context("registering the raw-READ session")?;
        let grant = session
            .alloc(1, false, &[])?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("the manager granted no region"))?;
        let client = MemNodeClient::connect(&grant.addr, cluster.conn_options())
            .with_context(|| format!("connecting to {}", grant.addr))?;
        let raw = RawRead {
            client,
            cap: grant.cap,
            pages: grant.size / PAGE_SIZE as u64,
        };
        for s in &args.swap_sizes {
            let row = match s.0 {
                64 => swap_ins::<8>(args, &cluster, &raw),
                128 => swap_ins::<16>(args, &cluster, &raw),
                256 => swap_ins::<32>(args, &cluster, &raw),
                512 => swap_ins::<64>(args, &cluster, &raw),
                1024 => swap_ins::<128>(args, &cluster, &raw),
                2048 => swap_ins::<256>(args, &cluster, &raw),
                4096 => swap_ins::<512>(args, &cluster, &raw),
                8192 => swap_ins::<1024>(args, &cluster, &raw),
                16384 => swap_ins::<2048>(args, &cluster, &raw),
                32768 => swap_ins::<4096>(args, &cluster, &raw),
                65536 => swap_ins::<8192>(args, &cluster, &raw),
                other => Err(anyhow!("unsupported size {other}")),
            }
            .with_context(|| format!("swap-in comparison at {s}"))?;
            swaps.push(row);
        }
    }
    drop(cluster);

    print_report(args, cpus, &local, &swaps, started.elapsed());
    if let Some(path) = &args.json {
        let v = json!({
            "memnodes": args.memnodes,
            "pinned": cpus.map(|(me, servers)| json!({ "bench_cpu": me, "memnode_cpu": servers })),
            "local_hit": local.iter().map(|r| r.to_json(args.passes)).collect::<Vec<_>>(),
            "swap_in": swaps.iter().map(SwapRow::to_json).collect::<Vec<_>>(),
            "closed_loop": true,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        progress(format_args!("results written to {}", path.display()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Local hits.

/// Sums `rems` (in `order`, or sequentially) inside one scope.
#[inline(never)]
fn pass_remora(rt: &Runtime, rems: &[RemBox<u64>], order: Option<&[u32]>) -> anyhow::Result<(u64, Duration)> {
    let scope = rt.scope();
    let t0 = Instant::now();
    let mut sum = 0u64;
    match order {
        None => {
            for b in black_box(rems) {
                sum = sum.wrapping_add(*black_box(b.deref(&scope)?));
            }
        }
        Some(o) => {
            for &i in black_box(o) {
                sum = sum.wrapping_add(*black_box(rems[i as usize].deref(&scope)?));
            }
        }
    }
    Ok((black_box(sum), t0.elapsed()))
}

/// The same over `Box`es.
#[inline(never)]
fn pass_box(boxes: &[Box<u64>], order: Option<&[u32]>) -> (u64, Duration) {
    let t0 = Instant::now();
    let mut sum = 0u64;
    match order {
        None => {
            for b in black_box(boxes) {
                sum = sum.wrapping_add(*black_box(&**b));
            }
        }
        Some(o) => {
            for &i in black_box(o) {
                sum = sum.wrapping_add(*black_box(&*boxes[i as usize]));
            }
        }
    }
    (black_box(sum), t0.elapsed())
}

/// The same over a plain slice.
#[inline(never)]
fn pass_slice(values: &[u64], order: Option<&[u32]>) -> (u64, Duration) {
    let t0 = Instant::now();
    let mut sum = 0u64;
    match order {
        None => {
            for v in black_box(values) {
                sum = sum.wrapping_add(*black_box(v));
            }
        }
        Some(o) => {
            for &i in black_box(o) {
                sum = sum.wrapping_add(*black_box(&values[i as usize]));
            }
        }
    }
    (black_box(sum), t0.elapsed())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn local_hits(args: &RuntimeArgs, cluster: &LocalCluster) -> anyhow::Result<Vec<LocalRow>> {
    let most = args.objects.iter().copied().max().unwrap_or(0);
    // 16-byte slots for u64 objects; twice that, so nothing is ever evicted.
    let budget = usize::try_from(most.saturating_mul(32))? + (64 << 20);
    let mut cfg = RuntimeConfig::new(cluster.manager_addr(), budget);
    cfg.conn = cluster.conn_options();
    cfg.name = "bench-runtime-local".into();
    let rt = Runtime::connect(cfg).context("connecting the runtime")?;
    let mut rows = Vec::new();
    for &n in &args.objects {
        progress(format_args!(
            "local hits: {n} objects, {} passes per side and order",
            args.passes
        ));
        let rems = (0..n)
            .map(|i| rt.alloc(i))
            .collect::<Result<Vec<RemBox<u64>>, _>>()
            .context("allocating objects")?;
        let boxes: Vec<Box<u64>> = (0..n).map(Box::new).collect();
        let values: Vec<u64> = (0..n).collect();
        let far = rems.iter().filter(|b| !b.is_local()).count();
        if far > 0 {
            bail!("{far} of {n} objects are not local although the budget holds them all");
        }
        let mut perm: Vec<u32> = (0..n as u32).collect();
        perm.shuffle(&mut SmallRng::seed_from_u64(n));
        let expect = (0..n).fold(0u64, u64::wrapping_add);
        let before = rt.stats().traffic.swap_ins;
        for (order_name, order) in [("sequential", None), ("random", Some(perm.as_slice()))] {
            // One untimed pass each (warms caches, sets hotness bits).
            pass_remora(&rt, &rems, order)?;
            pass_box(&boxes, order);
            pass_slice(&values, order);
            let (mut r, mut b, mut s) = (Vec::new(), Vec::new(), Vec::new());
            let (mut remora_cs, mut box_cs) = (Switches::default(), Switches::default());
            for p in 0..args.passes {
                // Rotate which side goes first.
                for k in 0..3 {
                    let (sum, d, out) = match (p + k) % 3 {
                        0 => {
                            let cs = Switches::now();
                            let (sum, d) = pass_remora(&rt, &rems, order)?;
                            remora_cs.add_since(cs);
                            (sum, d, &mut r)
                        }
                        1 => {
                            let cs = Switches::now();
                            let (sum, d) = pass_box(&boxes, order);
                            box_cs.add_since(cs);
                            (sum, d, &mut b)
                        }
                        _ => {
                            let (sum, d) = pass_slice(&values, order);
                            (sum, d, &mut s)
                        }
                    };
                    if sum != expect {
                        bail!("a {order_name} pass summed to {sum}, expected {expect}");
                    }
                    out.push(d.as_nanos() as f64 / n as f64);
                }
            }
            rows.push(LocalRow {
                objects: n,
                order: order_name,
                remora_ns: median(r),
                box_ns: median(b),
                slice_ns: median(s),
                remora_cs,
                box_cs,
                ops: n * u64::from(args.passes),
            });
        }
        let swapped = rt.stats().traffic.swap_ins - before;
        if swapped > 0 {
            bail!("{swapped} swap-ins during the local-hit passes: objects were not all local");
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------
// Swap-ins.

/// The raw-READ baseline: a region of its own on the same cluster.
struct RawRead {
    client: MemNodeClient,
    cap: remora_proto::Cap,
    pages: u64,
}

fn new_hist() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000_000, 3)?)
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1));
}

fn swap_ins<const W: usize>(args: &RuntimeArgs, cluster: &LocalCluster, raw: &RawRead) -> anyhow::Result<SwapRow> {
    let layout = SpanLayout::for_object(W * 8);
    let spans = args.round;
    let n = spans * layout.objects_per_span as u64;
    let data = layout.bytes_for(n);
    let big = usize::try_from(data * 2)? + (64 << 20);
    let span_pages = (layout.span_bytes / PAGE_SIZE) as u64;
    if raw.pages < span_pages {
        bail!("the raw region is smaller than a span");
    }
    progress(format_args!(
        "swap-ins: {} objects ({} per {} span), {} spans per round, {} samples",
        ByteSize(W as u64 * 8),
        layout.objects_per_span,
        ByteSize(layout.span_bytes as u64),
        spans,
        args.samples
    ));
    let mut cfg = RuntimeConfig::new(cluster.manager_addr(), big);
    cfg.conn = cluster.conn_options();
    cfg.name = "bench-runtime-swap".into();
    let rt = Runtime::connect(cfg).context("connecting the runtime")?;
    let mut objs = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut v = [0u64; W];
        fill(&mut v, base(i, 0));
        objs.push(rt.alloc(v).with_context(|| format!("allocating object {i}"))?);
    }
    let mut row = SwapRow {
        layout,
        swap: new_hist()?,
        raw: new_hist()?,
        swap_cs: Switches::default(),
        raw_cs: Switches::default(),
        discarded: 0,
        errors: 0,
        rounds: 0,
    };
    let mut buf = vec![0u8; layout.span_bytes];
    let mut rng = SmallRng::seed_from_u64(W as u64);
    let mut k = 0u64;
    while row.swap.len() < args.samples {
        row.rounds += 1;
        if row.rounds > 4 * args.samples.div_ceil(spans) + 4 {
            bail!(
                "only {} of {} swap-in samples after {} rounds ({} discarded)",
                row.swap.len(),
                args.samples,
                row.rounds - 1,
                row.discarded
            );
        }
        // Everything far, then room again so no eviction runs while timing.
        rt.set_local_budget(1);
        if let Err(e) = rt.wait_for_eviction(Duration::from_secs(30)) {
            tracing::warn!("eviction did not finish: {e}");
        }
        rt.set_local_budget(big);
        for s in 0..spans {
            if row.swap.len() >= args.samples {
                break;
            }
            let i = s * layout.objects_per_span as u64;
            let b = &objs[i as usize];
            if b.is_local() {
                row.discarded += 1;
                continue;
            }
            let off = rng.random_range(0..=raw.pages - span_pages) * PAGE_SIZE as u64;
            k += 1;
            let raw_first = k % 2 == 0;
            if raw_first {
                let cs = Switches::now();
                let t0 = Instant::now();
                raw.client.read(raw.cap, off, &mut buf).context("raw READ")?;
                record(&mut row.raw, t0.elapsed());
                row.raw_cs.add_since(cs);
            }
            let before = rt.stats().traffic.swap_ins;
            let cs = Switches::now();
            let t0 = Instant::now();
            let scope = rt.scope();
            let r = b.deref(&scope);
            let d = t0.elapsed();
            let mut cs_here = Switches::default();
            cs_here.add_since(cs);
            let ok = match r {
                Ok(o) => check(o, base(i, 0)),
                Err(e) => {
                    tracing::warn!("object {i}: dereference failed: {e}");
                    false
                }
            };
            drop(scope);
            let swapped = rt.stats().traffic.swap_ins - before;
            if !ok {
                row.errors += 1;
            } else if swapped == 1 {
                record(&mut row.swap, d);
                row.swap_cs.voluntary += cs_here.voluntary;
                row.swap_cs.involuntary += cs_here.involuntary;
            } else {
                row.discarded += 1;
            }
            if !raw_first {
                let cs = Switches::now();
                let t0 = Instant::now();
                raw.client.read(raw.cap, off, &mut buf).context("raw READ")?;
                record(&mut row.raw, t0.elapsed());
                row.raw_cs.add_since(cs);
            }
        }
    }
    if row.errors > 0 {
        bail!("{} dereferences failed or returned wrong bytes", row.errors);
    }
    drop(objs);
    drop(rt);
    Ok(row)
}

/// A small per-op rate: `0`, or `7.8e-7`.
fn tiny(x: f64) -> String {
    if x == 0.0 { "0".to_string() } else { format!("{x:.1e}") }
}

fn print_report(
    args: &RuntimeArgs,
    cpus: Option<(usize, usize)>,
    local: &[LocalRow],
    swaps: &[SwapRow],
    elapsed: Duration,
) {
    println!("remora bench runtime ({:.1} s)", elapsed.as_secs_f64());
    match cpus {
        Some((me, servers)) => println!("  pinned: benchmark on CPU {me}, memory nodes on CPU {servers}"),
        None => println!("  not pinned"),
    }
    if !local.is_empty() {
        println!();
        println!(
            "local-hit dereference vs plain references: u64 objects, sum in one scope, median of {} passes",
            args.passes
        );
        println!(
            "{:>10} {:>11} {:>10} {:>10} {:>10} {:>11} {:>11} {:>12} {:>12}",
            "objects", "order", "remora ns", "Box ns", "slice ns", "vs Box", "vs slice", "cs/op vol", "cs/op invol"
        );
        for r in local {
            let (v, i) = r.remora_cs.per_op(r.ops);
            println!(
                "{:>10} {:>11} {:>10.2} {:>10.2} {:>10.2} {:>10.2}x {:>10.2}x {:>12} {:>12}",
                r.objects,
                r.order,
                r.remora_ns,
                r.box_ns,
                r.slice_ns,
                r.remora_ns / r.box_ns,
                r.remora_ns / r.slice_ns,
                tiny(v),
                tiny(i)
            );
        }
        println!("  goal: remora / Box <= {GOAL_LOCAL_RATIO}x");
        for r in local {
            let (bv, bi) = r.box_cs.per_op(r.ops);
            println!(
                "  {} {}: {} voluntary + {} involuntary context switches of this process over {} remora \
                 dereferences (Box passes: {} + {} per op)",
                r.objects,
                r.order,
                r.remora_cs.voluntary,
                r.remora_cs.involuntary,
                r.ops,
                tiny(bv),
                tiny(bi)
            );
        }
    }
    if !swaps.is_empty() {
        println!();
        println!(
            "span swap-in vs raw READ of the span's bytes ({} memory node(s), one request in flight)",
            args.memnodes
        );
        println!(
            "{:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>11} {:>11} {:>9}",
            "object",
            "span",
            "samples",
            "swin p50",
            "swin p99",
            "READ p50",
            "READ p99",
            "READ n",
            "p50 x",
            "p99 x",
            "swin cs/op",
            "READ cs/op",
            "discarded"
        );
        for r in swaps {
            let ((sv, si), (rv, ri)) = r.switches();
            println!(
                "{:>8} {:>8} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9} {:>7.2}x {:>7.2}x {:>11.2} {:>11.2} {:>9}",
                ByteSize(r.layout.object_size as u64).to_string(),
                ByteSize(r.layout.span_bytes as u64).to_string(),
                r.swap.len(),
                SwapRow::us(&r.swap, 0.5),
                SwapRow::us(&r.swap, 0.99),
                SwapRow::us(&r.raw, 0.5),
                SwapRow::us(&r.raw, 0.99),
                r.raw.len(),
                r.ratio(0.5),
                r.ratio(0.99),
                sv + si,
                rv + ri,
                r.discarded
            );
        }
        println!("  latencies in µs; goal: swap-in / READ <= {GOAL_SWAP_RATIO}x at p50 and p99");
        println!(
            "  cs/op: context switches of this process (all threads) per timed operation, voluntary + involuntary:"
        );
        for r in swaps {
            let ((sv, si), (rv, ri)) = r.switches();
            println!(
                "  {}: swap-in {sv:.2} voluntary + {si:.2} involuntary; raw READ {rv:.2} + {ri:.2}; \
                 {:+.2} per swap-in beyond a READ",
                ByteSize(r.layout.object_size as u64),
                (sv + si) - (rv + ri)
            );
        }
    }
}
