//! ec-2pc on in-process memory nodes: slots freed by swap-ins are refilled
//! by later swap-outs with two-phase commit (parity updated in place by
//! deltas the data nodes send the parity nodes), so far memory stays near
//! (k+m)/k of the data however often it is rewritten; and a node that dies
//! (or drops connections) in the middle of a transaction loses nothing.
//! Every object is compared with what was last written.

use std::time::Duration;

use remora_memnode::InProcessCluster;
use remora_proto::msg::PeerTraffic;
use remora_runtime::{RemBox, Runtime, Stats, scheme};
use remora_testkit::in_process;
use remora_testkit::{KIB, MIB, Obj, obj};

fn runtime(c: &InProcessCluster, name: &str) -> Runtime {
    // No compaction threads: the `ec-batch` yardstick is holes kept until
    // a whole spanset is free, the cost slot reuse avoids (ec-2pc has none).
    let opts = scheme::SchemeOptions {
        compaction_threads: 0,
        ..scheme::SchemeOptions::default()
    };
    in_process::runtime(c, in_process::config(name, &opts, MIB))
}

/// Objects at their versions, every byte compared.
fn verify(rt: &Runtime, objs: &[RemBox<Obj>], versions: &[u64], what: &str) {
    remora_testkit::verify(rt, objs, |i| versions[i], what);
}

/// Rewrites objects `ids` (bringing their spans in dirty: their far slots
/// become free) at the next version.
fn rewrite(rt: &Runtime, objs: &mut [RemBox<Obj>], versions: &mut [u64], ids: impl Iterator<Item = usize>) {
    let mut scope = rt.scope();
    for (n, i) in ids.enumerate() {
        versions[i] += 1;
        *objs[i].deref_mut(&scope).unwrap() = obj(i as u64, versions[i]);
        if n % 64 == 0 {
            scope.renew();
        }
    }
}

fn peer(c: &InProcessCluster) -> PeerTraffic {
    PeerTraffic::sum(c.nodes().iter().map(|n| n.peer_traffic()))
}

/// A workload that rewrites a random quarter of 4 MiB of objects, ten
/// times over, with a 1 MiB budget; returns the stats at the end.
fn churn(c: &InProcessCluster, name: &str) -> Stats {
    let rt = runtime(c, name);
    let n = 4 * KIB;
    let mut objs: Vec<RemBox<Obj>> = (0..n as u64).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    let mut versions = vec![0u64; n];
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..10 {
        let ids: Vec<usize> = (0..n / 4)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % n as u64) as usize
            })
            .collect();
        rewrite(&rt, &mut objs, &mut versions, ids.into_iter());
        rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    }
    let st = rt.stats();
    verify(&rt, &objs, &versions, name);
    assert!(
        c.nodes().iter().all(|n| n.staged_transactions() == 0),
        "{name}: a transaction was left staged"
    );
    st
}

/// Slots freed by swap-ins are refilled by 2PC: parity nodes receive
/// deltas from data nodes, and far memory stays within (k+m)/k of the data
/// plus a spanset of slack per span size, where `ec-batch` (holes kept
/// until a whole spanset is free) grows past it under the same workload.
#[test]
fn freed_slots_are_refilled_by_two_phase_commit() {
    let c = InProcessCluster::new(7, 16, 2 * MIB as u64);
    let st = churn(&c, "ec-2pc");
    let p = peer(&c);
    assert!(p.delta_applies > 0, "no slot was refilled in place: {p:?} {st:?}");
    // Each filled slot sends one delta to each of the m = 2 parity nodes.
    assert_eq!(p.delta_applies % 2, 0, "{p:?}");
    assert_eq!(p.delta_bytes % (2 * 8 * KIB as u64), 0, "{p:?}");
    // Every spanset is whole ((k+m)/k of its k slots): far memory is live
    // spans, free slots (holes) and kept copies, times 1.5.
    let slots = st.far.live_bytes + st.far.hole_bytes + st.far.kept_bytes;
    assert!(
        st.far.bytes_used <= slots * 3 / 2 + slots / 100,
        "far memory beyond (k+m)/k of the slots: {st:?}"
    );
    // Free slots are refilled: they stay a small part of far memory (not
    // one per swap-in, as holes would), so far memory stays near (k+m)/k
    // of the live spans.
    let far_per_live = |s: &Stats| s.far.bytes_used as f64 / s.far.live_bytes.max(1) as f64;
    assert!(far_per_live(&st) < 2.0, "far memory per live byte: {st:?}");
    // A good share of what was evicted went into refilled slots (each
    // filled byte sends m = 2 delta bytes between memory nodes).
    let refilled = p.delta_bytes / 2;
    assert!(
        refilled * 10 > st.traffic.bytes_evicted_data,
        "{refilled} bytes refilled of {}: {st:?}",
        st.traffic.bytes_evicted_data
    );
    let c = InProcessCluster::new(7, 16, 2 * MIB as u64);
    let batch = churn(&c, "ec-batch");
    eprintln!(
        "far per live byte after churn: ec-2pc {:.2} (holes {}, {refilled} of {} bytes evicted refilled), ec-batch {:.2} (holes {})",
        far_per_live(&st),
        st.far.hole_bytes,
        st.traffic.bytes_evicted_data,
        far_per_live(&batch),
        batch.far.hole_bytes
    );
    assert!(
        batch.far.hole_bytes > st.far.hole_bytes,
        "the workload does not tell slot reuse apart: ec-batch {batch:?}"
    );
}

