//! The figures Figure 5 and Table 2 of the paper compare schemes by, and
//! each scheme's ratio to `non-ft`'s measured in the same run at the same
//! offered load (closed loop to closed loop, each swept rate to itself), so
//! what a scheme's redundancy costs is read off directly and machine noise
//! between invocations does not enter it.
//!
//! The figures: throughput; p50, p99 and p99.9 latency; remote reads per
//! swap-in (1 for schemes that read a span whole, k or more for split
//! ones); bytes written to memory nodes per byte of spans evicted (the
//! redundancy's write cost: 1 for non-ft, 3 for 3-way replication, about
//! (k+m)/k for whole-span EC); far memory in use (the time average of the
//! samples taken every 100 ms of the measured phase); and misses (swap-in
//! waits) per operation; CPU time per operation and cores kept busy, this
//! process's and its servers' (memory nodes, Redis servers) together: on a
//! saturated machine throughput is about cores ÷ CPU per op, and CPU per op
//! moves far less than throughput when something else runs beside the bench.
//!
//! Beside them, clean re-evictions (spans evicted again without a write, a
//! swapped-in clean span's far copy being kept) and, for the redundant
//! schemes, degraded reads and reconstructed bytes: all deltas over the
//! measured phase.

use serde_json::{Map, Value};

use super::record::{Record, mib};
use super::report::load_label;
use super::sweep::{BASELINE, ratio};

/// One figure of the comparison.
struct Fig {
    /// JSON key in `ratio_to_non_ft`.
    key: &'static str,
    /// Column head.
    head: &'static str,
    /// Decimals of the figure itself.
    prec: usize,
    get: fn(&Record) -> Option<f64>,
}

const FIGS: [Fig; 12] = [
    Fig {
        key: "throughput",
        head: "ops/s",
        prec: 0,
        get: |r| Some(r.throughput()),
    },
    Fig {
        key: "p50",
        head: "p50 µs",
        prec: 1,
        get: |r| Some(r.us(0.5)),
    },
    Fig {
        key: "p99",
        head: "p99 µs",
        prec: 1,
        get: |r| Some(r.us(0.99)),
    },
    Fig {
        key: "p999",
        head: "p99.9 µs",
        prec: 1,
        get: |r| Some(r.us(0.999)),
    },
    Fig {
        key: "reads_per_swap_in",
        head: "rd/swin",
        prec: 2,
        get: |r| r.remora().and_then(|f| f.reads_per_swap_in()),
    },
    Fig {
        key: "write_amplification",
        head: "wr/evict",
        prec: 2,
        get: |r| r.remora().and_then(|f| f.write_amplification()),
    },
    Fig {
        key: "network_bytes_per_op",
        head: "net KiB/op",
        prec: 2,
        get: |r| {
            r.remora()
                .map(|f| f.network_bytes() as f64 / 1024.0 / r.run.ops.max(1) as f64)
        },
    },
    Fig {
        key: "remote_bytes_used",
        head: "remote MiB",
        prec: 1,
        get: |r| Some(mib(r.far_bytes())),
    },
    Fig {
        key: "far_over_data",
        head: "far/data",
        prec: 2,
        get: Record::far_over_data,
    },
    Fig {
        key: "misses_per_op",
        head: "miss/op",
        prec: 4,
        get: |r| Some(r.measured_miss_ratio()),
    },
    Fig {
        key: "cpu_us_per_op",
        head: "cpu µs/op",
        prec: 2,
        get: Record::cpu_us_per_op,
    },
    Fig {
        key: "cpu_cores",
        head: "cores",
        prec: 2,
        get: Record::cpu_cores,
    },
];

/// `non-ft`'s record at `r`'s load, if it ran.
fn baseline<'a>(r: &Record, records: &'a [Record]) -> Option<&'a Record> {
    records
        .iter()
        .find(|b| b.scheme == BASELINE && b.run.offered == r.run.offered)
}

/// `ratio_to_non_ft` of record `r`: each figure over `non-ft`'s at the same
/// load (`null` where either is unknown or non-ft's is 0); `null` if
/// `non-ft` did not run at that load.
pub(crate) fn to_json(r: &Record, records: &[Record]) -> Value {
    let Some(b) = baseline(r, records) else {
        return Value::Null;
    };
    let m: Map<String, Value> = FIGS
        .iter()
        .map(|f| (f.key.to_string(), ratio((f.get)(r), (f.get)(b)).into()))
        .collect();
    Value::Object(m)
}

