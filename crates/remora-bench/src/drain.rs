//! `remora bench drain`: how fast eviction drains local memory.
//!
//! For each `--scheme`, one after another on one local cluster of
//! [`MEMNODES`] memory nodes, the benchmark connects a fresh runtime and:
//!
//! 1. **Fill.** Allocates `--fill` bytes of objects of `--object-size` (object
//!    `i` holds words derived from `i`, as in `remora bench micro`) from
//!    `--threads` threads, under a local budget large enough that nothing is
//!    evicted (the span bytes of the fill plus an eighth, at least 64 MiB).
//! 2. **Drain.** Starts a clock, lowers the budget with
//!    [`Runtime::set_local_budget`] to `--to` of the local bytes the fill
//!    left, and waits with [`Runtime::wait_for_eviction`] until local memory
//!    is at or below the runtime's low watermark of the new budget and no
//!    eviction round is under way; then stops the clock. Meanwhile a sampler
//!    thread reads `Stats::local.bytes` every 10 ms: the drain curve, whose
//!    50 % and 90 % times (of the bytes the drain removed, interpolated
//!    between samples) are reported beside the total.
//! 3. **Verify.** Dereferences every object inside a deref scope (swapping
//!    its span back in) and compares every word with what was written.
//!
//! The drain rate is `Stats::traffic.bytes_evicted_data` (whole data spans swapped
//! out) over the drain time; write amplification is
//! `Stats::traffic.bytes_written_remote` over the same bytes (1.0 for `non-ft`, 1.5
//! for RS(4,2) under `ec-batch`). Nothing else runs during the drain, so it
//! measures the eviction path alone: span selection, the grace period, the
//! remote writes (and encoding), and freeing local spans.
//!
//! Objects that fail to verify, dereferences that return an error, or a drain
//! that does not finish within `--timeout` make the command fail (after the
//! report is printed and the JSON written).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use remora_cluster::LocalCluster;
use remora_proto::{ByteSize, parse_duration};
use remora_runtime::{RemBox, Runtime, RuntimeConfig, Stats};
use serde_json::{Value, json};

use crate::micro::{MEMNODES, SpanLayout, base, check};

/// Region size of the benchmark's memory nodes.
/// How often the drain curve is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// Stack of the fill and verify threads (objects up to 64 KiB are built on it).
const STACK: usize = 8 << 20;
/// Bad objects logged before the rest are only counted.
const LOG_ERRORS: u64 = 5;
/// Decimal gigabyte, the unit of the drain rates.
const GB: f64 = 1e9;

