//! End-to-end checks of the local memory layer: objects written from several threads keep
//! every byte, never overlap, resolve through the page map, and leave no span behind.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::mpsc;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use remora_runtime::size_classes::{MAX_SIZE, PAGE_SIZE, SizeClass};
use remora_runtime::span::SpanKind;
use remora_runtime::{FreeError, LocalHeap};
use remora_testkit::{assert_bytes_eq, fill_pattern, pattern};

#[derive(Clone, Copy, Debug)]
struct Block {
    addr: usize,
    size: usize,
    id: u64,
}

impl Block {
    fn ptr(&self) -> NonNull<u8> {
        NonNull::new(self.addr as *mut u8).unwrap()
    }

    fn fill(&self) {
        // SAFETY: the object is live, `size` bytes long and owned by the caller.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.size) };
        // The block's id as the pattern's seed: blocks differ almost
        // everywhere, so an overlap or a stray write shows up in the check.
        fill_pattern(self.id, 0, bytes);
    }

    fn check(&self) {
        // SAFETY: as in `fill`.
        let bytes = unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.size) };
        assert_bytes_eq(
            bytes,
            &pattern(self.id, 0, self.size),
            &format!("object {} ({} bytes)", self.id, self.size),
        );
    }
}

fn alloc(heap: &LocalHeap, size: usize, id: u64) -> Block {
    let obj = Block {
        addr: heap.alloc(size).unwrap().as_ptr() as usize,
        size,
        id,
    };
    obj.fill();
    obj
}

fn free(heap: &LocalHeap, obj: Block) -> Result<(), FreeError> {
    // SAFETY: each `Block` is freed once and never touched again.
    unsafe { heap.free(obj.ptr()) }
}

/// Mostly small objects, some medium, a few beyond the largest class.
fn random_size(rng: &mut StdRng) -> usize {
    match rng.random_range(0..100) {
        0..=69 => rng.random_range(0..=512),
        70..=94 => rng.random_range(513..=32 << 10),
        95..=97 => rng.random_range(32 << 10..=MAX_SIZE),
        _ => rng.random_range(MAX_SIZE + 1..=3 << 20),
    }
}

/// The page map must send the first, last and a middle byte of `obj` to a live span that
/// holds it in one slot of at least its size.
fn check_pagemap(heap: &LocalHeap, obj: &Block) {
    let first = heap.span_of(obj.addr).expect("first byte resolves");
    let slot = first.slot_at(obj.addr).expect("object starts a slot");
    assert!(first.is_allocated(slot));
    assert!(first.object_size() >= obj.size);
    match first.kind() {
        Some(SpanKind::Small(class)) => {
            assert_eq!(Some(class), SizeClass::for_size(obj.size));
        }
        Some(SpanKind::Large) => {
            assert!(obj.size > MAX_SIZE);
            assert_eq!(first.pages(), obj.size.div_ceil(PAGE_SIZE));
        }
        None => panic!("live object in a free span"),
    }
    for offset in [obj.size / 2, obj.size.saturating_sub(1)] {
        let addr = obj.addr + offset;
        let span = heap.span_of(addr).expect("interior byte resolves");
        assert!(std::ptr::eq(span, first), "interior byte maps to another span");
        assert_eq!(span.slot_containing(addr), Some(slot));
    }
}

#[test]
fn threads_write_verify_and_free_in_random_order() {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 2500;
    let heap = LocalHeap::new();
    // Each thread allocates and fills its objects, then hands half of them to its neighbour,
    // so frees cross threads.
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<Vec<Block>>()).unzip();
    let survivors: Vec<Block> = std::thread::scope(|s| {
        let handles: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(t, rx)| {
                let heap = &heap;
                let tx = senders[(t + 1) % THREADS as usize].clone();
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(t as u64);
                    let mut mine: Vec<Block> = (0..PER_THREAD)
                        .map(|i| alloc(heap, random_size(&mut rng), t as u64 * PER_THREAD + i))
                        .collect();
                    mine.shuffle(&mut rng);
                    let given = mine.split_off(mine.len() / 2);
                    tx.send(given).unwrap();
                    drop(tx);
                    let mut received = rx.recv().unwrap();
                    received.shuffle(&mut rng);
                    // Free a third of what the neighbour made, checking it first.
                    let keep = received.split_off(received.len() / 3);
                    for obj in received {
                        obj.check();
                        free(heap, obj).unwrap();
                    }
                    // Reuse the freed space while others still write.
                    for i in 0..PER_THREAD / 4 {
                        let id = (THREADS + t as u64) * PER_THREAD + i;
                        mine.push(alloc(heap, random_size(&mut rng), id));
                    }
                    mine.extend(keep);
                    mine
                })
            })
            .collect();
        drop(senders);
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });

    // No two live objects share a byte.
    let mut by_addr: Vec<&Block> = survivors.iter().collect();
    by_addr.sort_unstable_by_key(|o| o.addr);
    for w in by_addr.windows(2) {
        assert!(
            w[0].addr + w[0].size.max(1) <= w[1].addr,
            "{:?} overlaps {:?}",
            w[0],
            w[1]
        );
    }
    for obj in &survivors {
        obj.check();
        check_pagemap(&heap, obj);
    }
    let usage = heap.usage();
    assert_eq!(usage.objects(), survivors.len());
    let rounded: usize = survivors
        .iter()
        .map(|o| match SizeClass::for_size(o.size) {
            Some(c) => c.info().size(),
            None => o.size.div_ceil(PAGE_SIZE) * PAGE_SIZE,
        })
        .sum();
    assert_eq!(usage.object_bytes(), rounded);
    assert!(usage.span_bytes >= rounded && usage.span_bytes <= usage.mapped_bytes);

    // Free everything from several threads in random order; every object is intact until its
    // own free.
    let mut rng = StdRng::seed_from_u64(99);
    let mut all = survivors;
    all.shuffle(&mut rng);
    let chunk = all.len().div_ceil(THREADS as usize);
    std::thread::scope(|s| {
        for part in all.chunks(chunk) {
            let heap = &heap;
            s.spawn(move || {
                for obj in part {
                    obj.check();
                    free(heap, *obj).unwrap();
                }
            });
        }
    });
    let usage = heap.usage();
    assert_eq!((usage.objects(), usage.object_bytes(), usage.span_bytes), (0, 0, 0));
    assert_eq!(usage.free_bytes, usage.mapped_bytes);
    assert_eq!(heap.page_heap().stats().spans_in_use, 0);
}

