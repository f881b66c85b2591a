//! The `LocalCluster` launcher: it leaves no child behind when dropped, and
//! reports a child that dies on its own while the rest goes on.

use std::process::Command;
use std::time::Duration;

use remora_cluster::ClusterEvent;

use crate::MIB;
use crate::common::*;

/// The launcher leaves no process behind when dropped.
#[test]
fn cluster_drop_kills_every_child() {
    let c = cluster(2, 128 * MIB, 64 * MIB);
    let pids: Vec<u32> = c.memnodes().iter().map(|m| m.pid).collect();
    for p in &pids {
        assert!(std::path::Path::new(&format!("/proc/{p}")).exists());
    }
    drop(c);
    for p in &pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists(),
            "memnode {p} outlived the cluster"
        );
    }
}

/// A memory node that dies on its own is reported, and the cluster goes on.
#[test]
fn unexpected_child_death_is_an_event() {
    let c = cluster(2, 128 * MIB, 64 * MIB);
    let events = c.events().unwrap();
    let pid = c.memnodes()[0].pid;
    let st = Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(st.success());
    match events.recv_timeout(Duration::from_secs(3)) {
        Ok(ClusterEvent::Exited { name, expected, .. }) => {
            assert_eq!(name, "memnode#0");
            assert!(!expected);
        }
        other => panic!("{other:?}"),
    }
    // The rest of the cluster still works.
    let s = session(&c, "after");
    let g = s.alloc(1, false, &[node_id(&c, 1)]).err();
    assert!(g.is_some(), "only node 1 is left and it is excluded");
    let g = s.alloc(1, false, &[]).unwrap().remove(0);
    assert_eq!(g.addr, c.memnodes()[1].addr);
}
