//! `remora bench drain` end to end with a small fill: both schemes drain,
//! every object verifies afterwards, and the JSON carries the figures with
//! the write amplification each scheme must have.

mod common;

use common::remora;

#[test]
fn drain_evicts_and_verifies_both_schemes() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("drain.json");
    let out = remora(&[
        "bench",
        "drain",
        "--fill",
        "16MiB",
        "--scheme",
        "non-ft,ec-batch",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench drain failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("ec-batch/non-ft drain rate"), "{stdout}");

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).expect("valid JSON");
    let results = v["results"].as_array().expect("results array");
    assert_eq!(results.len(), 2, "{v}");
    for (r, scheme, amp) in [(&results[0], "non-ft", 1.0), (&results[1], "ec-batch", 1.5)] {
        assert_eq!(r["scheme"], scheme, "{r}");
        // 16 MiB of 4 KiB objects.
        assert_eq!(r["objects"], 4096, "{r}");
        assert_eq!(r["verified"], r["objects"], "{r}");
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["timed_out"], false, "{r}");
        assert_eq!(r["fill_swap_outs"], 0, "nothing is evicted during the fill: {r}");

        let drained_local = r["drained_local_bytes"].as_u64().unwrap();
        let drained_data = r["drained_data_bytes"].as_u64().unwrap();
        assert!(drained_local > 0 && drained_data > 0, "{r}");
        // The drain ends at or below the low watermark of the lowered budget.
        let after = r["local_bytes_after"].as_u64().unwrap();
        assert!(after <= r["low_watermark_bytes"].as_u64().unwrap(), "{r}");
        // Whole spans were swapped out: what left local memory is what was evicted.
        assert_eq!(drained_data % r["span_bytes"].as_u64().unwrap(), 0, "{r}");
        assert!(drained_data >= drained_local, "{r}");

        let wa = r["write_amplification"].as_f64().unwrap();
        assert!(
            (wa - amp).abs() < 0.05,
            "{scheme}: write amplification {wa}, expected {amp}: {r}"
        );
        // The runtime's own counters over the drain, as `Stats` serializes them.
        let traffic = &r["stats"]["traffic"];
        assert!(traffic["swap_outs"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(traffic["bytes_evicted_data"].as_u64(), Some(drained_data), "{r}");
        let (secs, gbps) = (r["drain_s"].as_f64().unwrap(), r["drain_gbps"].as_f64().unwrap());
        assert!(secs > 0.0 && gbps > 0.0, "{r}");
        assert!(
            (gbps * 1e9 * secs - drained_data as f64).abs() < 1.0 + drained_data as f64 * 1e-9,
            "{r}"
        );
        let t90 = r["t90_s"].as_f64().expect("a 90 % time");
        let t50 = r["t50_s"].as_f64().expect("a 50 % time");
        assert!(0.0 <= t50 && t50 <= t90 && t90 <= secs, "{r}");
    }
    assert!(v["ec_batch_over_non_ft"].as_f64().is_some_and(|x| x > 0.0), "{v}");
}

#[test]
fn drain_rejects_bad_flags_without_panicking() {
    for args in [
        &["bench", "drain", "--object-size", "3000"][..],
        &["bench", "drain", "--scheme", "nope"],
        &["bench", "drain", "--to", "0"],
        &["bench", "drain", "--to", "1"],
        &["bench", "drain", "--fill", "1KiB"],
    ] {
        let out = remora(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}