/// Flags of `remora bench drain`.
#[derive(Debug, Clone, clap::Args)]
pub struct DrainArgs {
    /// Fault-tolerance schemes to run, one after another (repeat the flag or separate with commas).
    #[arg(long = "scheme", value_delimiter = ',', default_value = "non-ft,ec-batch")]
    pub schemes: Vec<String>,
    /// Bytes of objects to fill (object values; their spans take a little more).
    #[arg(long, default_value = "512MiB")]
    pub fill: ByteSize,
    /// Size of each object (64B, 128B, ..., 64KiB: powers of two).
    #[arg(long, default_value = "4KiB")]
    pub object_size: ByteSize,
    /// Lower the local budget to this fraction of the local bytes the fill left (0 < x < 1).
    #[arg(long, default_value_t = 0.1)]
    pub to: f64,
    /// Threads allocating the objects (and verifying them afterwards).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// Give up on a drain that has not reached the low watermark after this long.
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Eviction threads of the runtime (default: the runtime's default).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub eviction_threads: Option<u32>,
    /// Spans per eviction batch (default: the runtime's default).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub eviction_batch: Option<u32>,
    /// Managers in the local cluster; more than one run as a Raft group (3 survive losing one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub managers: u32,
    /// Also write the results as JSON (`{"results":[...]}`, one record per scheme) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The parameters every scheme's run shares.
struct Plan {
    n: u64,
    layout: SpanLayout,
    /// Span bytes the objects take when packed.
    span_bytes: u64,
    /// Local budget during the fill.
    fill_budget: u64,
}

/// What one scheme's run measured.
struct Record {
    scheme: String,
    /// Drain goal in GB/s, for the schemes that have one.
    goal_gbps: Option<f64>,
    eviction_threads: usize,
    eviction_batch: usize,
    fill_time: Duration,
    /// Spans swapped out during the fill (should be none).
    fill_swap_outs: u64,
    /// Budget the drain lowered to, and the low watermark it waited for.
    target: u64,
    low_mark: u64,
    local_before: u64,
    local_after: u64,
    drain_time: Duration,
    /// The drain did not reach the low watermark within `--timeout`.
    timed_out: bool,
    /// Counter deltas over the drain.
    delta: Stats,
    /// Drain curve: (seconds since the clock started, local bytes).
    curve: Vec<(f64, u64)>,
    verified: u64,
    wrong: u64,
    errors: u64,
    verify_time: Duration,
}

impl Record {
    fn drained_local(&self) -> u64 {
        self.local_before.saturating_sub(self.local_after)
    }

    fn secs(&self) -> f64 {
        self.drain_time.as_secs_f64().max(1e-9)
    }

    /// Data bytes swapped out per second, in GB/s.
    fn gbps(&self) -> f64 {
        self.delta.traffic.bytes_evicted_data as f64 / self.secs() / GB
    }

    fn mibps(&self) -> f64 {
        mib(self.delta.traffic.bytes_evicted_data as f64) / self.secs()
    }

    /// Remote bytes written per data byte swapped out.
    fn write_amp(&self) -> Option<f64> {
        (self.delta.traffic.bytes_evicted_data > 0)
            .then(|| self.delta.traffic.bytes_written_remote as f64 / self.delta.traffic.bytes_evicted_data as f64)
    }

    /// Fraction of the drain the eviction threads reported busy (summed over threads).
    fn busy_fraction(&self) -> Option<f64> {
        (self.delta.local.evict_busy_ns > 0).then(|| self.delta.local.evict_busy_ns as f64 / 1e9 / self.secs())
    }

    fn goal_met(&self) -> Option<bool> {
        self.goal_gbps.map(|g| self.gbps() >= g)
    }

    fn failed(&self) -> bool {
        self.timed_out || self.wrong > 0 || self.errors > 0
    }

    fn to_json(&self, args: &DrainArgs, plan: &Plan) -> Value {
        let d = &self.delta;
        let mut v = json!({
            "scheme": self.scheme,
            "objects": plan.n,
            "object_size": plan.layout.object_size,
            "slot_bytes": plan.layout.slot_bytes,
            "span_bytes": plan.layout.span_bytes,
            "objects_per_span": plan.layout.objects_per_span,
            "fill_bytes": args.fill.0,
            "fill_span_bytes": plan.span_bytes,
            "fill_budget_bytes": plan.fill_budget,
            "fill_threads": args.threads,
            "fill_s": self.fill_time.as_secs_f64(),
            "fill_swap_outs": self.fill_swap_outs,
            "to": args.to,
            "target_budget_bytes": self.target,
            "low_watermark_bytes": self.low_mark,
            "eviction_threads": self.eviction_threads,
            "eviction_batch": self.eviction_batch,
            "memnodes": MEMNODES,
        });
        let measured = json!({
            "local_bytes_before": self.local_before,
            "local_bytes_after": self.local_after,
            "drained_local_bytes": self.drained_local(),
            "drained_data_bytes": d.traffic.bytes_evicted_data,
            "drain_s": self.drain_time.as_secs_f64(),
            "timed_out": self.timed_out,
            "drain_gbps": self.gbps(),
            "drain_mibps": self.mibps(),
            "goal_gbps": self.goal_gbps,
            "goal_met": self.goal_met(),
            "write_amplification": self.write_amp(),
            "evict_busy_fraction": self.busy_fraction(),
            "t50_s": curve_time(&self.curve, 0.5),
            "t90_s": curve_time(&self.curve, 0.9),
            "curve_samples": self.curve.len(),
            "curve_interval_ms": SAMPLE_EVERY.as_millis() as u64,
            "verified": self.verified,
            "wrong": self.wrong,
            "errors": self.errors,
            "verify_s": self.verify_time.as_secs_f64(),
            // The runtime's own figures over the drain: counters the drain's,
            // levels as at its end.
            "stats": d,
        });
        if let (Value::Object(m), Value::Object(o)) = (&mut v, measured) {
            m.extend(o);
        }
        v
    }
}

/// The drain goal of a scheme, in GB/s.
fn goal(scheme: &str) -> Option<f64> {
    match scheme {
        "non-ft" => Some(1.0),
        "ec-batch" | "ec-batch-local" => Some(0.8),
        _ => None,
    }
}

/// Seconds after the start at which a drain curve had removed `frac` of the
/// bytes it removed in all, interpolated linearly between samples; `None`
/// when it removed nothing.
fn curve_time(curve: &[(f64, u64)], frac: f64) -> Option<f64> {
    let (&(_, first), &(_, last)) = (curve.first()?, curve.last()?);
    let total = first.checked_sub(last).filter(|&t| t > 0)? as f64;
    let want = frac * total;
    let mut prev = curve[0];
    for &(t, local) in curve {
        let done = first.saturating_sub(local) as f64;
        if done >= want {
            let prev_done = first.saturating_sub(prev.1) as f64;
            if done <= prev_done {
                return Some(t);
            }
            return Some(prev.0 + (t - prev.0) * (want - prev_done) / (done - prev_done));
        }
        prev = (t, local);
    }
    None
}

/// Runs the benchmark; see the module docs.
pub fn run(args: &DrainArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let layout = SpanLayout::for_object(usize::try_from(args.object_size.0)?);
    let n = args.fill.0 / args.object_size.0;
    let span_bytes = layout.bytes_for(n);
    let plan = Plan {
        n,
        layout,
        span_bytes,
        fill_budget: span_bytes + (span_bytes / 8).max(64 << 20),
    };

    // Far memory for every scheme's run, with room for the 1.5x of RS(4,2)
    // and for the holes verification leaves behind.
    let cluster = crate::micro::start_cluster(span_bytes, args.schemes.len() as u64, args.managers as usize)?;

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
        records.push(r);
    }
    drop(cluster);

    print_report(args, &plan, &records);
    if let Some(path) = &args.json {
        let v = json!({
            "results": records.iter().map(|r| r.to_json(args, &plan)).collect::<Vec<_>>(),
            "ec_batch_over_non_ft": ratio(&records, "ec-batch", "non-ft"),
        });
        let text = serde_json::to_string_pretty(&v)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        progress(format_args!("results written to {}", path.display()));
    }
    let failed: Vec<&str> = records
        .iter()
        .filter(|r| r.failed())
        .map(|r| r.scheme.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "{}: objects failed to verify or the drain timed out (see above)",
            failed.join(", ")
        );
    }
    Ok(())
}

