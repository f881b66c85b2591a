//! Filtering rounds driven by hand on in-process memory nodes.

use super::*;
use crate::{RemBox, Runtime, RuntimeConfig};
use remora_memnode::InProcessCluster;

/// The sweep's window is classified even when fresh spans fill the
/// round's batch (they used to cap it for both, so under a steady stream
/// of swap-ins the sweep sorted nothing: see `classify`).
#[test]
fn the_sweep_chooses_from_its_window_when_fresh_spans_fill_the_batch() {
    const SPANS: usize = 50;
    const MIXED: usize = 10;
    let c = InProcessCluster::new(1, 8, 2 << 20);
    let mut cfg = RuntimeConfig::new("unused:0", 64 << 20);
    cfg.tuning.filtering_threads = 0; // this test runs the rounds itself
    let rt = Runtime::with_backend(cfg, c.backend()).expect("runtime starts");
    // 1 KiB objects: the 1152-byte class, 7 to an 8 KiB span, filled in
    // allocation order.
    let objs: Vec<RemBox<[u64; 128]>> = (0..SPANS * 7)
        .map(|i| rt.alloc([i as u64; 128]).expect("alloc"))
        .collect();
    let inner = &rt.inner;
    let mut spans = Vec::new();
    let mut cursor = 0;
    inner.heap.visit_spans(&mut cursor, usize::MAX, |s| spans.push(s));
    assert_eq!(spans.len(), SPANS, "one span per 7 objects");

    // A first round ages every object (nothing is mixed yet), then one
    // object of each span is read: every span is then mixed, one hot
    // object among six cold ones.
    inner.filter_round(&mut Filter::new(0, Duration::from_millis(1)));
    let moved0 = rt.stats().local.objects_moved;
    {
        let scope = rt.scope();
        for j in 0..SPANS {
            assert_eq!(objs[7 * j].deref(&scope).expect("deref")[0], (7 * j) as u64);
        }
    }
    // All but the first spans of the window come back as swapped in:
    // more than a batch of them.
    for &s in &spans[MIXED..] {
        inner.filtering.queue(s);
    }
    const { assert!(SPANS - MIXED > BATCH) };
    inner.filter_round(&mut Filter::new(0, Duration::from_millis(1)));
    // The hot object of each span moves out (its six cold span-mates
    // stay, as a cold span): BATCH fresh spans, and from the window the
    // first spans and the fresh ones the batch left over.
    let moved = rt.stats().local.objects_moved - moved0;
    assert_eq!(moved, SPANS as u64, "objects moved in the round ({BATCH} fresh spans)");
    // Every byte is still right.
    let scope = rt.scope();
    for (i, o) in objs.iter().enumerate() {
        assert_eq!(*o.deref(&scope).expect("deref"), [i as u64; 128], "object {i}");
    }
}
