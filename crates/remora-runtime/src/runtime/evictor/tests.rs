//! The evictor on an in-process memory node, with filtering rounds driven
//! by hand.

use super::*;
use crate::runtime::filtering::Filter;
use crate::{RemBox, Runtime, RuntimeConfig};
use remora_memnode::InProcessCluster;
use std::thread;
use std::time::Duration;

/// Between the watermarks, spans the filter queued as cold are evicted
/// without waiting for the high watermark: otherwise they fill the band
/// between the two until the next round, and hot objects get only the low
/// watermark's worth of local memory.
#[test]
fn queued_cold_spans_go_between_the_watermarks() {
    const SPANS: usize = 100;
    let c = InProcessCluster::new(1, 8, 4 << 20);
    // 1 KiB objects take the 1152-byte class, 7 to an 8 KiB span: the
    // budget puts 100 spans at 95.2 %, between the default watermarks.
    let mut cfg = RuntimeConfig::new("unused:0", SPANS * 8192 * 1000 / 952);
    cfg.tuning.filtering_threads = 0; // this test runs the rounds itself
    cfg.tuning.eviction_threads = 1;
    cfg.tuning.eviction_batch = 4;
    let rt = Runtime::with_backend(cfg, c.backend()).expect("runtime starts");
    let objs: Vec<RemBox<[u64; 128]>> = (0..SPANS * 7)
        .map(|i| rt.alloc([i as u64; 128]).expect("alloc"))
        .collect();
    let inner = &rt.inner;
    let level = inner.heap.bytes_in_use() as u64;
    assert!(
        level > inner.pressure.low_bytes() && level <= inner.pressure.high_bytes(),
        "the fill sits between the watermarks: {level} of {}",
        inner.pressure.budget()
    );
    assert_eq!(
        rt.stats().traffic.swap_outs,
        0,
        "nothing is evicted below the high watermark"
    );

    // Untouched, every object turns cold: the first pass of the filter's
    // hand ages it, the second finds it cold and queues its span.
    let mut f = Filter::new(0, Duration::from_millis(1));
    for _ in 0..2 * SPANS.div_ceil(64) + 1 {
        inner.filter_round(&mut f);
        thread::sleep(Duration::from_millis(3));
    }
    assert!(inner.heap.cold_queued() >= 4, "the filter queued cold spans");

    // The evictor looks at the queue at least every 100 ms.
    let deadline = Instant::now() + Duration::from_secs(20);
    while inner.heap.bytes_in_use() as u64 > inner.pressure.low_bytes() {
        assert!(
            Instant::now() < deadline,
            "queued cold spans were not evicted: {} bytes local, low watermark {}, {} queued",
            inner.heap.bytes_in_use(),
            inner.pressure.low_bytes(),
            inner.heap.cold_queued()
        );
        thread::sleep(Duration::from_millis(10));
    }
    assert!(rt.stats().traffic.swap_outs > 0);
    // Every byte comes back right.
    let scope = rt.scope();
    for (i, o) in objs.iter().enumerate() {
        assert_eq!(*o.deref(&scope).expect("deref"), [i as u64; 128], "object {i}");
    }
}
