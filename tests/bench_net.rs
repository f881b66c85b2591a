//! `remora bench net --tls` end to end: both sides measured at every
//! `--tls-tput-sizes` size, every window pair's throughput ratio reported
//! beside the whole phase's, the memory node's CPU per byte on each side,
//! sealing and opening alone timed beside them, and the p50 floor they set.

mod common;

use common::{run_remora, stderr};

#[test]
fn net_tls_reports_window_ratios_beside_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("net.json");
    let json_path = json.to_str().unwrap();
    let out = run_remora(
        &[
            "bench",
            "net",
            "--tls",
            "--sizes",
            "4KiB",
            "--samples",
            "50",
            "--duration",
            "300ms",
            "--slices",
            "3",
            "--tls-tput-sizes",
            "4KiB,16KiB",
            "--connects",
            "0",
            "--json",
            json_path,
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    assert!(stdout.contains("median and range over the window pairs"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["replies_checked"].as_u64().unwrap() > 0, "{v}");
    let seal = v["tls"]["seal_s_per_gb"].as_f64().unwrap();
    assert!(seal > 0.0 && seal.is_finite(), "{v}");
    let open = v["tls"]["open_s_per_gb"].as_f64().unwrap();
    assert!(open > 0.0 && open.is_finite(), "{v}");
    // The p50 floor: plain's p50 plus the reply's seal and open.
    for r in v["tls"]["latency"].as_array().unwrap() {
        let size = r["size_bytes"].as_f64().unwrap();
        let plain_p50 = r["plain"]["p50_ns"].as_f64().unwrap();
        let floor = (plain_p50 + (seal + open) * size) / plain_p50;
        let got = r["p50_floor_ratio"].as_f64().unwrap();
        assert!(
            got > 1.0 && (got - floor).abs() < 1e-3 * floor,
            "{r}: {got} against {floor}"
        );
    }
    let rows = v["tls"]["throughput"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|t| t["size_bytes"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [4096, 16384], "{v}");
    for t in rows {
        let (plain, tls) = (
            t["plain"]["gb_per_s"].as_f64().unwrap(),
            t["tls"]["gb_per_s"].as_f64().unwrap(),
        );
        assert!(plain > 0.0 && tls > 0.0, "{t}");
        assert!((t["gbps_ratio"].as_f64().unwrap() - tls / plain).abs() < 1e-9, "{t}");
        let w: Vec<f64> = t["window_ratios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(w.len(), 3, "{t}");
        let mut sorted = w.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(sorted[0] > 0.0, "{t}");
        assert_eq!(t["median_window_ratio"].as_f64(), Some(sorted[1]), "{t}");
        // The memory node's CPU per byte on each side, and the ceiling it sets.
        let per_gb = |side: &str| t[side]["server_cpu_s_per_gb"].as_f64().unwrap();
        let (p, s) = (per_gb("plain"), per_gb("tls"));
        assert!(p > 0.0 && s > 0.0, "{t}");
        let busy = t["tls"]["server_busy"].as_f64().unwrap();
        assert!(
            busy > 0.0 && busy < 1.5,
            "one memory-node thread serves the connection: {t}"
        );
        assert!(
            (t["memnode_bound_ceiling"].as_f64().unwrap() - p / s).abs() < 1e-9,
            "{t}"
        );
        assert!(
            (t["seal_only_ceiling"].as_f64().unwrap() - p / (p + seal)).abs() < 1e-9,
            "{t}"
        );
    }
    for line in [
        "memory node CPU per GB read",
        "seal only: sealing alone",
        "floor ×: the least p50 ratio",
    ] {
        assert!(stdout.contains(line), "{stdout}");
    }
    assert!(stdout.contains("16KiB   "), "{stdout}");
}

/// A TLS throughput size the region cannot hold is refused before anything
/// starts, with the size named.
#[test]
fn net_tls_refuses_a_throughput_size_beyond_the_region() {
    let out = run_remora(
        &[
            "bench",
            "net",
            "--tls",
            "--region-size",
            "1MiB",
            "--tls-tput-sizes",
            "16KiB,2MiB",
        ],
        &[],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("request size 2MiB must be positive and fit the 1MiB region"),
        "{err}"
    );
}
