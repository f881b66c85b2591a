//! `remora chaos`: a nemesis run. A local cluster of k+2m memory nodes plus
//! spares, a multi-threaded workload with writes over remotable objects,
//! and a seeded schedule (printed first) that kill -9s, pauses (SIGSTOP /
//! SIGCONT) and partitions memory nodes, bringing a fresh node up after
//! each kill, and kill -9s the manager, starting it again on its port with
//! its data directory 0.5–10 s later. With `shrink`, the cluster starts at
//! k+m+1 nodes and a shrink kill -9s m of them at once, none joining for
//! 5–15 s: a phase below k+m live nodes, in which `ec-batch` writes short
//! spansets and re-stripes the groups it cannot rebuild. At the end every
//! object is verified against its last written version.
//!
//! No stripe group may have more than m unrepaired losses: a memory-node
//! fault strikes only a node whose every stripe group (as the runtime
//! reports them) has fewer than m members down now (killed and not yet
//! rebuilt, paused, partitioned, or fenced and not yet rebuilt), and waits
//! while no such node holds data. A shrink, m at once, strikes only while
//! nothing is down. A manager outage
//! loses no data and is not counted; it never overlaps another, and while it
//! lasts only kills strike (their new node joins, and their rebuild starts,
//! once the manager is back): a pause or partition waits, because whether it
//! ends in a fence is the manager's verdict. Far data that cannot be reached
//! during an outage is `Unavailable` after the runtime's outage deadline,
//! counted apart from `DataLost`, of which there must be none.
//!
//! Throughput is counted in 50 ms windows; each fault's dip is the mean from
//! the fault to its end (rebuilt, healed, or the manager back) over the mean
//! of the 5 s before it, and the longest stretch of windows with no
//! completed operation is reported, overall and outside the manager's
//! outages (far memory waits those out by design).

mod nemesis;
mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use remora_cluster::{ClusterConfig, LocalCluster};
use remora_proto::msg::Fault;
use remora_proto::{ByteSize, parse_duration};
use remora_runtime::{RemBox, Runtime, RuntimeConfig, RuntimeError, scheme};

pub use self::nemesis::FaultKind;
use self::nemesis::Planned;
use self::report::{Done, WINDOW};
use crate::workload::{Obj, Verified, is, make, verify_all};

/// Flags of `remora chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// How long the workload runs (e.g. 60s, 10m); faults stop 10 s before the end.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Seed of the fault schedule and of the workload (default: drawn and printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Faults to draw from (comma-separated): `kill`, `pause` and
    /// `partition` strike a memory node, `manager` kill -9s the manager (the
    /// group's leader with `--managers` above 1) for 0.5–10 s, `shrink`
    /// kill -9s m nodes at once and lets none join for 5–15 s (the cluster
    /// then starts at k+m+1 nodes, so a shrink leaves fewer than k+m).
    /// `partition` needs a build with `--features fault-injection` (it
    /// drops a node's traffic from inside it).
    #[arg(long, value_delimiter = ',', default_value = "kill,pause,manager,shrink")]
    pub faults: Vec<FaultKind>,
    /// Mean time between faults.
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    pub mean_gap: Duration,
    /// TLS of the cluster (`off`, `control`, `data`); it makes its own certificates.
    #[arg(long, default_value = "off", value_name = "MODE")]
    pub tls: remora_proto::TlsMode,
    /// The scheme under test (a redundant one).
    #[arg(long, default_value = "ec-batch")]
    pub scheme: String,
    /// Number of 4 KiB objects.
    #[arg(long, default_value_t = 16384)]
    pub objects: u64,
    /// Fraction of the data that fits in local memory.
    #[arg(long, default_value_t = 0.5)]
    pub local_ratio: f64,
    /// Zipf skew of the accesses.
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Fraction of accesses that write a new version.
    #[arg(long, default_value_t = 0.2)]
    pub write_ratio: f64,
    /// Application threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Memory nodes beyond k+2m at the start (more join after each kill).
    #[arg(long, default_value_t = 2)]
    pub spares: usize,
    /// Managers in the local cluster; more than one run as a Raft group (3 survive losing one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub managers: u32,
    /// Where to draw the throughput timeline with the faults marked (SVG).
    #[arg(long, default_value = "remora-chaos.svg")]
    pub plot: PathBuf,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The local cluster's heartbeat timeout.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

