//! The remora schemes of `remora bench micro`: the array of objects behind
//! remotable pointers, filled through one runtime and measured by the shared
//! worker loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use remora_cluster::LocalCluster;
use remora_proto::ByteSize;
use remora_proto::msg::PeerTraffic;
use remora_runtime::{RemBox, Runtime, RuntimeConfig, Stats};

use super::alternate::{Contestant, Counters, Entry, Recorded};
use super::cache_sim::SimMisses;
use super::census::CensusSum;
use super::record::{Figures, Record, RemoraFigures};
use super::worker::{self, Outcome, Run, Snaps, Store};
use super::{MicroArgs, Plan, alloc_parallel, bar, base, check, fill, progress};

/// One object of the array behind its lock.
type Cell<const W: usize> = RwLock<RemBox<[u64; W]>>;

/// The objects, their shadow versions and the runtime that holds them.
struct Array<'a, const W: usize> {
    /// Declared before `rt`, so the objects (and their far copies) are
    /// freed before the runtime goes.
    cells: Vec<Cell<W>>,
    rt: Runtime,
    versions: Vec<AtomicU64>,
    /// The memory nodes' process ids.
    servers: Vec<u32>,
    cluster: &'a LocalCluster,
    /// Peer traffic at each boundary of the measured phases.
    peer: Mutex<Vec<PeerTraffic>>,
    /// With `--census`: the local spans counted at every snapshot.
    census: Option<Mutex<CensusSum>>,
}

impl<const W: usize> Store for Array<'_, W> {
    type Worker = ();
    type Snap = Stats;

    fn worker(&self, _t: usize) -> anyhow::Result<()> {
        Ok(())
    }

    fn read(&self, _: &mut (), i: usize) -> Outcome {
        let g = self.cells[i].read().unwrap_or_else(PoisonError::into_inner);
        let v = self.versions[i].load(Ordering::Acquire);
        let scope = self.rt.scope();
        let b: &RemBox<[u64; W]> = &g;
        match b.deref(&scope) {
            Ok(o) if check(o, base(i as u64, v)) => Outcome::Ok,
            Ok(_) => Outcome::Wrong { index: i, version: v },
            Err(e) => Outcome::Error(e.to_string()),
        }
    }

    fn write(&self, _: &mut (), i: usize) -> Outcome {
        let mut g = self.cells[i].write().unwrap_or_else(PoisonError::into_inner);
        let v = self.versions[i].load(Ordering::Acquire);
        let scope = self.rt.scope();
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
            Err(e) => Outcome::Error(e.to_string()),
        }
    }

    fn snap(&self) -> Stats {
        if let Some(c) = &self.census {
            let census = self.rt.local_census();
            c.lock().unwrap_or_else(PoisonError::into_inner).add(&census);
        }
        self.rt.stats()
    }

    fn servers(&self) -> Vec<u32> {
        self.servers.clone()
    }

    fn boundary(&self) {
        let now = self.cluster.peer_traffic_now();
        self.peer.lock().unwrap_or_else(PoisonError::into_inner).push(now);
    }

    fn note(&self, s0: &Stats, s: &Stats, secs: f64) -> String {
        format!(
            "{:.0} swap-ins/s",
            (s.traffic.swap_ins - s0.traffic.swap_ins) as f64 / secs
        )
    }
}

/// Averages of the levels sampled during the measured phase.
fn figures(first: &Stats, last: &Stats, samples: &[Stats]) -> RemoraFigures {
    let k = samples.len().max(1) as f64;
    let avg = |f: fn(&Stats) -> u64| samples.iter().map(|s| f(s) as f64).sum::<f64>() / k;
    RemoraFigures {
        delta: last.since(first),
        avg_remote_used: avg(|s| s.far.bytes_used),
        avg_live: avg(|s| s.far.live_bytes),
        avg_local: avg(|s| s.local.bytes),
        avg_kept: avg(|s| s.far.kept_bytes),
        avg_local_objects: avg(|s| s.local.objects.saturating_sub(s.far.objects)),
        level_samples: samples.len() as u64,
        peer_bytes: 0,
        peer_delta_bytes: 0,
        timeline: Vec::new(),
        census: None,
    }
}

