//! A group of three managers in one process: a leader is elected, clients
//! given every address find it, what it acknowledged survives its loss, and
//! a single manager's store is taken over on the upgrade.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use redb::{Database, TableDefinition};
use remora_manager::{Config, Manager};
use remora_proto::msg::{ManagerRole, MgrRequest, MgrResponse};
use remora_proto::{ConnOptions, ManagerConn, Session, Token};

fn config(dir: &Path, id: u64, peers: &BTreeMap<u64, String>) -> Config {
    Config {
        listen: peers.get(&id).cloned().unwrap_or_else(|| "127.0.0.1:0".into()),
        data_dir: dir.join(format!("m{id}")),
        heartbeat_timeout: Duration::from_secs(3),
        cluster_key: None,
        tls: None,
        id,
        peers: peers.clone(),
        snapshot_every: 8,
        limits: Default::default(),
    }
}

fn free_ports(n: usize) -> Vec<String> {
    let ls: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    ls.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}

fn opts() -> ConnOptions {
    ConnOptions {
        call_timeout: Duration::from_secs(5),
        ..ConnOptions::default()
    }
}

fn register(conn: &ManagerConn, name: &str) -> Session {
    match conn
        .call(&MgrRequest::RegisterCompute {
            name: name.into(),
            request: MgrRequest::registration_number(),
        })
        .unwrap()
    {
        MgrResponse::ComputeRegistered { session, .. } => session,
        other => panic!("{other:?}"),
    }
}

fn leader(managers: &[Option<Manager>]) -> Option<usize> {
    let leaders: Vec<usize> = managers
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.as_ref()
                .is_some_and(|m| m.status().managers[0].role == ManagerRole::Leader)
        })
        .map(|(i, _)| i)
        .collect();
    assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
    leaders.first().copied()
}

fn wait_leader(managers: &[Option<Manager>], within: Duration) -> usize {
    let start = Instant::now();
    loop {
        if let Some(l) = leader(managers) {
            return l;
        }
        assert!(start.elapsed() < within, "no leader within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_group_of_three_survives_its_leader() {
    let dir = tempfile::tempdir().unwrap();
    let addrs = free_ports(3);
    let peers: BTreeMap<u64, String> = (1..=3).map(|i| (i, addrs[i as usize - 1].clone())).collect();
    let mut managers: Vec<Option<Manager>> = (1..=3)
        .map(|i| Some(Manager::start(config(dir.path(), i, &peers)).unwrap()))
        .collect();
    let first = wait_leader(&managers, Duration::from_secs(5));
    let conn = ManagerConn::connect(&addrs.join(","), opts()).unwrap();
    let a = register(&conn, "a");
    assert_eq!(
        conn.call(&MgrRequest::ComputeHeartbeat { session: a }).unwrap(),
        MgrResponse::Ok
    );
    let st = conn.status().unwrap();
    assert_eq!(st.managers.len(), 3);
    assert_eq!(st.managers.iter().filter(|m| m.role == ManagerRole::Leader).count(), 1);
    assert!(st.managers.iter().all(|m| m.term >= 1), "{:?}", st.managers);

    // The leader goes; the other two elect one of themselves, which knows
    // the session the old one acknowledged.
    let killed = Instant::now();
    managers[first].take().unwrap().shutdown();
    let second = wait_leader(&managers, Duration::from_secs(5));
    assert_ne!(second, first);
    assert!(killed.elapsed() < Duration::from_secs(3), "took {:?}", killed.elapsed());
    assert_eq!(
        conn.call(&MgrRequest::ComputeHeartbeat { session: a }).unwrap(),
        MgrResponse::Ok,
        "the new leader knows the session"
    );
    let b = register(&conn, "b");
    assert_ne!(a.id, b.id);
    // Enough entries for several snapshots (one every 8): the log the old
    // leader missed is purged, so it must catch up from a snapshot.
    for i in 0..30 {
        register(&conn, &format!("c{i}"));
    }
    let st = conn.status().unwrap();
    assert_eq!(st.compute_nodes.len(), 32);
    assert_eq!(
        st.managers
            .iter()
            .filter(|m| m.role == ManagerRole::Unreachable)
            .count(),
        1,
        "{:?}",
        st.managers
    );

    // The old leader comes back as a follower and catches up.
    managers[first] = Some(Manager::start(config(dir.path(), first as u64 + 1, &peers)).unwrap());
    let start = Instant::now();
    while managers[first].as_ref().unwrap().status().compute_nodes.len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the restarted member did not catch up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(leader(&managers), Some(second));
}

const NODES: TableDefinition<u64, &[u8]> = TableDefinition::new("memory_nodes");
const COMPUTES: TableDefinition<u64, &[u8]> = TableDefinition::new("compute_nodes");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The upgrade: what a single manager (schema version 2) left behind is
/// taken over by the group it becomes, once, and its sessions carry on.
#[test]
fn a_single_managers_store_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m1");
    std::fs::create_dir_all(&data).unwrap();
    {
        // As the single manager made it: private to its owner.
        remora_proto::secret::create_private(&data.join("manager.redb")).unwrap();
        let db = Database::create(data.join("manager.redb")).unwrap();
        let w = db.begin_write().unwrap();
        {
            // Memory node 4 at h:9 (draining, no regions) and compute node
            // 5 "app" with secret 0x01.., as the version-2 records encode them.
            let node = format!("03683a39 8080808004 80808020 {} 01 00", "07".repeat(16));
            w.open_table(NODES).unwrap().insert(4, unhex(&node).as_slice()).unwrap();
            let compute = format!("03617070 {} 00", "01".repeat(16));
            w.open_table(COMPUTES)
                .unwrap()
                .insert(5, unhex(&compute).as_slice())
                .unwrap();
            let mut m = w.open_table(META).unwrap();
            m.insert("schema_version", 2).unwrap();
            m.insert("next_node", 4).unwrap();
            m.insert("next_compute", 5).unwrap();
            m.insert("incarnation", 7).unwrap();
        }
        w.commit().unwrap();
    }
    let m = Manager::start(config(dir.path(), 1, &BTreeMap::new())).unwrap();
    let st = m.status();
    assert_eq!(st.memory_nodes.len(), 1);
    assert_eq!(st.memory_nodes[0].addr, "h:9");
    assert_eq!(st.compute_nodes.len(), 1);
    assert_eq!(st.compute_nodes[0].name, "app");
    let conn = ManagerConn::connect(&m.local_addr().to_string(), opts()).unwrap();
    let app = Session {
        id: remora_proto::ComputeId(5),
        secret: Token([1; 16]),
    };
    assert_eq!(
        conn.call(&MgrRequest::ComputeHeartbeat { session: app }).unwrap(),
        MgrResponse::Ok,
        "the old session carries on"
    );
    // Counters carry on too: the next compute node is 6.
    assert_eq!(register(&conn, "next").id, remora_proto::ComputeId(6));
    drop(conn);
    m.shutdown();
    // Restarted: the state is the group's now, and not imported again.
    let m = Manager::start(config(dir.path(), 1, &BTreeMap::new())).unwrap();
    let start = Instant::now();
    while m.status().compute_nodes.len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "state lost across the restart"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(m.status().compute_nodes.len(), 2);
}