/// Drain rate of scheme `a` over that of scheme `b`, when both ran.
fn ratio(records: &[Record], a: &str, b: &str) -> Option<f64> {
    let rate = |s: &str| records.iter().find(|r| r.scheme == s).map(Record::gbps);
    match (rate(a), rate(b)) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    }
}

fn check_args(args: &DrainArgs) -> anyhow::Result<()> {
    crate::micro::check_object_size(args.object_size)?;
    if args.fill.0 < args.object_size.0 {
        bail!(
            "--fill {} is smaller than one object of {}",
            args.fill,
            args.object_size
        );
    }
    if args.fill.0 / args.object_size.0 > u64::from(u32::MAX) {
        bail!("--fill {} makes more than 2^32 objects", args.fill);
    }
    if !(args.to.is_finite() && args.to > 0.0 && args.to < 1.0) {
        bail!(
            "--to must be a fraction between 0 and 1 (exclusive) of the filled local memory, got {}",
            args.to
        );
    }
    if args.timeout.is_zero() {
        bail!("--timeout must be positive");
    }
    if args.schemes.is_empty() {
        bail!("--scheme needs at least one scheme");
    }
    for s in &args.schemes {
        if remora_runtime::scheme::by_name(s).is_none() {
            bail!("unknown scheme {s:?} (known: non-ft, ec-batch)");
        }
    }
    Ok(())
}

fn progress(msg: std::fmt::Arguments<'_>) {
    eprintln!("[bench drain] {msg}");
}

