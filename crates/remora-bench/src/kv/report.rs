//! What `bench kv` prints, writes as JSON and draws (Figure 8).

use anyhow::bail;
use hdrhistogram::Histogram;
use remora_apps::kv::tpca::{Audit, Shape};
use serde_json::{Value, json};

use super::drive::{Cells, Window};
use super::plot::{self, Line};
use super::subjects::Store;
use super::{KvArgs, progress};

/// The median of the finite values (a round in which a store committed
/// nothing gives an infinite ratio, which says nothing).
fn median(v: Vec<f64>) -> Option<f64> {
    let v: Vec<f64> = v.into_iter().filter(|x| x.is_finite()).collect();
    crate::net::stats::median(&v)
}

fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

/// One store at one local ratio, over its rounds.
struct Summary {
    tps: f64,
    p50: u64,
    p99: u64,
    remote: Option<f64>,
    local: Option<f64>,
    hit: Option<f64>,
    errors: u64,
    first_error: Option<String>,
}

fn summarise(rounds: &[Window]) -> Summary {
    let mut h: Histogram<u64> = Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds");
    for w in rounds {
        let _ = h.add(&w.hist);
    }
    let (misses, ops): (u64, u64) = rounds.iter().fold((0, 0), |a, w| (a.0 + w.misses, a.1 + w.table_ops));
    Summary {
        tps: median(rounds.iter().map(Window::tps).collect()).unwrap_or(0.0),
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        remote: median(rounds.iter().filter_map(|w| w.remote).collect()),
        local: median(rounds.iter().filter_map(|w| w.local).collect()),
        hit: (ops > 0).then(|| (1.0 - misses as f64 / ops as f64).max(0.0)),
        errors: rounds.iter().map(|w| w.errors).sum(),
        first_error: rounds.iter().find_map(|w| w.first_error.clone()),
    }
}