fn say(t: f64, msg: impl AsRef<str>) {
    println!("[chaos {t:7.2}s] {}", msg.as_ref());
}

/// A pause or partition under way.
struct Hold {
    node: usize,
    kind: FaultKind,
    until: f64,
}

/// The manager's outage under way.
struct Outage {
    /// Its entry in the faults done.
    done: usize,
    /// When to start the manager again.
    until: f64,
}

/// What the workload threads counted.
#[derive(Default)]
struct Tally {
    ops: AtomicU64,
    data_lost: AtomicU64,
    unavailable: AtomicU64,
    wrong: AtomicU64,
    other: AtomicU64,
    first_errors: Mutex<Vec<String>>,
}

impl Tally {
    fn error(&self, what: String, e: &RuntimeError) {
        let counter = match e {
            RuntimeError::DataLost { .. } => &self.data_lost,
            RuntimeError::Unavailable { .. } => &self.unavailable,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut v = self.first_errors.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < 10 {
            v.push(format!("{what}: {e}"));
        }
    }
}

/// Runs the chaos workload; fails if any object is lost or wrong.
pub fn run(args: &ChaosArgs) -> Result<()> {
    if args.faults.is_empty() {
        bail!("--faults names no fault");
    }
    // A group has no one manager to take down: killing its leader is what
    // `manager` means there.
    let mut args = args.clone();
    for f in &mut args.faults {
        match (*f, args.managers > 1) {
            (FaultKind::Manager, true) => *f = FaultKind::ManagerLeader,
            (FaultKind::ManagerLeader, false) => bail!("--faults manager-leader needs a group: --managers 3"),
            _ => {}
        }
    }
    let args = &args;
    if !(0.01..=1.0).contains(&args.local_ratio) || !(0.0..=1.0).contains(&args.write_ratio) || args.threads == 0 {
        bail!("--local-ratio must be in (0, 1], --write-ratio in [0, 1], --threads at least 1");
    }
    let opts = scheme::SchemeOptions::default();
    let info = scheme::SCHEMES
        .iter()
        .find(|s| s.name == args.scheme)
        .ok_or_else(|| anyhow!("unknown scheme {:?}", args.scheme))?;
    if !info.redundant {
        bail!("{} keeps no redundancy: chaos would lose data by design", args.scheme);
    }
    let duration = args.duration.as_secs_f64();
    let (warm, tail) = ((duration / 6.0).clamp(2.0, 10.0), (duration / 6.0).clamp(3.0, 10.0));
    let seed = args.seed.unwrap_or_else(|| rand::rng().random_range(1..1_000_000));
    let plan = nemesis::plan(seed, duration, warm, tail, args.mean_gap.as_secs_f64(), &args.faults);
    let (k, m) = (opts.k, opts.m);
    // With phases below k+m live nodes, k+m+1 nodes: killing m of them
    // (as many as may die at once) leaves fewer than k+m.
    let shrinks = args.faults.contains(&FaultKind::Shrink);
    let memnodes = if shrinks { k + m + 1 } else { k + 2 * m + args.spares };
    if shrinks {
        println!(
            "remora chaos: seed {seed} (replay with --seed {seed}), {} s, {} on {memnodes} memory nodes (k+m+1, so that \
             `shrink` takes the cluster below k+m; --spares does not apply)",
            duration, args.scheme
        );
    } else {
        println!(
            "remora chaos: seed {seed} (replay with --seed {seed}), {} s, {} on {memnodes} memory nodes (k+2m = {} plus {} spares)",
            duration,
            args.scheme,
            k + 2 * m,
            args.spares
        );
    }
    println!(
        "schedule ({} faults; a memory-node fault strikes a node whose every stripe group has fewer than m = {m} members down, \
         waiting while none has; a shrink only while nothing is down, a manager outage while one is under way, \
         a pause or partition while the manager is down):",
        plan.len()
    );
    for p in &plan {
        match p.kind {
            FaultKind::Kill => println!("  {:7.2}s  kill -9, then a new node joins", p.at),
            FaultKind::Shrink => println!(
                "  {:7.2}s  kill -9 {m} nodes at once, {m} new nodes join after {:.2}s",
                p.at, p.hold
            ),
            FaultKind::Manager => println!("  {:7.2}s  kill -9 the manager, back after {:.2}s", p.at, p.hold),
            FaultKind::ManagerLeader => println!(
                "  {:7.2}s  kill -9 the managers' leader, back as a follower after {:.2}s",
                p.at, p.hold
            ),
            _ => println!("  {:7.2}s  {} for {:.2}s", p.at, p.kind.name(), p.hold),
        }
    }

    let data = args.objects * 4096;
    let budget = (data as f64 * args.local_ratio) as usize;
    let mut cfg = ClusterConfig::new(std::env::current_exe().context("locating the remora binary")?);
    cfg.memnodes = memnodes;
    cfg.managers = args.managers as usize;
    cfg.tls = args.tls;
    cfg.region_size = 16 << 20;
    cfg.capacity = ((data * 4 / (k as u64) + (64 << 20)) / cfg.region_size + 1) * cfg.region_size;
    if shrinks {
        // Sized for k+2m nodes and more; a shrink leaves k+m-1 of k+m+1 to
        // hold everything, while re-striped groups still hold regions until
        // they are given back. (A seed-7 run with the smaller capacity had
        // free regions on only 2 live nodes for 30 s: eviction waited.)
        cfg.capacity *= 2;
    }
    cfg.log_level = "warn".into();
    // The manager's verdict on memory nodes and on this compute node alike:
    // long enough that a starved heartbeat on 2 busy cores is not a death
    // (at 1 s, CI's load once expired the compute node itself).
    cfg.heartbeat_timeout = HEARTBEAT_TIMEOUT;
    let mut cluster = LocalCluster::start(cfg).context("starting the cluster")?;
    if args.faults.contains(&FaultKind::Partition) {
        // Resume is harmless on a healthy node: it asks whether faults can be injected at all.
        cluster.fault(0, Fault::Resume).map_err(|e| {
            anyhow!("--faults partition needs fault injection in the memory nodes ({e}); build with `cargo build --release --features fault-injection`")
        })?;
    }
    let mut rcfg = RuntimeConfig::new(cluster.manager_addr(), budget);
    rcfg.conn = cluster.conn_options();
    rcfg.name = "remora-chaos".into();
    rcfg.scheme = scheme::make(&args.scheme, &opts).context("building the scheme")?;
    let rt = Runtime::connect(rcfg).context("connecting the runtime")?;
    println!(
        "filling {} objects ({}), local budget {}",
        args.objects,
        ByteSize(data),
        ByteSize(budget as u64)
    );
    let objs: Vec<RwLock<RemBox<Obj>>> = (0..args.objects)
        .map(|i| rt.alloc(make(i, 0)).map(RwLock::new))
        .collect::<Result<_, _>>()
        .context("filling")?;
    let versions: Vec<AtomicU64> = (0..args.objects).map(|_| AtomicU64::new(0)).collect();
    let zipf = Zipf::new(args.objects as f64, args.zipf).map_err(|e| anyhow!("Zipf: {e}"))?;
    let tally = Tally::default();
    let stop = AtomicBool::new(false);
    let base_recoveries = rt.stats().scheme.recoveries;

    let mut windows: Vec<(f64, f64)> = Vec::new();
    let mut done: Vec<Done> = Vec::new();
    let mut holds: Vec<Hold> = Vec::new();
    let mut dead: Vec<usize> = Vec::new();
    let mut outage: Option<Outage> = None;
    // New memory nodes owed for kills while the manager was down: one
    // cannot register until it is back.
    let mut joins_owed = 0usize;
    // Nodes owed by shrink phases: (when, how many) join.
    let mut rejoins: Vec<(f64, usize)> = Vec::new();
    // The manager's last verdict on the memory nodes; it stands while the
    // manager is down, since nobody can declare a node dead meanwhile.
    let mut last_status: Option<remora_proto::ClusterStatus> = None;
    let mut settled = true;
    std::thread::scope(|s| -> Result<()> {
        for t in 0..args.threads {
            let (rt, objs, versions, stop, tally, zipf) = (&rt, &objs, &versions, &stop, &tally, &zipf);
            let wseed = seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            std::thread::Builder::new()
                .name(format!("chaos-{t}"))
                .spawn_scoped(s, move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(wseed);
                    let mult = 0x9E37_79B9u64 | 1;
                    while !stop.load(Ordering::Relaxed) {
                        let rank = zipf.sample(&mut rng) as u64 - 1;
                        let i = rank.wrapping_mul(mult) % objs.len() as u64;
                        let scope = rt.scope();
                        if rng.random::<f64>() < args.write_ratio {
                            let mut g = objs[i as usize].write().unwrap_or_else(|p| p.into_inner());
                            let v = versions[i as usize].load(Ordering::Relaxed) + 1;
                            match g.deref_mut(&scope) {
                                Ok(o) => {
                                    *o = make(i, v);
                                    versions[i as usize].store(v, Ordering::Relaxed);
                                }
                                Err(e) => tally.error(format!("write {i}"), &e),
                            }
                        } else {
                            let g = objs[i as usize].read().unwrap_or_else(|p| p.into_inner());
                            match g.deref(&scope) {
                                Ok(o) if is(o, i, versions[i as usize].load(Ordering::Relaxed)) => {}
                                Ok(_) => {
                                    tally.wrong.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => tally.error(format!("read {i}"), &e),
                            }
                        }
                        tally.ops.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .context("starting a workload thread")?;
        }
        let start = Instant::now();
        let now = || start.elapsed().as_secs_f64();
        let mut next = 0usize;
        let mut last_ops = 0u64;
        let mut last_t = 0.0;
        let mut tick = start;
        let mut settle_deadline = None;
        loop {
            let window = Duration::from_secs_f64(WINDOW);
            // Behind (a restart held this loop up): half a window from now at
            // least, since catch-up windows of a few microseconds would show
            // as zeros or spikes.
            tick = (tick + window).max(Instant::now() + window / 2);
            std::thread::sleep(tick.saturating_duration_since(Instant::now()));
            let t = now();
            let ops = tally.ops.load(Ordering::Relaxed);
            // Over the time that really passed: starting the manager or a
            // memory node holds this loop up for longer than a window.
            windows.push((t, (ops - last_ops) as f64 / (t - last_t).max(1e-3)));
            (last_ops, last_t) = (ops, t);
            let st = rt.stats();
            // A kill is rebuilt once the runtime holds no region on that
            // node any more: each was rebuilt elsewhere (or given back).
            if done.iter().any(|d| d.kind.kills() && d.rebuilt_at.is_none()) {
                let held: Vec<String> = rt.regions().into_iter().map(|(_, g)| g.addr).collect();
                for d in done.iter_mut().filter(|d| d.kind.kills() && d.rebuilt_at.is_none()) {
                    if !held.contains(&d.node) {
                        d.rebuilt_at = Some(t);
                        say(
                            t,
                            format!("rebuilt what {} held ({:.2}s after the kill)", d.node, t - d.at),
                        );
                    }
                }
            }
            // Heal what is due.
            holds.retain(|h| {
                if h.until > t {
                    return true;
                }
                let healed = match h.kind {
                    FaultKind::Pause => cluster.resume_memnode(h.node).map_err(|e| e.to_string()),
                    _ => cluster.fault(h.node, Fault::Resume).map_err(|e| e.to_string()),
                };
                match healed {
                    Ok(()) => say(t, format!("healed {} of node #{}", h.kind.name(), h.node)),
                    Err(e) => say(t, format!("healing node #{} failed: {e}", h.node)),
                }
                false
            });
            if let Some(o) = outage.as_ref().filter(|o| o.until <= t) {
                match cluster.start_manager_again() {
                    Ok(()) => {
                        let back = now();
                        let d = &mut done[o.done];
                        d.hold = back - d.at;
                        let how = if d.kind == FaultKind::ManagerLeader {
                            ", as a follower"
                        } else {
                            ""
                        };
                        say(back, format!("the manager is back{how} ({:.2}s down)", d.hold));
                        outage = None;
                        for _ in 0..std::mem::take(&mut joins_owed) {
                            join(&mut cluster, back);
                        }
                        // The restart took part of this window: the next
                        // fault starts at a fresh one, with a fresh verdict.
                        continue;
                    }
                    // Tried again at the next window.
                    Err(e) => say(t, format!("starting the manager again failed: {e}")),
                }
            }
            // A shrink phase ends: as many nodes join as it killed.
            rejoins.retain(|&(at, n)| {
                if at > t {
                    return true;
                }
                for _ in 0..n {
                    if outage.is_some() {
                        joins_owed += 1;
                    } else {
                        join(&mut cluster, t);
                    }
                }
                false
            });
            let unrebuilt = done.iter().filter(|d| d.kind.kills() && d.rebuilt_at.is_none()).count() + holds.len();
            if t >= duration {
                // Calm: wait (bounded) for every rebuild, then stop.
                if unrebuilt == 0 && st.scheme.recovering == 0 && outage.is_none() {
                    break;
                }
                let deadline = *settle_deadline.get_or_insert(t + 60.0);
                if t > deadline {
                    say(
                        t,
                        format!("recovery did not finish within 60 s ({unrebuilt} outstanding)"),
                    );
                    settled = false;
                    break;
                }
                continue;
            }
            let Some(p) = plan.get(next).copied() else { continue };
            if p.at > t {
                continue;
            }
            if p.kind.is_manager() {
                if outage.is_some() {
                    continue;
                }
                next += 1;
                last_status = cluster.status().ok();
                cluster.kill_manager();
                // In a group, the leader it was.
                let killed = cluster.manager_addrs()[cluster.last_killed_manager()].clone();
                let who = if p.kind == FaultKind::ManagerLeader {
                    "the managers' leader"
                } else {
                    "the manager"
                };
                say(t, format!("kill -9 {who} ({killed}) for {:.2}s", p.hold));
                outage = Some(Outage {
                    done: done.len(),
                    until: t + p.hold,
                });
                done.push(Done::new(p.kind, killed, t, p.hold));
                continue;
            }
            if p.kind == FaultKind::Shrink {
                // m at once, so only with nothing else un-rebuilt, and one
                // phase at a time (never below k: at least m+1 nodes live).
                if unrebuilt > 0 || outage.is_some() || !rejoins.is_empty() {
                    continue;
                }
                last_status = cluster.status().ok();
                if fenced_unrebuilt(last_status.as_ref(), &rt, &done).is_none_or(|f| !f.is_empty()) {
                    continue;
                }
                next += 1;
                let mut struck = Vec::new();
                for j in 0..m {
                    let one = Planned {
                        kind: FaultKind::Kill,
                        pick: p.pick.wrapping_add(j as u64),
                        ..p
                    };
                    let cands = victims(&cluster, &rt, &dead, &holds, &|_| true);
                    if cands.is_empty() {
                        say(t, "shrink: no other live node holds the runtime's data");
                        break;
                    }
                    match strike(&mut cluster, one, &cands) {
                        Ok((node, addr)) => {
                            dead.push(node);
                            struck.push(format!("#{node} ({addr})"));
                            done.push(Done::new(p.kind, addr, t, p.hold));
                        }
                        Err(e) => {
                            say(t, format!("shrink: {e}"));
                            break;
                        }
                    }
                }
                if !struck.is_empty() {
                    say(
                        t,
                        format!(
                            "shrink: kill -9 nodes {} at once; {} new nodes join after {:.2}s",
                            struck.join(", "),
                            struck.len(),
                            p.hold
                        ),
                    );
                    rejoins.push((t + p.hold, struck.len()));
                }
                continue;
            }
            if outage.is_some() && p.kind != FaultKind::Kill {
                continue;
            }
            // A paused or partitioned node the manager declared dead is
            // fenced when it comes back: its data is un-rebuilt too until the
            // runtime holds nothing on it.
            if outage.is_none() {
                last_status = cluster.status().ok();
            }
            let Some(fenced) = fenced_unrebuilt(last_status.as_ref(), &rt, &done) else {
                continue;
            };
            let down = down_now(&cluster, &done, &holds, fenced);
            let groups = rt.stripe_groups();
            let tolerable = |addr: &str| within_tolerance(&groups, &down, addr, m);
            let cands = victims(&cluster, &rt, &dead, &holds, &tolerable);
            if cands.is_empty() {
                continue; // wait: every node holding data would take a group past m
            }
            next += 1;
            if let Err(e) = strike(&mut cluster, p, &cands).map(|(node, addr)| {
                say(
                    t,
                    match p.kind {
                        FaultKind::Kill => format!("kill -9 node #{node} ({addr})"),
                        _ => format!("{} node #{node} ({addr}) for {:.2}s", p.kind.name(), p.hold),
                    },
                );
                done.push(Done::new(p.kind, addr, t, p.hold));
                match p.kind {
                    FaultKind::Kill => dead.push(node),
                    FaultKind::Manager | FaultKind::ManagerLeader | FaultKind::Shrink => {}
                    kind => holds.push(Hold {
                        node,
                        kind,
                        until: t + p.hold,
                    }),
                }
            }) {
                say(t, format!("{} skipped: {e}", p.kind.name()));
                continue;
            }
            if p.kind == FaultKind::Kill {
                if outage.is_some() {
                    joins_owed += 1;
                    say(t, "a new node joins once the manager is back");
                } else {
                    join(&mut cluster, t);
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        Ok(())
    })?;
    for h in &holds {
        let _ = cluster.resume_memnode(h.node);
        let _ = cluster.fault(h.node, Fault::Resume);
    }
    if outage.is_some() {
        // Recovery did not settle with the manager down: verifying needs it.
        cluster
            .start_manager_again()
            .context("starting the manager again to verify")?;
    }

    println!("verifying every object against its last written version...");
    let Verified {
        ok: verified,
        wrong,
        lost,
    } = verify_all(&rt, &objs, &versions);
    let st = rt.stats();
    let recoveries = st.scheme.recoveries.saturating_sub(base_recoveries);
    let kills = done.iter().filter(|d| d.kind.kills()).count() as u64;
    let shrink_phases = done
        .iter()
        .filter(|d| d.kind == FaultKind::Shrink)
        .map(|d| d.at.to_bits())
        .collect::<std::collections::HashSet<_>>()
        .len();
    let outages = report::manager_outages(&done);
    let down: Vec<f64> = outages.iter().map(|o| o.1 - o.0).collect();
    let down_total: f64 = down.iter().sum();
    let down_longest = down.iter().copied().fold(0.0, f64::max);
    let longest_zero = report::longest_zero(&windows, &[]);
    let outside: Vec<(f64, f64)> = outages.iter().map(|o| (o.0, o.1 + report::AFTER_OUTAGE)).collect();
    let longest_zero_outside = report::longest_zero(&windows, &outside);
    println!();
    println!("remora chaos — results (seed {seed})");
    println!(
        "  objects verified   {verified} of {} (lost {lost}, wrong {wrong})",
        args.objects
    );
    println!(
        "  during the run     {} ops, {} wrong reads, {} DataLost errors, {} Unavailable errors, {} other errors",
        tally.ops.load(Ordering::Relaxed),
        tally.wrong.load(Ordering::Relaxed),
        tally.data_lost.load(Ordering::Relaxed),
        tally.unavailable.load(Ordering::Relaxed),
        tally.other.load(Ordering::Relaxed)
    );
    for e in tally.first_errors.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        println!("    {e}");
    }
    println!(
        "  recoveries         {recoveries} for {kills} kills ({} beyond the kills: a paused or partitioned node declared dead)",
        recoveries.saturating_sub(kills)
    );
    println!(
        "  manager outages    {}, down {down_total:.2}s in total (longest {down_longest:.2}s)",
        outages.len()
    );
    println!(
        "  members in doubt   {} repaired (a fold's commit never acknowledged); {} spansets below full tolerance now",
        st.scheme.doubt_repairs, st.scheme.spansets_below_tolerance
    );
    if shrinks {
        println!(
            "  below k+m          {shrink_phases} phases; {} short spansets now, {} spans re-striped",
            st.scheme.short_spansets, st.scheme.restriped_spans
        );
    }
    if outages.is_empty() {
        println!("  longest at zero    {longest_zero:.2}s (goal: never more than 1 s)");
    } else {
        println!(
            "  longest at zero    {longest_zero:.2}s; {longest_zero_outside:.2}s outside the manager's outages and the {}s after each (goal there: never more than 1 s)",
            report::AFTER_OUTAGE
        );
    }
    println!(
        "  faults             kind            node                   at s    end s   dip (mean during / 5 s before)   back after (manager: its restart)"
    );
    let mut dips = Vec::new();
    for d in &done {
        let end = match d.kind {
            FaultKind::Kill | FaultKind::Shrink => d.rebuilt_at.unwrap_or(duration),
            _ => d.at + d.hold,
        };
        let back_from = if d.kind.is_manager() { end } else { d.at };
        let dip = report::dip(&windows, d.at, end, back_from);
        let shown = dip.map_or("-".to_string(), |x| format!("{:.2}", x.ratio));
        let back = dip
            .and_then(|x| x.back_after)
            .map_or("not within the run".to_string(), |b| format!("{b:.2}s"));
        println!(
            "                     {:<14}  {:<20} {:>7.2} {:>7.2}   {shown:>31}   {back}",
            d.kind.name(),
            d.node,
            d.at,
            end
        );
        dips.push(serde_json::json!({
            "kind": d.kind.name(), "node": d.node, "at_s": d.at, "end_s": end,
            "baseline_ops_per_s": dip.map(|x| x.baseline),
            "dip_ratio": dip.map(|x| x.ratio),
            "back_after_s": dip.and_then(|x| x.back_after),
        }));
    }
    let title = format!(
        "remora chaos: {} on {memnodes}+ memory nodes, seed {seed}, {} faults; throughput in 50 ms windows",
        args.scheme,
        done.len()
    );
    report::draw(&args.plot, &windows, &done, &title)?;
    println!("  timeline           {}", args.plot.display());
    if let Some(path) = &args.json {
        let v = serde_json::json!({
            "seed": seed,
            "scheme": args.scheme,
            "duration_s": duration,
            "verified_objects": verified,
            "lost_objects": lost,
            "wrong_objects": wrong,
            "wrong_reads": tally.wrong.load(Ordering::Relaxed),
            "data_lost_errors": tally.data_lost.load(Ordering::Relaxed),
            "unavailable_errors": tally.unavailable.load(Ordering::Relaxed),
            "other_errors": tally.other.load(Ordering::Relaxed),
            "ops": tally.ops.load(Ordering::Relaxed),
            "faults": done.iter().map(|d| serde_json::json!({
                "kind": d.kind.name(), "node": d.node, "at_s": d.at, "hold_s": d.hold, "rebuilt_at_s": d.rebuilt_at,
            })).collect::<Vec<_>>(),
            "dips": dips,
            "recoveries": recoveries,
            "spurious_recoveries": recoveries.saturating_sub(kills),
            "longest_zero_s": longest_zero,
            "longest_zero_outside_outages_s": longest_zero_outside,
            "manager_outages": outages.len(),
            "shrink_phases": shrink_phases,
            "manager_down_s": down_total,
            "manager_down_longest_s": down_longest,
            "settled": settled,
            "window_s": WINDOW,
            "timeline": windows.iter().map(|w| [w.0, w.1]).collect::<Vec<_>>(),
            // The runtime's own figures at the end of the run (since its start).
            "stats": st,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("  json               {}", path.display());
    }
    let data_lost = tally.data_lost.load(Ordering::Relaxed);
    if lost + wrong > 0 || tally.wrong.load(Ordering::Relaxed) > 0 || data_lost > 0 || !settled {
        bail!(
            "{lost} objects lost, {wrong} wrong, {} wrong reads, {data_lost} DataLost errors{}",
            tally.wrong.load(Ordering::Relaxed),
            if settled { "" } else { "; recovery did not finish" }
        );
    }
    Ok(())
}

/// Starts a memory node in place of a killed one.
fn join(cluster: &mut LocalCluster, t: f64) {
    match cluster.add_memnode() {
        Ok(i) => say(t, format!("node #{i} joined ({})", cluster.memnodes()[i].addr)),
        Err(e) => say(t, format!("a new node could not start: {e}")),
    }
}

/// The addresses of nodes the manager declared dead (in `status`, its last
/// verdict) that were paused or partitioned, not killed, and on which the
/// runtime still holds regions; `None` with no verdict to go by (then
/// nothing strikes).
fn fenced_unrebuilt(status: Option<&remora_proto::ClusterStatus>, rt: &Runtime, done: &[Done]) -> Option<Vec<String>> {
    let status = status?;
    // By node id: a fenced node comes back under a new id at the same address.
    let held: Vec<remora_proto::NodeId> = rt.regions().into_iter().map(|(_, g)| g.node).collect();
    let killed: Vec<&str> = done
        .iter()
        .filter(|d| d.kind.kills())
        .map(|d| d.node.as_str())
        .collect();
    Some(
        status
            .memory_nodes
            .iter()
            .filter(|n| n.state == remora_proto::NodeState::Dead)
            .filter(|n| !killed.contains(&n.addr.as_str()) && held.contains(&n.id))
            .map(|n| n.addr.clone())
            .collect(),
    )
}

/// The addresses of memory nodes down now: killed (or shrunk) and not yet
/// rebuilt, paused or partitioned, or `fenced` and not yet rebuilt.
fn down_now(cluster: &LocalCluster, done: &[Done], holds: &[Hold], fenced: Vec<String>) -> Vec<String> {
    let mut down = fenced;
    down.extend(
        done.iter()
            .filter(|d| d.kind.kills() && d.rebuilt_at.is_none())
            .map(|d| d.node.clone()),
    );
    down.extend(holds.iter().map(|h| cluster.memnodes()[h.node].addr.clone()));
    down
}

/// Whether the node at `addr` may go down now: every stripe group it is
/// in has fewer than `m` members `down`.
fn within_tolerance(groups: &[Vec<String>], down: &[String], addr: &str, m: usize) -> bool {
    groups
        .iter()
        .filter(|g| g.iter().any(|a| a == addr))
        .all(|g| g.iter().filter(|a| *a != addr && down.contains(a)).count() < m)
}

/// Memory nodes a fault may strike: alive, under no fault, holding the
/// runtime's far data, and `tolerable`.
fn victims(
    cluster: &LocalCluster,
    rt: &Runtime,
    dead: &[usize],
    holds: &[Hold],
    tolerable: &dyn Fn(&str) -> bool,
) -> Vec<usize> {
    let held: Vec<String> = rt.regions_with_data().into_iter().map(|(_, g)| g.addr).collect();
    (0..cluster.memnodes().len())
        .filter(|i| !dead.contains(i) && !holds.iter().any(|h| h.node == *i))
        .filter(|&i| {
            let addr = &cluster.memnodes()[i].addr;
            held.contains(addr) && tolerable(addr)
        })
        .collect()
}

/// Applies one planned fault to one of `cands` (the [`victims`], at least
/// one); returns its index and address.
fn strike(cluster: &mut LocalCluster, p: Planned, cands: &[usize]) -> Result<(usize, String)> {
    let node = cands[(p.pick % cands.len() as u64) as usize];
    let addr = cluster.memnodes()[node].addr.clone();
    match p.kind {
        FaultKind::Kill => cluster.kill_memnode(node)?,
        FaultKind::Pause => cluster.pause_memnode(node)?,
        FaultKind::Partition => {
            // Unanswered both ways: nothing served, no heartbeat, and every
            // open connection cut.
            cluster.fault(node, Fault::Pause)?;
            cluster.fault(node, Fault::DropConnections)?;
        }
        FaultKind::Manager | FaultKind::ManagerLeader => bail!("a manager is not a memory node"),
        FaultKind::Shrink => bail!("a shrink strikes several nodes"),
    }
    Ok((node, addr))
}

#[cfg(test)]
mod tests {
    use super::within_tolerance;

    #[test]
    fn a_node_may_go_down_only_while_each_of_its_groups_has_fewer_than_m_down() {
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let groups = vec![g(&["a", "b", "c", "d"]), g(&["c", "d", "e", "f"])];
        let m = 2;
        // One down in a's group: a second may go.
        assert!(within_tolerance(&groups, &g(&["b"]), "a", m));
        // Two down in a's group: a would be a third.
        assert!(!within_tolerance(&groups, &g(&["b", "c"]), "a", m));
        // e's only group has one of those down.
        assert!(within_tolerance(&groups, &g(&["b", "c"]), "e", m));
        // d is in both; the first has two down.
        assert!(!within_tolerance(&groups, &g(&["a", "b"]), "d", m));
        // In no group: free to go.
        assert!(within_tolerance(&groups, &g(&["a", "b", "c", "d"]), "z", m));
    }
}
