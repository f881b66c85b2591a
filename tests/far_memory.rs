//! Far memory held follows the data, against real processes: when objects
//! die, the regions that emptied go back to the manager (its status shows
//! them free again), and the region indices they leave are reused when the
//! data grows again, without a byte of the survivors changing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use remora_runtime::{RemBox, Runtime, scheme};

const REGION: u64 = 1 << 20;

/// Regions the manager has handed out, over every memory node.
fn regions_in_use(c: &remora_cluster::LocalCluster) -> u64 {
    let s = c.status().expect("status");
    s.memory_nodes.iter().map(|m| m.regions_total - m.regions_free).sum()
}

/// Far bytes held, once the runtime's count and the manager's agree (eviction
/// or the periodic give-back may move either between two readings).
fn held_agreed(rt: &Runtime, c: &remora_cluster::LocalCluster, what: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held = rt.stats().far.bytes_held;
        let at_manager = regions_in_use(c) * REGION;
        if held == at_manager && rt.stats().far.bytes_held == held {
            return held;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the runtime holds {held} bytes of regions, the manager counts {at_manager}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn verify(rt: &Runtime, objs: &[(u64, RemBox<Obj2K>)]) {
    let scope = rt.scope();
    for (id, b) in objs {
        let o = b.deref(&scope).expect("object reads back");
        assert!(o.is(*id, 0), "object {id} changed");
    }
}

fn gives_back(name: &str) {
    let c = cluster(7, 256 << 20, REGION);
    let mut cfg = runtime_config(&c, &format!("give-back-{name}"), 2 << 20);
    cfg.scheme = scheme::make(name, &scheme::SchemeOptions::default()).unwrap();
    let rt = Runtime::connect(cfg).unwrap();

    // ~40 MiB of objects against a 2 MiB local budget: most go far, over
    // many 1 MiB regions.
    let n = 20_000u64;
    let mut objs: Vec<(u64, RemBox<Obj2K>)> = (0..n).map(|i| (i, rt.alloc(Obj2K::new(i, 0)).unwrap())).collect();
    rt.wait_for_eviction(Duration::from_secs(60)).unwrap();
    // No read pass here: swapping every object in and out again would
    // scatter the survivors over every stripe group (re-evictions go
    // wherever there is room), and nothing could be given back. They are
    // read back once the others are gone.
    // The manager and the runtime agree on regions held (once eviction
    // has settled between the two readings).
    let held_full = held_agreed(&rt, &c, name);
    let at_manager_full = held_full / REGION;
    assert!(
        held_full >= 10 * REGION,
        "{name}: the data should span many regions, holds {held_full}"
    );

    // The oldest 90 % die (a cache dropping its old entries). Regions
    // that held only them empty. (Survivors scattered over every region
    // would pin them all: nothing moves live spans between stripe groups.)
    objs.retain(|(id, _)| *id >= n * 9 / 10);
    rt.wait_for_eviction(Duration::from_secs(60)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        rt.give_back_empty_regions();
        let s = rt.stats();
        if s.far.bytes_held * 2 <= held_full {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: far memory held stays at {} of {held_full} bytes after 90 % of the data died (in use {})",
            s.far.bytes_held,
            s.far.bytes_used
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let s = rt.stats();
    assert!(s.far.bytes_given_back > 0, "{name}: given back is counted");
    // The manager sees the regions free again.
    let held_now = held_agreed(&rt, &c, name);
    assert!(
        held_now / REGION < at_manager_full,
        "{name}: {held_now} of {held_full} bytes held"
    );
    verify(&rt, &objs);

    // Grow again until far memory grows (ec-2pc first refills its
    // spansets' free slots in the regions kept), by at most 3/4 of the
    // first peak's objects, so that the peak stays below the first: new
    // regions take the vacant indices; old and new objects all read back.
    let mut next = n;
    while rt.stats().far.bytes_held <= s.far.bytes_held && next < n + n * 3 / 4 {
        objs.extend((next..next + n / 8).map(|i| (i, rt.alloc(Obj2K::new(i, 0)).unwrap())));
        next += n / 8;
        rt.wait_for_eviction(Duration::from_secs(60)).unwrap();
    }
    // Read before the objects are verified: the swap-ins of the check
    // leave holes and free slots, and the runtime may give regions back
    // meanwhile.
    let grown = rt.stats().far.bytes_held;
    verify(&rt, &objs);
    assert!(
        grown > s.far.bytes_held,
        "{name}: far memory did not grow again ({grown} held, {} after the drop)",
        s.far.bytes_held
    );
    let indices: Vec<u16> = rt.regions().iter().map(|(i, _)| *i).collect();
    let max = indices.iter().copied().max().unwrap_or(0) as u64;
    // Reused, the highest index stays below the most regions held at once:
    // the first peak, or now if a starved machine made the runtime place
    // stripes again elsewhere. Not reused, it would be past both (the
    // first peak plus every region taken since).
    let most = at_manager_full.max(indices.len() as u64);
    assert!(
        max < most + 6,
        "{name}: region indices were not reused (max index {max}, {at_manager_full} held at the first peak, {} now)",
        indices.len()
    );
}

#[test]
fn non_ft_gives_empty_regions_back() {
    gives_back("non-ft");
}

#[test]
fn ec_batch_gives_empty_regions_back() {
    gives_back("ec-batch");
}

#[test]
fn ec_split_gives_empty_regions_back() {
    gives_back("ec-split");
}

#[test]
fn ec_batch_remote_gives_empty_regions_back() {
    gives_back("ec-batch-remote");
}

#[test]
fn ec_2pc_gives_empty_regions_back() {
    gives_back("ec-2pc");
}