/// A runtime for `scheme` on `cluster`, configured by the bench's flags.
fn connect(args: &MicroArgs, plan: &Plan, cluster: &LocalCluster, scheme: &str) -> anyhow::Result<Runtime> {
    let mut cfg = RuntimeConfig::new(cluster.manager_addr(), usize::try_from(plan.budget)?);
    cfg.conn = cluster.conn_options();
    cfg.name = format!("bench-micro-{scheme}");
    let (name, compaction) = super::schemes::split_label(scheme);
    let opts = remora_runtime::scheme::SchemeOptions {
        compaction_threads: compaction.unwrap_or(plan.opts.compaction_threads),
        ..plan.opts
    };
    cfg.scheme = remora_runtime::scheme::make(name, &opts).map_err(|e| anyhow!("building scheme {scheme}: {e}"))?;
    if let Some(t) = args.filtering_threads {
        cfg.tuning.filtering_threads = t as usize;
    }
    if let Some(t) = args.eviction_threads {
        cfg.tuning.eviction_threads = t as usize;
    }
    if let Some(b) = args.eviction_batch {
        cfg.tuning.eviction_batch = b as usize;
    }
    if args.span_swap_in {
        cfg.tuning.object_swap_in = false;
    }
    if let Some(d) = args.filter_interval {
        cfg.tuning.filter_interval = d;
    }
    if let Some(h) = args.high_watermark {
        cfg.tuning.high_watermark = h;
    }
    if let Some(l) = args.low_watermark {
        cfg.tuning.low_watermark = l;
    }
    if cfg.tuning.low_watermark > cfg.tuning.high_watermark {
        bail!(
            "--low-watermark {} is above --high-watermark {}",
            cfg.tuning.low_watermark,
            cfg.tuning.high_watermark
        );
    }
    Runtime::connect(cfg).context("connecting the runtime")
}

/// Fills the array of `plan` into `rt`; returns it and how long the fill took.
fn fill_array<'a, const W: usize>(
    args: &MicroArgs,
    plan: &Plan,
    cluster: &'a LocalCluster,
    rt: Runtime,
    scheme: &str,
) -> anyhow::Result<(Array<'a, W>, Duration)> {
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
    let cells: Vec<Cell<W>> = alloc_parallel(&rt, n, threads, "micro-fill", &pb, RwLock::new)?;
    if let Err(e) = rt.wait_for_eviction(Duration::from_secs(60)) {
        tracing::warn!("eviction did not settle after the fill: {e}");
    }
    let fill_time = fill_start.elapsed();
    pb.finish_and_clear();
    let st = rt.stats();
    progress(format_args!(
        "[{scheme}] filled in {:.2} s: {} local, {} far in {} swap-outs",
        fill_time.as_secs_f64(),
        ByteSize(st.local.bytes),
        ByteSize(st.far.live_bytes),
        st.traffic.swap_outs
    ));
    let array = Array::<W> {
        cells,
        rt,
        versions: (0..n).map(|_| AtomicU64::new(0)).collect(),
        servers: cluster.memnodes().iter().map(|m| m.pid).collect(),
        cluster,
        peer: Mutex::new(Vec::new()),
        census: args.census.then(|| Mutex::new(CensusSum::default())),
    };
    Ok((array, fill_time))
}

