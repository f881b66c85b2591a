//! Stress tests of the runtime against a real cluster (manager and memory
//! nodes as child processes on loopback): many threads dereference, write,
//! allocate and drop while eviction runs, and every byte is checked against
//! what the test knows each object must hold.
//!
//! Object contents are a pure function of (object id, version), so a check
//! needs only the version the test expects. Every assertion is about data
//! or counters, never about timing; the time limits only bound the work.
//!
//! ```text
//! CARGO_TARGET_DIR=/tmp/target-loom cargo test --test stress -- --nocapture
//! ```

mod common;

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{KIB, MIB, Node, Obj, Obj2K, Obj4K, cluster, runtime_config};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remora_runtime::{RemBox, RemRc, Runtime, Stats};

/// Objects of 1, 2 and 4 KiB (with the runtime's 8-byte header they fall in
/// three different size classes).
type Small = Obj;
type Medium = Obj2K;
type Large = Obj4K;

/// A pointer to an object of one of the three sizes.
enum AnyBox {
    Small(RemBox<Small>),
    Medium(RemBox<Medium>),
    Large(RemBox<Large>),
}

impl AnyBox {
    /// Object `id` at version 0; its size class follows from the id.
    fn alloc(rt: &Runtime, id: u64) -> Self {
        match id % 3 {
            0 => Self::Small(rt.alloc(Small::new(id, 0)).expect("alloc")),
            1 => Self::Medium(rt.alloc(Medium::new(id, 0)).expect("alloc")),
            _ => Self::Large(rt.alloc(Large::new(id, 0)).expect("alloc")),
        }
    }

    fn bytes(id: u64) -> usize {
        [1024, 2048, 4096][(id % 3) as usize]
    }

    #[track_caller]
    fn check(&self, rt: &Runtime, id: u64, version: u64) {
        let scope = rt.scope();
        match self {
            Self::Small(b) => b.deref(&scope).expect("deref").check(id, version),
            Self::Medium(b) => b.deref(&scope).expect("deref").check(id, version),
            Self::Large(b) => b.deref(&scope).expect("deref").check(id, version),
        }
    }

    /// Checks the object is at `version` and rewrites it at `version + 1`.
    #[track_caller]
    fn update(&mut self, rt: &Runtime, id: u64, version: u64) {
        let scope = rt.scope();
        match self {
            Self::Small(b) => {
                let o = b.deref_mut(&scope).expect("deref_mut");
                o.check(id, version);
                o.rewrite(version + 1);
            }
            Self::Medium(b) => {
                let o = b.deref_mut(&scope).expect("deref_mut");
                o.check(id, version);
                o.rewrite(version + 1);
            }
            Self::Large(b) => {
                let o = b.deref_mut(&scope).expect("deref_mut");
                o.check(id, version);
                o.rewrite(version + 1);
            }
        }
    }
}

fn runtime(c: &remora_cluster::LocalCluster, name: &str, budget: usize) -> Runtime {
    Runtime::connect(runtime_config(c, name, budget)).expect("runtime connects")
}

/// Asserts that eviction really moved spans both ways, with one remote read per swap-in.
#[track_caller]
fn assert_evicted_and_swapped(st: &Stats) {
    assert!(st.traffic.swap_outs > 0, "nothing was evicted: {st:?}");
    assert!(st.traffic.swap_ins > 0, "nothing was swapped in: {st:?}");
    assert_eq!(
        st.traffic.swap_in_reads, st.traffic.swap_ins,
        "one remote read per swap-in: {st:?}"
    );
}

/// Once every object is dropped and no eviction round holds far pages, the
/// runtime holds no object and no far memory.
#[track_caller]
fn assert_empty(rt: &Runtime) {
    rt.wait_for_eviction(Duration::from_secs(20)).expect("eviction settles");
    let st = rt.stats();
    assert_eq!(st.local.objects, 0, "objects leaked: {st:?}");
    assert_eq!(st.far.bytes_used, 0, "far memory leaked: {st:?}");
    assert_eq!(st.far.live_bytes, 0, "far spans still live: {st:?}");
}

