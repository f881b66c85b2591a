//! The worker loop of `remora bench micro`, shared by every store it
//! measures (remora's runtime and the Redis baseline): the Zipf draw, the
//! closed and open loops, the warm-up and measured phases, the sampling of
//! the store's levels and the record of the access stream.
//!
//! A store only says how to read and write object `i` (verifying every word
//! against its shadow version) and how to snapshot its counters; everything
//! that decides *which* operations run and *how they are timed* lives here,
//! so every store sees the same operation stream (same permutation, same
//! per-thread seeds, same write ratio) and is timed the same way.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

use super::cache_sim;
use super::open_loop::{Arrivals, Lag1, tight_timer_slack};
use super::{MicroArgs, STACK, bar, progress, splitmix, threads_label};
use crate::net::stats::Latency;

/// How often the store's levels are sampled during the measured phase.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Errors of each kind logged before the rest are only counted.
const LOG_ERRORS: u64 = 5;
/// Operations of the access stream kept per measured run (12 bytes each),
/// split evenly over the threads; past it the simulated caches see a prefix.
const TRACE_CAP: usize = 1 << 24;

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;
/// A worker could not be started: the others stop at once.
const ABORT: u8 = 3;

/// How one operation went.
pub(crate) enum Outcome {
    Ok,
    /// The store returned an error.
    Error(String),
    /// The bytes read differ from the object's current version.
    Wrong {
        index: usize,
        version: u64,
    },
}

/// What the benchmark measures: an array of objects, each readable and
/// writable by index, whose every read is verified by the store.
pub(crate) trait Store: Sync {
    /// A worker thread's own state (a connection, say).
    type Worker;
    /// The store's counters and levels at one instant.
    type Snap: Send;

    /// The state of worker thread `t` (made on that thread).
    fn worker(&self, t: usize) -> anyhow::Result<Self::Worker>;
    /// Reads object `i` and checks every word against its current version.
    fn read(&self, w: &mut Self::Worker, i: usize) -> Outcome;
    /// Reads object `i`, checks it, and rewrites it at the next version.
    fn write(&self, w: &mut Self::Worker, i: usize) -> Outcome;
    /// The counters and levels now (called every [`SAMPLE_EVERY`] while measuring).
    fn snap(&self) -> Self::Snap;
    /// A few words for the progress bar on what happened between two snapshots `secs` apart.
    fn note(&self, s0: &Self::Snap, s: &Self::Snap, secs: f64) -> String;
    /// Process ids of the servers behind the store (memory nodes, Redis
    /// servers), whose CPU time is charged to the run with this process's.
    fn servers(&self) -> Vec<u32>;
    /// Called as the measured phase begins and as it ends, beside the
    /// snapshots, for figures too costly to take every sample.
    fn boundary(&self) {}
}

/// CPU time used so far by this process and `servers`; `None` if any of
/// them cannot be read (no `/proc`, or a server has exited).
fn cpu_time(servers: &[u32]) -> Option<Duration> {
    let mut total = remora_memnode::cpu_time_of("self")?;
    for pid in servers {
        total += remora_memnode::cpu_time_of(&pid.to_string())?;
    }
    Some(total)
}

/// What one measured run counted, whatever the store.
pub(crate) struct Run {
    /// Offered rate of an open-loop run (ops/s in total); `None` for the closed loop.
    pub(crate) offered: Option<f64>,
    /// Measured operations issued (the samples, apart from `unissued`).
    pub(crate) ops: u64,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    /// Operations that completed inside the measured window.
    pub(crate) completed: u64,
    /// Open loop: arrivals scheduled inside the window.
    pub(crate) scheduled: u64,
    /// Open loop: arrivals of the window still unissued when it ended.
    pub(crate) unissued: u64,
    pub(crate) elapsed: Duration,
    pub(crate) lat: Latency,
    /// Open loop: how late a thread woke for an operation it was early for.
    pub(crate) late: Latency,
    pub(crate) lag: Lag1,
    pub(crate) op_errors: u64,
    pub(crate) wrong_bytes: u64,
    /// Object indices of the measured operations in issue order, all threads merged.
    pub(crate) trace: Vec<u32>,
    /// Measured operations left out of `trace` (past [`TRACE_CAP`]).
    pub(crate) trace_dropped: u64,
    /// CPU time this process and the store's servers used in the measured
    /// phase (`None` where `/proc` could not be read): on a saturated
    /// machine, the cost of an operation that contention does not blur.
    pub(crate) cpu: Option<Duration>,
}