fn bar(len: u64, prefix: &'static str) -> ProgressBar {
    let style = ProgressStyle::with_template("{prefix:>6} [{bar:30}] {pos}/{len} objects ({per_sec}, eta {eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    ProgressBar::new(len).with_style(style).with_prefix(prefix)
}

/// `0..n` split into `parts` contiguous ranges.
fn split(n: u64, parts: u64) -> Vec<std::ops::Range<u64>> {
    let chunk = n.div_ceil(parts);
    (0..parts)
        .map(|t| (t * chunk).min(n)..((t + 1) * chunk).min(n))
        .collect()
}

fn run_scheme<const W: usize>(
    args: &DrainArgs,
    plan: &Plan,
    cluster: &LocalCluster,
    scheme: &str,
) -> anyhow::Result<Record> {
    let mut cfg = RuntimeConfig::new(cluster.manager_addr(), usize::try_from(plan.fill_budget)?);
    cfg.conn = cluster.conn_options();
    cfg.name = format!("bench-drain-{scheme}");
    cfg.scheme = remora_runtime::scheme::by_name(scheme).ok_or_else(|| anyhow!("unknown scheme {scheme:?}"))?;
    if let Some(t) = args.eviction_threads {
        cfg.tuning.eviction_threads = t as usize;
    }
    if let Some(b) = args.eviction_batch {
        cfg.tuning.eviction_batch = b as usize;
    }
    let (low, eviction_threads, eviction_batch) = (
        cfg.tuning.low_watermark,
        cfg.tuning.eviction_threads,
        cfg.tuning.eviction_batch,
    );
    let rt = Runtime::connect(cfg).context("connecting the runtime")?;

    // Fill.
    let n = plan.n;
    progress(format_args!(
        "[{scheme}] filling {n} objects of {} ({} of spans; local budget {})",
        args.object_size,
        Mib(plan.span_bytes),
        Mib(plan.fill_budget)
    ));
    let pb = bar(n, "fill");
    let s_fill = rt.stats();
    let fill_start = Instant::now();
    let objects: Vec<RemBox<[u64; W]>> =
        crate::micro::alloc_parallel(&rt, n, u64::from(args.threads), "drain-fill", &pb, |b| b)?;
    let fill_time = fill_start.elapsed();
    pb.finish_and_clear();
    let s0 = rt.stats();
    let fill_swap_outs = s0.traffic.swap_outs - s_fill.traffic.swap_outs;
    if fill_swap_outs > 0 {
        tracing::warn!("{fill_swap_outs} spans were evicted during the fill: the drain starts from less");
    }
    progress(format_args!(
        "[{scheme}] filled in {:.2} s: {} local, {fill_swap_outs} swap-outs",
        fill_time.as_secs_f64(),
        Mib(s0.local.bytes)
    ));

    // Drain: a budget of `--to` of what the fill left (at least 16 spans, so
    // verification has room to swap in), timed until the low watermark.
    let floor = 16 * plan.layout.span_bytes as u64;
    let target = ((args.to * s0.local.bytes as f64) as u64).max(floor);
    let low_mark = (target as f64 * low) as u64;
    progress(format_args!(
        "[{scheme}] draining {} local to a budget of {} (low watermark {})",
        Mib(s0.local.bytes),
        Mib(target),
        Mib(low_mark)
    ));
    let done = AtomicBool::new(false);
    let (waited, drain_time, mut curve) = thread::scope(|s| {
        let t0 = Instant::now();
        let (rt, done, local0) = (&rt, &done, s0.local.bytes);
        let sampler = thread::Builder::new()
            .name("drain-sampler".into())
            .spawn_scoped(s, move || {
                let mut curve = vec![(0.0, local0)];
                let mut next = t0 + SAMPLE_EVERY;
                while !done.load(Ordering::Acquire) {
                    thread::sleep(next.saturating_duration_since(Instant::now()));
                    next += SAMPLE_EVERY;
                    let local = rt.stats().local.bytes;
                    curve.push((t0.elapsed().as_secs_f64(), local));
                }
                curve
            });
        rt.set_local_budget(usize::try_from(target).unwrap_or(usize::MAX));
        let waited = rt.wait_for_eviction(args.timeout);
        let drain_time = t0.elapsed();
        done.store(true, Ordering::Release);
        let curve = match sampler {
            Ok(h) => h.join().unwrap_or_default(),
            Err(e) => {
                tracing::warn!("cannot start the sampler thread ({e}): no drain curve");
                Vec::new()
            }
        };
        (waited, drain_time, curve)
    });
    let s1 = rt.stats();
    // Samples taken after the clock stopped belong to no drain.
    curve.retain(|&(t, _)| t < drain_time.as_secs_f64());
    curve.push((drain_time.as_secs_f64(), s1.local.bytes));
    let timed_out = match waited {
        Ok(()) => false,
        Err(e) => {
            tracing::warn!("[{scheme}] drain did not finish: {e}");
            true
        }
    };
    let delta = s1.since(&s0);
    progress(format_args!(
        "[{scheme}] drained {} of data in {:.3} s ({:.0} MiB/s); {} local now",
        Mib(delta.traffic.bytes_evicted_data),
        drain_time.as_secs_f64(),
        mib(delta.traffic.bytes_evicted_data as f64) / drain_time.as_secs_f64().max(1e-9),
        Mib(s1.local.bytes)
    ));

    // Verify every object.
    let pb = bar(n, "verify");
    let verify_start = Instant::now();
    let logged = AtomicU64::new(0);
    let counts: Vec<(u64, u64, u64)> = thread::scope(|s| {
        let handles: Vec<_> = split(n, u64::from(args.threads))
            .into_iter()
            .enumerate()
            .map(|(t, range)| {
                let (rt, pb, objects, logged) = (&rt, &pb, &objects, &logged);
                thread::Builder::new()
                    .name(format!("drain-verify-{t}"))
                    .stack_size(STACK)
                    .spawn_scoped(s, move || {
                        let (mut ok, mut wrong, mut errors) = (0u64, 0u64, 0u64);
                        for i in range {
                            let scope = rt.scope();
                            match objects[i as usize].deref(&scope) {
                                Ok(o) if check(o, base(i, 0)) => ok += 1,
                                Ok(_) => {
                                    wrong += 1;
                                    if logged.fetch_add(1, Ordering::Relaxed) < LOG_ERRORS {
                                        tracing::warn!("[{scheme}] object {i}: bytes differ from what was written");
                                    }
                                }
                                Err(e) => {
                                    errors += 1;
                                    if logged.fetch_add(1, Ordering::Relaxed) < LOG_ERRORS {
                                        tracing::warn!("[{scheme}] object {i}: {e}");
                                    }
                                }
                            }
                            if i % 1024 == 1023 {
                                pb.inc(1024);
                            }
                        }
                        (ok, wrong, errors)
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    tracing::warn!("[{scheme}] a verify thread panicked");
                    (0, 0, 1)
                }),
                Err(e) => {
                    tracing::warn!("[{scheme}] cannot start a verify thread: {e}");
                    (0, 0, 1)
                }
            })
            .collect()
    });
    let verify_time = verify_start.elapsed();
    pb.finish_and_clear();
    let (verified, wrong, mut errors) = counts.iter().fold((0, 0, 0), |a, c| (a.0 + c.0, a.1 + c.1, a.2 + c.2));
    // Objects a failed thread never got to count as errors too.
    errors += n.saturating_sub(verified + wrong + errors);
    progress(format_args!(
        "[{scheme}] verified {verified} of {n} objects in {:.2} s ({wrong} wrong, {errors} errors)",
        verify_time.as_secs_f64()
    ));

    // Free the objects (and their far copies) before the runtime goes.
    drop(objects);
    drop(rt);
    Ok(Record {
        scheme: scheme.to_string(),
        goal_gbps: goal(scheme),
        eviction_threads,
        eviction_batch,
        fill_time,
        fill_swap_outs,
        target,
        low_mark,
        local_before: s0.local.bytes,
        local_after: s1.local.bytes,
        drain_time,
        timed_out,
        delta,
        curve,
        verified,
        wrong,
        errors,
        verify_time,
    })
}

/// Bytes shown in MiB with one decimal (`614.4 MiB`).
struct Mib(u64);

impl std::fmt::Display for Mib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} MiB", mib(self.0 as f64))
    }
}

fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"))
}

fn print_report(args: &DrainArgs, plan: &Plan, records: &[Record]) {
    let l = &plan.layout;
    println!("remora bench drain");
    println!(
        "  fill: {} objects x {} (slot {} B, {} per {} span) = {} of spans from {} threads, local budget {} \
         (nothing evicted)",
        plan.n,
        args.object_size,
        l.slot_bytes,
        l.objects_per_span,
        ByteSize(l.span_bytes as u64),
        Mib(plan.span_bytes),
        args.threads,
        Mib(plan.fill_budget)
    );
    if let Some(r) = records.first() {
        println!(
            "  drain: budget lowered to {} of the filled local bytes ({}), timed until the low watermark ({}); \
             {} eviction thread(s), batches of {} spans; {MEMNODES} memory nodes",
            args.to,
            Mib(r.target),
            Mib(r.low_mark),
            r.eviction_threads,
            r.eviction_batch
        );
    }
    println!();
    println!(
        "{:<10} {:>11} {:>10} {:>8} {:>7} {:>7} {:>14} {:>7} {:>7} {:>7} {:>9} {:>6} {:>9} {:>6} {:>6}",
        "scheme",
        "drained MiB",
        "data MiB",
        "time s",
        "GB/s",
        "MiB/s",
        "goal",
        "t50 s",
        "t90 s",
        "wr amp",
        "swap-outs",
        "busy",
        "verified",
        "wrong",
        "errors"
    );
    for r in records {
        let goal = match (r.goal_gbps, r.goal_met()) {
            (Some(g), Some(true)) => format!(">= {g} met"),
            (Some(g), _) => format!(">= {g} MISSED"),
            _ => "-".to_string(),
        };
        println!(
            "{:<10} {:>11.1} {:>10.1} {:>8.3} {:>7.3} {:>7.0} {:>14} {:>7} {:>7} {:>7} {:>9} {:>6} {:>9} {:>6} {:>6}",
            r.scheme,
            mib(r.drained_local() as f64),
            mib(r.delta.traffic.bytes_evicted_data as f64),
            r.drain_time.as_secs_f64(),
            r.gbps(),
            r.mibps(),
            goal,
            opt(curve_time(&r.curve, 0.5), 3),
            opt(curve_time(&r.curve, 0.9), 3),
            opt(r.write_amp(), 3),
            r.delta.traffic.swap_outs,
            r.busy_fraction()
                .map_or_else(|| "-".to_string(), |f| format!("{:.0}%", f * 100.0)),
            r.verified,
            r.wrong,
            r.errors
        );
    }
    if let Some(x) = ratio(records, "ec-batch", "non-ft") {
        println!("ec-batch/non-ft drain rate: {x:.2}x");
    }
    println!(
        "  GB/s = data spans swapped out (bytes_evicted_data) / drain time, 1 GB = 1e9 B; wr amp = remote bytes \
         written / data bytes (non-ft 1.0, RS(4,2) 1.5); t50/t90 = when the drain curve (local bytes every {} ms) \
         had removed 50 % / 90 % of what it removed; busy = eviction threads' busy time / drain time (- when the \
         runtime does not count it)",
        SAMPLE_EVERY.as_millis()
    );
    for r in records {
        println!(
            "  {}: {} local -> {} in {} swap-outs ({} aborted); fill {:.2} s, verify {:.2} s{}",
            r.scheme,
            Mib(r.local_before),
            Mib(r.local_after),
            r.delta.traffic.swap_outs,
            r.delta.traffic.evictions_aborted,
            r.fill_time.as_secs_f64(),
            r.verify_time.as_secs_f64(),
            if r.fill_swap_outs > 0 {
                format!("; {} spans were evicted during the fill", r.fill_swap_outs)
            } else {
                String::new()
            }
        );
        if r.timed_out {
            println!(
                "  {}: the drain did not reach the low watermark within {:.0} s",
                r.scheme,
                args.timeout.as_secs_f64()
            );
        }
        if r.wrong + r.errors > 0 {
            println!(
                "  {}: {} objects had wrong bytes and {} dereferences failed (see the log)",
                r.scheme, r.wrong, r.errors
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curve_times_interpolate_between_samples() {
        // 100 -> 0 bytes: 50 % gone at 0.5 s (exactly a sample), 90 % between 0.5 s and 1.0 s.
        let curve = [(0.0, 100), (0.5, 50), (1.0, 0)];
        assert_eq!(curve_time(&curve, 0.5), Some(0.5));
        let t90 = curve_time(&curve, 0.9).unwrap();
        assert!((t90 - 0.9).abs() < 1e-9, "{t90}");
        // Flat stretches and nothing drained.
        let t = curve_time(&[(0.0, 100), (0.1, 100), (0.2, 20)], 0.5).unwrap();
        assert!((t - 0.15).abs() < 1e-9, "{t}");
        assert_eq!(curve_time(&[(0.0, 100), (0.1, 100)], 0.5), None);
        assert_eq!(curve_time(&[], 0.5), None);
    }

    #[test]
    fn split_covers_every_index_once() {
        let parts = split(10, 3);
        assert_eq!(parts, vec![0..4, 4..8, 8..10]);
        let parts = split(2, 4);
        assert_eq!(parts.iter().map(|r| r.clone().count()).sum::<usize>(), 2);
    }
}
