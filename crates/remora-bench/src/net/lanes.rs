//! `remora bench lanes`: does a swap-in wait behind eviction?
//!
//! The runtime talks to each memory node over two connections, one lane for
//! swap-ins and one for everything else (eviction writes, repairs), because
//! a connection's requests are answered in order: a 16 KiB READ queued
//! behind a pipeline of 64 KiB WRITEs waits for all of them. This benchmark
//! measures what the lanes buy, side by side in one run, on one memory node
//! (a child process of a local cluster, as deployed):
//!
//! 1. **idle**: only swap-in-sized READs, open loop at `--read-rate`
//!    (Poisson arrivals, each timed from its *scheduled* start, so a stall
//!    is charged to every read scheduled behind it);
//! 2. **lanes**: the same reads on their own connection while a writer
//!    pipelines eviction-sized WRITEs at `--write-rate` on another;
//! 3. **one connection**: the same, with reads and writes sharing one
//!    connection (what the runtime did before it had lanes).
//!
//! It prints READ p50/p99 (with 95 % confidence intervals) per phase, each
//! phase's p99 ÷ idle's, and the write rate really achieved (a loaded phase
//! whose writer fell below 95 % of `--write-rate` says so: its ratio would
//! flatter). Every read is checked against the region's known pattern and
//! every write lands in a separate half of the region, so the reads'
//! expected bytes never change.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};
use remora_cluster::{ClusterConfig, LocalCluster};
use remora_proto::{ByteSize, Cap, MemNodeClient, MemTransport, parse_duration};
use serde_json::{Value, json};

use super::pattern::{Image, Offsets};
use super::stats::Latency;

/// The goal: swap-in p99 under eviction at most this many times idle.
const GOAL_P99_RATIO: f64 = 1.5;
/// WRITEs the writer keeps in flight (the evictor pipelines its swap-outs).
const WRITE_DEPTH: usize = 8;

