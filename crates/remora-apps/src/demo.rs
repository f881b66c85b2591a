//! `remora demo`: the promise in one run. A local cluster, a Zipf workload
//! over remotable objects under `ec-batch` with half the data in local
//! memory, a memory node killed with SIGKILL midway; throughput every
//! 100 ms before, during and after; reconstruction figures; and finally
//! every object checked against what was written.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use remora_cluster::{ClusterConfig, LocalCluster};
use remora_proto::ByteSize;
use remora_runtime::{RemBox, Runtime, RuntimeConfig, scheme};

use crate::workload::{Obj, Verified, is, make, verify_all};

/// Flags of `remora demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Number of 4 KiB objects.
    #[arg(long, default_value_t = 32768)]
    pub objects: u64,
    /// Fraction of the data that fits in local memory.
    #[arg(long, default_value_t = 0.5)]
    pub local_ratio: f64,
    /// Zipf skew of the accesses.
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Fraction of accesses that write a new version.
    #[arg(long, default_value_t = 0.1)]
    pub write_ratio: f64,
    /// Application threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Seconds of workload before the kill.
    #[arg(long, default_value_t = 8.0)]
    pub before: f64,
    /// Seconds of workload after the kill.
    #[arg(long, default_value_t = 12.0)]
    pub after: f64,
    /// Memory nodes (at least k+m+1 = 7, so a replacement exists).
    #[arg(long, default_value_t = 7)]
    pub memnodes: usize,
    /// Managers in the local cluster; more than one run as a Raft group (3 survive losing one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub managers: u32,
    /// Where to draw the throughput timeline (SVG).
    #[arg(long, default_value = "remora-demo.svg")]
    pub plot: PathBuf,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// TLS of the demo's cluster (`off`, `control`, `data`); it makes its own certificates.
    #[arg(long, default_value = "off", value_name = "MODE")]
    pub tls: remora_proto::TlsMode,
}

struct Sample {
    t: f64,
    ops_per_sec: f64,
    degraded: u64,
}

