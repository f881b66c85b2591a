//! Object swap-in against a real cluster (`RuntimeConfig::object_swap_in`,
//! on by default): a miss on an object in a span of small objects reads the
//! whole span once, brings back that object alone and leaves the span's
//! other objects far; they come back one by one, written or not, and the far
//! span goes when its last object has left. Every object is checked.

mod common;

use std::time::Duration;

use common::*;
use remora_runtime::{RemBox, Runtime};

fn runtime(c: &remora_cluster::LocalCluster, scheme: &str, budget: usize) -> Runtime {
    let mut cfg = runtime_config(c, &format!("object-swap-in-{scheme}"), budget);
    cfg.scheme = remora_runtime::scheme::by_name(scheme).expect("known scheme");
    Runtime::connect(cfg).expect("runtime connects")
}

/// A non-ft runtime with `n` objects, most of them evicted, and then room
/// for all of them (nothing is evicted while a test counts swap-ins).
fn evicted(c: &remora_cluster::LocalCluster, n: usize) -> (Runtime, Vec<RemBox<Obj2K>>) {
    let rt = runtime(c, "non-ft", 32 * MIB);
    let objs: Vec<RemBox<Obj2K>> = (0..n).map(|i| rt.alloc(obj(i as u64, 0)).unwrap()).collect();
    rt.set_local_budget(MIB / 4);
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    rt.set_local_budget(64 * MIB);
    (rt, objs)
}

/// Reads objects `idx`, never written, checking each.
#[track_caller]
fn read_unwritten(rt: &Runtime, objs: &[RemBox<Obj2K>], idx: impl Iterator<Item = usize>) {
    for i in idx {
        let scope = rt.scope();
        assert!(
            Words::is(objs[i].deref(&scope).expect("deref"), i as u64, 0),
            "object {i}"
        );
    }
}

#[track_caller]
fn check_all(rt: &Runtime, objs: &[RemBox<Obj2K>], versions: &[u64]) {
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        let got = o.deref(&scope).expect("deref");
        assert!(
            Words::is(got, i as u64, versions[i]),
            "object {i} v{}: wrong bytes",
            versions[i]
        );
    }
}

fn one_object_per_swap_in(scheme: &str, kill: bool) {
    let c = cluster(7, 256 << 20, 16 << 20);
    let rt = runtime(&c, scheme, 32 * MIB);
    let n = 4096usize; // 2 KiB objects: 8 MiB
    let mut objs: Vec<RemBox<Obj2K>> = (0..n).map(|i| rt.alloc(obj(i as u64, 0)).unwrap()).collect();
    let mut versions = vec![0u64; n];
    rt.set_local_budget(MIB / 4);
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    let s0 = rt.stats();
    assert!(s0.far.objects as usize >= n * 3 / 4, "objects did not go far: {s0:?}");
    // One object from each of 64 places far apart, so no two share a span.
    let picked: Vec<usize> = (0..64).map(|j| j * (n / 64) + j % 3).collect();
    let d = stats_delta(&rt, || {
        if kill {
            // Every later swap-in from this node's spans is a degraded read.
            c.kill_memnode(0).expect("kill");
        }
        // Room for everything: nothing is evicted while we count.
        rt.set_local_budget(32 * MIB);
        read_unwritten(&rt, &objs, picked.iter().copied());
    });
    let swap_ins = d.traffic.swap_ins;
    let object_swap_ins = d.traffic.object_swap_ins;
    let left_far = s0.far.objects - d.far.objects;
    eprintln!("{scheme}: {swap_ins} swap-ins, {object_swap_ins} of one object, {left_far} objects left far memory");
    assert!(swap_ins >= 32, "{scheme}: the picked objects were not far: {d:?}");
    assert_eq!(object_swap_ins, swap_ins, "{scheme}: a whole span came back: {d:?}");
    assert_eq!(
        left_far, swap_ins,
        "{scheme}: a swap-in took more than its object out of far memory"
    );
    if kill {
        assert!(d.scheme.degraded_reads > 0, "{scheme}: no degraded read: {d:?}");
    } else {
        assert_eq!(d.traffic.swap_in_reads, swap_ins, "{scheme}: one read per swap-in");
    }

    // Write the picked ones, then bring everything back and out again
    // under pressure: the spans they left are still far, with holes.
    for &i in &picked {
        let scope = rt.scope();
        versions[i] += 1;
        *objs[i].deref_mut(&scope).unwrap() = obj(i as u64, versions[i]);
    }
    rt.set_local_budget(2 * MIB);
    for _ in 0..2 {
        check_all(&rt, &objs, &versions);
    }
    rt.set_local_budget(32 * MIB);
    check_all(&rt, &objs, &versions);

    // Freeing every object, local or far, gives every far span back.
    drop(objs);
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    let st = wait_far_given_back(&rt, scheme);
    assert_eq!(st.far.objects, 0, "{scheme}: far objects outlived their owners: {st:?}");
}

