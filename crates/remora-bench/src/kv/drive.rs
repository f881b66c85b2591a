//! Driving a store: transfers from many threads for a window, timed one by
//! one, with the store's trimmer running beside them; and the alternating
//! rounds at each local ratio.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use remora_apps::kv::tpca::Shape;

use super::subjects::Store;
use super::{KvArgs, progress};

/// Latencies are recorded in microseconds up to this.
const MAX_LATENCY_US: u64 = 600_000_000;
/// How often levels (far and local bytes) are sampled in a window.
const LEVEL_EVERY: Duration = Duration::from_millis(100);

/// What one window measured.
pub(crate) struct Window {
    pub(crate) commits: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) secs: f64,
    /// Transaction latency, µs.
    pub(crate) hist: Histogram<u64>,
    /// Dereferences that waited for a swap-in (remora stores).
    pub(crate) misses: u64,
    /// B-tree operations of the KV store (remora and local stores).
    pub(crate) table_ops: u64,
    /// Far bytes (remora: allocated to spans; Redis: used by all its
    /// servers), the mean of samples every 100 ms.
    pub(crate) remote: Option<f64>,
    /// Local bytes in spans (remora), the mean of the samples.
    pub(crate) local: Option<f64>,
}

impl Window {
    pub(crate) fn tps(&self) -> f64 {
        self.commits as f64 / self.secs.max(1e-9)
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// Runs transfers drawn from `shape` on `store` from `threads` threads
/// (seeded by `seed`) for `dur`, with the store's trimmer on a thread of
/// its own; calls `tick(seconds, commits so far)` every `every`.
pub(crate) fn drive(
    store: &Store<'_>,
    shape: Shape,
    threads: usize,
    dur: Duration,
    seed: u64,
    every: Duration,
    tick: &mut dyn FnMut(f64, u64),
) -> Window {
    let stop = AtomicBool::new(false);
    let commits = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    let hist = Mutex::new(histogram());
    let before = store.rt.map(|rt| rt.stats().local.deref_misses);
    let ops_before = store.bank.kv_stats().map_or(0, |k| k.table_ops);
    let (mut remote, mut local) = ((0.0, 0u32), (0.0, 0u32));
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, commits, errors, first_error, hist) = (&stop, &commits, &errors, &first_error, &hist);
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed.wrapping_mul(1000) + t as u64);
                let mut h = histogram();
                while !stop.load(Ordering::Relaxed) {
                    let tr = shape.draw(&mut rng);
                    let t0 = Instant::now();
                    match store.bank.transfer(&tr) {
                        Ok(()) => {
                            let _ = h.record((t0.elapsed().as_micros() as u64).clamp(1, MAX_LATENCY_US));
                            commits.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            first_error
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert_with(|| e.to_string());
                        }
                    }
                }
                let _ = hist.lock().unwrap_or_else(|p| p.into_inner()).add(&h);
            });
        }
        if store.bank.kv_stats().is_some() {
            let stop = &stop;
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match store.bank.trim() {
                        Ok(0) => std::thread::sleep(Duration::from_millis(1)),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!("[{}] trimming: {e}", store.label);
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            });
        }
        let mut next_level = Duration::ZERO;
        loop {
            let el = start.elapsed();
            if el >= dur {
                break;
            }
            std::thread::sleep(every.min(dur - el));
            let el = start.elapsed();
            tick(el.as_secs_f64(), commits.load(Ordering::Relaxed));
            if el >= next_level {
                next_level = el + LEVEL_EVERY;
                if let Some(rt) = store.rt {
                    let st = rt.stats();
                    remote = (remote.0 + st.far.bytes_used as f64, remote.1 + 1);
                    local = (local.0 + st.local.bytes as f64, local.1 + 1);
                } else if let Some(b) = store.bank.redis_bytes() {
                    remote = (remote.0 + b as f64, remote.1 + 1);
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let secs = start.elapsed().as_secs_f64();
    let commits = commits.into_inner();
    store.committed.fetch_add(commits, Ordering::Relaxed);
    let mean = |(sum, n): (f64, u32)| (n > 0).then(|| sum / f64::from(n));
    Window {
        commits,
        errors: errors.into_inner(),
        first_error: first_error.into_inner().unwrap_or_else(|p| p.into_inner()),
        secs,
        hist: hist.into_inner().unwrap_or_else(|p| p.into_inner()),
        misses: store.rt.map_or(0, |rt| {
            rt.stats().local.deref_misses.saturating_sub(before.unwrap_or(0))
        }),
        table_ops: store
            .bank
            .kv_stats()
            .map_or(0, |k| k.table_ops.saturating_sub(ops_before)),
        remote: mean(remote),
        local: mean(local),
    }
}

/// The windows of every store (inner) at every local ratio (outer), one per round.
pub(crate) type Cells = Vec<Vec<Vec<Window>>>;

/// At each local ratio: every runtime given its budget and left to evict,
/// then every store measured in alternating rounds with the others paused.
pub(crate) fn rounds(stores: &[Store<'_>], args: &KvArgs, peak: u64) -> anyhow::Result<Cells> {
    let shape = args.shape();
    let mut cells = Vec::new();
    let mut seed = 1u64;
    for &ratio in &args.local_ratio {
        let budget = (peak as f64 * ratio) as usize;
        progress(format_args!(
            "local ratio {ratio}: budget {:.1} MiB",
            budget as f64 / (1 << 20) as f64
        ));
        for s in stores {
            if let Some(rt) = s.rt {
                rt.set_local_budget(budget);
                rt.pause_background(false);
                let settled = rt.wait_for_eviction(Duration::from_secs(120));
                rt.pause_background(true);
                settled.map_err(|e| anyhow::anyhow!("{}: eviction to {ratio}: {e}", s.label))?;
            }
        }
        let mut per_store: Vec<Vec<Window>> = stores.iter().map(|_| Vec::new()).collect();
        for round in 0..args.rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..stores.len()).collect()
            } else {
                (0..stores.len()).rev().collect()
            };
            for i in order {
                let s = &stores[i];
                if let Some(rt) = s.rt {
                    rt.pause_background(false);
                }
                seed += 1;
                if !args.warmup.is_zero() {
                    drive(s, shape, args.threads, args.warmup, seed, LEVEL_EVERY, &mut |_, _| {});
                }
                let w = drive(
                    s,
                    shape,
                    args.threads,
                    args.duration,
                    seed + 7919,
                    LEVEL_EVERY,
                    &mut |_, _| {},
                );
                if let Some(rt) = s.rt {
                    rt.pause_background(true);
                }
                progress(format_args!(
                    "ratio {ratio} round {round}: {:<16} {:>9.0} TPS  p99 {:>7} µs{}",
                    s.label,
                    w.tps(),
                    w.hist.value_at_quantile(0.99),
                    if w.errors > 0 {
                        format!("  {} errors ({})", w.errors, w.first_error.as_deref().unwrap_or("?"))
                    } else {
                        String::new()
                    }
                ));
                per_store[i].push(w);
            }
        }
        cells.push(per_store);
    }
    Ok(cells)
}
