//! A group of three managers, against real processes: the leader killed
//! (`kill -9`) over and over during a workload, a follower killed, and the
//! leader's machine gone for good. Far memory never stops, nothing is lost,
//! and the history of every grant the workload received is checked for
//! double grants, epoch order and grants forgotten.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use common::*;
use remora_cluster::LocalCluster;
use remora_proto::msg::{Event, EventKind, ManagerRole, MgrRequest, MgrResponse, decode};
use remora_proto::{
    ComputeSession, MemNodeClient, MemTransport, RegionGrant, RegionId, RemoteError, RpcConn, RpcError, SessionEvent,
    Token,
};
use remora_runtime::{RemBox, Runtime, scheme};

/// One group of managers and seven memory nodes at a time in this binary:
/// two on two cores would slow each other past an election's timing.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

fn group(memnodes: usize) -> LocalCluster {
    let mut cfg = cluster_config(memnodes, 64 << 20, 4 << 20, Duration::from_secs(3));
    cfg.managers = 3;
    LocalCluster::start(cfg).expect("cluster with three managers starts")
}

/// Grants as the workload received them, checked as they arrive.
#[derive(Default)]
struct History {
    /// Regions held now: epoch and token of the grant.
    held: HashMap<RegionId, (u64, Token)>,
    /// The last epoch each region was granted at.
    last_epoch: HashMap<RegionId, u64>,
    grants: u64,
    frees: u64,
    /// Writes refused while a memory node's lease had lapsed.
    unavailable: u64,
    violations: Vec<String>,
}

impl History {
    fn granted(&mut self, g: &RegionGrant) {
        let r = g.cap.region;
        self.grants += 1;
        if let Some(old) = self.held.get(&r) {
            self.violations.push(format!(
                "{r} granted at epoch {} while held since epoch {}",
                g.cap.epoch, old.0
            ));
        }
        if let Some(&e) = self.last_epoch.get(&r) {
            if g.cap.epoch <= e {
                self.violations
                    .push(format!("{r} granted at epoch {} after epoch {e}", g.cap.epoch));
            }
        }
        self.last_epoch.insert(r, g.cap.epoch);
        self.held.insert(r, (g.cap.epoch, g.cap.token));
    }
}