#[test]
fn non_ft_brings_back_one_object_per_swap_in() {
    one_object_per_swap_in("non-ft", false);
}

#[test]
fn ec_batch_brings_back_one_object_per_swap_in() {
    one_object_per_swap_in("ec-batch", false);
}

#[test]
fn ec_batch_brings_back_one_object_by_a_degraded_read() {
    one_object_per_swap_in("ec-batch", true);
}

/// A scan reads the objects of each far span one after another: the first
/// miss on a span brings back its object alone, the next (moments later)
/// the rest of the span, so a scan costs about two reads per span, not one
/// per object.
#[test]
fn a_scan_brings_the_rest_of_a_span_back_whole() {
    let c = cluster(3, 256 << 20, 16 << 20);
    let n = 4096usize;
    let (rt, objs) = evicted(&c, n);
    let far = rt.stats().far.objects;
    let d = stats_delta(&rt, || check_all(&rt, &objs, &vec![0; n]));
    let (swap_ins, objects) = (d.traffic.swap_ins, d.traffic.object_swap_ins);
    eprintln!("scan of {far} far objects: {swap_ins} swap-ins, {objects} of one object");
    assert!(objects > 0, "no object swap-in: {d:?}");
    assert!(objects < swap_ins, "no span came back whole: {d:?}");
    assert!(
        swap_ins * 3 <= far,
        "a scan read spans once per object: {swap_ins} swap-ins for {far} objects"
    );
}

/// Passes over every far span, one object of each per pass (misses on a
/// span far enough apart not to count as a scan): each object swap-in
/// leaves a hole in far memory, until a span would be less than half full;
/// then it comes back whole and its far copy goes. So far spans stay at
/// least half full of live objects.
#[test]
fn far_spans_stay_at_least_half_full() {
    let c = cluster(3, 256 << 20, 16 << 20);
    let n = 8192usize;
    let (rt, objs) = evicted(&c, n);
    let slot = 2304u64; // Obj2K's slot
    for pass in 0..5 {
        read_unwritten(&rt, &objs, (pass..n).step_by(8));
        let st = rt.stats();
        // Kept far copies of spans swapped in whole are not holes.
        let far = st.far.bytes_used - st.far.kept_bytes;
        let live = st.far.objects * slot;
        eprintln!("pass {pass}: {far} far bytes for {live} of live far objects: {st:?}");
        assert!(
            far <= live * 21 / 10 + 4 * (16 << 10), // and a few spans' rounding
            "pass {pass}: far spans less than half full ({far} bytes for {live}): {st:?}"
        );
    }
    check_all(&rt, &objs, &vec![0; n]);
}

/// Four threads read and write objects of the same few spans while a small
/// budget keeps evicting them: threads often miss on objects of one far
/// span at once (each takes its own object out), and on the same object
/// (one brings it back, the others find it local). Every read is checked
/// against the version last written.
#[test]
fn threads_missing_on_one_span_each_get_their_object() {
    use std::sync::RwLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    let c = cluster(3, 256 << 20, 16 << 20);
    let rt = runtime(&c, "non-ft", MIB);
    let n = 2048u64;
    let objs: Vec<RwLock<RemBox<Obj2K>>> = (0..n).map(|i| RwLock::new(rt.alloc(obj(i, 0)).unwrap())).collect();
    let versions: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let d = stats_delta(&rt, || {
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (rt, objs, versions) = (&rt, &objs, &versions);
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Eight neighbours (one span's worth) of one of 64 places.
                        let i = ((x % 64) * 32 + (x >> 40) % 8) % n;
                        let scope = rt.scope();
                        if x % 4 == 0 {
                            let mut g = objs[i as usize].write().unwrap();
                            let v = versions[i as usize].load(Ordering::Relaxed) + 1;
                            *g.deref_mut(&scope).expect("deref_mut") = obj(i, v);
                            versions[i as usize].store(v, Ordering::Relaxed);
                        } else {
                            let g = objs[i as usize].read().unwrap();
                            let v = versions[i as usize].load(Ordering::Relaxed);
                            let o = g.deref(&scope).expect("deref");
                            assert!(Words::is(o, i, v), "object {i} v{v}: got id {} v{}", o.id, o.version);
                        }
                    }
                });
            }
        })
    });
    assert!(
        d.traffic.object_swap_ins > 100,
        "too few object swap-ins to have raced: {d:?}"
    );
    let objs: Vec<RemBox<Obj2K>> = objs.into_iter().map(|o| o.into_inner().unwrap()).collect();
    let versions: Vec<u64> = versions.iter().map(|v| v.load(Ordering::Relaxed)).collect();
    check_all(&rt, &objs, &versions);
}