/// 4 MiB of objects, mostly far; half of them are rewritten and held
/// local, so their slots are free; `fault` is armed; the budget drops and the dirty
/// spans go back out, into the free slots by 2PC. Every object verifies.
fn refill_under(what: &str, fault: impl FnOnce(&InProcessCluster, &Runtime)) -> (InProcessCluster, Stats) {
    let c = InProcessCluster::new(7, 16, 2 * MIB as u64);
    let rt = runtime(&c, "ec-2pc");
    let n = 4 * KIB;
    let mut objs: Vec<RemBox<Obj>> = (0..n as u64).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    let mut versions = vec![0u64; n];
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    rt.set_local_budget(64 * MIB);
    // Objects of one span are allocated together: rewriting blocks of
    // them at random frees some slots of a spanset and leaves the others live.
    let block = |i: usize| ((i / 16) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 0;
    rewrite(&rt, &mut objs, &mut versions, (0..n).filter(|&i| block(i)));
    let before = peer(&c);
    fault(&c, &rt);
    rt.set_local_budget(MIB);
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    verify(&rt, &objs, &versions, what);
    let after = peer(&c);
    let st = rt.stats();
    eprintln!(
        "{what}: {} delta applies, {} degraded reads, far objects {}",
        after.delta_applies - before.delta_applies,
        st.scheme.degraded_reads,
        st.far.objects
    );
    (c, st)
}

#[test]
fn refill_without_faults_commits_in_place() {
    let (c, st) = refill_under("no fault", |_, _| {});
    let p = peer(&c);
    assert!(p.delta_applies > 0, "{p:?} {st:?}");
    assert_eq!(st.scheme.degraded_reads, 0, "{st:?}");
    assert!(c.nodes().iter().all(|n| n.staged_transactions() == 0));
}

/// A data node (position 0 of the first stripe group) or a parity node
/// (position 4) dies after `n` more requests: during a zeroing write, a
/// prepare, a delta from a peer, or a commit. The transaction aborts (and
/// the spans go to a new spanset) or stands, and every object reads back
/// right, around the dead node.
#[test]
fn a_node_dying_mid_transaction_loses_nothing() {
    for pos in [0usize, 4] {
        for n in [0u64, 1, 2, 3, 5, 8, 13] {
            let what = format!("position {pos} dies after {n}");
            refill_under(&what, |c, rt| {
                let victim = rt.regions()[pos].1.node;
                c.node(victim).unwrap().die_after(n);
            });
        }
    }
}

/// Every node breaks the connection of its next requests: prepares and
/// commits fail in the transport; aborts or retried commits make it right.
#[test]
fn broken_connections_mid_transaction_lose_nothing() {
    for k in [1u64, 2, 3] {
        refill_under(&format!("next {k} requests fail"), |c, _| {
            for node in c.nodes() {
                node.fail_next(k);
            }
        });
    }
}