/// Flags of `remora bench lanes`.
#[derive(Debug, Clone, clap::Args)]
pub struct LanesArgs {
    /// Swap-in READs per second (open loop, Poisson arrivals).
    #[arg(long, default_value_t = 2000.0)]
    pub read_rate: f64,
    /// Size of each READ (a span).
    #[arg(long, default_value = "16KiB")]
    pub read_size: ByteSize,
    /// Eviction bytes per second written to the same memory node while loaded.
    #[arg(long, default_value = "300MB")]
    pub write_rate: ByteSize,
    /// Size of each WRITE (a batch of spans).
    #[arg(long, default_value = "64KiB")]
    pub write_size: ByteSize,
    /// Measured time per phase, split over `--rounds`.
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Rounds in which the phases take turns.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
    /// The region both read and written (reads in its first half, writes in its second).
    #[arg(long, default_value = "64MiB")]
    pub region_size: ByteSize,
    /// Managers in the local cluster; more than one run as a Raft group (3 survive losing one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub managers: u32,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One phase's figures, summed over rounds.
struct Phase {
    name: &'static str,
    reads: Latency,
    /// Bytes written while reads were timed, and for how long they were.
    written: u64,
    secs: f64,
    wrong: u64,
}

impl Phase {
    /// Bytes written per second, as achieved.
    fn write_rate(&self) -> f64 {
        self.written as f64 / self.secs.max(1e-9)
    }
}

/// Runs the benchmark and prints its table.
pub fn run(args: &LanesArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let region = args.region_size.0;
    let binary = std::env::current_exe().context("locating the remora binary")?;
    let mut cfg = ClusterConfig::new(&binary);
    cfg.memnodes = 1;
    cfg.managers = args.managers as usize;
    cfg.region_size = region;
    cfg.capacity = region.saturating_mul(2);
    cfg.log_level = "warn".into();
    cfg.heartbeat_timeout = Duration::from_secs(5);
    eprintln!("[lanes] starting a local cluster: manager + 1 memory node");
    let cluster = LocalCluster::start(cfg).context("starting the local cluster")?;
    let (_session, grant) = super::one_region(&cluster, "bench-lanes")?;
    let connect = || -> anyhow::Result<Arc<MemNodeClient>> {
        Ok(Arc::new(
            MemNodeClient::connect(&grant.addr, cluster.conn_options())
                .with_context(|| format!("connecting to the memory node at {}", grant.addr))?,
        ))
    };
    let image = Image::new(usize::try_from(region)?, 1);
    let half = region / 2;
    let loader = connect()?;
    for (i, chunk) in image.bytes()[..usize::try_from(half)?].chunks(1 << 20).enumerate() {
        loader.write(grant.cap, (i << 20) as u64, chunk)?;
    }

    // The phases take turns, round by round in a rotating order, so a
    // neighbour's burst of CPU on this shared machine lands on all of them
    // rather than on whichever ran at that moment.
    let mut phases = Vec::new();
    let mut conns = Vec::new();
    for name in ["idle", "lanes", "one connection"] {
        let reads = connect()?;
        let writes = match name {
            "idle" => None,
            "lanes" => Some(connect()?),
            _ => Some(Arc::clone(&reads)),
        };
        conns.push((reads, writes));
        phases.push(Phase {
            name,
            reads: Latency::new()?,
            written: 0,
            secs: 0.0,
            wrong: 0,
        });
    }
    let slice = args.duration / args.rounds;
    eprintln!(
        "[lanes] {} rounds of {slice:?} per phase: {}",
        args.rounds,
        phases.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
    );
    for round in 0..args.rounds as usize {
        for i in 0..phases.len() {
            let j = (i + round) % phases.len();
            let (reads, writes) = &conns[j];
            let seed = (round * phases.len() + j) as u64;
            phase(
                args,
                grant.cap,
                &image,
                reads,
                writes.clone(),
                slice,
                seed,
                &mut phases[j],
            )?;
        }
    }
    print(args, &phases);
    if let Some(path) = &args.json {
        let v = to_json(args, &phases);
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let wrong: u64 = phases.iter().map(|p| p.wrong).sum();
    if wrong > 0 {
        bail!("{wrong} reads returned wrong bytes");
    }
    Ok(())
}

fn check_args(a: &LanesArgs) -> anyhow::Result<()> {
    if !(a.read_rate.is_finite() && a.read_rate > 0.0 && a.read_rate <= 1e6) {
        bail!("--read-rate must be in (0, 1e6] reads per second");
    }
    if a.read_size.0 == 0 || a.write_size.0 == 0 {
        bail!("--read-size and --write-size must be positive");
    }
    if a.region_size.0 < 2 * a.read_size.0.max(a.write_size.0) * 4 {
        bail!("--region-size must hold at least 8 reads and 8 writes");
    }
    if a.duration.is_zero() {
        bail!("--duration must be positive");
    }
    Ok(())
}

/// One measured phase: open-loop reads, and with `writes` a paced writer.
#[allow(clippy::too_many_arguments)]
fn phase(
    args: &LanesArgs,
    cap: Cap,
    image: &Image,
    reads: &Arc<MemNodeClient>,
    writes: Option<Arc<MemNodeClient>>,
    duration: Duration,
    seed: u64,
    out: &mut Phase,
) -> anyhow::Result<()> {
    let half = args.region_size.0 / 2;
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = writes.map(|client| {
        let (stop, written) = (Arc::clone(&stop), Arc::clone(&written));
        let size = args.write_size.0;
        let rate = args.write_rate.0 as f64;
        let data = image.at(0, size as usize).to_vec();
        thread::spawn(move || write_loop(&client, cap, half, size, rate, &data, &stop, &written))
    });
    // Let the writer reach its pace before reads are timed.
    thread::sleep(Duration::from_millis(200));
    let w0 = written.load(Ordering::Relaxed);
    crate::micro::open_loop::tight_timer_slack();
    let started = Instant::now();
    let mut offsets = Offsets::new(seed, half, args.read_size.0);
    let gaps = Exp::new(args.read_rate).map_err(|e| anyhow!("exponential gaps: {e}"))?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut buf = vec![0u8; args.read_size.0 as usize];
    let mut due = started;
    let result = loop {
        due += Duration::from_secs_f64(gaps.sample(&mut rng));
        if due >= started + duration {
            break Ok(());
        }
        wait_until(due);
        let off = offsets.next_offset();
        if let Err(e) = reads.read(cap, off, &mut buf) {
            break Err(anyhow!("read at {off}: {e}"));
        }
        out.reads.record(due.elapsed());
        if image.check("read", off, &buf).is_err() {
            out.wrong += 1;
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    let w1 = written.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    if let Some(w) = writer {
        w.join().map_err(|_| anyhow!("the writer panicked"))??;
    }
    result?;
    out.written += w1 - w0;
    out.secs += elapsed;
    Ok(())
}

/// Sleeps until `due`. The reading thread runs with a 1 ns timer slack
/// (see `micro::open_loop`), so the 50 µs default slack is not charged to
/// every read, inflating the idle figure the loaded ones are divided by.
fn wait_until(due: Instant) {
    let now = Instant::now();
    if due > now {
        thread::sleep(due - now);
    }
}

/// Pipelines WRITEs of `size` into the region's second half at `rate`
/// bytes per second, `WRITE_DEPTH` in flight, until `stop`.
#[allow(clippy::too_many_arguments)]
fn write_loop(
    client: &MemNodeClient,
    cap: Cap,
    half: u64,
    size: u64,
    rate: f64,
    data: &[u8],
    stop: &AtomicBool,
    written: &AtomicU64,
) -> anyhow::Result<()> {
    let gap = Duration::from_secs_f64(size as f64 / rate);
    let slots = half / size;
    let mut inflight = std::collections::VecDeque::new();
    let mut next = Instant::now();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if inflight.len() == WRITE_DEPTH {
            let t = inflight.pop_front().expect("a write in flight");
            client.wait_write(t)?;
            written.fetch_add(size, Ordering::Relaxed);
            continue;
        }
        let now = Instant::now();
        if next > now {
            // Collect what has arrived while waiting for the next slot.
            match inflight.pop_front() {
                Some(t) => {
                    client.wait_write(t)?;
                    written.fetch_add(size, Ordering::Relaxed);
                }
                None => thread::sleep(next - now),
            }
            continue;
        }
        inflight.push_back(client.send_write(cap, half + (i % slots) * size, data)?);
        i += 1;
        next += gap;
    }
    for t in inflight {
        client.wait_write(t)?;
    }
    Ok(())
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

fn print(args: &LanesArgs, phases: &[Phase]) {
    let idle_p99 = phases[0].reads.at(0.99).max(1) as f64;
    println!();
    println!(
        "swap-in READs of {} at {:.0}/s (open loop) on one memory node; eviction WRITEs of {} at {:.0} MB/s while loaded",
        args.read_size,
        args.read_rate,
        args.write_size,
        args.write_rate.0 as f64 / 1e6
    );
    println!(
        "{:<16} {:>8} {:>10} {:>22} {:>10} {:>22} {:>12} {:>14} {:>6}",
        "phase", "reads", "p50 µs", "p50 95% CI", "p99 µs", "p99 95% CI", "p99 ÷ idle", "writes MB/s", "wrong"
    );
    for p in phases {
        let (l50, h50) = p.reads.ci95(0.5);
        let (l99, h99) = p.reads.ci95(0.99);
        println!(
            "{:<16} {:>8} {:>10} {:>22} {:>10} {:>22} {:>12.2} {:>14.0} {:>6}",
            p.name,
            p.reads.samples(),
            us(p.reads.at(0.5)),
            format!("[{}, {}]", us(l50), us(h50)),
            us(p.reads.at(0.99)),
            format!("[{}, {}]", us(l99), us(h99)),
            p.reads.at(0.99) as f64 / idle_p99,
            p.write_rate() / 1e6,
            p.wrong
        );
    }
    for p in &phases[1..] {
        if p.write_rate() < 0.95 * args.write_rate.0 as f64 {
            println!(
                "  note: {}: the writer achieved {:.0} MB/s, below 95 % of the {:.0} MB/s asked for",
                p.name,
                p.write_rate() / 1e6,
                args.write_rate.0 as f64 / 1e6
            );
        }
    }
    let lanes = phases[1].reads.at(0.99) as f64 / idle_p99;
    println!(
        "goal: swap-in p99 under eviction <= {GOAL_P99_RATIO}x idle: {lanes:.2}x with lanes ({})",
        if lanes <= GOAL_P99_RATIO { "met" } else { "missed" }
    );
}

fn to_json(args: &LanesArgs, phases: &[Phase]) -> Value {
    let idle_p99 = phases[0].reads.at(0.99).max(1) as f64;
    json!({
        "read_size": args.read_size.0,
        "read_rate": args.read_rate,
        "write_size": args.write_size.0,
        "write_rate_asked": args.write_rate.0,
        "phases": phases.iter().map(|p| json!({
            "phase": p.name,
            "reads": p.reads.to_json(),
            "p99_ratio_to_idle": p.reads.at(0.99) as f64 / idle_p99,
            "write_bytes_per_sec": p.write_rate(),
            "wrong_reads": p.wrong,
        })).collect::<Vec<_>>(),
    })
}
