//! `remora bench micro` and `remora bench runtime` end to end, with tiny
//! parameters: they run, verify every object, and write the JSON they promise.

mod common;

use common::{read_json, remora, remora_ok};

#[test]
fn micro_runs_swaps_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("micro.json");
    let svg = dir.path().join("timeline.svg");
    let (stdout, _) = remora_ok(
        &[
            &[
                "bench",
                "micro",
                "--timeline",
                svg.to_str().unwrap(),
                "--scheme",
                "non-ft",
            ][..],
            common::SMALL_ARRAY,
            &[
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
                "--census",
                "--json",
                json.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert!(stdout.contains("closed-loop"), "{stdout}");
    assert!(stdout.contains("local spans by use"), "{stdout}");
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
        "stats",
        "reads_per_swap_in",
        "errors",
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
    // The runtime's counters, as `Stats` serializes them: one object per group.
    let traffic = &r["stats"]["traffic"];
    for key in [
        "swap_ins",
        "swap_outs",
        "bytes_read_remote",
        "bytes_written_remote",
        "bytes_evicted_data",
    ] {
        assert!(traffic.get(key).is_some(), "missing stats.traffic.{key} in {r}");
    }
    assert!(traffic["swap_ins"].as_u64().unwrap() > 0, "{r}");
    assert!(r["stats"]["far"]["live_bytes"].as_u64().is_some(), "{r}");
    // About a quarter of 2000 objects fits locally (the budget is a quarter of their spans).
    let local = r["local_objects"].as_f64().expect("local_objects");
    assert!(local > 0.0 && local <= 600.0, "{r}");
    // The census counted the same local objects span by span (averaged over
    // the same samples and the phase's two ends).
    let census = &r["census"];
    assert!(census["samples"].as_u64().unwrap() >= 10, "{census}");
    let counted = census["live_objects"].as_f64().unwrap();
    assert!(
        (counted - local).abs() <= 0.25 * local,
        "census {counted} vs local {local}: {census}"
    );
    for g in census["groups"].as_array().unwrap() {
        assert!(g["live"].as_u64().unwrap() <= g["capacity"].as_u64().unwrap(), "{g}");
    }
    // Counted at the transport: a read sent just before the window closes
    // may finish (and count its swap-in) just after, so allow a few in 10^4.
    let reads = r["reads_per_swap_in"].as_f64().expect("reads_per_swap_in");
    assert!((reads - 1.0).abs() < 1e-3, "one read per swap-in: {r}");
    assert!(r["writes"].as_u64().unwrap() > 0, "{r}");
    assert!(r["throughput_ops"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["samples"], r["ops"], "{r}");
    // CPU charged to the run: this process's and the memory nodes'. A
    // closed loop of 2 threads keeps something busy all the time, and no
    // more than the machine's cores can be.
    let cores = r["cpu_cores"].as_f64().expect("cpu_cores");
    let max = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    assert!(cores > 0.2 && cores <= max * 1.05, "{r}");
    let per_op = r["cpu_us_per_op"].as_f64().expect("cpu_us_per_op");
    let expect = cores * 1e6 / r["throughput_ops"].as_f64().unwrap();
    assert!((per_op / expect - 1.0).abs() < 0.05, "{r}");
    // The timeline: 100 ms windows over the 2 s run, each with far memory
    // held (whole regions) at least what is allocated, and the windows'
    // operations adding up to the run's (each thread reports 256 at a time).
    let tl = &r["timeline"];
    let n = tl["t_s"].as_array().expect("timeline").len();
    assert!((15..=21).contains(&n), "{n} windows in 2 s: {tl}");
    let held = tl["far_held_bytes"].as_array().unwrap();
    let used = tl["far_used_bytes"].as_array().unwrap();
    assert!(
        held.iter()
            .zip(used)
            .all(|(h, u)| h.as_u64().unwrap() >= u.as_u64().unwrap()),
        "{tl}"
    );
    assert!(
        held.iter().all(|h| h.as_u64().unwrap() > 0),
        "the data is partly far: {tl}"
    );
    let t: Vec<f64> = tl["t_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let ops: f64 = tl["ops_per_s"]
        .as_array()
        .unwrap()
        .iter()
        .zip(std::iter::once(0.0).chain(t.iter().copied()).zip(&t))
        .map(|(r, (t0, t1))| r.as_f64().unwrap() * (t1 - t0))
        .sum();
    let total = r["ops"].as_f64().unwrap();
    assert!(
        ops <= total && ops >= total - 2.0 * 256.0 - total * 0.06,
        "windows {ops} vs run {total}"
    );
    assert!(
        std::fs::read_to_string(&svg).unwrap().contains("non-ft"),
        "the timeline SVG names the run"
    );
    assert!(stdout.contains("far memory held over the run"), "{stdout}");
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
        &["bench", "micro", "--scheme", "all,nope"],
        &["bench", "micro", "--ec", "0+2"],
        &["bench", "micro", "--ec", "4"],
        &["bench", "micro", "--ec", "4+x"],
        &["bench", "micro", "--ec", "20+20"],
        // RS needs a parity span: ec-batch refuses 4+0 before any cluster starts.
        &["bench", "micro", "--scheme", "all", "--ec", "4+0"],
        &["bench", "micro", "--plot", "x.svg"],
        &["bench", "micro", "--sweep", "auto,100"],
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
    remora_ok(&[
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

/// [`common::SMALL_ARRAY`] at 2000 ops/s offered by one thread, 2 s measured.
const SMALL_OPEN_LOOP: &[&str] = &[
    "--threads",
    "1",
    "--open-loop",
    "2000",
    "--duration",
    "2",
    "--warmup",
    "200ms",
];

#[test]
fn micro_open_loop_times_from_the_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("open.json");
    let args = [
        &["bench", "micro"],
        common::SMALL_ARRAY,
        SMALL_OPEN_LOOP,
        &["--json", json.to_str().unwrap()],
    ]
    .concat();
    let (stdout, _) = remora_ok(&args);
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

/// Several stores at one open-loop rate alternate in rounds too, each
/// window open loop at that rate.
#[test]
fn micro_open_loop_stores_alternate_at_one_rate() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("open-rounds.json");
    let args = [
        &["bench", "micro", "--scheme", "non-ft,ec-batch", "--rounds", "2"],
        common::SMALL_ARRAY,
        SMALL_OPEN_LOOP,
        &["--json", json.to_str().unwrap()],
    ]
    .concat();
    let (_, stderr) = remora_ok(&args);
    assert!(
        stderr.contains("[non-ft, ec-batch] 2 alternating rounds of 1.0 s"),
        "{stderr}"
    );
    let v = read_json(&json);
    let results = v["results"].as_array().expect("results array");
    assert_eq!(results.len(), 2, "{v}");
    for r in results {
        assert_eq!(r["latency_mode"], "open-loop", "{r}");
        assert_eq!(r["open_loop_rate"].as_f64(), Some(2000.0), "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["wrong_bytes"], 0, "{r}");
        assert_eq!(rounds_of(r).len(), 2, "{r}");
        // The samples are the arrivals scheduled in two 1 s windows at
        // 2000/s (Poisson), not what a closed loop would issue.
        let samples = r["samples"].as_u64().unwrap();
        assert!((3000..=5000).contains(&samples), "{samples} samples: {r}");
    }
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

/// `--scheme all` runs every scheme of the runtime's table, in its order, on
/// one cluster, at each rate of a two-rate sweep; every record verifies, the
/// whole-span schemes read once per swap-in, every record carries its ratios
/// to non-ft, and the plot names every scheme.
#[test]
fn micro_all_schemes_sweep_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("all.json");
    let svg = dir.path().join("sweep.svg");
    let threads = 2u64;
    let (stdout, _) = remora_ok(
        &[
            &["bench", "micro", "--scheme", "all"][..],
            common::SMALL_ARRAY,
            &[
                "--threads",
                "2",
                "--write-ratio",
                "0.1",
                "--sweep",
                "300,600",
                "--duration",
                "1",
                "--warmup",
                "200ms",
                "--plot",
                svg.to_str().unwrap(),
                "--json",
                json.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    for want in ["ratios to non-ft", "saturation", "clean re-evictions"] {
        assert!(stdout.contains(want), "{want} missing:\n{stdout}");
    }
    let v = read_json(&json);
    let results = v["results"].as_array().expect("results array");
    let table: Vec<&str> = remora_runtime::scheme::SCHEMES.iter().map(|s| s.name).collect();
    // One record per scheme and rate, schemes in table order.
    let ran: Vec<&str> = results.iter().map(|r| r["scheme"].as_str().unwrap()).collect();
    let want: Vec<&str> = table.iter().flat_map(|s| [*s, *s]).collect();
    assert_eq!(ran, want, "records in table order");
    for r in results {
        let scheme = r["scheme"].as_str().unwrap();
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["wrong_bytes"], 0, "{r}");
        let traffic = &r["stats"]["traffic"];
        assert!(traffic["swap_ins"].as_u64().unwrap() > 0, "{r}");
        if ["non-ft", "replication", "ec-batch"].contains(&scheme) {
            // One read per swap-in; reads are counted at the transport, so
            // each thread may have one in flight across either window edge.
            // A read left overdue by a starved node is read around (more
            // reads): the count holds only without one.
            let (ins, reads) = (
                traffic["swap_ins"].as_u64().unwrap(),
                traffic["swap_in_reads"].as_u64().unwrap(),
            );
            if r["stats"]["detection"]["overdue_reads"].as_u64() == Some(0) {
                assert!(ins.abs_diff(reads) <= 2 * threads, "one read per swap-in: {r}");
            }
        }
        let ratios = &r["ratio_to_non_ft"];
        assert!(ratios.is_object(), "ratio_to_non_ft: {r}");
        if scheme == "non-ft" {
            assert_eq!(ratios["throughput"].as_f64(), Some(1.0), "{r}");
            assert_eq!(ratios["remote_bytes_used"].as_f64(), Some(1.0), "{r}");
        }
        if scheme == "replication" {
            // Three copies: far memory and bytes written about 3x non-ft's.
            let far = ratios["remote_bytes_used"].as_f64().unwrap();
            assert!((2.0..=4.5).contains(&far), "replication far memory {far}x non-ft: {r}");
        }
        if r["ec"].is_string() {
            assert_eq!((r["ec_k"].as_u64(), r["ec_m"].as_u64()), (Some(4), Some(2)), "{r}");
        }
    }
    let sweep = &v["sweep"];
    assert_eq!(sweep["rates"].as_array().map(Vec::len), Some(2), "{sweep}");
    assert_eq!(sweep["schemes"].as_array().map(Vec::len), Some(table.len()), "{sweep}");
    let svg = std::fs::read_to_string(&svg).expect("SVG written");
    assert!(svg.contains("<svg"), "not an SVG");
    for s in &table {
        assert!(svg.contains(s), "{s} missing from the plot");
    }
}

/// A short closed-loop run of `schemes` for `secs` seconds (4000 objects of
/// 4 KiB, a quarter local, uniform, 2 threads) with the fault flags
/// `faults`; returns its stderr and its JSON.
fn faulted_run(schemes: &str, secs: &str, faults: &[&str]) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let mut args = vec![
        "bench",
        "micro",
        "--scheme",
        schemes,
        "--objects",
        "4000",
        "--object-size",
        "4KiB",
        "--local-ratio",
        "0.25",
        "--threads",
        "2",
        "--zipf",
        "0",
        "--duration",
        secs,
        "--warmup",
        "200ms",
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(faults);
    let stderr = remora_ok(&args).1;
    (stderr, read_json(&json))
}

/// Every record of `v` ran operations, with 0 errors and 0 wrong bytes.
fn assert_clean_results(v: &serde_json::Value) {
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["wrong_bytes"], 0, "{r}");
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
    }
}

/// `--kill-at`: every redundant scheme runs through the SIGKILL of a memory
/// node holding its data with 0 errors and 0 wrong bytes, reading around it.
#[test]
fn micro_redundant_schemes_survive_a_kill_mid_run() {
    let (stderr, v) = faulted_run("replication,ec-split,ec-batch", "2", &["--kill-at", "300ms"]);
    assert_eq!(
        stderr.matches("with SIGKILL").count(),
        3,
        "one kill per scheme:\n{stderr}"
    );
    assert_clean_results(&v);
    for r in v["results"].as_array().unwrap() {
        // Network figures add in what memory nodes sent each other.
        let sum = [
            "/stats/traffic/bytes_read_remote",
            "/stats/traffic/bytes_written_remote",
            "/stats/traffic/txn_bytes",
            "/peer_bytes",
        ]
        .iter()
        .map(|k| r.pointer(k).and_then(serde_json::Value::as_u64).unwrap())
        .sum::<u64>();
        assert_eq!(r["network_bytes"].as_u64().unwrap(), sum, "{r}");
        // The node's data is read around (degraded) or already rebuilt:
        // found dead by the first request to fail, it may be rebuilt
        // before the workload threads, starved on a loaded machine, meet it.
        assert!(
            r["stats"]["scheme"]["degraded_reads"].as_u64().unwrap() > 0
                || r["stats"]["scheme"]["reconstructed_bytes"].as_u64().unwrap_or(0) > 0,
            "uniform accesses over 3/4 far data must meet the dead node: {r}"
        );
    }
}

/// `--compaction-threads 0,2` measures the two counts of a compacting scheme
/// in alternating rounds: one record each, every round's throughput, its
/// ratio to the 0-thread count per round, folds only where threads run.
#[test]
fn micro_compaction_counts_alternate_in_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rounds.json");
    let (stdout, stderr) = remora_ok(&[
        "bench",
        "micro",
        "--scheme",
        "ec-batch-local",
        "--compaction-threads",
        "0,2",
        "--compaction-trigger",
        "0",
        "--rounds",
        "3",
        "--objects",
        "4000",
        "--object-size",
        "1KiB",
        "--local-ratio",
        "0.25",
        "--threads",
        "2",
        "--write-ratio",
        "0.2",
        "--duration",
        "1500ms",
        "--warmup",
        "200ms",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(stderr.contains("3 alternating rounds of 0.5 s"), "{stderr}");
    assert!(stdout.contains("compaction's cost in 3 alternating rounds"), "{stdout}");
    let v = read_json(&json);
    let results = v["results"].as_array().expect("results array");
    let ran: Vec<&str> = results.iter().map(|r| r["scheme"].as_str().unwrap()).collect();
    assert_eq!(ran, ["ec-batch-local:c0", "ec-batch-local:c2"]);
    for r in results {
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["wrong_bytes"], 0, "{r}");
        let rounds = r["rounds"]["ops_per_s"].as_array().expect("rounds");
        assert_eq!(rounds.len(), 3, "{r}");
        assert!(rounds.iter().all(|x| x.as_f64().unwrap() > 0.0), "{r}");
        // The windows add up to --duration (each closed-loop window ends
        // when its time is up, a little after).
        let measured = r["measured_s"].as_f64().unwrap();
        assert!((1.5..2.5).contains(&measured), "measured {measured} s: {r}");
        // Whole-run throughput is the windows' operations over their time.
        let ops = r["completed_in_window"].as_f64().unwrap();
        assert!(
            (r["throughput_ops"].as_f64().unwrap() - ops / measured).abs() < 1.0,
            "{r}"
        );
    }
    let (c0, c2) = (&results[0], &results[1]);
    assert_eq!(c0["stats"]["scheme"]["compactions"], 0, "no thread folds: {c0}");
    assert!(
        c2["stats"]["scheme"]["compactions"].as_u64().unwrap() > 0,
        "two threads fold: {c2}"
    );
    assert!(c0["rounds"]["base"].is_null(), "{c0}");
    assert_eq!(c2["rounds"]["base"], "ec-batch-local:c0", "{c2}");
    let ratios = c2["rounds"]["throughput_ratio_to_base"].as_array().expect("ratios");
    assert_eq!(ratios.len(), 3, "{c2}");
    for (i, x) in ratios.iter().enumerate() {
        let want = rounds_of(c2)[i] / rounds_of(c0)[i];
        assert!((x.as_f64().unwrap() - want).abs() < 1e-9, "round {i}: {c2}");
    }
}

fn rounds_of(r: &serde_json::Value) -> Vec<f64> {
    r["rounds"]["ops_per_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// `--kill-manager-at`: the manager is killed mid-run and started again
/// `--manager-down` later; far memory pauses and resumes with 0 errors and
/// 0 wrong bytes, and the run says how soon it was back.
#[test]
fn micro_runs_through_a_manager_outage() {
    let (stderr, v) = faulted_run("ec-batch", "6", &["--kill-manager-at", "1s", "--manager-down", "3s"]);
    assert!(stderr.contains("killed the manager with SIGKILL"), "{stderr}");
    assert!(stderr.contains("manager down from"), "{stderr}");
    assert_eq!(v["manager_down_s"], 3.0, "{v}");
    assert_clean_results(&v);
}

/// `--kill-at --kill-count 2 --memnodes 7`: two of seven memory nodes are
/// killed at once, leaving five for RS(4, 2); the run goes on with 0
/// errors and 0 wrong bytes and says when every spanset tolerated two
/// losses again.
#[test]
fn micro_runs_through_two_of_seven_nodes_killed_at_once() {
    let (stderr, v) = faulted_run(
        "ec-batch",
        "8",
        &["--kill-at", "1s", "--kill-count", "2", "--memnodes", "7"],
    );
    assert!(stderr.contains("killed 2 memory node(s)"), "{stderr}");
    assert!(stderr.contains("2 node(s) killed at"), "{stderr}");
    assert!(
        stderr.contains("every spanset tolerates m losses again"),
        "tolerance restored within the run: {stderr}"
    );
    assert_eq!(v["kill_count"], 2, "{v}");
    assert_clean_results(&v);
}
