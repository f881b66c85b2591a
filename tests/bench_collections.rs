//! `remora bench collections` end to end, small: every table is there, no
//! operation read a wrong value, and the far phase really ran far (the
//! structures were measured against the array a fraction local). A bad
//! flag is refused with a clear error.

mod common;

use common::remora;

#[test]
fn bench_collections_measures_every_collection_beside_its_yardstick() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("collections.json");
    let out = remora(&[
        "bench",
        "collections",
        "--keys",
        "4096",
        "--value-size",
        "256",
        "--duration",
        "100ms",
        "--rounds",
        "1",
        "--scheme",
        "ec-batch",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench collections failed:\n{stdout}\n{stderr}");
    for what in [
        "HashMap get",
        "BTreeMap get",
        "Vec get",
        "HashMap insert",
        "BTreeMap scan",
        "2 threads / 1 thread",
    ] {
        assert!(stdout.contains(what), "{what} missing:\n{stdout}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).expect("valid JSON");
    assert_eq!(v["errors"], 0, "{v}");
    let local = v["local"].as_array().unwrap();
    // 5 operations at 1 and 2 threads, and 2 scans.
    assert_eq!(local.len(), 12, "{v}");
    for r in local {
        assert!(
            r["std_ops_per_sec"].as_f64().unwrap() > 0.0 && r["remora_ops_per_sec"].as_f64().unwrap() > 0.0,
            "{r}"
        );
    }
    let far = v["far"].as_array().unwrap();
    assert_eq!(far.len(), 4, "{v}");
    assert_eq!(far[0]["what"], "array (bench micro)");
    for r in &far[1..] {
        assert!(r["to_array"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["local_ratio"], 0.5, "{r}");
    }
}

#[test]
fn bench_collections_refuses_a_value_size_it_does_not_have() {
    let out = remora(&["bench", "collections", "--value-size", "100"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--value-size 100"), "{stderr}");
}
