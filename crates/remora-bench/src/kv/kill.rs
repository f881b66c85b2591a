//! `--kill-at`: the paper's Figure 10a. For `replication` and `ec-batch`,
//! a fresh store at `--kill-ratio` runs transfers for `--kill-duration`;
//! `--kill-at` into it, a memory node holding its data is killed with
//! SIGKILL. Throughput is counted in 100 ms windows; the dip is the mean
//! from the kill to the store's rebuild (every failure recovered, every
//! spanset at full tolerance again) over the mean of the 5 s before, and
//! "back" is when throughput stayed at 90 % of that for 0.5 s, as
//! `remora chaos` reads its faults. A new memory node joins after each run,
//! so the next scheme again has a spare to rebuild on.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::Context;
use remora_apps::kv::tpca::Shape;
use remora_apps::throughput;
use remora_cluster::LocalCluster;
use serde_json::{Value, json};

use super::plot::{self, KillRun};
use super::subjects::{self, Store, StoreSpec};
use super::{KvArgs, progress};

/// Width of a throughput window, seconds (Figure 10a's data points).
const WINDOW: f64 = 0.1;
/// How often commits and the runtime's recovery are sampled.
const SAMPLE: Duration = Duration::from_millis(10);

/// Runs the kill of every Figure 10a scheme among `specs`; returns their
/// JSON records and draws the figure.
pub(crate) fn runs(
    cluster: &mut LocalCluster,
    args: &KvArgs,
    shape: Shape,
    specs: &[StoreSpec],
    peak: u64,
    at: Duration,
) -> anyhow::Result<Vec<Value>> {
    let dur = args.kill_duration.unwrap_or(at + Duration::from_secs(10));
    let mut out = Vec::new();
    let mut drawn = Vec::new();
    for spec in specs.iter().filter(|s| s.is_kill_scheme()) {
        let name = spec.scheme().expect("a remora scheme");
        let (record, run) = one(cluster, args, shape, name, peak, at, dur)?;
        out.push(record);
        drawn.push(run);
        // A spare again for the next scheme's rebuild.
        cluster.add_memnode().context("adding a memory node after the kill")?;
    }
    let subtitle = format!(
        "TPC-A, {} accounts, local ratio {}, one memory node killed {:.1} s in",
        shape.accounts(),
        args.kill_ratio,
        at.as_secs_f64()
    );
    plot::figure10a(&args.kill_plot, &drawn, &subtitle)?;
    progress(format_args!("Figure 10a drawn to {}", args.kill_plot.display()));
    Ok(out)
}

