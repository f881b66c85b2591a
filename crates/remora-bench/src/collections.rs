//! `remora bench collections`: the far collections of `remora-collections`
//! against their std counterparts, and against `bench micro`'s array.
//!
//! 1. **All local** (local ratio 1.0: a budget no fill reaches). For each
//!    thread count: lookups in `RemHashMap`, `RemBTreeMap` and `RemVec`
//!    against std's `HashMap`, `BTreeMap` and `Vec` behind an `RwLock`;
//!    inserts over existing keys in both maps; a full scan of the vector
//!    and of the B-tree. Each op checks the value it reads (its first word
//!    names its key), and errors are counted.
//! 2. **Far** (each `--local-ratios` below 1.0): every structure is filled
//!    with a budget no fill reaches, then given `ratio` × the bytes of local
//!    spans the fill took, and left to evict. `bench micro`'s array (a
//!    `RemBox` per value behind an `RwLock`) is the yardstick of the
//!    collections' own overhead; all are measured in `--rounds` alternating
//!    windows while the others' background work is paused, and the ratio of
//!    each collection to the array is the median over the rounds.
//!
//! Keys are drawn from Zipf(`--zipf`) over the keys, through a fixed
//! permutation (hot keys scattered), before the clock starts: each thread
//! walks its own pre-drawn sequence, so drawing costs nothing measured.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::Zipf;
use remora_collections::{RemBTreeMap, RemHashMap, RemVec};
use remora_proto::parse_duration;
use remora_runtime::{RemBox, Remotable, Runtime, RuntimeConfig, scheme};
use serde_json::json;

/// Arguments of `remora bench collections`.
#[derive(clap::Args, Debug, Clone)]
pub struct CollectionsArgs {
    /// Number of keys (values) in each structure.
    #[arg(long, default_value_t = 65_536)]
    pub keys: u64,
    /// Bytes per value: 64, 256, 1024 or 4096.
    #[arg(long, default_value_t = 1024)]
    pub value_size: usize,
    /// Thread counts, comma-separated.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Threads of the far phase.
    #[arg(long, default_value_t = 2)]
    pub far_threads: usize,
    /// Length of each measured window.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Rounds of alternating windows (all-local pairs and far structures).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Local ratios of the far phase (values below 1.0), comma-separated.
    #[arg(long, default_value = "0.5", value_delimiter = ',')]
    pub local_ratios: Vec<f64>,
    /// Zipf skew of the keys (0: uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// The runtime's fault-tolerance scheme.
    #[arg(long, default_value = "non-ft")]
    pub scheme: String,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

fn progress(msg: std::fmt::Arguments<'_>) {
    eprintln!("[bench collections] {msg}");
}

/// Runs the benchmark.
pub fn run(args: &CollectionsArgs) -> anyhow::Result<()> {
    if args.keys < 16 || args.threads.is_empty() || args.threads.contains(&0) || args.far_threads == 0 {
        bail!("--keys must be at least 16 and every thread count at least 1");
    }
    if !(args.zipf.is_finite() && args.zipf >= 0.0) {
        bail!("--zipf must be a non-negative number");
    }
    if args.local_ratios.iter().any(|r| !(*r > 0.0 && *r < 1.0)) {
        bail!("--local-ratios are fractions between 0 and 1 (1.0 is the all-local phase, always run)");
    }
    scheme::by_name(&args.scheme).with_context(|| format!("unknown scheme {:?}", args.scheme))?;
    match args.value_size {
        64 => run_sized::<8>(args),
        256 => run_sized::<32>(args),
        1024 => run_sized::<128>(args),
        4096 => run_sized::<512>(args),
        other => bail!("--value-size {other}: choose 64, 256, 1024 or 4096"),
    }
}

/// A value: word 0 names its key, the others are filler.
type Val<const W: usize> = [u64; W];

fn val<const W: usize>(k: u64) -> Val<W> {
    let mut v = [k.wrapping_mul(0x9E37_79B9_7F4A_7C15); W];
    v[0] = k;
    v
}

/// Pre-drawn keys: one sequence per thread.
struct Keys {
    seqs: Vec<Vec<u64>>,
}

impl Keys {
    fn draw(n: u64, zipf: f64, threads: usize, per_thread: usize) -> anyhow::Result<Self> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut perm: Vec<u64> = (0..n).collect();
        perm.shuffle(&mut rng);
        let z = if zipf > 0.0 {
            Some(Zipf::new(n as f64, zipf).context("Zipf parameters")?)
        } else {
            None
        };
        let seqs = (0..threads)
            .map(|_| {
                (0..per_thread)
                    .map(|_| match &z {
                        Some(z) => perm[(rng.sample(z) as u64 - 1).min(n - 1) as usize],
                        None => rng.random_range(0..n),
                    })
                    .collect()
            })
            .collect();
        Ok(Self { seqs })
    }
}

