//! The runtime against a real cluster: objects evicted to memory nodes and
//! swapped back in, every byte checked.

mod common;

use std::time::Duration;

use common::*;
use remora_runtime::{RemBox, Runtime};

/// A 4 KiB object (with its header, the 4 736-byte class).
type Page = Obj4K;

fn runtime(c: &remora_cluster::LocalCluster, budget: usize) -> Runtime {
    Runtime::connect(runtime_config(c, "test", budget)).expect("runtime connects")
}

#[test]
fn objects_survive_eviction_and_swap_in() {
    let c = cluster(3, 256 << 20, 16 << 20);
    let rt = runtime(&c, 8 * MIB);
    let n = 16 * 1024u64; // 64 MiB of 4 KiB objects, 8x the budget
    let mut objs: Vec<RemBox<Page>> = (0..n).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    let st = rt.stats();
    assert!(st.traffic.swap_outs > 0, "nothing was evicted: {st:?}");
    assert!(st.local.bytes <= 10 * MIB as u64, "local memory over budget: {st:?}");
    // Read everything back, then update every other object and read again.
    {
        let mut scope = rt.scope();
        for (i, o) in objs.iter().enumerate() {
            Words::check(o.deref(&scope).unwrap(), i as u64, 0);
            if i % 64 == 0 {
                scope.renew();
            }
        }
    }
    for (i, o) in objs.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
        let scope = rt.scope();
        *o.deref_mut(&scope).unwrap() = obj(i as u64, 1);
    }
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        Words::check(o.deref(&scope).unwrap(), i as u64, (i % 2 == 0) as u64);
    }
    let st = rt.stats();
    eprintln!("after reads and updates: {st:?}");
    assert!(
        st.traffic.swap_ins > 1000 && st.traffic.swap_in_reads == st.traffic.swap_ins,
        "one read per swap-in: {st:?}"
    );
    assert!(st.traffic.bytes_written_remote >= st.traffic.bytes_evicted_data);
    // Dropping objects (local and far) returns far space.
    let far_before = st.far.bytes_used;
    objs.truncate(n as usize / 4);
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    let st = rt.stats();
    assert!(st.far.bytes_used < far_before, "{st:?}");
    assert_eq!(st.local.objects, n / 4);
    // Every object is local or far, and each side's count fits its bytes
    // (a 4 KiB object takes at least 4 KiB of a span).
    let local = st
        .local
        .objects
        .checked_sub(st.far.objects)
        .expect("more far objects than objects");
    assert!(
        st.far.objects > 0 && st.far.objects * 4096 <= st.far.live_bytes,
        "{st:?}"
    );
    assert!(local * 4096 <= st.local.bytes, "{st:?}");
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        Words::check(o.deref(&scope).unwrap(), i as u64, (i % 2 == 0) as u64);
    }
    drop(objs);
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    assert_eq!(rt.stats().local.objects, 0);
    assert_eq!(rt.stats().far.objects, 0);
    assert_eq!(rt.stats().far.bytes_used, 0);
}

/// A 16 KiB value (with its header, the 20 KiB class: two per 40 KiB span).
type Value16 = Words<2046>;

#[test]
fn few_per_span_objects_get_a_span_each_and_swap_in_alone() {
    assert_eq!(std::mem::size_of::<Value16>(), 16 << 10);
    let c = cluster(3, 256 << 20, 16 << 20);
    let rt = runtime(&c, 8 * MIB);
    let n = 2048u64; // 32 MiB of values, 4x the budget
    let mut objs: Vec<RemBox<Value16>> = (0..n).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    for (i, o) in objs.iter_mut().enumerate().filter(|(i, _)| i % 3 == 0) {
        let scope = rt.scope();
        *o.deref_mut(&scope).unwrap() = obj(i as u64, 1);
    }
    // A 16 KiB value gets a 24 KiB span of its own, so a miss reads that
    // object alone (counted at the transport); every byte round-trips.
    let before = rt.stats();
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        Words::check(o.deref(&scope).unwrap(), i as u64, (i % 3 == 0) as u64);
    }
    let st = rt.stats();
    let (swap_ins, read) = (
        st.traffic.swap_ins - before.traffic.swap_ins,
        st.traffic.bytes_read_remote - before.traffic.bytes_read_remote,
    );
    assert!(
        swap_ins > 500 && st.traffic.swap_in_reads == st.traffic.swap_ins,
        "{st:?}"
    );
    // One 24 KiB span per swap-in on the wire (40 KiB if two shared a span).
    assert_eq!(read, swap_ins * 24576, "{st:?}");
}
