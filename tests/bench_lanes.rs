//! `remora bench lanes` end to end: three phases, every read checked.

mod common;

use std::process::Command;

#[test]
fn lanes_bench_measures_three_phases_and_verifies_reads() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lanes.json");
    let out = Command::new(common::BIN)
        .args([
            "bench",
            "lanes",
            "--duration",
            "400ms",
            "--read-rate",
            "1000",
            "--write-rate",
            "50MB",
        ])
        .args(["--region-size", "8MiB", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("p99 ÷ idle"), "{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let phases = v["phases"].as_array().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(names, ["idle", "lanes", "one connection"]);
    for p in phases {
        assert_eq!(p["wrong_reads"], 0, "{p}");
        // ~400 reads scheduled at 1000/s over 400 ms.
        let n = p["reads"]["samples"].as_u64().unwrap();
        assert!((200..=700).contains(&n), "{p}");
    }
    assert_eq!(phases[0]["write_bytes_per_sec"], 0.0, "the idle phase writes nothing");
    for p in &phases[1..] {
        assert!(p["write_bytes_per_sec"].as_f64().unwrap() > 10e6, "the writer ran: {p}");
    }
}

#[test]
fn lanes_bench_rejects_bad_flags() {
    for bad in [["--read-rate", "0"], ["--write-size", "0"], ["--region-size", "1KiB"]] {
        let out = Command::new(common::BIN)
            .args(["bench", "lanes"])
            .args(bad)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && !stderr.contains("panicked"),
            "{bad:?}: {stderr}"
        );
    }
}