/// A shared object and the version the test expects it to hold. The lock
/// makes the version and the contents change together; a write takes it
/// exclusively because `deref_mut` needs `&mut RemBox`.
struct Shared {
    obj: AnyBox,
    version: u64,
}

/// 8 threads, 70 % reads and 30 % writes over about 4.7x the local budget
/// of 1, 2 and 4 KiB objects, while eviction runs; every read is checked, and
/// at the end every object is.
#[test]
fn random_reads_and_writes_over_four_times_the_budget() {
    const THREADS: usize = 8;
    const OPS_PER_THREAD: usize = 20_000;
    let budget = 4 * MIB;
    let c = cluster(2, 256 << 20, 16 << 20);
    let rt = runtime(&c, "stress-rw", budget);

    let n = 8 * 1024u64;
    let objs: Vec<RwLock<Shared>> = (0..n)
        .map(|id| {
            RwLock::new(Shared {
                obj: AnyBox::alloc(&rt, id),
                version: 0,
            })
        })
        .collect();
    let total: usize = (0..n).map(AnyBox::bytes).sum();
    assert!(total >= 4 * budget, "working set {total} bytes is not 4x the budget");
    let after_alloc = rt.stats();
    eprintln!("allocated {n} objects, {} MiB: {after_alloc:?}", total / MIB);
    assert!(
        after_alloc.traffic.swap_outs > 0,
        "allocation past the budget evicted nothing"
    );

    let deadline = Instant::now() + Duration::from_secs(12);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (rt, objs, done) = (&rt, &objs, &done);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(0x5eed_0000 + t as u64);
                let mut ops = 0;
                while ops < OPS_PER_THREAD && Instant::now() < deadline {
                    let id = rng.random_range(0..n);
                    let cell = &objs[id as usize];
                    if rng.random_bool(0.7) {
                        let g = cell.read().unwrap();
                        g.obj.check(rt, id, g.version);
                    } else {
                        let mut g = cell.write().unwrap();
                        let v = g.version;
                        g.obj.update(rt, id, v);
                        g.version = v + 1;
                    }
                    ops += 1;
                }
                done.fetch_add(ops as u64, Ordering::Relaxed);
            });
        }
    });
    let st = rt.stats();
    eprintln!("{} ops by {THREADS} threads: {st:?}", done.load(Ordering::Relaxed));
    assert_evicted_and_swapped(&st);
    assert!(
        st.traffic.swap_ins > after_alloc.traffic.swap_ins,
        "the random phase swapped nothing in: {st:?}"
    );
    assert!(
        st.traffic.swap_outs > after_alloc.traffic.swap_outs,
        "the random phase evicted nothing: {st:?}"
    );

    // Every object against the version the test recorded.
    let mut writes = 0;
    for (id, cell) in objs.iter().enumerate() {
        let g = cell.read().unwrap();
        g.obj.check(&rt, id as u64, g.version);
        writes += g.version;
    }
    eprintln!("all {n} objects verified ({writes} writes)");
    drop(objs);
    assert_empty(&rt);
}

/// An object owned by one churn thread and the version it holds.
struct Owned {
    obj: AnyBox,
    id: u64,
    version: u64,
}