fn one(
    cluster: &LocalCluster,
    args: &KvArgs,
    shape: Shape,
    name: &str,
    peak: u64,
    at: Duration,
    dur: Duration,
) -> anyhow::Result<(Value, KillRun)> {
    let budget = (peak as f64 * args.kill_ratio) as usize;
    let rt = subjects::runtime(cluster, name, budget)?;
    let bank = subjects::remora_bank(&rt, shape, args.versions)?;
    rt.wait_for_eviction(Duration::from_secs(120))
        .with_context(|| format!("{name}: eviction to {}", args.kill_ratio))?;
    let store = Store {
        label: name.to_string(),
        bank: Box::new(bank),
        rt: Some(&rt),
        committed: AtomicU64::new(0),
    };
    // Warm the store at its ratio before the clock starts.
    super::drive::drive(
        &store,
        shape,
        args.threads,
        Duration::from_secs(1),
        99,
        SAMPLE,
        &mut |_, _| {},
    );
    let base = rt.stats().scheme.recoveries;
    let samples: Mutex<Vec<(f64, u64)>> = Mutex::new(Vec::new());
    let mut rebuilt: Option<f64> = None;
    // (seconds, room wait ns, misses) at each sample: where the time went
    // while the store was rebuilt, against as long a stretch before the kill.
    let mut waits: Vec<(f64, u64, u64)> = Vec::new();
    let (w, kill) = std::thread::scope(|s| {
        let killer = s.spawn(|| crate::micro::node_kill::kill_nodes(cluster, &rt, name, at, 1));
        let w = super::drive::drive(&store, shape, args.threads, dur, 5, SAMPLE, &mut |t, commits| {
            samples.lock().unwrap_or_else(|p| p.into_inner()).push((t, commits));
            if rebuilt.is_none() {
                let st = rt.stats();
                waits.push((t, st.local.room_wait_ns, st.local.deref_misses));
                if st.scheme.recoveries > base && st.scheme.recovering == 0 && st.scheme.spansets_below_tolerance == 0 {
                    rebuilt = Some(t);
                }
            }
        });
        (w, killer.join())
    });
    let kill = kill.map_err(|_| anyhow::anyhow!("the killer thread panicked"))?;
    let kill_s = kill.at.as_secs_f64();
    let mut samples = samples.into_inner().unwrap_or_else(|p| p.into_inner());
    samples.insert(0, (0.0, 0));
    let windows = throughput::windows(&samples, WINDOW);
    let end = samples.last().map_or(0.0, |s| s.0);
    let dip = throughput::dip(&windows, WINDOW, kill_s, rebuilt.unwrap_or(end), kill_s);
    // Room waited for (ms, summed over threads) and misses from the kill to
    // the rebuild, and over as long a stretch just before the kill.
    let span = |from: f64, to: f64| {
        let at = |t: f64| waits.iter().rev().find(|w| w.0 <= t).copied().unwrap_or((0.0, 0, 0));
        let (a, b) = (at(from), at(to));
        (b.1.saturating_sub(a.1) as f64 / 1e6, b.2.saturating_sub(a.2))
    };
    let rebuild_len = rebuilt.map_or(0.0, |r| r - kill_s);
    let during = span(kill_s, kill_s + rebuild_len);
    let before = span(kill_s - rebuild_len, kill_s);
    let audit = store
        .bank
        .audit()
        .map_err(|e| anyhow::anyhow!("auditing {name} after the kill: {e}"))?;
    let verdict = audit.check(&shape, store.committed.load(std::sync::atomic::Ordering::Relaxed));
    let st = rt.stats();
    progress(format_args!(
        "[{name}] kill at {kill_s:.2} s ({} node): rebuilt {}; dip {} (mean from kill to rebuilt ÷ 5 s before); \
         back to 90 % {}; {} errors; {} degraded reads; from kill to rebuilt {:.0} ms waiting for room and {} misses \
         (as long before the kill: {:.0} ms, {}); audit {}",
        kill.nodes,
        rebuilt.map_or("never within the run".into(), |r| format!("{:.2} s after", r - kill_s)),
        dip.map_or("-".into(), |d| format!("{:.0} %", (1.0 - d.ratio) * 100.0)),
        dip.and_then(|d| d.back_after)
            .map_or("not within the run".into(), |b| format!("after {b:.2} s")),
        w.errors,
        st.scheme.degraded_reads,
        during.0,
        during.1,
        before.0,
        before.1,
        match &verdict {
            Ok(()) => "passed".to_string(),
            Err(e) => format!("FAILED: {e}"),
        }
    ));
    let record = json!({
        "scheme": name,
        "local_ratio": args.kill_ratio,
        "killed_nodes": kill.nodes,
        "kill_at_s": kill_s,
        "rebuilt_after_s": rebuilt.map(|r| r - kill_s),
        "baseline_tps": dip.map(|d| d.baseline),
        "dip": dip.map(|d| 1.0 - d.ratio),
        "back_after_s": dip.and_then(|d| d.back_after),
        "errors": w.errors,
        "first_error": w.first_error,
        "tps": w.tps(),
        "room_wait_ms_during_rebuild": during.0,
        "misses_during_rebuild": during.1,
        "room_wait_ms_before": before.0,
        "misses_before": before.1,
        "audit_ok": verdict.is_ok() && w.errors == 0 && kill.nodes > 0,
        "audit_error": verdict.err(),
        "windows": windows.iter().map(|w| json!([w.0, w.1])).collect::<Vec<_>>(),
        // The runtime's own figures at the end of the run (since its start).
        "stats": st,
    });
    Ok((
        record,
        KillRun {
            label: name.to_string(),
            windows,
            kill_at: kill_s,
            rebuilt_at: rebuilt,
        },
    ))
}