impl Run {
    /// Adds a later measured window of the same store at the same load (a
    /// round of [`MicroArgs::rounds`]): counts and times add up, histograms
    /// merge, and the access streams join end to end (up to the trace cap).
    pub(crate) fn append(&mut self, o: Run) -> anyhow::Result<()> {
        self.lat.merge(&o.lat)?;
        self.late.merge(&o.late)?;
        self.lag.merge(&o.lag);
        self.ops += o.ops;
        self.reads += o.reads;
        self.writes += o.writes;
        self.completed += o.completed;
        self.scheduled += o.scheduled;
        self.unissued += o.unissued;
        self.elapsed += o.elapsed;
        self.op_errors += o.op_errors;
        self.wrong_bytes += o.wrong_bytes;
        let room = TRACE_CAP.saturating_sub(self.trace.len()).min(o.trace.len());
        self.trace.extend_from_slice(&o.trace[..room]);
        self.trace_dropped += o.trace_dropped + (o.trace.len() - room) as u64;
        self.cpu = self.cpu.zip(o.cpu).map(|(a, b)| a + b);
        Ok(())
    }

    /// Operations completed per second of the measured phase.
    pub(crate) fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A store's snapshots around and during the measured phase.
pub(crate) struct Snaps<S> {
    /// Just before the measured phase.
    pub(crate) first: S,
    /// Just after it.
    pub(crate) last: S,
    /// Every [`SAMPLE_EVERY`] during it.
    pub(crate) samples: Vec<S>,
    /// When each sample was taken (seconds into the measured phase) and the
    /// operations the workers had completed by then (counted 256 at a time
    /// per thread, so a window's rate is off by at most that much).
    pub(crate) at: Vec<(f64, u64)>,
    /// Operations completed when the measured phase began.
    pub(crate) ops0: u64,
}

/// One window of a measured run: its end (seconds into the measured phase)
/// and the operations per second completed in it.
pub(crate) fn rates<S>(snaps: &Snaps<S>) -> Vec<(f64, f64)> {
    let mut prev = (0.0, snaps.ops0);
    snaps
        .at
        .iter()
        .map(|&(t, ops)| {
            let rate = ops.saturating_sub(prev.1) as f64 / (t - prev.0).max(1e-9);
            prev = (t, ops);
            (t, rate)
        })
        .collect()
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
    /// Issue times (ns since the run's start) of the measured operations.
    trace_t: Vec<u64>,
    /// Their object indices.
    trace_i: Vec<u32>,
    trace_cap: usize,
    trace_dropped: u64,
}

impl WorkerOut {
    fn new(trace_cap: usize) -> anyhow::Result<Self> {
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
            // Reserved, not touched: pages are committed as the trace grows,
            // and the measured loop never pauses to copy a grown vector.
            trace_t: Vec::with_capacity(trace_cap),
            trace_i: Vec::with_capacity(trace_cap),
            trace_cap,
            trace_dropped: 0,
        })
    }

    /// This thread's counts as a run (no time, CPU or access stream yet),
    /// and its access stream: issue times and object indices.
    fn into_run(self, offered: Option<f64>) -> (Run, (Vec<u64>, Vec<u32>)) {
        let run = Run {
            offered,
            ops: self.reads + self.writes,
            reads: self.reads,
            writes: self.writes,
            completed: self.completed,
            scheduled: self.scheduled,
            unissued: self.unissued,
            elapsed: Duration::ZERO,
            lat: self.lat,
            late: self.late,
            lag: self.lag,
            op_errors: self.op_errors,
            wrong_bytes: self.wrong_bytes,
            trace: Vec::new(),
            trace_dropped: self.trace_dropped,
            cpu: Some(Duration::ZERO),
        };
        (run, (self.trace_t, self.trace_i))
    }

    /// Adds a measured operation on object `i` issued at `at` to the access stream.
    fn trace(&mut self, origin: Instant, at: Instant, i: usize) {
        if self.trace_i.len() < self.trace_cap {
            self.trace_t
                .push(u64::try_from(at.saturating_duration_since(origin).as_nanos()).unwrap_or(u64::MAX));
            self.trace_i.push(i as u32);
        } else {
            self.trace_dropped += 1;
        }
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
struct Ctx<'a, S: Store> {
    store: &'a S,
    perm: &'a [u32],
    zipf: Option<&'a Zipf<f64>>,
    write_ratio: f64,
    phase: &'a AtomicU8,
    live_ops: &'a AtomicU64,
    logged: &'a AtomicU64,
}

