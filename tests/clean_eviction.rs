//! Clean re-eviction against a real cluster: a span swapped in for reading
//! only goes back to far memory without a write, a span with a written
//! object is written again (never its stale kept copy), and kept copies are
//! given back when their objects go away. Every object is checked.
//!
//! Kept copies come from whole-span swap-ins, so these runtimes turn object
//! swap-in off (`tests/object_swap_in.rs` covers it).

mod common;

use std::time::{Duration, Instant};

use common::*;
use remora_runtime::{RemBox, Runtime};

/// Objects of about 1 KiB (1016 bytes): 14 to a span, so a written object
/// dirties a span that also holds objects only read.
type Obj1016 = Words<125>;

fn runtime(c: &remora_cluster::LocalCluster, scheme: &str, budget: usize) -> Runtime {
    let mut cfg = runtime_config(c, &format!("clean-{scheme}"), budget);
    cfg.scheme = remora_runtime::scheme::by_name(scheme).expect("known scheme");
    cfg.tuning.object_swap_in = false;
    Runtime::connect(cfg).expect("runtime connects")
}

/// Reads every object once, in a scattered order (an odd stride over a
/// power-of-two count): in address order, all the spans of an ec-batch row
/// would come back together and free the row, cancelling its kept copies.
fn read_all(rt: &Runtime, objs: &[RemBox<Obj1016>], versions: &[u64]) {
    let n = objs.len();
    assert!(n.is_power_of_two());
    for k in 0..n {
        let i = (k * 9973) % n;
        let scope = rt.scope();
        Obj1016::check(objs[i].deref(&scope).expect("deref"), i as u64, versions[i]);
    }
}

fn clean_reeviction(scheme: &str) {
    let c = cluster(7, 256 << 20, 16 << 20);
    let rt = runtime(&c, scheme, 4 * MIB);
    let n = 16 * 1024usize; // ~16 MiB of objects, 4x the budget
    let mut objs: Vec<RemBox<Obj1016>> = (0..n).map(|i| rt.alloc(obj(i as u64, 0)).unwrap()).collect();
    let mut versions = vec![0u64; n];
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();

    // Two read-only passes: the second pass evicts spans the first brought
    // in unchanged, so they go back without a write.
    read_all(&rt, &objs, &versions);
    let d = stats_delta(&rt, || read_all(&rt, &objs, &versions));
    let clean = d.traffic.clean_evictions;
    let written = d.traffic.bytes_evicted_data;
    let saved = d.traffic.clean_bytes_saved;
    eprintln!("{scheme}: read-only pass: {clean} clean re-evictions, {saved} bytes not written, {written} written");
    assert!(clean > 0, "{scheme}: no clean re-eviction in a read-only pass: {d:?}");
    if scheme != "ec-batch" {
        // (Under ec-batch a row whose other members all came back is freed,
        // cancelling its kept copies, so a sequential pass keeps fewer.)
        assert!(
            saved > written,
            "{scheme}: a read-only pass should mostly skip writes: {saved} saved, {written} written"
        );
    }
    assert!(d.far.kept_bytes > 0, "{scheme}: kept copies not reported: {d:?}");

    // Write one object in every span's worth, then read everything: a
    // dirty span must be written, never flipped back to its stale copy.
    let d = stats_delta(&rt, || {
        for i in (0..n).step_by(7) {
            let scope = rt.scope();
            versions[i] += 1;
            *objs[i].deref_mut(&scope).unwrap() = obj(i as u64, versions[i]);
        }
        for _ in 0..2 {
            read_all(&rt, &objs, &versions);
        }
    });
    assert!(
        d.traffic.bytes_evicted_data > 0,
        "{scheme}: dirty spans were not written: {d:?}"
    );

    // Free half the objects (local and far): kept copies of spans that go
    // away are given back, and every far byte once all are gone.
    objs.truncate(n / 2);
    read_all(&rt, &objs, &versions[..n / 2]);
    drop(objs);
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    wait_far_given_back(&rt, scheme);
}

#[test]
fn non_ft_reevicts_clean_spans_without_a_write() {
    clean_reeviction("non-ft");
}

#[test]
fn ec_batch_reevicts_clean_spans_without_a_write() {
    clean_reeviction("ec-batch");
}

#[test]
fn replication_reevicts_clean_spans_without_a_write() {
    clean_reeviction("replication");
}

#[test]
fn ec_split_reevicts_clean_spans_without_a_write() {
    clean_reeviction("ec-split");
}

/// Filtering moves only the touched objects out of a span that came back
/// with a kept far copy: its cold objects stay (and its holes are not filled
/// with other cold objects), so the span goes back without a write. Moving
/// them too (the density rule for other spans, with 5 of 14 objects hot)
/// would write them all again.
#[test]
fn filtering_leaves_the_cold_objects_of_a_clean_span_in_place() {
    let c = cluster(2, 256 << 20, 16 << 20);
    let mut cfg = fast_filtering_config(&c, "clean-filter", 32 * MIB);
    cfg.tuning.object_swap_in = false;
    let rt = Runtime::connect(cfg).expect("runtime connects");
    let (spans, per) = (64usize, 14usize);
    let n = spans * per;
    let objs: Vec<RemBox<Obj1016>> = (0..n).map(|i| rt.alloc(obj(i as u64, 0)).unwrap()).collect();
    rt.set_local_budget(MIB / 4);
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    assert!(rt.stats().far.objects as usize >= n * 3 / 4, "{:?}", rt.stats());
    rt.set_local_budget(32 * MIB);
    // Each span comes back for 5 of its objects, read again and again while
    // the filter moves them to hot spans.
    let hot = |i: usize| i % per < 5;
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        for i in (0..n).filter(|&i| hot(i)) {
            let scope = rt.scope();
            Obj1016::check(objs[i].deref(&scope).expect("deref"), i as u64, 0);
        }
    }
    let st = rt.stats();
    assert!(
        st.traffic.swap_ins as usize >= spans / 2,
        "spans did not come back: {st:?}"
    );
    let d = stats_delta(&rt, || {
        rt.set_local_budget(MIB / 4);
        rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    });
    let clean = d.traffic.clean_evictions;
    let written = d.traffic.bytes_evicted_data;
    let span_bytes = 16 << 10;
    eprintln!("{clean} clean re-evictions, {written} bytes written: {d:?}");
    assert!(
        clean as usize >= spans / 2,
        "spans with a kept copy were written again ({clean} clean of {spans}): {d:?}"
    );
    assert!(
        (written as usize) < spans * span_bytes * 6 / 10,
        "cold objects were written again ({written} bytes): {d:?}"
    );
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        Obj1016::check(o.deref(&scope).expect("deref"), i as u64, 0);
    }
}