#[test]
fn budget_stops_growth_until_memory_is_freed() {
    let limit = 4 << 20;
    let heap = LocalHeap::with_limit(limit);
    let mut rng = StdRng::seed_from_u64(5);
    let mut live = Vec::new();
    let mut id = 0;
    let failed_size = loop {
        let size = random_size(&mut rng);
        match heap.alloc(size) {
            Ok(p) => {
                let obj = Block {
                    addr: p.as_ptr() as usize,
                    size,
                    id,
                };
                obj.fill();
                live.push(obj);
                id += 1;
            }
            Err(remora_runtime::AllocError::BudgetExceeded {
                requested,
                in_use,
                limit: l,
            }) => {
                assert_eq!(l, limit);
                assert!(in_use + requested > limit);
                break size;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    };
    assert!(heap.usage().span_bytes <= limit);
    live.shuffle(&mut rng);
    while heap
        .alloc(failed_size)
        .map(|p| {
            // SAFETY: just allocated, freed straight away.
            unsafe { heap.free(p) }.unwrap()
        })
        .is_err()
    {
        let obj = live.pop().expect("freeing everything must make room");
        obj.check();
        free(&heap, obj).unwrap();
    }
    for obj in live {
        obj.check();
        free(&heap, obj).unwrap();
    }
    assert_eq!(heap.usage().span_bytes, 0);
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..=2048).prop_map(Op::Alloc),
        2 => (2049usize..=MAX_SIZE).prop_map(Op::Alloc),
        1 => (MAX_SIZE + 1..=1usize << 20).prop_map(Op::Alloc),
        6 => any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random alloc/free sequences: live objects never overlap, keep their bytes, and the
    /// accounting ends at zero.
    #[test]
    fn live_objects_never_overlap(ops in proptest::collection::vec(op(), 1..300)) {
        let heap = LocalHeap::new();
        // start address -> object
        let mut live: BTreeMap<usize, Block> = BTreeMap::new();
        for (id, op) in ops.into_iter().enumerate() {
            match op {
                Op::Alloc(size) => {
                    let obj = alloc(&heap, size, id as u64);
                    let end = obj.addr + size.max(1);
                    if let Some((_, prev)) = live.range(..obj.addr).next_back() {
                        prop_assert!(prev.addr + prev.size.max(1) <= obj.addr, "{prev:?} overlaps {obj:?}");
                    }
                    if let Some((_, next)) = live.range(obj.addr..).next() {
                        prop_assert!(end <= next.addr, "{obj:?} overlaps {next:?}");
                    }
                    prop_assert!(heap.usable_size(obj.ptr()).unwrap() >= size);
                    live.insert(obj.addr, obj);
                }
                Op::Free(pick) if !live.is_empty() => {
                    let addr = *live.keys().nth(pick % live.len()).unwrap();
                    let obj = live.remove(&addr).unwrap();
                    obj.check();
                    free(&heap, obj).unwrap();
                    prop_assert_eq!(free(&heap, obj).is_err(), true);
                }
                Op::Free(_) => {}
            }
        }
        prop_assert_eq!(heap.usage().objects(), live.len());
        for obj in live.values() {
            obj.check();
            check_pagemap(&heap, obj);
        }
        for obj in std::mem::take(&mut live).into_values() {
            free(&heap, obj).unwrap();
        }
        let usage = heap.usage();
        prop_assert_eq!((usage.objects(), usage.span_bytes), (0, 0));
    }
}
