//! Throughput ratios read off stores measured in alternating rounds
//! (`--rounds`, `alternate.rs`): each round gives every store a window in
//! turn, so each round yields one ratio of two stores' throughputs taken
//! seconds apart, not one ratio of two runs that the machine's drift can
//! move by 10–20 %. The median of the rounds, with their range, is the
//! figure; the whole run's ratio stands beside it.
//!
//! Two tables: every pair of stores (row ÷ column, medians), and what
//! compaction costs (each compaction-thread count of a scheme ÷ its first
//! count, normally 0, round by round).

use serde_json::{Value, json};

use super::record::Record;
use super::schemes::split_label;
use crate::net::stats::{median, range};

/// The record `r`'s rounds are compared with: the first record of the same
/// scheme at another compaction-thread count, measured in as many rounds.
fn base<'a>(r: &Record, records: &'a [Record]) -> Option<&'a Record> {
    let (name, Some(_)) = split_label(&r.scheme) else {
        return None;
    };
    records
        .iter()
        .find(|b| split_label(&b.scheme).0 == name && !b.rounds.is_empty() && b.rounds.len() == r.rounds.len())
        .filter(|b| !std::ptr::eq(*b, r))
}

/// Each round's throughput ratio of `r` to `b`.
fn per_round(r: &Record, b: &Record) -> Vec<f64> {
    r.rounds
        .iter()
        .zip(&b.rounds)
        .filter(|(_, b)| **b > 0.0)
        .map(|(x, b)| x / b)
        .collect()
}

/// The records measured in as many rounds as `r`, `r` among them.
fn paired<'a>(r: &Record, records: &'a [Record]) -> Vec<&'a Record> {
    records
        .iter()
        .filter(|b| !r.rounds.is_empty() && b.rounds.len() == r.rounds.len())
        .collect()
}

/// The rounds of `r` and their ratios to its base, as JSON (`null` for a
/// record not measured in rounds).
pub(crate) fn to_json(r: &Record, records: &[Record]) -> Value {
    if r.rounds.is_empty() {
        return Value::Null;
    }
    let b = base(r, records);
    let ratios = b.map(|b| per_round(r, b));
    let to: serde_json::Map<String, Value> = paired(r, records)
        .into_iter()
        .filter(|b| !std::ptr::eq(*b, r))
        .map(|b| (b.scheme.clone(), json!(median(&per_round(r, b)))))
        .collect();
    json!({
        "median_ratio_to": to,
        "ops_per_s": r.rounds,
        "base": b.map(|b| b.scheme.clone()),
        "throughput_ratio_to_base": ratios,
        "median_ratio": ratios.as_deref().and_then(median),
        "whole_run_ratio": b.map(|b| r.throughput() / b.throughput().max(1e-9)),
    })
}

/// Prints the tables, if any record was measured in rounds.
pub(crate) fn print(records: &[Record]) {
    print_pairs(records);
    print_compaction(records);
}

/// Every pair of stores: the median of the per-round ratios, row ÷ column.
fn print_pairs(records: &[Record]) {
    let Some(first) = records.iter().find(|r| !r.rounds.is_empty()) else {
        return;
    };
    let rows = paired(first, records);
    if rows.len() < 2 {
        return;
    }
    println!();
    println!(
        "throughput in {} alternating rounds: each round measures every store in turn (order reversed every other \
         round) while the others are paused; median over the rounds of row ÷ column, each round's ratio taken \
         seconds apart",
        first.rounds.len()
    );
    let w = rows.iter().map(|r| r.scheme.len()).max().unwrap_or(0).max(8);
    let mut head = format!("{:<w$} {:>10}", "scheme", "ops/s");
    for c in &rows {
        head += &format!(" {:>w$}", c.scheme);
    }
    println!("{head}");
    for r in &rows {
        let mut line = format!("{:<w$} {:>10.0}", r.scheme, r.throughput());
        for c in &rows {
            let cell = if std::ptr::eq(*r, *c) {
                "-".to_string()
            } else {
                median(&per_round(r, c)).map_or("-".into(), |m| format!("{m:.3}"))
            };
            line += &format!(" {cell:>w$}");
        }
        println!("{line}");
    }
}

/// Each compaction-thread count of a scheme ÷ its first count, per round.
fn print_compaction(records: &[Record]) {
    let rows: Vec<(&Record, &Record)> = records.iter().filter_map(|r| Some((r, base(r, records)?))).collect();
    let Some(n) = rows.first().map(|(r, _)| r.rounds.len()) else {
        return;
    };
    println!();
    println!(
        "compaction's cost in {n} alternating rounds: each round measures every compaction-thread count of a scheme \
         in turn (order reversed every other round) while the others' runtimes are paused; throughput ÷ the first \
         count's, per round, their median [min, max], and the whole run's"
    );
    let w = records.iter().map(|r| r.scheme.len()).max().unwrap_or(0).max(10);
    println!(
        "{:<w$} {:<w$} {:>8} {:>22} {:>10}   per round",
        "scheme", "÷", "median", "[min, max]", "whole"
    );
    for (r, b) in rows {
        let x = per_round(r, b);
        let (lo, hi) = range(&x).unwrap_or((f64::NAN, f64::NAN));
        let list: Vec<String> = x.iter().map(|v| format!("{v:.3}")).collect();
        println!(
            "{:<w$} {:<w$} {:>8} {:>22} {:>10.3}   {}",
            r.scheme,
            b.scheme,
            median(&x).map_or("-".into(), |m| format!("{m:.3}")),
            format!("[{lo:.3}, {hi:.3}]"),
            r.throughput() / b.throughput().max(1e-9),
            list.join(" ")
        );
    }
}