impl<S: Store> Ctx<'_, S> {
    /// Draws an object and whether to write it, and runs the operation.
    fn op(&self, w: &mut S::Worker, rng: &mut SmallRng) -> (usize, bool, Outcome) {
        let i = draw(self.perm, self.zipf, rng);
        let write = self.write_ratio > 0.0 && rng.random_bool(self.write_ratio);
        let res = if write {
            self.store.write(w, i)
        } else {
            self.store.read(w, i)
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
    fn closed(&self, w: &mut S::Worker, seed: u64, win: Window, trace_cap: usize) -> anyhow::Result<WorkerOut> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out = WorkerOut::new(trace_cap)?;
        let mut pending = 0u64;
        loop {
            let ph = self.phase.load(Ordering::Relaxed);
            if ph >= STOP {
                break;
            }
            let t0 = Instant::now();
            let (i, write, res) = self.op(w, &mut rng);
            let dt = t0.elapsed();
            if ph != MEASURE {
                continue;
            }
            out.lat.record(dt);
            out.lag.push(dt);
            out.completed += 1;
            out.trace(win.start, t0, i);
            self.count(&mut out, i, write, res);
            self.progress(&mut pending);
        }
        Ok(out)
    }

    /// Open loop: operations at Poisson arrival times at `rate` per second,
    /// each timed from its scheduled start; see the module docs of `micro`.
    fn open(
        &self,
        w: &mut S::Worker,
        seed: u64,
        win: Window,
        rate: f64,
        trace_cap: usize,
    ) -> anyhow::Result<WorkerOut> {
        tight_timer_slack();
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut arrivals = Arrivals::new(win.start, rate, splitmix(seed ^ 0x6F70_656E_6C6F_6F70))?;
        let mut out = WorkerOut::new(trace_cap)?;
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
            let (i, write, res) = self.op(w, &mut rng);
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
                out.trace(win.start, now, i);
                self.count(&mut out, i, write, res);
            }
        }
        Ok(out)
    }
}

/// Draws an object: a rank from `zipf` (uniform if `None`) mapped through `perm`.
pub(crate) fn draw(perm: &[u32], zipf: Option<&Zipf<f64>>, rng: &mut SmallRng) -> usize {
    let n = perm.len() as u64;
    let rank = match zipf {
        Some(z) => (z.sample(rng) as u64).clamp(1, n) - 1,
        None => rng.random_range(0..n),
    };
    perm[rank as usize] as usize
}