/// Threads allocate, update, check and drop objects concurrently while
/// eviction runs, so frees race eviction rounds (marking, commit, swap-in of
/// spans whose objects are being freed). Every object is checked before it
/// is dropped; at the end nothing may be left, locally or far.
#[test]
fn drop_churn_under_eviction() {
    const THREADS: usize = 6;
    const OPS_PER_THREAD: usize = 25_000;
    /// Live objects per thread: 6 x 600 x ~2.3 KiB is about 8 MiB, 4x the budget.
    const LIVE: usize = 600;
    let budget = 2 * MIB;
    let c = cluster(2, 256 << 20, 16 << 20);
    let rt = runtime(&c, "stress-churn", budget);
    let next_id = AtomicU64::new(0);
    let dropped = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(12);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (rt, next_id, dropped) = (&rt, &next_id, &dropped);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(0xc4a2_0000 + t as u64);
                let mut mine: Vec<Owned> = Vec::with_capacity(LIVE);
                let mut ops = 0;
                while ops < OPS_PER_THREAD && Instant::now() < deadline {
                    ops += 1;
                    let roll = rng.random_range(0..100);
                    if mine.len() < LIVE / 2 || (roll < 35 && mine.len() < LIVE) {
                        let id = next_id.fetch_add(1, Ordering::Relaxed);
                        mine.push(Owned {
                            obj: AnyBox::alloc(rt, id),
                            id,
                            version: 0,
                        });
                        continue;
                    }
                    let k = rng.random_range(0..mine.len());
                    if roll < 65 {
                        // Check, then drop: the free may find the object
                        // local, marked for eviction, or far.
                        let o = mine.swap_remove(k);
                        o.obj.check(rt, o.id, o.version);
                        drop(o);
                        dropped.fetch_add(1, Ordering::Relaxed);
                    } else if roll < 85 {
                        let o = &mut mine[k];
                        o.obj.update(rt, o.id, o.version);
                        o.version += 1;
                    } else {
                        let o = &mine[k];
                        o.obj.check(rt, o.id, o.version);
                    }
                }
                for o in &mine {
                    o.obj.check(rt, o.id, o.version);
                }
                // Dropped at the end of the thread, while the others may still run.
            });
        }
    });
    let st = rt.stats();
    eprintln!(
        "allocated {}, dropped {} early: {st:?}",
        next_id.load(Ordering::Relaxed),
        dropped.load(Ordering::Relaxed)
    );
    assert_evicted_and_swapped(&st);
    assert_empty(&rt);
}

/// A list node, as in the runtime's documentation: the `RemBox` inside an
/// object stays valid while the object is far.
type ListNode = Node<u64>;

/// Walks the list from `head`, checking node `i` holds `value(i)`; returns the length.
fn walk(rt: &Runtime, head: &RemBox<ListNode>, value: impl Fn(u64) -> u64) -> u64 {
    // One scope for the whole walk: each `&RemBox` comes from the previous
    // node's memory, so the scope cannot be renewed mid-way.
    let scope = rt.scope();
    let mut cur = Some(head);
    let mut i = 0;
    while let Some(b) = cur {
        let node = b.deref(&scope).expect("deref");
        assert_eq!(node.value, value(i), "node {i}");
        cur = node.next.as_ref();
        i += 1;
    }
    i
}

/// Pushes `n` nodes, so node i (counting from the head) holds `n - 1 - i`.
fn build_list(rt: &Runtime, n: u64) -> RemBox<ListNode> {
    let mut head: Option<RemBox<ListNode>> = None;
    for v in 0..n {
        head = Some(rt.alloc(ListNode { value: v, next: head }).expect("alloc"));
    }
    head.expect("n > 0")
}

/// A singly linked list of 10k remotable nodes built over a budget far
/// smaller than the list, walked (before and after eviction has caught up),
/// updated in place, walked again, and dropped through its head: nothing may be left.
#[test]
fn linked_list_over_a_small_budget() {
    const NODES: u64 = 10_000;
    let c = cluster(2, 256 << 20, 16 << 20);
    // Nodes take 24 bytes with the header, so the list needs ~240 KiB of
    // spans; 64 KiB keeps most of it far.
    let rt = runtime(&c, "stress-list", 64 * KIB);
    let mut head = build_list(&rt, NODES);
    let value = |i: u64| NODES - 1 - i;
    let built = rt.stats();
    eprintln!("built: {built:?}");
    assert!(
        built.traffic.swap_outs > 0,
        "building the list evicted nothing: {built:?}"
    );
    assert_eq!(built.local.objects, NODES);

    assert_eq!(walk(&rt, &head, value), NODES);
    rt.wait_for_eviction(Duration::from_secs(20))
        .expect("eviction catches up");
    assert_eq!(walk(&rt, &head, value), NODES);

    // Add 1 to every node through `deref_mut`: each `&mut RemBox` to the
    // next node lives in the current node's memory, so the walk is one scope.
    {
        let scope = rt.scope();
        let mut cur = &mut head;
        loop {
            let node = cur.deref_mut(&scope).expect("deref_mut");
            node.value += 1;
            match node.next.as_mut() {
                Some(next) => cur = next,
                None => break,
            }
        }
    }
    rt.wait_for_eviction(Duration::from_secs(20))
        .expect("eviction catches up");
    assert_eq!(walk(&rt, &head, |i| value(i) + 1), NODES);
    let st = rt.stats();
    eprintln!("updated: {st:?}");
    assert_evicted_and_swapped(&st);

    // Dropping the head frees every node, local or far.
    drop(head);
    assert_empty(&rt);
}