/// Runs `op` on `threads` threads for `dur`, each walking its own keys;
/// returns operations per second and the operations that failed.
fn measure(keys: &Keys, threads: usize, dur: Duration, op: &(dyn Fn(u64) -> bool + Sync)) -> (f64, u64) {
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, ops, errors) = (&stop, &ops, &errors);
            let seq = &keys.seqs[t % keys.seqs.len()];
            s.spawn(move || {
                let (mut n, mut bad) = (0u64, 0u64);
                let mut i = t * 7919;
                while n % 256 != 0 || !stop.load(Ordering::Relaxed) {
                    if !op(seq[i % seq.len()]) {
                        bad += 1;
                    }
                    i += 1;
                    n += 1;
                }
                ops.fetch_add(n, Ordering::Relaxed);
                errors.fetch_add(bad, Ordering::Relaxed);
            });
        }
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
    });
    let secs = start.elapsed().as_secs_f64();
    (
        ops.load(Ordering::Relaxed) as f64 / secs,
        errors.load(Ordering::Relaxed),
    )
}

/// One row of the all-local phase.
struct Row {
    what: &'static str,
    threads: usize,
    std_ops: f64,
    rem_ops: f64,
    /// remora / std: the median of the rounds' ratios.
    ratio: f64,
    errors: u64,
}

fn runtime(cluster: &remora_cluster::LocalCluster, args: &CollectionsArgs, budget: usize) -> anyhow::Result<Runtime> {
    let mut cfg = RuntimeConfig::new(cluster.manager_addr(), budget);
    cfg.conn = cluster.conn_options();
    cfg.name = "bench-collections".into();
    cfg.scheme = scheme::by_name(&args.scheme).context("scheme")?;
    Runtime::connect(cfg).context("connecting a runtime")
}

