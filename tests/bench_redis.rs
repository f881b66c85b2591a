//! The Redis baseline of `remora bench micro` (`--scheme redis-cache:R`)
//! against real `redis-server` processes: it runs beside a remora scheme on
//! the same workload, verifies every object, reports its figures, and leaves
//! no server behind, even when the benchmark is killed.
//!
//! Without `redis-server` (on PATH or at `$REMORA_REDIS_SERVER`) the tests
//! that need it print why and pass, unless `REMORA_REQUIRE_REDIS=1` (CI sets
//! it), which makes them fail instead.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{read_json, remora_command, succeeded};

fn redis_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("REMORA_REDIS_SERVER").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
}

/// Whether redis-server is there; if not, says so, and fails when it is required.
fn have_redis(test: &str) -> bool {
    if redis_server().is_some() {
        return true;
    }
    let required = std::env::var("REMORA_REQUIRE_REDIS").is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(
        !required,
        "{test}: redis-server not found and REMORA_REQUIRE_REDIS is set \
         (sudo apt-get install redis-server, or set REMORA_REDIS_SERVER)"
    );
    eprintln!(
        "{test}: SKIPPED: redis-server not found (sudo apt-get install redis-server, or set REMORA_REDIS_SERVER)"
    );
    false
}

fn f(r: &Value, key: &str) -> f64 {
    r[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {r}"))
}

fn u(r: &Value, key: &str) -> u64 {
    r[key].as_u64().unwrap_or_else(|| panic!("{key} is not a count in {r}"))
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet).
fn dead(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Live `redis-server` children of `parent`.
fn redis_children(parent: u32) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            head.ends_with("(redis-server")
                && fields.first().is_some_and(|s| *s != "Z")
                && fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
        })
        .collect()
}

