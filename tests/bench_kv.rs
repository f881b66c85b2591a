//! `remora bench kv` end to end, small: every store measured at every local
//! ratio, every audit passed, far memory really used (remora's stores
//! missed locally and the erasure-coded one held more far bytes than
//! `non-ft`), Figure 8 drawn; a kill run of `replication` and `ec-batch`
//! with no failed transfer and the store rebuilt; bad flags refused.

mod common;

use common::remora;

fn run(args: &[&str]) -> (String, String, bool) {
    let out = remora(args);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("JSON written")).expect("valid JSON")
}

#[test]
fn bench_kv_measures_every_store_at_every_ratio_and_audits_them() {
    let dir = tempfile::tempdir().unwrap();
    let (plot, out) = (dir.path().join("kv.svg"), dir.path().join("kv.json"));
    let (stdout, stderr, ok) = run(&[
        "bench",
        "kv",
        "--store",
        "remora,local,redis:1,redis:1+wait",
        "--scheme",
        "non-ft,ec-batch",
        "--local-ratio",
        "0.5,0.3",
        "--threads",
        "2",
        "--accounts-per-branch",
        "200",
        "--duration",
        "300ms",
        "--warmup",
        "100ms",
        "--rounds",
        "2",
        "--calibrate",
        "500ms",
        "--plot",
        plot.to_str().unwrap(),
        "--json",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "bench kv failed:\n{stdout}\n{stderr}");
    let v = json(&out);
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["audits_failed"], 0, "{v}");
    let redis = stderr.contains("redis:1: skipped") || stderr.contains("redis:1+wait: skipped");
    let want: Vec<&str> = if redis {
        vec!["non-ft", "ec-batch", "local"]
    } else {
        vec!["non-ft", "ec-batch", "local", "redis:1", "redis:1+wait"]
    };
    let rows = 8 * (1 + 10 + 200);
    for a in v["audits"].as_array().unwrap() {
        assert_eq!(a["ok"], true, "{a}");
        assert_eq!(a["values"], rows, "{a}");
        assert_eq!(a["bad_values"], 0, "{a}");
        assert!(a["committed"].as_u64().unwrap() > 0, "{a}");
        assert_eq!(a["history_records"], a["committed"], "{a}");
    }
    let ratios = v["ratios"].as_array().unwrap();
    assert_eq!(ratios.len(), 2, "{v}");
    for r in ratios {
        let stores = r["stores"].as_array().unwrap();
        let by = |l: &str| {
            stores
                .iter()
                .find(|s| s["store"] == l)
                .unwrap_or_else(|| panic!("{l} missing at {}", r["local_ratio"]))
        };
        for l in &want {
            let s = by(l);
            assert!(s["tps"].as_f64().unwrap() > 0.0, "{s}");
            assert!(s["p99_us"].as_u64().unwrap() >= s["p50_us"].as_u64().unwrap(), "{s}");
        }
        assert_eq!(by("local")["hit_ratio"], 1.0, "{r}");
        if r["local_ratio"] == 0.3 {
            // Far memory was used: misses, and parity beside the data.
            assert!(by("ec-batch")["hit_ratio"].as_f64().unwrap() < 1.0, "{r}");
            assert!(by("non-ft")["hit_ratio"].as_f64().unwrap() < 1.0, "{r}");
            assert!(by("ec-batch")["remote_to_non_ft"].as_f64().unwrap() > 1.1, "{r}");
        }
        assert!(
            r["pairs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["a"] == "ec-batch" && p["b"] == "non-ft"),
            "{r}"
        );
    }
    for what in [
        "local ratio 0.3",
        "ec-batch ÷ non-ft",
        "ec-batch ÷ local",
        "audit: every store",
    ] {
        assert!(stdout.contains(what), "{what} missing:\n{stdout}");
    }
    let svg = std::fs::read_to_string(&plot).expect("Figure 8 drawn");
    for l in &want {
        assert!(svg.contains(l), "{l} not in the plot");
    }
}

#[test]
fn bench_kv_kills_a_node_under_replication_and_ec_batch_without_a_failed_transfer() {
    let dir = tempfile::tempdir().unwrap();
    let (plot, kill_plot, out) = (
        dir.path().join("kv.svg"),
        dir.path().join("kill.svg"),
        dir.path().join("kv.json"),
    );
    let (stdout, stderr, ok) = run(&[
        "bench",
        "kv",
        "--store",
        "remora",
        "--scheme",
        "replication,ec-batch",
        "--local-ratio",
        "0.3",
        "--threads",
        "2",
        "--accounts-per-branch",
        "200",
        "--duration",
        "200ms",
        "--warmup",
        "0s",
        "--rounds",
        "1",
        "--calibrate",
        "500ms",
        "--kill-at",
        "2s",
        "--kill-duration",
        "4s",
        "--plot",
        plot.to_str().unwrap(),
        "--kill-plot",
        kill_plot.to_str().unwrap(),
        "--json",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "bench kv failed:\n{stdout}\n{stderr}");
    let v = json(&out);
    let kills = v["kill"].as_array().unwrap();
    assert_eq!(kills.len(), 2, "{v}");
    for (k, scheme) in kills.iter().zip(["replication", "ec-batch"]) {
        assert_eq!(k["scheme"], scheme, "{k}");
        assert_eq!(k["killed_nodes"], 1, "{k}");
        assert_eq!(k["errors"], 0, "{k}");
        assert_eq!(k["audit_ok"], true, "{k}");
        assert!(k["rebuilt_after_s"].as_f64().is_some(), "never rebuilt: {k}");
        assert!(
            k["stats"]["scheme"]["degraded_reads"].as_u64().unwrap() > 0
                || k["stats"]["scheme"]["reconstructed_bytes"].as_u64().unwrap() > 0,
            "{k}"
        );
        assert!(k["windows"].as_array().unwrap().len() >= 35, "{k}");
        assert!(k["dip"].as_f64().is_some(), "{k}");
    }
    let svg = std::fs::read_to_string(&kill_plot).expect("Figure 10a drawn");
    assert!(
        svg.contains("kill") && svg.contains("ec-batch"),
        "Figure 10a lacks its marks"
    );
}

#[test]
fn bench_kv_refuses_bad_flags_with_a_clear_error() {
    let (_, stderr, ok) = run(&["bench", "kv", "--threads", "2", "--branches", "4"]);
    assert!(!ok && stderr.contains("fewer than 4 per thread"), "{stderr}");
    let (_, stderr, ok) = run(&["bench", "kv", "--store", "mongo"]);
    assert!(!ok && stderr.contains("unknown store"), "{stderr}");
    let (_, stderr, ok) = run(&["bench", "kv", "--scheme", "raid5"]);
    assert!(!ok && stderr.contains("unknown scheme"), "{stderr}");
    let (_, stderr, ok) = run(&["bench", "kv", "--store", "local", "--kill-at", "2s"]);
    assert!(!ok && stderr.contains("--kill-at needs"), "{stderr}");
}