/// The median over rounds of `a`'s TPS ÷ `b`'s, each round's pair taken
/// seconds apart.
fn ratio_of(cells: &[Vec<Window>], stores: &[Store<'_>], a: &str, b: &str) -> Option<f64> {
    let find = |l: &str| stores.iter().position(|s| s.label == l);
    let (ia, ib) = (find(a)?, find(b)?);
    median(
        cells[ia]
            .iter()
            .zip(&cells[ib])
            .map(|(x, y)| x.tps() / y.tps())
            .collect(),
    )
}

/// The comparisons the goals are stated in, at every ratio.
const PAIRS: [(&str, &str); 6] = [
    ("ec-batch", "non-ft"),
    ("ec-batch", "ec-split"),
    ("ec-batch-local", "ec-batch-remote"),
    ("ec-batch", "redis:2"),
    ("ec-batch", "redis:2+wait"),
    ("ec-batch", "local"),
];

/// Prints every table and returns the JSON document.
pub(crate) fn print(
    args: &KvArgs,
    shape: Shape,
    peak: u64,
    stores: &[Store<'_>],
    cells: &Cells,
    audits: &[(Audit, Result<(), String>)],
) -> anyhow::Result<Value> {
    println!();
    println!(
        "remora bench kv: TPC-A, {} branches / {} tellers / {} accounts, rows of {} bytes, {} versions kept, {} threads; \
         peak working set {:.1} MiB",
        shape.branches,
        shape.tellers(),
        shape.accounts(),
        remora_apps::kv::ROW_BYTES,
        args.versions,
        args.threads,
        mib(peak as f64)
    );
    let mut ratios_json = Vec::new();
    let mut errors = 0u64;
    for (ri, &ratio) in args.local_ratio.iter().enumerate() {
        let sums: Vec<Summary> = cells[ri].iter().map(|r| summarise(r)).collect();
        let non_ft_remote = stores
            .iter()
            .position(|s| s.label == "non-ft")
            .and_then(|i| sums[i].remote);
        println!();
        println!(
            "local ratio {ratio} (budget {:.1} MiB), medians of {} rounds",
            mib(peak as f64 * ratio),
            args.rounds
        );
        println!(
            "  {:<16} {:>9} {:>8} {:>9} {:>11} {:>9} {:>9} {:>8} {:>7}",
            "store", "TPS", "p50 µs", "p99 µs", "remote MiB", "÷ non-ft", "hit ratio", "÷ local", "errors"
        );
        let mut rows = Vec::new();
        for (si, s) in stores.iter().enumerate() {
            let m = &sums[si];
            let to_local = ratio_of(&cells[ri], stores, &s.label, "local");
            let remote_x = m.remote.zip(non_ft_remote).map(|(a, b)| a / b);
            let opt = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |x| format!("{x:.p$}"));
            println!(
                "  {:<16} {:>9.0} {:>8} {:>9} {:>11} {:>9} {:>9} {:>8} {:>7}",
                s.label,
                m.tps,
                m.p50,
                m.p99,
                opt(m.remote.map(mib), 1),
                opt(remote_x, 2),
                opt(m.hit, 3),
                opt(to_local, 2),
                m.errors
            );
            if let Some(e) = &m.first_error {
                println!("      first error: {e}");
            }
            errors += m.errors;
            rows.push(json!({
                "store": s.label,
                "tps": m.tps,
                "tps_rounds": cells[ri][si].iter().map(Window::tps).collect::<Vec<_>>(),
                "p50_us": m.p50,
                "p99_us": m.p99,
                "remote_bytes": m.remote,
                "remote_to_non_ft": remote_x,
                "local_bytes": m.local,
                "hit_ratio": m.hit,
                "to_local": to_local,
                "errors": m.errors,
            }));
        }
        let mut pairs = Vec::new();
        for (a, b) in PAIRS {
            if let Some(x) = ratio_of(&cells[ri], stores, a, b) {
                println!("  {a} ÷ {b} TPS (median of rounds): {x:.2}");
                pairs.push(json!({"a": a, "b": b, "tps_ratio": x}));
            }
        }
        ratios_json.push(json!({ "local_ratio": ratio, "budget_bytes": (peak as f64 * ratio) as u64, "stores": rows, "pairs": pairs }));
    }
    let failed: Vec<String> = stores
        .iter()
        .zip(audits)
        .filter_map(|(s, (_, v))| v.as_ref().err().map(|e| format!("{}: {e}", s.label)))
        .collect();
    println!();
    if failed.is_empty() {
        println!(
            "audit: every store's invariant holds (Σ accounts = Σ tellers = Σ branches = initial + Σ history) and every row verified"
        );
    } else {
        for f in &failed {
            println!("AUDIT FAILED: {f}");
        }
    }
    println!("errors (transfers that failed): {errors}");
    Ok(json!({
        "shape": { "branches": shape.branches, "tellers": shape.tellers(), "accounts": shape.accounts() },
        "row_bytes": remora_apps::kv::ROW_BYTES,
        "versions": args.versions,
        "threads": args.threads,
        "peak_bytes": peak,
        "ratios": ratios_json,
        "audits": stores.iter().zip(audits).map(|(s, (a, v))| json!({
            "store": s.label, "ok": v.is_ok(), "error": v.as_ref().err(),
            "values": a.values, "bad_values": a.bad_values, "history_records": a.history_records,
            "committed": s.committed.load(std::sync::atomic::Ordering::Relaxed),
        })).collect::<Vec<_>>(),
        "audits_failed": failed.len(),
        "errors": errors,
    }))
}

/// Draws Figure 8 to `--plot`.
pub(crate) fn figure8(args: &KvArgs, shape: Shape, stores: &[Store<'_>], cells: &Cells) -> anyhow::Result<()> {
    let lines: Vec<Line> = stores
        .iter()
        .enumerate()
        .map(|(si, s)| Line {
            label: s.label.clone(),
            points: args
                .local_ratio
                .iter()
                .enumerate()
                .map(|(ri, &r)| {
                    let m = summarise(&cells[ri][si]);
                    (r, m.tps, m.remote)
                })
                .collect(),
        })
        .collect();
    let subtitle = format!(
        "TPC-A, {} accounts of {} bytes, {} threads",
        shape.accounts(),
        remora_apps::kv::ROW_BYTES,
        args.threads
    );
    plot::figure8(&args.plot, &lines, &subtitle)?;
    progress(format_args!("Figure 8 drawn to {}", args.plot.display()));
    Ok(())
}

/// Fails the run if any transfer failed outside a kill run, any audit
/// failed, or a kill run erred or broke its store.
pub(crate) fn fail_on_errors(doc: &Value) -> anyhow::Result<()> {
    let errors = doc["errors"].as_u64().unwrap_or(0);
    let audits = doc["audits_failed"].as_u64().unwrap_or(0);
    let kill_bad = doc["kill"]
        .as_array()
        .map_or(0, |k| k.iter().filter(|r| r["audit_ok"] != Value::Bool(true)).count());
    if errors > 0 || audits > 0 || kill_bad > 0 {
        bail!("{errors} transfers failed, {audits} audits failed, {kill_bad} kill runs broke their store");
    }
    Ok(())
}