/// Prints the figures, their ratios to `non-ft` and the clean/degraded table.
pub(crate) fn print(records: &[Record]) {
    if records.is_empty() {
        return;
    }
    let w = records.iter().map(|r| r.scheme.len()).max().unwrap_or(0).max(10);
    let head = || {
        print!("{:<w$} {:>10}", "scheme", "load");
        for f in &FIGS {
            print!(" {:>10}", f.head);
        }
        println!();
    };
    println!();
    println!(
        "figures compared (paper Fig. 5 / Table 2): rd/swin: remote reads per swap-in; wr/evict: bytes written \
         remotely per byte of spans evicted; net KiB/op: bytes the compute node read and wrote plus what memory \
         nodes sent each other, per op; remote MiB: far memory in use (average of 100 ms samples); miss/op: \
         swap-in waits (Redis: cache misses) per op; cpu µs/op: CPU time of this process and its servers (memory \
         nodes; Redis servers) per op; cores: the same CPU time per second measured"
    );
    head();
    for r in records {
        print!("{:<w$} {:>10}", r.scheme, load_label(r.run.offered));
        for f in &FIGS {
            print!(" {:>10}", opt((f.get)(r), f.prec));
        }
        println!();
    }

    println!();
    if !records.iter().any(|r| r.scheme == BASELINE) {
        println!("ratios to {BASELINE}: {BASELINE} did not run (add it to --scheme, or use --scheme all)");
    } else {
        println!("ratios to {BASELINE} at the same offered load, same run (x; - where a figure does not apply)");
        head();
        for r in records {
            print!("{:<w$} {:>10}", r.scheme, load_label(r.run.offered));
            let b = baseline(r, records);
            for f in &FIGS {
                let x = b.and_then(|b| ratio((f.get)(r), (f.get)(b)));
                print!(" {:>10}", opt(x, 2));
            }
            println!();
        }
    }

    if !records.iter().any(|r| r.remora().is_some()) {
        return;
    }
    println!();
    println!(
        "clean re-evictions (spans evicted again without a write: the far copy of a swapped-in clean span was \
         kept) and, for redundant schemes, reads served by decoding and bytes rebuilt; over the measured phase"
    );
    println!(
        "{:<w$} {:>10} {:>11} {:>10} {:>12} {:>9} {:>14} {:>16} {:>10} {:>9} {:>9}",
        "scheme",
        "load",
        "clean evs",
        "clean/s",
        "saved MiB",
        "saved %",
        "degraded reads",
        "reconstructed MiB",
        "stripes",
        "partial",
        "peer MiB"
    );
    for r in records {
        let Some(f) = r.remora() else { continue };
        let d = &f.delta;
        let secs = r.run.elapsed.as_secs_f64().max(1e-9);
        // Of the span bytes eviction had to place, the share kept copies saved writing.
        let placed = d.traffic.clean_bytes_saved + d.traffic.bytes_evicted_data;
        let saved_pct = (placed > 0).then(|| 100.0 * d.traffic.clean_bytes_saved as f64 / placed as f64);
        let redundant = r.scheme != BASELINE;
        let dash = || "-".to_string();
        println!(
            "{:<w$} {:>10} {:>11} {:>10.0} {:>12.1} {:>9} {:>14} {:>16} {:>10} {:>9} {:>9.1}",
            r.scheme,
            load_label(r.run.offered),
            d.traffic.clean_evictions,
            d.traffic.clean_evictions as f64 / secs,
            mib(d.traffic.clean_bytes_saved as f64),
            opt(saved_pct, 1),
            if redundant {
                d.scheme.degraded_reads.to_string()
            } else {
                "-".to_string()
            },
            if redundant {
                format!("{:.1}", mib(d.scheme.reconstructed_bytes as f64))
            } else {
                "-".to_string()
            },
            if d.scheme.spansets_written > 0 {
                d.scheme.spansets_written.to_string()
            } else {
                dash()
            },
            if d.scheme.spansets_written > 0 {
                d.scheme.partial_spansets.to_string()
            } else {
                dash()
            },
            mib(f.peer_bytes as f64)
        );
    }
    println!(
        "  saved %: clean-saved bytes / (clean-saved + evicted bytes written); stripes: spansets (ec-split: rows) \
         written, partial: of those with fewer than k data spans, each costing (j+m)/j in writes; peer MiB: bytes \
         memory nodes sent each other (rebuild reads), from their heartbeats"
    );
}

fn opt(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".to_string(), |x| format!("{x:.prec$}"))
}
