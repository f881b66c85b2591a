//! `remora bench micro` and `remora bench runtime` end to end, with tiny
//! parameters: they run, verify every object, and write the JSON they promise.

use std::process::Command;

fn remora(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("remora runs")
}

fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("JSON written");
    serde_json::from_str(&text).expect("valid JSON")
}

#[test]
fn micro_runs_swaps_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("micro.json");
    let out = remora(&[
        "bench",
        "micro",
        "--scheme",
        "non-ft",
        "--objects",
        "2000",
        "--object-size",
        "4KiB",
        "--local-ratio",
        "0.25",
        "--zipf",
        "0.99",
        "--threads",
        "2",
        "--duration",
        "2",
        "--warmup",
        "200ms",
        "--write-ratio",
        "0.1",
        "--filter-interval",
        "2ms",
        "--high-watermark",
        "0.95",
        "--low-watermark",
        "0.9",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench micro failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("closed-loop"), "{stdout}");
    let v = read_json(&json);
    let results = v["results"].as_array().expect("results array");
    assert_eq!(results.len(), 1);
    let r = &results[0];
    for key in [
        "scheme",
        "throughput_ops",
        "p50_us",
        "p99_us",
        "p999_us",
        "samples",
        "swap_ins",
        "swap_outs",
        "reads_per_swap_in",
        "errors",
        "bytes_read_remote",
        "bytes_written_remote",
        "bytes_evicted_data",
        "remote_bytes_used",
        "live_bytes",
        "objects",
        "object_size",
        "local_ratio",
        "zipf",
        "threads",
        "write_ratio",
        "closed_loop",
    ] {
        assert!(r.get(key).is_some(), "missing {key} in {r}");
    }
    assert_eq!(r["scheme"], "non-ft");
    assert_eq!(r["errors"], 0, "{r}");
    assert!(r["swap_ins"].as_u64().unwrap() > 0, "{r}");
    // About a quarter of 2000 objects fits locally (the budget is a quarter of their spans).
    let local = r["local_objects"].as_f64().expect("local_objects");
    assert!(local > 0.0 && local <= 600.0, "{r}");
    // Counted at the transport: a read sent just before the window closes
    // may finish (and count its swap-in) just after, so allow a few in 10^4.
    let reads = r["reads_per_swap_in"].as_f64().expect("reads_per_swap_in");
    assert!((reads - 1.0).abs() < 1e-3, "one read per swap-in: {r}");
    assert!(r["writes"].as_u64().unwrap() > 0, "{r}");
    assert!(r["throughput_ops"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["samples"], r["ops"], "{r}");
}

#[test]
fn micro_rejects_bad_flags_without_panicking() {
    for args in [
        &["bench", "micro", "--object-size", "3000"][..],
        &["bench", "micro", "--scheme", "nope"],
        &["bench", "micro", "--scheme", "redis-cache:99"],
        &["bench", "micro", "--scheme", "redis-cache:x"],
        &["bench", "micro", "--local-ratio", "0"],
        &["bench", "micro", "--write-ratio", "1.5"],
        &["bench", "micro", "--zipf", "-1"],
        &["bench", "micro", "--objects", "0"],
        &["bench", "micro", "--high-watermark", "1.5"],
        &["bench", "micro", "--filter-interval", "soon"],
        &["bench", "micro", "--high-watermark", "0.8", "--low-watermark", "0.9"],
    ] {
        let out = remora(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}

#[test]
fn runtime_bench_reports_both_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("runtime.json");
    let out = remora(&[
        "bench",
        "runtime",
        "--objects",
        "1000",
        "--passes",
        "3",
        "--swap-sizes",
        "4KiB",
        "--samples",
        "100",
        "--round",
        "50",
        "--pin",
        "none",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench runtime failed:\n{stdout}\n{stderr}");
    let v = read_json(&json);
    assert_eq!(v["local_hit"].as_array().map(Vec::len), Some(2), "{v}");
    let s = &v["swap_in"][0];
    assert_eq!(s["swap_in_samples"], 100, "{v}");
    assert_eq!(s["span_bytes"], 24576, "{v}");
    assert!(s["ratio_p50"].as_f64().unwrap() > 0.0, "{v}");
    for key in [
        "swap_in_voluntary_cs_per_op",
        "swap_in_involuntary_cs_per_op",
        "raw_read_voluntary_cs_per_op",
    ] {
        assert!(s[key].as_f64().is_some_and(|x| x >= 0.0), "{key} in {v}");
    }
    assert!(
        v["local_hit"][0]["remora_voluntary_cs_per_op"].as_f64().is_some(),
        "{v}"
    );
}

#[test]
fn micro_open_loop_times_from_the_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("open.json");
    let out = remora(&[
        "bench",
        "micro",
        "--objects",
        "2000",
        "--object-size",
        "4KiB",
        "--local-ratio",
        "0.25",
        "--threads",
        "1",
        "--open-loop",
        "2000",
        "--duration",
        "2",
        "--warmup",
        "200ms",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench micro --open-loop failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("open-loop"), "{stdout}");
    let v = read_json(&json);
    let r = &v["results"][0];
    assert_eq!(r["latency_mode"], "open-loop", "{r}");
    assert_eq!(r["closed_loop"], false, "{r}");
    assert_eq!(r["open_loop_rate"].as_f64(), Some(2000.0), "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    let achieved = r["throughput_ops"].as_f64().unwrap() / 2000.0;
    assert!(
        (0.5..=1.2).contains(&achieved),
        "achieved {achieved} of the offered rate: {r}"
    );
    let (p50, p99) = (r["p50_us"].as_f64().unwrap(), r["p99_us"].as_f64().unwrap());
    assert!(p50 > 0.0 && p99 >= p50, "{r}");
    for key in ["p50_ci95_us", "p99_ci95_us"] {
        let ci = r[key].as_array().expect("a [lo, hi] interval");
        let (lo, hi) = (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap());
        assert!(lo <= hi, "{key}: {r}");
    }
    assert!(r["samples"].as_u64().unwrap() > 1000, "{r}");
}

#[test]
fn micro_rejects_bad_open_loop_flags() {
    for args in [
        &["bench", "micro", "--open-loop", "0"][..],
        &["bench", "micro", "--open-loop", "-5"],
        &["bench", "micro", "--sweep", "100,nan"],
        &["bench", "micro", "--open-loop", "100", "--sweep", "100,200"],
    ] {
        let out = remora(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}