/// Dropping the head of a long list frees the whole list without deep
/// recursion: each node's free would otherwise run inside the previous one
/// (`free_object` drops the value it read out, whose `next` is a `RemBox`),
/// at about 320 bytes of stack per node in the test profile, so 10k nodes
/// would overflow a 2 MiB thread stack and abort the process.
#[test]
fn dropping_a_long_list_does_not_overflow_the_stack() {
    const NODES: u64 = 10_000;
    let c = cluster(2, 256 << 20, 16 << 20);
    let rt = runtime(&c, "stress-list-drop", 64 * KIB);
    let head = build_list(&rt, NODES);
    assert_eq!(walk(&rt, &head, |i| NODES - 1 - i), NODES);
    // The default stack of a spawned thread, stated so the test does not
    // depend on RUST_MIN_STACK.
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(2 * MIB)
            .spawn_scoped(s, move || drop(head))
            .expect("spawn")
            .join()
            .expect("drop thread");
    });
    assert_empty(&rt);
}

/// `RemRc` clones share one object: its contents are visible through every
/// clone (from several threads) after it has been evicted, the count follows
/// the clones, and the object is freed with the last one.
#[test]
fn shared_object_survives_eviction_and_is_freed_with_the_last_clone() {
    let budget = MIB;
    let c = cluster(2, 256 << 20, 16 << 20);
    let rt = runtime(&c, "stress-rc", budget);
    let rc = rt.alloc_shared(Large::new(7, 3)).expect("alloc_shared");
    let clones: Vec<RemRc<Large>> = (0..7).map(|_| rc.clone()).collect();
    assert_eq!(rc.count(), 8);
    // Filler 4x the budget pushes the (now cold) shared object out.
    let filler: Vec<AnyBox> = (1000..1000 + (4 * budget / 2300) as u64)
        .map(|id| AnyBox::alloc(&rt, id))
        .collect();
    let st = rt.stats();
    assert!(st.traffic.swap_outs > 0, "filler evicted nothing: {st:?}");
    assert_eq!(st.local.objects, 1 + filler.len() as u64, "clones are one object");

    // Each round sweeps the filler (4x the budget) through local memory,
    // which pushes the cold shared object out, then reads it through every
    // clone at once, one thread per clone.
    let swap_ins_before = st.traffic.swap_ins;
    for round in 0..4 {
        for (i, f) in filler.iter().enumerate() {
            f.check(&rt, 1000 + i as u64, 0);
        }
        std::thread::scope(|s| {
            for cl in &clones {
                let rt = &rt;
                s.spawn(move || {
                    let scope = rt.scope();
                    cl.deref(&scope).expect("deref").check(7, 3);
                });
            }
        });
        eprintln!("round {round}: {:?}", rt.stats());
    }
    let st = rt.stats();
    assert!(
        st.traffic.swap_ins > swap_ins_before,
        "nothing was swapped back in: {st:?}"
    );
    assert_eq!(
        st.traffic.swap_in_reads, st.traffic.swap_ins,
        "one remote read per swap-in: {st:?}"
    );

    // Dropping all but one clone keeps the object; the last one frees it.
    drop(clones);
    assert_eq!(rc.count(), 1);
    {
        let scope = rt.scope();
        rc.deref(&scope).expect("deref").check(7, 3);
    }
    let before = rt.stats().local.objects;
    drop(rc);
    assert_eq!(rt.stats().local.objects, before - 1, "the last clone frees the object");
    drop(filler);
    assert_empty(&rt);
}