#[test]
fn redis_cache_runs_beside_remora_and_cleans_up() {
    if !have_redis("redis_cache_runs_beside_remora_and_cleans_up") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("micro.json");
    let out = remora_command("warn")
        .args(["bench", "micro", "--scheme", "redis-cache:1,non-ft"])
        .args(common::SMALL_ARRAY)
        .args([
            "--zipf",
            "0.99",
            "--threads",
            "2",
            "--duration",
            "1",
            "--warmup",
            "200ms",
            "--rounds",
            "2",
            "--write-ratio",
            "0.1",
            "--json",
            json.to_str().unwrap(),
        ])
        .output()
        .expect("remora runs");
    let (stdout, stderr) = succeeded(&out, "bench micro");
    // Remora and Redis stores alternate in rounds, and every pair gets a median ratio.
    assert!(
        stderr.contains("[redis-cache:1, redis-cache:1+wait, non-ft] 2 alternating rounds of 0.5 s"),
        "{stderr}"
    );
    assert!(stdout.contains("throughput in 2 alternating rounds"), "{stdout}");
    for text in ["redis-cache:1+wait", "ideal LRU", "S3-FIFO", "hit ratio"] {
        assert!(stdout.contains(text), "{text} missing from:\n{stdout}");
    }
    let v = read_json(&json);
    let results = v["results"].as_array().expect("results array");
    let schemes: Vec<&str> = results.iter().map(|r| r["scheme"].as_str().unwrap()).collect();
    assert_eq!(schemes, ["redis-cache:1", "redis-cache:1+wait", "non-ft"], "{v}");
    let rounds = |r: &Value| -> Vec<f64> {
        r["rounds"]["ops_per_s"]
            .as_array()
            .unwrap_or_else(|| panic!("no rounds in {r}"))
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    for r in results {
        let mine = rounds(r);
        assert_eq!(mine.len(), 2, "{r}");
        assert!(mine.iter().all(|&x| x > 0.0), "{r}");
        let to = r["rounds"]["median_ratio_to"].as_object().expect("median_ratio_to");
        for other in results.iter().filter(|o| o["scheme"] != r["scheme"]) {
            // The median of two rounds' ratios is their mean.
            let theirs = rounds(other);
            let want = (mine[0] / theirs[0] + mine[1] / theirs[1]) / 2.0;
            let got = to[other["scheme"].as_str().unwrap()].as_f64().unwrap();
            assert!((got - want).abs() < 1e-9, "{got} vs {want}: {r}");
        }
        assert_eq!(to.len(), 2, "{r}");
    }

    for r in results {
        assert_eq!(u(r, "errors"), 0, "{r}");
        assert_eq!(u(r, "wrong_bytes"), 0, "{r}");
        assert!(u(r, "ops") > 100 && u(r, "writes") > 0, "{r}");
        assert!(f(r, "throughput_ops") > 0.0, "{r}");
        let p50 = f(r, "p50_us");
        assert!(p50 > 0.0 && f(r, "p99_us") >= p50, "{r}");
        for key in ["p50_ci95_us", "p99_ci95_us", "p999_ci95_us"] {
            assert_eq!(r[key].as_array().map(Vec::len), Some(2), "{key}: {r}");
        }
        // Miss ratios: measured and simulated, over the same stream.
        assert_eq!(u(r, "sim_trace_ops"), u(r, "ops"), "{r}");
        assert_eq!(u(r, "sim_capacity_objects"), u(r, "local_budget_objects"), "{r}");
        for key in ["measured_miss_ratio", "lru_miss_ratio", "s3fifo_miss_ratio"] {
            assert!((0.0..=1.0).contains(&f(r, key)), "{key}: {r}");
        }
        // A quarter of the objects fit: a Zipf(0.99) stream still misses sometimes.
        assert!(f(r, "lru_miss_ratio") > 0.0, "{r}");
        // The LRU as good as the store: smaller than the budget's exactly
        // when the store missed more than the budget's LRU did (null only
        // when it missed less than any LRU can).
        if let Some(eq) = r["lru_equivalent_objects"].as_u64() {
            assert!(eq <= u(r, "objects"), "{r}");
            let (measured, lru) = (f(r, "measured_miss_ratio"), f(r, "lru_miss_ratio"));
            let budget = u(r, "sim_capacity_objects");
            assert!(if measured >= lru { eq <= budget } else { eq > budget }, "{r}");
        } else {
            assert!(r["lru_equivalent_objects"].is_null(), "{r}");
            assert!(f(r, "measured_miss_ratio") < f(r, "lru_miss_ratio"), "{r}");
        }
        assert!(f(r, "remote_bytes_used") > 0.0 && f(r, "far_data_bytes") > 0.0, "{r}");
    }

    for r in &results[..2] {
        assert_eq!(r["store"], "redis-cache", "{r}");
        assert_eq!(u(r, "redis_replicas"), 1, "{r}");
        assert_eq!(u(r, "redis_servers"), 2, "{r}");
        assert!(f(r, "redis_used_memory") > 0.0, "{r}");
        assert_eq!(f(r, "redis_used_memory"), f(r, "remote_bytes_used"), "{r}");
        // Two copies of 8 MiB of values: Redis holds at least that.
        assert!(f(r, "far_over_data") >= 2.0, "{r}");
        assert_eq!(f(r, "far_data_bytes"), 2000.0 * 4096.0, "{r}");
        let (hits, misses, ops) = (u(r, "cache_hits"), u(r, "cache_misses"), u(r, "ops"));
        assert!(hits > 0 && misses > 0, "{r}");
        // Counters are deltas between snapshots; ops in flight at the edges
        // of each window (two rounds) differ by a few.
        assert!((hits + misses).abs_diff(ops) <= 16, "hits + misses vs ops: {r}");
        let hit_ratio = f(r, "cache_hit_ratio");
        assert!(hit_ratio > 0.0 && hit_ratio < 1.0, "{r}");
        assert_eq!(u(r, "cache_capacity_objects"), u(r, "local_budget_objects"), "{r}");
        assert!(f(r, "cache_objects") <= f(r, "cache_capacity_objects"), "{r}");
        assert_eq!(u(r, "short_waits"), 0, "{r}");
        assert_eq!(u(r, "redis_info_errors"), 0, "{r}");
        // remora's own figures do not apply.
        for key in ["stats", "reads_per_swap_in", "swap_in_amplification", "kept_bytes"] {
            assert!(r[key].is_null(), "{key} should be null: {r}");
        }
    }
    assert_eq!(results[0]["redis_wait"], false, "{v}");
    assert_eq!(results[1]["redis_wait"], true, "{v}");

    let remora = &results[2];
    assert_eq!(remora["store"], "remora", "{remora}");
    assert!(remora["stats"]["traffic"]["swap_ins"].as_u64().unwrap() > 0, "{remora}");
    for key in ["redis_used_memory", "cache_hits", "redis_pids"] {
        assert!(remora[key].is_null(), "{key} should be null: {remora}");
    }
    for key in [
        "room_wait_pct",
        "evict_mib_s",
        "miss_ratio",
        "kept_bytes",
        "stats/local/objects_moved",
        "stats/local/objects_moved_hot",
    ] {
        let x = remora.pointer(&format!("/{key}")).and_then(Value::as_f64);
        assert!(x.is_some_and(|x| x >= 0.0), "{key}: {remora}");
    }

    // No server outlives the benchmark: every pid is gone and every port
    // closed (the +wait record ran on servers of its own).
    let pids = |r: &Value| -> Vec<u64> {
        r["redis_pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap())
            .collect()
    };
    assert_eq!(pids(&results[0]).len(), 2);
    assert!(pids(&results[0]).iter().all(|p| !pids(&results[1]).contains(p)), "{v}");
    for r in &results[..2] {
        for pid in pids(r) {
            assert!(dead(pid), "redis-server {pid} outlived the benchmark");
        }
        for port in r["redis_ports"].as_array().unwrap() {
            let addr = format!("127.0.0.1:{}", port.as_u64().unwrap());
            assert!(
                TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(200)).is_err(),
                "something still listens on {addr}"
            );
        }
    }
}

#[test]
fn redis_servers_die_with_a_killed_bench() {
    if !have_redis("redis_servers_die_with_a_killed_bench") {
        return;
    }
    // The killed benchmark cannot remove its servers' directories: they go in ours.
    let tmp = tempfile::tempdir().unwrap();
    let mut child = remora_command("warn")
        .env("TMPDIR", tmp.path())
        .args([
            "bench",
            "micro",
            "--scheme",
            "redis-cache:1",
            "--objects",
            "1000",
            "--duration",
            "60",
            "--warmup",
            "100ms",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("remora runs");
    let deadline = Instant::now() + Duration::from_secs(30);
    let servers = loop {
        let s = redis_children(child.id());
        if s.len() == 2 {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the benchmark did not start its 2 redis-servers in 30 s (found {s:?})");
        }
        thread::sleep(Duration::from_millis(50));
    };
    // SIGKILL: no Drop runs; only the death signal asked for at spawn can stop them.
    child.kill().expect("kill the benchmark");
    child.wait().expect("reap the benchmark");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !servers.iter().all(|&p| dead(p)) {
        assert!(
            Instant::now() < deadline,
            "redis-servers {servers:?} outlived the killed benchmark"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn redis_cache_open_loop_keeps_up() {
    if !have_redis("redis_cache_open_loop_keeps_up") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("open.json");
    let out = remora_command("warn")
        .args([
            "bench",
            "micro",
            "--scheme",
            "redis-cache:0",
            "--objects",
            "2000",
            "--object-size",
            "1KiB",
            "--threads",
            "1",
            "--open-loop",
            "2000",
            "--duration",
            "1",
            "--warmup",
            "200ms",
            "--write-ratio",
            "0.2",
            "--json",
            json.to_str().unwrap(),
        ])
        .output()
        .expect("remora runs");
    succeeded(&out, "bench micro");
    let v = read_json(&json);
    let results = v["results"].as_array().expect("results array");
    // No replicas: no +wait record.
    assert_eq!(results.len(), 1, "{v}");
    let r = &results[0];
    assert_eq!(r["scheme"], "redis-cache:0", "{r}");
    assert_eq!(r["latency_mode"], "open-loop", "{r}");
    assert_eq!(u(r, "errors"), 0, "{r}");
    assert_eq!(u(r, "redis_servers"), 1, "{r}");
    let achieved = f(r, "throughput_ops") / 2000.0;
    assert!(
        (0.5..=1.2).contains(&achieved),
        "achieved {achieved} of the offered rate: {r}"
    );
}

#[test]
fn missing_redis_is_a_skip_or_an_error_when_required() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("skip.json");
    let args = [
        "bench",
        "micro",
        "--scheme",
        "redis-cache",
        "--objects",
        "100",
        "--duration",
        "1",
        "--json",
        json.to_str().unwrap(),
    ];
    let out = remora_command("warn")
        .args(args)
        .env("REMORA_REDIS_SERVER", "/nonexistent/redis-server")
        .env_remove("REMORA_REQUIRE_REDIS")
        .output()
        .expect("remora runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a missing redis-server is a skip:\n{stdout}\n{stderr}"
    );
    assert!(stderr.contains("apt-get install redis-server"), "{stderr}");
    assert!(stdout.contains("SKIPPED"), "{stdout}");
    let v = read_json(&json);
    assert_eq!(v["results"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["skipped"][0]["scheme"], "redis-cache", "{v}");

    let out = remora_command("warn")
        .args(args)
        .env("REMORA_REDIS_SERVER", "/nonexistent/redis-server")
        .env("REMORA_REQUIRE_REDIS", "1")
        .output()
        .expect("remora runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "REMORA_REQUIRE_REDIS=1 makes it an error");
    assert!(
        stderr.contains("brew install redis") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