impl<const W: usize> Array<'_, W> {
    /// Peer traffic over the measured phases so far (marks are pushed in
    /// pairs, as each begins and ends; what memory nodes sent each other
    /// between them, for other runtimes, is not counted).
    fn measured_peer(&self) -> anyhow::Result<PeerTraffic> {
        let marks = self.peer.lock().unwrap_or_else(PoisonError::into_inner);
        anyhow::ensure!(
            marks.len() >= 2 && marks.len() % 2 == 0,
            "the measured phases left {} peer-traffic marks",
            marks.len()
        );
        let mut sum = PeerTraffic::default();
        for m in marks.chunks_exact(2) {
            sum.rebuild_reads += m[1].rebuild_reads.saturating_sub(m[0].rebuild_reads);
            sum.rebuild_bytes += m[1].rebuild_bytes.saturating_sub(m[0].rebuild_bytes);
            sum.delta_applies += m[1].delta_applies.saturating_sub(m[0].delta_applies);
            sum.delta_bytes += m[1].delta_bytes.saturating_sub(m[0].delta_bytes);
        }
        Ok(sum)
    }

    fn clear_marks(&self) {
        self.peer.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

impl Counters for Stats {
    fn since(&self, earlier: &Self) -> Self {
        // The runtime's own subtraction (the inherent method): counters
        // subtracted, levels as now.
        Stats::since(self, earlier)
    }
}

impl<const W: usize> Recorded for Array<'_, W> {
    fn pause(&self, on: bool) {
        self.rt.pause_background(on);
    }

    /// The record of a measured run (its snapshots, and the simulated
    /// caches over its access stream).
    fn record(
        &self,
        scheme: &str,
        fill_time: Duration,
        run: Run,
        sim: SimMisses,
        snaps: &Snaps<Stats>,
    ) -> anyhow::Result<Record> {
        // The measured phases' own boundaries (not the warm-ups'): compaction
        // counters are taken there too.
        let peer = self.measured_peer()?;
        Ok(Record {
            scheme: scheme.to_string(),
            fill_time,
            figures: Figures::Remora(Box::new(RemoraFigures {
                peer_bytes: peer.bytes(),
                peer_delta_bytes: peer.delta_bytes,
                timeline: super::timeline::points(snaps),
                census: self
                    .census
                    .as_ref()
                    .and_then(|c| std::mem::take(&mut *c.lock().unwrap_or_else(PoisonError::into_inner)).average()),
                ..figures(&snaps.first, &snaps.last, &snaps.samples)
            })),
            run,
            sim,
            rounds: Vec::new(),
        })
    }
}

/// `scheme` filled on `cluster`, to be measured in alternating rounds
/// beside other stores (paused until its first window).
pub(super) fn contestant<'a, const W: usize>(
    args: &MicroArgs,
    plan: &Plan,
    cluster: &'a LocalCluster,
    scheme: &str,
) -> anyhow::Result<Box<dyn Contestant + 'a>> {
    let rt = connect(args, plan, cluster, scheme)?;
    let (array, fill_time) = fill_array::<W>(args, plan, cluster, rt, scheme)?;
    Ok(Box::new(Entry::new(scheme, array, fill_time)))
}

/// Fills the array under `scheme` on `cluster` and measures it at every load.
pub(super) fn run_scheme<const W: usize>(
    args: &MicroArgs,
    plan: &Plan,
    cluster: &LocalCluster,
    scheme: &str,
) -> anyhow::Result<Vec<Record>> {
    let rt = connect(args, plan, cluster, scheme)?;
    let (array, fill_time) = fill_array::<W>(args, plan, cluster, rt, scheme)?;
    let zipf = worker::zipf(args, plan.n)?;

    // One measured run per load, each after its own warm-up.
    let mut records = Vec::new();
    for (i, &offered) in plan.loads.iter().enumerate() {
        let redundant = super::schemes::info(scheme).is_some_and(|s| s.redundant);
        let kill = args.kill_at.filter(|_| i == 0 && redundant);
        let manager_kill = args.kill_manager_at.filter(|_| i == 0);
        array.clear_marks();
        let (measured, outage, killed) = std::thread::scope(|s| {
            let killed = kill.map(|at| {
                let (rt, after) = (&array.rt, args.warmup + at);
                s.spawn(move || super::node_kill::kill_nodes(cluster, rt, scheme, after, args.kill_count as usize))
            });
            let outage = manager_kill.map(|at| {
                let after = args.warmup + at;
                s.spawn(move || super::manager_outage::kill_and_restart(cluster, scheme, after, args.manager_down))
            });
            let measured = worker::measure(args, &array, &plan.perm, zipf.as_ref(), offered);
            (
                measured,
                outage.and_then(|h| h.join().ok().flatten()),
                killed.and_then(|h| h.join().ok()),
            )
        });
        let (mut run, snaps) = measured.with_context(|| match offered {
            Some(rate) => format!("open loop at {rate} ops/s"),
            None => "closed loop".to_string(),
        })?;
        if let Some(o) = outage {
            super::manager_outage::report(scheme, o, args.warmup, &snaps.at);
        }
        if let Some(k) = killed {
            super::node_kill::report(scheme, k, args.warmup, &snaps.at, &snaps.samples);
        }
        let sim = super::simulate(args, plan, scheme, &mut run, zipf.as_ref());
        records.push(array.record(scheme, fill_time, run, sim, &snaps)?);
    }
    Ok(records)
}