/// The Zipf distribution of ranks over `1..=n` (`None` for uniform accesses).
pub(crate) fn zipf(args: &MicroArgs, n: u64) -> anyhow::Result<Option<Zipf<f64>>> {
    if args.zipf > 0.0 {
        Ok(Some(
            Zipf::new(n as f64, args.zipf).map_err(|e| anyhow!("Zipf({}) over {n}: {e}", args.zipf))?,
        ))
    } else {
        Ok(None)
    }
}

/// Warm-up and one measured run of `store` at `offered` ops/s (open loop) or closed loop.
pub(crate) fn measure<S: Store>(
    args: &MicroArgs,
    store: &S,
    perm: &[u32],
    zipf: Option<&Zipf<f64>>,
    offered: Option<f64>,
) -> anyhow::Result<(Run, Snaps<S::Snap>)> {
    let threads = u64::from(args.threads);
    let trace_cap = TRACE_CAP / args.threads as usize;
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
        store,
        perm,
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
                    let mut w = ctx.store.worker(t as usize)?;
                    match offered {
                        Some(rate) => ctx.open(&mut w, seed, win, rate / threads as f64, trace_cap),
                        None => ctx.closed(&mut w, seed, win, trace_cap),
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
        let servers = store.servers();
        let cpu0 = cpu_time(&servers);
        let s0 = store.snap();
        store.boundary();
        let t0 = Instant::now();
        let ops0 = live_ops.load(Ordering::Relaxed);
        phase.store(MEASURE, Ordering::Relaxed);
        // The open loop's window is fixed in advance; the closed loop's starts now.
        let end = if offered.is_some() { win.end } else { t0 + args.duration };
        let mut samples = Vec::new();
        let mut at = Vec::new();
        let mut next = t0 + SAMPLE_EVERY;
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            thread::sleep(next.min(end).saturating_duration_since(now));
            // A late sample (the sampler was starved) starts the next
            // window afresh: catching up would record windows of a few µs
            // with no operation in them, false zeros in the timeline.
            next = (next + SAMPLE_EVERY).max(Instant::now() + SAMPLE_EVERY / 2);
            let st = store.snap();
            let el = t0.elapsed().as_secs_f64().max(1e-9);
            pb.set_position((args.warmup + t0.elapsed()).as_millis() as u64);
            let done = live_ops.load(Ordering::Relaxed) as f64 / el;
            let note = store.note(&s0, &st, el);
            pb.set_message(match offered {
                Some(rate) => format!("{done:.0} of {rate} ops/s offered, {note}"),
                None => format!("{done:.0} ops/s, {note}"),
            });
            samples.push(st);
            at.push((t0.elapsed().as_secs_f64(), live_ops.load(Ordering::Relaxed)));
        }
        phase.store(STOP, Ordering::Relaxed);
        let elapsed = if offered.is_some() { args.duration } else { t0.elapsed() };
        let cpu = cpu_time(&servers).zip(cpu0).map(|(b, a)| b.saturating_sub(a));
        let s1 = store.snap();
        store.boundary();
        let outs: Vec<anyhow::Result<WorkerOut>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a worker thread panicked"))))
            .collect();
        let snaps = Snaps {
            first: s0,
            last: s1,
            samples,
            at,
            ops0,
        };
        Ok((outs, (elapsed, cpu, snaps)))
    })?;
    pb.finish_and_clear();
    let (elapsed, cpu, snaps) = measured;
    // Each thread's counts as a run of its own, added up; the access
    // streams merged in issue order across threads.
    let mut run: Option<Run> = None;
    let mut traces = Vec::new();
    for o in outs {
        let (r, trace) = o?.into_run(offered);
        traces.push(trace);
        match &mut run {
            Some(all) => all.append(r)?,
            None => run = Some(r),
        }
    }
    let mut run = run.ok_or_else(|| anyhow!("no worker thread ran"))?;
    run.elapsed = elapsed;
    run.cpu = cpu;
    run.trace = cache_sim::merge(traces);
    Ok((run, snaps))
}