fn run_sized<const W: usize>(args: &CollectionsArgs) -> anyhow::Result<()>
where
    Val<W>: Remotable,
{
    let n = args.keys;
    let data = n * (W as u64 * 8 + 64);
    // Four runtimes at once in the far phase, each holding at least one
    // stripe group (k+m regions on distinct nodes) and growing a second
    // while it evicts, whatever the data: small runs need the regions more
    // than the bytes.
    let groups = 4 * 2 * crate::micro::MEMNODES as u64 * crate::micro::REGION_SIZE;
    let cluster = crate::micro::start_cluster_for((data * 3 * 4).max(groups), crate::micro::MEMNODES, 1)?;
    let max_threads = args.threads.iter().copied().max().unwrap_or(1).max(args.far_threads);
    let keys = Keys::draw(n, args.zipf, max_threads, 1 << 20)?;
    let dur = args.duration;
    let mut rows = Vec::new();

    // ---- 1. all local ----
    progress(format_args!(
        "all local: {n} keys of {} bytes, threads {:?}",
        W * 8,
        args.threads
    ));
    let rt = runtime(&cluster, args, (data * 4) as usize)?;
    let std_hash: RwLock<HashMap<u64, Val<W>>> = RwLock::new((0..n).map(|k| (k, val::<W>(k))).collect());
    let std_tree: RwLock<BTreeMap<u64, Val<W>>> = RwLock::new((0..n).map(|k| (k, val::<W>(k))).collect());
    let std_vec: RwLock<Vec<Val<W>>> = RwLock::new((0..n).map(val::<W>).collect());
    let hash = RemHashMap::<u64, Val<W>>::new(&rt);
    let tree = RemBTreeMap::<u64, Val<W>>::new(&rt);
    let vec = RemVec::<Val<W>>::with_chunk_bytes(&rt, 16 << 10);
    for k in 0..n {
        hash.insert(k, val::<W>(k))?;
        tree.insert((k * 2_654_435_761) % n, val::<W>((k * 2_654_435_761) % n))?;
        vec.push(val::<W>(k))?;
    }
    let st = rt.stats();
    if st.traffic.swap_outs > 0 {
        bail!(
            "the all-local phase evicted {} spans: the budget is too small",
            st.traffic.swap_outs
        );
    }
    let read = |r: Option<bool>| r == Some(true);
    type Op<'a> = Box<dyn Fn(u64) -> bool + Sync + 'a>;
    let ops: Vec<(&'static str, Op<'_>, Op<'_>)> = vec![
        (
            "HashMap get",
            Box::new(|k| read(std_hash.read().unwrap().get(&k).map(|v| v[0] == k))),
            Box::new(|k| read(hash.get_with(&k, |v| v[0] == k).ok().flatten())),
        ),
        (
            "BTreeMap get",
            Box::new(|k| read(std_tree.read().unwrap().get(&k).map(|v| v[0] == k))),
            Box::new(|k| read(tree.get_with(&k, |v| v[0] == k).ok().flatten())),
        ),
        (
            "Vec get",
            Box::new(|k| read(std_vec.read().unwrap().get(k as usize).map(|v| v[0] == k))),
            Box::new(|k| read(vec.get(k as usize).ok().flatten().map(|v| v[0] == k))),
        ),
        (
            "HashMap insert",
            Box::new(|k| std_hash.write().unwrap().insert(k, val::<W>(k)).is_some()),
            Box::new(|k| hash.insert(k, val::<W>(k)).unwrap_or(false)),
        ),
        (
            "BTreeMap insert",
            Box::new(|k| std_tree.write().unwrap().insert(k, val::<W>(k)).is_some()),
            Box::new(|k| tree.insert(k, val::<W>(k)).unwrap_or(false)),
        ),
    ];
    // Every (op, threads) pair, std and remora, once per round, so that
    // each ratio is of windows taken a second apart (this machine drifts
    // by more than the differences measured over a minute).
    let mut samples: Vec<Vec<(f64, f64, u64)>> = vec![Vec::new(); ops.len() * args.threads.len()];
    for round in 0..args.rounds.max(1) {
        for (o, (what, std_op, rem_op)) in ops.iter().enumerate() {
            for (ti, &t) in args.threads.iter().enumerate() {
                let ((s, e1), (r, e2)) = if round % 2 == 0 {
                    let s = measure(&keys, t, dur, &**std_op);
                    (s, measure(&keys, t, dur, &**rem_op))
                } else {
                    let r = measure(&keys, t, dur, &**rem_op);
                    (measure(&keys, t, dur, &**std_op), r)
                };
                progress(format_args!(
                    "round {round}: {what} x{t}: std {s:.0}/s, remora {r:.0}/s ({:.2}x)",
                    r / s
                ));
                samples[o * args.threads.len() + ti].push((s, r, e1 + e2));
            }
        }
    }
    for (o, (what, ..)) in ops.iter().enumerate() {
        for (ti, &t) in args.threads.iter().enumerate() {
            let v = &samples[o * args.threads.len() + ti];
            rows.push(Row {
                what,
                threads: t,
                std_ops: median(v.iter().map(|x| x.0).collect()),
                rem_ops: median(v.iter().map(|x| x.1).collect()),
                ratio: median(v.iter().map(|x| x.1 / x.0).collect()),
                errors: v.iter().map(|x| x.2).sum(),
            });
        }
    }
    // Remora's 2-thread / 1-thread throughput, median over the rounds.
    let scaling: Vec<(&str, f64)> = match (
        args.threads.iter().position(|&t| t == 1),
        args.threads.iter().position(|&t| t == 2),
    ) {
        (Some(one), Some(two)) => ops
            .iter()
            .enumerate()
            .filter(|(_, (what, ..))| what.ends_with("get"))
            .map(|(o, (what, ..))| {
                let (a, b) = (
                    &samples[o * args.threads.len() + one],
                    &samples[o * args.threads.len() + two],
                );
                (*what, median(a.iter().zip(b).map(|(x, y)| y.1 / x.1).collect()))
            })
            .collect(),
        _ => Vec::new(),
    };
    drop(ops);
    // Scans, one thread: values per second.
    let scan = |what: &'static str, std_scan: &dyn Fn() -> u64, rem_scan: &dyn Fn() -> u64| {
        // A scan that saw a wrong or missing value counts as one error.
        let time = |f: &dyn Fn() -> u64| {
            let start = Instant::now();
            let (mut seen, mut bad) = (0, 0);
            while start.elapsed() < dur {
                match f() {
                    0 => bad += 1,
                    got => seen += got,
                }
            }
            (seen as f64 / start.elapsed().as_secs_f64(), bad)
        };
        let (s, e1) = time(std_scan);
        let (r, e2) = time(rem_scan);
        progress(format_args!("{what}: std {s:.0}/s, remora {r:.0}/s ({:.2}x)", r / s));
        Row {
            what,
            threads: 1,
            std_ops: s,
            rem_ops: r,
            ratio: r / s,
            errors: e1 + e2,
        }
    };
    let whole = |got: u64| if got == n { n } else { 0 };
    rows.push(scan(
        "Vec scan (values)",
        &|| {
            whole(
                std_vec
                    .read()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .filter(|(i, v)| v[0] == *i as u64)
                    .count() as u64,
            )
        },
        &|| {
            let mut ok = 0u64;
            let _ = vec.for_each_chunk(0, |first, vals| {
                ok += vals
                    .iter()
                    .enumerate()
                    .filter(|(j, v)| v[0] == (first + j) as u64)
                    .count() as u64;
                true
            });
            whole(ok)
        },
    ));
    rows.push(scan(
        "BTreeMap scan (entries)",
        &|| whole(std_tree.read().unwrap().iter().filter(|(k, v)| v[0] == **k).count() as u64),
        &|| whole(tree.iter().filter(|e| matches!(e, Ok((k, v)) if v[0] == *k)).count() as u64),
    ));
    drop(hash);
    drop(tree);
    drop(vec);
    drop(rt);

    // ---- 2. far ----
    let mut far_rows = Vec::new();
    for &ratio in &args.local_ratios {
        far_rows.extend(far_phase::<W>(args, &cluster, &keys, ratio)?);
    }

    // ---- report ----
    println!();
    println!(
        "remora bench collections: {n} keys of {} bytes, Zipf {}, scheme {}",
        W * 8,
        args.zipf,
        args.scheme
    );
    println!();
    println!("all local (medians)          threads       std ops/s    remora ops/s   remora / std");
    for r in &rows {
        println!(
            "{:<28} {:>7} {:>15.0} {:>15.0} {:>14.2}",
            r.what, r.threads, r.std_ops, r.rem_ops, r.ratio
        );
    }
    for (what, x) in &scaling {
        println!("remora {what}: 2 threads / 1 thread = {x:.2}");
    }
    println!();
    println!(
        "far ({} threads)             local ratio     ops/s (median)   / array (median of rounds)",
        args.far_threads
    );
    for r in &far_rows {
        println!(
            "{:<28} {:>11.2} {:>18.0} {:>26}",
            r.what,
            r.ratio,
            r.ops,
            r.to_array.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into())
        );
    }
    let errors: u64 = rows.iter().map(|r| r.errors).sum::<u64>() + far_rows.iter().map(|r| r.errors).sum::<u64>();
    println!("errors (values that did not match their key, or failed reads): {errors}");
    if let Some(path) = &args.json {
        let doc = json!({
            "keys": n,
            "value_size": W * 8,
            "zipf": args.zipf,
            "scheme": args.scheme,
            "local": rows.iter().map(|r| json!({
                "what": r.what, "threads": r.threads, "std_ops_per_sec": r.std_ops,
                "remora_ops_per_sec": r.rem_ops, "remora_to_std": r.ratio, "errors": r.errors,
            })).collect::<Vec<_>>(),
            "scaling_2_to_1": scaling.iter().map(|(w, x)| json!({"what": w, "ratio": x})).collect::<Vec<_>>(),
            "far": far_rows.iter().map(|r| json!({
                "what": r.what, "local_ratio": r.ratio, "threads": args.far_threads,
                "ops_per_sec": r.ops, "to_array": r.to_array, "errors": r.errors,
            })).collect::<Vec<_>>(),
            "errors": errors,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if errors > 0 {
        bail!("{errors} operations read a wrong value or failed");
    }
    Ok(())
}

/// One structure's result in the far phase.
struct FarRow {
    what: &'static str,
    ratio: f64,
    ops: f64,
    to_array: Option<f64>,
    errors: u64,
}

/// A filled structure of the far phase, on a runtime of its own.
struct Far<'a> {
    what: &'static str,
    rt: &'a Runtime,
    op: Box<dyn Fn(u64) -> bool + Sync + 'a>,
}

fn median(v: Vec<f64>) -> f64 {
    crate::net::stats::median(&v).unwrap_or(0.0)
}

fn far_phase<const W: usize>(
    args: &CollectionsArgs,
    cluster: &remora_cluster::LocalCluster,
    keys: &Keys,
    ratio: f64,
) -> anyhow::Result<Vec<FarRow>>
where
    Val<W>: Remotable,
{
    let n = args.keys;
    let unlimited = (n * (W as u64 * 8 + 64) * 4) as usize;
    progress(format_args!(
        "far: local ratio {ratio}, {} threads, {} rounds",
        args.far_threads, args.rounds
    ));
    let rts: Vec<Runtime> = (0..4)
        .map(|_| runtime(cluster, args, unlimited))
        .collect::<Result<_, _>>()?;
    let array: Vec<RwLock<RemBox<Val<W>>>> = (0..n)
        .map(|k| rts[0].alloc(val::<W>(k)).map(RwLock::new))
        .collect::<Result<_, _>>()?;
    let hash = RemHashMap::<u64, Val<W>>::new(&rts[1]);
    let tree = RemBTreeMap::<u64, Val<W>>::new(&rts[2]);
    let vec = RemVec::<Val<W>>::with_chunk_bytes(&rts[3], 16 << 10);
    for k in 0..n {
        hash.insert(k, val::<W>(k))?;
        tree.insert((k * 2_654_435_761) % n, val::<W>((k * 2_654_435_761) % n))?;
        vec.push(val::<W>(k))?;
    }
    let read = |r: Option<bool>| r == Some(true);
    let fars = vec![
        Far {
            what: "array (bench micro)",
            rt: &rts[0],
            op: Box::new(|k| {
                let g = array[k as usize].read().unwrap();
                let scope = rts[0].scope();
                g.deref(&scope).is_ok_and(|v| v[0] == k)
            }),
        },
        Far {
            what: "RemHashMap get",
            rt: &rts[1],
            op: Box::new(|k| read(hash.get_with(&k, |v| v[0] == k).ok().flatten())),
        },
        Far {
            what: "RemBTreeMap get",
            rt: &rts[2],
            op: Box::new(|k| read(tree.get_with(&k, |v| v[0] == k).ok().flatten())),
        },
        Far {
            what: "RemVec get",
            rt: &rts[3],
            op: Box::new(|k| read(vec.get(k as usize).ok().flatten().map(|v| v[0] == k))),
        },
    ];
    // Each gets `ratio` of the local span bytes its own fill took.
    for f in &fars {
        let took = f.rt.stats().local.bytes;
        f.rt.set_local_budget((took as f64 * ratio) as usize);
        f.rt.wait_for_eviction(Duration::from_secs(60))
            .with_context(|| format!("{}: eviction to the local ratio", f.what))?;
        f.rt.pause_background(true);
    }
    let mut ops: Vec<Vec<f64>> = vec![Vec::new(); fars.len()];
    let mut errors = vec![0u64; fars.len()];
    for round in 0..args.rounds.max(1) {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..fars.len()).collect()
        } else {
            (0..fars.len()).rev().collect()
        };
        for i in order {
            let f = &fars[i];
            f.rt.pause_background(false);
            // A short unmeasured window: the previous structure's paging settles.
            measure(keys, args.far_threads, Duration::from_millis(200), &*f.op);
            let (o, e) = measure(keys, args.far_threads, args.duration, &*f.op);
            f.rt.pause_background(true);
            ops[i].push(o);
            errors[i] += e;
        }
    }
    let rows = fars
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let per_round: Vec<f64> = ops[i].iter().zip(&ops[0]).map(|(o, a)| o / a).collect();
            let row = FarRow {
                what: f.what,
                ratio,
                ops: median(ops[i].clone()),
                to_array: (i > 0).then(|| median(per_round)),
                errors: errors[i],
            };
            progress(format_args!(
                "{} at {ratio}: {:.0}/s{}",
                row.what,
                row.ops,
                row.to_array.map(|x| format!(", {x:.2}x the array")).unwrap_or_default()
            ));
            row
        })
        .collect();
    Ok(rows)
}