fn say(msg: impl AsRef<str>) {
    println!("[demo] {}", msg.as_ref());
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<()> {
    if args.memnodes < 7 {
        return Err(anyhow!("--memnodes must be at least 7 (k+m = 6 plus one replacement)"));
    }
    if !(0.01..=1.0).contains(&args.local_ratio) {
        return Err(anyhow!("--local-ratio must be in (0, 1]"));
    }
    let obj_bytes = 4096u64;
    let data = args.objects * obj_bytes;
    let budget = (data as f64 * args.local_ratio) as usize;
    let managers = match args.managers {
        1 => "manager".to_string(),
        n => format!("{n} managers (a Raft group)"),
    };
    say(format!(
        "starting a local cluster: {managers} + {} memory nodes on loopback (RS 4+2 needs 6; one spare)",
        args.memnodes
    ));
    let mut cfg = ClusterConfig::new(std::env::current_exe().context("locating the remora binary")?);
    cfg.memnodes = args.memnodes;
    cfg.managers = args.managers as usize;
    cfg.tls = args.tls;
    cfg.region_size = 32 << 20;
    // Room for the data with parity and holes, twice over, spread over the nodes.
    cfg.capacity = ((data * 3 / args.memnodes as u64 + (64 << 20)) / cfg.region_size + 1) * cfg.region_size;
    cfg.log_level = "warn".into();
    let cluster = LocalCluster::start(cfg).context("starting the cluster")?;
    let events = cluster.events();
    let mut rcfg = RuntimeConfig::new(cluster.manager_addr(), budget);
    rcfg.conn = cluster.conn_options();
    rcfg.name = "remora-demo".into();
    rcfg.scheme = scheme::by_name("ec-batch").expect("built-in scheme");
    let rt = Runtime::connect(rcfg).context("connecting the runtime")?;
    say(format!(
        "filling {} objects ({}) with a local budget of {} ({}% of the data), scheme {}",
        args.objects,
        ByteSize(data),
        ByteSize(budget as u64),
        (args.local_ratio * 100.0).round(),
        rt.scheme()
    ));
    let fill_start = Instant::now();
    let objs: Vec<RwLock<RemBox<Obj>>> = (0..args.objects)
        .map(|i| rt.alloc(make(i, 0)).map(RwLock::new))
        .collect::<Result<_, _>>()
        .context("filling")?;
    let versions: Vec<AtomicU64> = (0..args.objects).map(|_| AtomicU64::new(0)).collect();
    let st = rt.stats();
    say(format!(
        "filled in {:.1}s: {} spans swapped out, {} written for {} of data ({:.2}x)",
        fill_start.elapsed().as_secs_f64(),
        st.traffic.swap_outs,
        ByteSize(st.traffic.bytes_written_remote),
        ByteSize(st.traffic.bytes_evicted_data),
        st.traffic.bytes_written_remote as f64 / st.traffic.bytes_evicted_data.max(1) as f64
    ));

    let zipf = Zipf::new(args.objects as f64, args.zipf).map_err(|e| anyhow!("Zipf: {e}"))?;
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let errors = Mutex::new(Vec::<String>::new());
    let mut samples: Vec<Sample> = Vec::new();
    let victim = 3usize;
    let (mut kill_t, mut recovered_t) = (None, None);
    let total = args.before + args.after;
    say(format!(
        "running Zipf({}) over {} objects with {} threads ({}% writes) for {:.0}s; kill -9 of memory node #{victim} at t={:.1}s",
        args.zipf,
        args.objects,
        args.threads,
        (args.write_ratio * 100.0).round(),
        total,
        args.before
    ));
    std::thread::scope(|s| {
        for t in 0..args.threads {
            let (rt, objs, versions, stop, ops, errors, zipf) = (&rt, &objs, &versions, &stop, &ops, &errors, &zipf);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 1);
                // Shuffle ranks to indices so hot objects are spread over spans.
                let mult = 0x9E37_79B9u64 | 1;
                while !stop.load(Ordering::Relaxed) {
                    let rank = zipf.sample(&mut rng) as u64 - 1;
                    let i = (rank.wrapping_mul(mult)) % objs.len() as u64;
                    let write = rng.random::<f64>() < args.write_ratio;
                    let scope = rt.scope();
                    if write {
                        let mut g = objs[i as usize].write().unwrap_or_else(|p| p.into_inner());
                        let v = versions[i as usize].load(Ordering::Relaxed) + 1;
                        match g.deref_mut(&scope) {
                            Ok(o) => {
                                *o = make(i, v);
                                versions[i as usize].store(v, Ordering::Relaxed);
                            }
                            Err(e) => errors
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(format!("write {i}: {e}")),
                        }
                    } else {
                        let g = objs[i as usize].read().unwrap_or_else(|p| p.into_inner());
                        let v = versions[i as usize].load(Ordering::Relaxed);
                        match g.deref(&scope) {
                            Ok(o) if is(o, i, v) => {}
                            Ok(_) => errors
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(format!("read {i}: wrong bytes")),
                            Err(e) => errors
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(format!("read {i}: {e}")),
                        }
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let start = Instant::now();
        let mut last = (0u64, start);
        while start.elapsed().as_secs_f64() < total {
            std::thread::sleep(Duration::from_millis(100));
            let now = Instant::now();
            let n = ops.load(Ordering::Relaxed);
            let rate = (n - last.0) as f64 / (now - last.1).as_secs_f64();
            last = (n, now);
            let t = (now - start).as_secs_f64();
            let st = rt.stats();
            let phase = match (kill_t, recovered_t) {
                (None, _) => "before",
                (Some(_), None) => "during",
                _ => "after",
            };
            println!(
                "  t={t:5.1}s  {rate:>9.0} ops/s  [{phase}]  swap-ins {:>7}  degraded reads {:>5}  rebuilt {}",
                st.traffic.swap_ins,
                st.scheme.degraded_reads,
                ByteSize(st.scheme.reconstructed_bytes)
            );
            samples.push(Sample {
                t,
                ops_per_sec: rate,
                degraded: st.scheme.degraded_reads,
            });
            if kill_t.is_none() && t >= args.before {
                say(format!(
                    "kill -9 memory node #{victim} ({})",
                    cluster.memnodes()[victim].addr
                ));
                if let Err(e) = cluster.kill_memnode(victim) {
                    say(format!("could not kill: {e}"));
                }
                kill_t = Some(t);
            }
            if kill_t.is_some() && recovered_t.is_none() && st.scheme.recoveries >= 1 && st.scheme.recovering == 0 {
                say(format!(
                    "recovery finished: {} rebuilt in {:.2}s",
                    ByteSize(st.scheme.reconstructed_bytes),
                    st.scheme.reconstruct_seconds
                ));
                recovered_t = Some(t);
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    if let Some(rx) = events {
        while let Ok(ev) = rx.try_recv() {
            tracing::debug!("cluster event: {ev:?}");
        }
    }
    let st = rt.stats();
    let errors = errors.into_inner().unwrap_or_else(|p| p.into_inner());
    say(format!(
        "workload done: {} operations, {} errors",
        ops.load(Ordering::Relaxed),
        errors.len()
    ));
    for e in errors.iter().take(5) {
        say(format!("  error: {e}"));
    }

    say("verifying every object against its last written version...");
    let Verified {
        ok: verified,
        wrong: corrupt,
        lost,
    } = verify_all(&rt, &objs, &versions);
    let kill_at = kill_t.unwrap_or(args.before);
    let rec_at = recovered_t.unwrap_or(total);
    let mean = |lo: f64, hi: f64| {
        let v: Vec<f64> = samples
            .iter()
            .filter(|s| s.t > lo && s.t <= hi)
            .map(|s| s.ops_per_sec)
            .collect();
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let before = mean(1.0, kill_at);
    let during = mean(kill_at, rec_at.max(kill_at + 0.1));
    let after = mean(rec_at, total);
    let worst = samples
        .iter()
        .filter(|s| s.t > kill_at && s.t <= rec_at + 0.5)
        .map(|s| s.ops_per_sec)
        .fold(f64::INFINITY, f64::min);
    let dip = if before > 0.0 && worst.is_finite() {
        (1.0 - worst / before).max(0.0)
    } else {
        0.0
    };
    // The paper's measure: mean throughput while the failure is being
    // handled (kill to rebuilt) against before.
    let degradation = if before > 0.0 {
        (1.0 - during / before).max(0.0)
    } else {
        0.0
    };
    // Back to normal: the first 300 ms window after the kill whose mean is
    // within 10% of before.
    let normal_again = samples
        .windows(3)
        .find(|w| w[0].t > kill_at && w.iter().map(|s| s.ops_per_sec).sum::<f64>() / 3.0 >= 0.9 * before)
        .map(|w| w[2].t - kill_at);
    let noise = {
        let v: Vec<f64> = samples
            .iter()
            .filter(|s| s.t > 1.0 && s.t <= kill_at)
            .map(|s| s.ops_per_sec)
            .collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        if before > 0.0 && lo.is_finite() {
            1.0 - lo / before
        } else {
            0.0
        }
    };
    let speed = st.scheme.reconstructed_bytes as f64 / st.scheme.reconstruct_seconds.max(1e-9) / 1e9;
    println!();
    println!("remora demo — results");
    println!(
        "  objects verified        {verified} of {} (lost {lost}, corrupt {corrupt})",
        args.objects
    );
    println!("  throughput before       {before:.0} ops/s");
    println!("  throughput during       {during:.0} ops/s  (kill at {kill_at:.1}s, rebuilt at {rec_at:.1}s)");
    println!("  throughput after        {after:.0} ops/s");
    println!(
        "  degradation             {:.0}% mean from kill to rebuilt (goal <= 25%; paper 36%)",
        degradation * 100.0
    );
    println!(
        "  worst 100 ms sample     {:.0}% below before (before the kill the worst sample was already {:.0}% below)",
        dip * 100.0,
        noise * 100.0
    );
    match normal_again {
        Some(s) => println!(
            "  back to normal          {s:.1}s after the kill (detection takes the manager's heartbeat timeout)"
        ),
        None => println!("  back to normal          not within the run"),
    }
    println!("  degraded reads          {}", st.scheme.degraded_reads);
    println!(
        "  reconstruction          {} in {:.2}s = {:.2} GB/s (offloaded to the replacement node)",
        ByteSize(st.scheme.reconstructed_bytes),
        st.scheme.reconstruct_seconds,
        speed
    );
    println!(
        "  swap-out bytes          {:.2}x data (RS 4+2: 1.5x over full spansets; {} of {} spansets partial); \
         reads per swap-in {:.3}",
        st.traffic.bytes_written_remote as f64 / st.traffic.bytes_evicted_data.max(1) as f64,
        st.scheme.partial_spansets,
        st.scheme.spansets_written,
        st.traffic.swap_in_reads as f64 / st.traffic.swap_ins.max(1) as f64
    );
    draw(&args.plot, &samples, kill_at, rec_at).with_context(|| format!("writing {}", args.plot.display()))?;
    println!("  throughput timeline     {}", args.plot.display());
    if let Some(path) = &args.json {
        let v = serde_json::json!({
            "verified_objects": verified,
            "lost_objects": lost,
            "corrupt_objects": corrupt,
            "errors": errors.len(),
            "reconstruct_gbps": speed,
            "throughput_before": before,
            "throughput_during": during,
            "throughput_after": after,
            "worst_sample_dip_fraction": dip,
            "degradation_fraction": degradation,
            "normal_again_s": normal_again,
            "noise_before_fraction": noise,
            "kill_at_s": kill_at,
            "recovered_at_s": rec_at,
            "objects": args.objects,
            "local_ratio": args.local_ratio,
            "zipf": args.zipf,
            "threads": args.threads,
            "write_bytes_ratio": st.traffic.bytes_written_remote as f64 / st.traffic.bytes_evicted_data.max(1) as f64,
            "timeline": samples.iter().map(|s| serde_json::json!([s.t, s.ops_per_sec, s.degraded])).collect::<Vec<_>>(),
            // The runtime's own figures at the end of the run (since its start).
            "stats": st,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("  json                    {}", path.display());
    }
    if lost + corrupt > 0 || !errors.is_empty() {
        return Err(anyhow!(
            "{lost} objects lost, {corrupt} corrupt, {} operation errors",
            errors.len()
        ));
    }
    Ok(())
}

/// Draws the throughput timeline as an SVG: ops/s every 100 ms, the kill
/// and the end of the rebuild marked, the degraded window shaded.
fn draw(path: &Path, samples: &[Sample], kill: f64, recovered: f64) -> Result<()> {
    use plotters::prelude::*;
    let tmax = samples.last().map(|s| s.t).unwrap_or(1.0).max(1.0);
    let ymax = samples.iter().map(|s| s.ops_per_sec).fold(1.0, f64::max) * 1.1 / 1000.0;
    let err = crate::plot::err(path);
    let root = crate::plot::canvas(path, (900, 360))?;
    let title = format!("remora demo: throughput, ec-batch RS(4,2), memory node killed at {kill:.1}s");
    let mut chart = crate::plot::timeline(path, &root, &title, (tmax, ymax), "k ops/s")?;
    let red = RGBColor(214, 39, 40);
    let green = RGBColor(44, 160, 44);
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(kill, 0.0), (recovered.max(kill), ymax)],
            RGBColor(253, 236, 234).filled(),
        )))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            samples.iter().map(|s| (s.t, s.ops_per_sec / 1000.0)),
            RGBColor(31, 119, 180).stroke_width(2),
        ))
        .map_err(err)?
        .label("throughput")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(31, 119, 180).stroke_width(2)));
    for (at, color, label) in [(kill, red, "kill -9"), (recovered, green, "rebuilt")] {
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(at, 0.0), (at, ymax)], color)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