/// Allocates and frees regions until `stop`, recording every grant, and
/// writes each granted region and reads it back (the grant reached its
/// memory node). Regions of a memory node declared dead are gone from the
/// record when the session hears of it.
fn grant_churn(c: &LocalCluster, s: &ComputeSession, h: &Mutex<History>, stop: &AtomicBool) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut clients: HashMap<String, MemNodeClient> = HashMap::new();
    let events = s.take_events().expect("the session's events");
    while !stop.load(Ordering::Relaxed) {
        for e in events.try_iter() {
            if let SessionEvent::Manager(Event {
                kind: EventKind::NodeDead { regions, .. },
                ..
            }) = e
            {
                let mut h = h.lock().unwrap();
                for r in regions {
                    h.held.remove(&r);
                }
            }
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let held: Vec<RegionId> = h.lock().unwrap().held.keys().copied().collect();
        if held.len() < 4 || (held.len() < 12 && x % 2 == 0) {
            let grants = s.alloc(1 + (x % 2) as u32, false, &[]).expect("alloc");
            for g in &grants {
                h.lock().unwrap().granted(g);
                let cl = clients
                    .entry(g.addr.clone())
                    .or_insert_with(|| MemNodeClient::connect(&g.addr, c.conn_options()).unwrap());
                let data = pattern(g.cap.region.0 ^ g.cap.epoch, 0, 4096);
                // A memory node whose lease lapsed while the group changed
                // leader serves again once renewed, as the runtime waits.
                let asked = Instant::now();
                loop {
                    match cl.write(g.cap, 0, &data) {
                        Ok(()) => break,
                        Err(RpcError::Remote(RemoteError::Unavailable))
                            if asked.elapsed() < Duration::from_secs(10) =>
                        {
                            h.lock().unwrap().unavailable += 1;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => panic!("write to granted region {}: {e}", g.cap.region),
                    }
                }
                let mut back = vec![0u8; data.len()];
                cl.read(g.cap, 0, &mut back).expect("read a granted region");
                assert_bytes_eq(&back, &data, "granted region");
            }
        } else {
            let r = held[(x as usize / 7) % held.len()];
            // Out of the record first: from here on it may be granted again.
            h.lock().unwrap().held.remove(&r);
            match s.free(r) {
                Ok(()) => h.lock().unwrap().frees += 1,
                // Taken back with its dead node just now: the news follows.
                Err(RpcError::Remote(RemoteError::BadCapability { .. })) => {
                    let told = events.recv_timeout(Duration::from_secs(5)).ok().is_some_and(|e| {
                        matches!(e, SessionEvent::Manager(Event {
                            kind: EventKind::NodeDead { regions, .. }, ..
                        }) if regions.contains(&r))
                    });
                    assert!(told, "free of {r} refused, and its node was not declared dead");
                }
                Err(e) => panic!("free of {r}: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Opens a session under a new name until `stop` (each open is one
/// registration, retried across elections by the client) and closes it
/// again: the names of those acknowledged, and the count refused.
fn registration_churn(c: &LocalCluster, stop: &AtomicBool) -> (Vec<String>, u64) {
    let (mut acked, mut refused) = (Vec::new(), 0);
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let name = format!("churn-{i}");
        match ComputeSession::open(c.manager_addr(), &name, c.conn_options()) {
            Ok(_) => acked.push(name),
            Err(e) => {
                eprintln!("registration {name}: {e}");
                refused += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (acked, refused)
}

/// Every acknowledged registration is in the group's state once, and none
/// was applied twice (each name is used once).
fn assert_registered_once(c: &LocalCluster, acked: &[String]) {
    let st = c.status().unwrap();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for n in st.compute_nodes.iter().filter(|n| n.name.starts_with("churn-")) {
        *seen.entry(n.name.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "registered more than once: {twice:?}");
    let lost: Vec<_> = acked.iter().filter(|n| !seen.contains_key(n.as_str())).collect();
    assert!(lost.is_empty(), "acknowledged registrations lost: {lost:?}");
}

/// Every grant the manager group remembers for `s` is one the workload
/// holds, at the same epoch and token, and the other way round.
fn assert_nothing_forgotten(s: &ComputeSession, h: &History) {
    let known: BTreeSet<(RegionId, u64, [u8; 16])> = s
        .my_regions()
        .unwrap()
        .iter()
        .map(|g| (g.cap.region, g.cap.epoch, g.cap.token.0))
        .collect();
    let held: BTreeSet<(RegionId, u64, [u8; 16])> = h.held.iter().map(|(r, (e, t))| (*r, *e, t.0)).collect();
    assert_eq!(known, held, "the group's record of the session's regions");
}

/// An ec-batch runtime on the cluster holding 8 MiB of 1 KiB objects, 4x
/// its local budget, evicted.
fn filled(c: &LocalCluster, name: &str) -> (Runtime, Vec<RwLock<RemBox<Obj>>>, Vec<AtomicU64>) {
    let mut cfg = runtime_config(c, name, 2 << 20);
    cfg.scheme = scheme::by_name("ec-batch").unwrap();
    let rt = Runtime::connect(cfg).unwrap();
    let n = 8192u64;
    let objs: Vec<RwLock<RemBox<Obj>>> = (0..n).map(|i| RwLock::new(rt.alloc(obj(i, 0)).unwrap())).collect();
    let versions = (0..n).map(|_| AtomicU64::new(0)).collect();
    rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    (rt, objs, versions)
}

/// The leader is killed `REMORA_LEADER_KILLS` times (default 4) during a
/// far-memory workload and a grant/free workload, each time restarted as a
/// follower 0.5–2 s later, while compute nodes register (and leave) all
/// along. A new leader serves within 2 s each time; no operation fails, no
/// second of the workload passes without progress, no region is granted
/// twice or at an epoch that does not grow, no grant or registration is
/// forgotten or applied twice, and every object verifies.
#[test]
fn the_leader_killed_over_and_over_loses_nothing() {
    let _one = one_at_a_time();
    let kills: usize = std::env::var("REMORA_LEADER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let c = group(7);
    let (rt, objs, versions) = filled(&c, "leader-kills");
    let s = session(&c, "grants");
    let history = Mutex::new(History::default());
    let load = Uniform::new(&rt, &objs, &versions, kills * 60 + 100);
    let stop_grants = AtomicBool::new(false);
    let mut elections = Vec::new();
    let (first_kill, last_restart, (acked, refused)) = std::thread::scope(|sc| {
        for t in 0..2 {
            let load = &load;
            sc.spawn(move || load.run(t));
        }
        sc.spawn(|| grant_churn(&c, &s, &history, &stop_grants));
        let registrations = sc.spawn(|| registration_churn(&c, &stop_grants));
        std::thread::sleep(Duration::from_secs(2));
        let first_kill = load.elapsed();
        for k in 0..kills {
            let old = c.wait_for_leader(Duration::from_secs(10)).expect("a leader");
            let killed = Instant::now();
            c.kill_manager_member(old);
            let new = c.wait_for_leader(Duration::from_secs(10)).expect("a new leader");
            elections.push(killed.elapsed());
            assert_ne!(new, old, "kill {k}: the killed member still leads");
            std::thread::sleep(Duration::from_millis(500 + 300 * (k as u64 % 6)));
            c.start_manager_member_again(old).expect("restarted as a follower");
            std::thread::sleep(Duration::from_secs(1));
        }
        let last_restart = load.elapsed();
        std::thread::sleep(Duration::from_secs(2));
        stop_grants.store(true, Ordering::Relaxed);
        load.stop.store(true, Ordering::Relaxed);
        (first_kill, last_restart, registrations.join().unwrap())
    });
    load.assert_no_errors();
    let windows = load.windows_between(first_kill, last_restart);
    let zero = windows.iter().filter(|w| **w == 0).count();
    let per_second: Vec<u64> = windows.chunks(10).map(|c| c.iter().sum()).collect();
    eprintln!(
        "{kills} leader kills: new leader after {elections:?}; {zero} of {} 100 ms windows at 0 ops; ops per \
         second {per_second:?}",
        windows.len()
    );
    // What was granted, and every byte, first: those must hold however
    // slow the machine.
    let h = history.into_inner().unwrap();
    eprintln!(
        "{} grants, {} frees, {} writes refused while a lease had lapsed; {} registrations acknowledged, {refused} \
         refused",
        h.grants,
        h.frees,
        h.unavailable,
        acked.len()
    );
    assert!(h.violations.is_empty(), "grant history: {:?}", h.violations);
    assert!(
        h.grants > 10 && h.frees > 5,
        "too little churn to judge: {} grants, {} frees",
        h.grants,
        h.frees
    );
    assert_nothing_forgotten(&s, &h);
    assert!(acked.len() > 10, "too few registrations to judge: {}", acked.len());
    assert_registered_once(&c, &acked);
    load.verify_all();
    assert_eq!(rt.stats().scheme.lost_positions, 0, "{:?}", rt.stats());
    assert!(
        per_second.iter().all(|s| *s > 0),
        "a whole second without far-memory progress: {per_second:?}"
    );
    for (k, e) in elections.iter().enumerate() {
        assert!(*e < Duration::from_secs(2), "kill {k}: a new leader only after {e:?}");
    }
    let st = c.status().unwrap();
    assert_eq!(st.managers.len(), 3);
    assert!(
        st.memory_nodes
            .iter()
            .all(|m| m.state == remora_proto::NodeState::Alive),
        "{st:?}"
    );
}

/// A follower killed changes nothing for clients; restarted, it catches up.
/// Then the leader's machine is gone for good (never restarted): the group
/// of two goes on deciding, so a memory node killed after is still declared
/// dead and rebuilt, and every object verifies.
#[test]
fn a_follower_and_then_the_leaders_machine_lost() {
    let _one = one_at_a_time();
    let c = group(7);
    let (rt, objs, versions) = filled(&c, "lost-members");
    let s = session(&c, "grants");
    let history = Mutex::new(History::default());
    let leader = c.wait_for_leader(Duration::from_secs(10)).unwrap();
    let follower = (leader + 1) % 3;
    c.kill_manager_member(follower);
    let grants = s.alloc(3, false, &[]).unwrap();
    for g in &grants {
        history.lock().unwrap().granted(g);
    }
    assert_eq!(
        c.wait_for_leader(Duration::from_secs(1)).unwrap(),
        leader,
        "a follower's loss moved the lead"
    );
    let st = c.status().unwrap();
    assert_eq!(
        st.managers
            .iter()
            .filter(|m| m.role == remora_proto::msg::ManagerRole::Unreachable)
            .count(),
        1,
        "{:?}",
        st.managers
    );
    c.start_manager_member_again(follower).unwrap();

    // The leader's machine goes and never comes back.
    c.kill_manager_member(leader);
    let new = c.wait_for_leader(Duration::from_secs(5)).unwrap();
    assert_ne!(new, leader);
    let load = Uniform::new(&rt, &objs, &versions, 400);
    let stop_grants = AtomicBool::new(false);
    std::thread::scope(|sc| {
        for t in 0..2 {
            let load = &load;
            sc.spawn(move || load.run(t));
        }
        sc.spawn(|| grant_churn(&c, &s, &history, &stop_grants));
        std::thread::sleep(Duration::from_secs(1));
        c.kill_memnode(0).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while rt.stats().scheme.recoveries == 0 || rt.stats().scheme.recovering > 0 {
            assert!(
                Instant::now() < deadline,
                "no rebuild with two managers: {:?}",
                rt.stats()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(1));
        stop_grants.store(true, Ordering::Relaxed);
        load.stop.store(true, Ordering::Relaxed);
    });
    load.assert_no_errors();
    let h = history.into_inner().unwrap();
    assert!(h.violations.is_empty(), "grant history: {:?}", h.violations);
    assert_nothing_forgotten(&s, &h);
    load.verify_all();
    assert_eq!(rt.stats().scheme.lost_positions, 0, "{:?}", rt.stats());
    let st = c.status().unwrap();
    let dead: Vec<&str> = st
        .memory_nodes
        .iter()
        .filter(|m| m.state == remora_proto::NodeState::Dead)
        .map(|m| m.addr.as_str())
        .collect();
    assert_eq!(dead, vec![c.memnodes()[0].addr.as_str()]);
}

/// Each manager's role as it reports it (`Unreachable` if it does not answer).
fn roles(c: &LocalCluster) -> Vec<ManagerRole> {
    c.manager_addrs()
        .iter()
        .map(|a| {
            let asked = RpcConn::connect(a, quick_opts(c)).and_then(|conn| {
                let t = conn.send(&MgrRequest::Member, &[])?;
                Ok(decode::<MgrResponse>(&conn.wait(t, None, Duration::from_secs(1))?.head))
            });
            match asked {
                Ok(Ok(MgrResponse::Member(m))) => m.role,
                _ => ManagerRole::Unreachable,
            }
        })
        .collect()
}

/// Cuts manager `i` off from the other members for `d`, both ways.
fn partition(c: &LocalCluster, i: usize, d: Duration) {
    let addrs = c.manager_addrs();
    let me = i as u64 + 1;
    for (j, a) in addrs.iter().enumerate() {
        let peers: Vec<u64> = if j == i {
            (1..=addrs.len() as u64).filter(|id| *id != me).collect()
        } else {
            vec![me]
        };
        let conn = RpcConn::connect(a, quick_opts(c)).unwrap();
        let req = MgrRequest::Isolate {
            peers,
            for_ms: d.as_millis() as u32,
        };
        let t = conn.send(&req, &[]).unwrap();
        let r = conn.wait(t, None, Duration::from_secs(2)).unwrap();
        assert_eq!(decode::<MgrResponse>(&r.head).unwrap(), MgrResponse::Ok);
    }
}

/// The leader cut off from the other two for 6 s (fault injection): they
/// elect one of themselves within 2 s; the old leader, unable to confirm its
/// lead, sends clients and memory nodes on, and decides nothing. Far memory
/// keeps going, no operation fails, the grant history holds, and after the
/// partition heals the old leader follows.
#[test]
fn the_leader_partitioned_from_the_others() {
    let _one = one_at_a_time();
    let c = group(7);
    let (rt, objs, versions) = filled(&c, "partition");
    let s = session(&c, "grants");
    let history = Mutex::new(History::default());
    let old = c.wait_for_leader(Duration::from_secs(10)).unwrap();
    let load = Uniform::new(&rt, &objs, &versions, 400);
    let stop_grants = AtomicBool::new(false);
    let cut = Duration::from_secs(6);
    let (elected, cut_at) = std::thread::scope(|sc| {
        for t in 0..2 {
            let load = &load;
            sc.spawn(move || load.run(t));
        }
        sc.spawn(|| grant_churn(&c, &s, &history, &stop_grants));
        std::thread::sleep(Duration::from_secs(2));
        let cut_at = load.elapsed();
        let t0 = Instant::now();
        partition(&c, old, cut);
        let elected = loop {
            let r = roles(&c);
            if let Some(n) = (0..3).find(|j| *j != old && r[*j] == ManagerRole::Leader) {
                break (n, t0.elapsed());
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no new leader: {r:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(cut + Duration::from_secs(3) - t0.elapsed());
        stop_grants.store(true, Ordering::Relaxed);
        load.stop.store(true, Ordering::Relaxed);
        (elected, cut_at)
    });
    let (new, took) = elected;
    let windows = load.windows_between(cut_at, cut_at + cut);
    let per_second: Vec<u64> = windows.chunks(10).map(|c| c.iter().sum()).collect();
    eprintln!(
        "partitioned leader {old}: member {new} leads after {took:?}; {} of {} 100 ms windows at 0 ops; ops per \
         second {per_second:?}",
        windows.iter().filter(|w| **w == 0).count(),
        windows.len()
    );
    load.assert_no_errors();
    assert!(took < Duration::from_secs(2), "a new leader only after {took:?}");
    assert!(
        per_second.iter().all(|s| *s > 0),
        "a whole second without progress: {per_second:?}"
    );
    let h = history.into_inner().unwrap();
    assert!(h.violations.is_empty(), "grant history: {:?}", h.violations);
    assert_nothing_forgotten(&s, &h);
    load.verify_all();
    assert_eq!(rt.stats().scheme.lost_positions, 0, "{:?}", rt.stats());
    let r = roles(&c);
    assert_eq!(
        r.iter().filter(|x| **x == ManagerRole::Leader).count(),
        1,
        "after the heal: {r:?}"
    );
    assert!(
        c.status()
            .unwrap()
            .memory_nodes
            .iter()
            .all(|m| m.state == remora_proto::NodeState::Alive)
    );
}
