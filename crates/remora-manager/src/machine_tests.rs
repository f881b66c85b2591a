//! The replicated state's rules, command by command.

use super::*;

fn p(cmd: Command) -> Proposal {
    Proposal { at_ms: 1000, cmd }
}

fn tokens(n: usize, seed: u8) -> Vec<Token> {
    (0..n).map(|i| Token([seed.wrapping_add(i as u8); 16])).collect()
}

/// Two memory nodes of 4 regions and one compute node.
fn cluster() -> (Machine, Session) {
    let mut m = Machine::default();
    for (i, addr) in ["a:1", "b:1"].into_iter().enumerate() {
        let o = m
            .apply(p(Command::RegisterNode {
                addr: addr.into(),
                capacity: 4 << 20,
                region_size: 1 << 20,
                admin: Token([i as u8; 16]),
                request: 100 + i as u64,
            }))
            .unwrap();
        assert!(matches!(o, Outcome::NodeRegistered { ref regions, .. } if regions.len() == 4));
    }
    let Outcome::ComputeRegistered(s) = m
        .apply(p(Command::RegisterCompute {
            name: "app".into(),
            secret: Token([9; 16]),
            request: 1,
        }))
        .unwrap()
    else {
        panic!()
    };
    (m, s)
}

fn grant(m: &mut Machine, s: Session, seq: u64, count: u32, seed: u8) -> Answer {
    m.apply(p(Command::Grant {
        session: s,
        seq,
        count,
        distinct: false,
        exclude: vec![],
        tokens: tokens(count as usize, seed),
    }))
}

#[test]
fn a_retried_registration_is_applied_once() {
    let (mut m, s) = cluster();
    // A compute node's registration again (its answer was lost), with the
    // new leader's fresh secret: the first session, no second one.
    let again = m
        .apply(p(Command::RegisterCompute {
            name: "app".into(),
            secret: Token([77; 16]),
            request: 1,
        }))
        .unwrap();
    assert_eq!(again, Outcome::ComputeRegistered(s));
    assert_eq!(m.computes.len(), 1);
    // A memory node's: the same node and regions, and the node is not
    // taken for a restart of itself (which would declare it dead).
    let node = |request| Command::RegisterNode {
        addr: "c:1".into(),
        capacity: 2 << 20,
        region_size: 1 << 20,
        admin: Token([5; 16]),
        request,
    };
    let first = m.apply(p(node(7))).unwrap();
    assert_eq!(m.apply(p(node(7))).unwrap(), first);
    let Outcome::NodeRegistered { node: id, .. } = first else {
        panic!()
    };
    assert_eq!(m.nodes[&id].state, NodeState::Alive);
    assert_eq!(m.nodes.len(), 3);
    // A new request number at the same address is a restart.
    let Outcome::NodeRegistered { node: restarted, .. } = m.apply(p(node(8))).unwrap() else {
        panic!()
    };
    assert_ne!(restarted, id);
    assert_eq!(m.nodes[&id].state, NodeState::Dead);
    // Only the latest registrations are remembered.
    for r in 0..REGISTRATIONS_KEPT as u64 + 10 {
        m.apply(p(Command::RegisterCompute {
            name: "many".into(),
            secret: Token([1; 16]),
            request: 1000 + r,
        }))
        .unwrap();
    }
    assert_eq!(m.registrations.len(), REGISTRATIONS_KEPT);
    assert_eq!(m.registration_order.len(), REGISTRATIONS_KEPT);
    assert!(!m.registrations.contains_key(&1));
}

#[test]
fn a_retried_grant_is_applied_once() {
    let (mut m, s) = cluster();
    let first = grant(&mut m, s, 1, 3, 10).unwrap();
    // The same request number again, as after a change of leader (with the
    // new leader's fresh tokens): the first answer, nothing more granted.
    let again = grant(&mut m, s, 1, 3, 50).unwrap();
    assert_eq!(first, again);
    let owned = m.regions.values().filter(|r| r.owner.is_some()).count();
    assert_eq!(owned, 3);
    let Outcome::Granted(g) = first else { panic!() };
    for x in &g {
        assert_eq!(m.regions[&x.region].epoch, 1);
        assert_eq!(m.regions[&x.region].owner, Some((s.id, x.token)));
    }
    // A new request number is a new grant.
    grant(&mut m, s, 2, 2, 20).unwrap();
    assert_eq!(m.regions.values().filter(|r| r.owner.is_some()).count(), 5);
}

#[test]
fn a_region_is_never_granted_twice_and_epochs_only_grow() {
    let (mut m, s) = cluster();
    let Outcome::Granted(g) = grant(&mut m, s, 1, 8, 0).unwrap() else {
        panic!()
    };
    let mut regions: Vec<RegionId> = g.iter().map(|x| x.region).collect();
    regions.sort();
    regions.dedup();
    assert_eq!(regions.len(), 8, "eight distinct regions");
    assert!(matches!(
        grant(&mut m, s, 2, 1, 0),
        Err(RemoteError::NoCapacity {
            wanted: 1,
            available: 0
        })
    ));
    // Free one: revoked at a new epoch, not handed out until released.
    let r = g[0].region;
    let Outcome::Freeing { epoch, .. } = m
        .apply(p(Command::Free {
            session: s,
            seq: 3,
            region: r,
        }))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(epoch, 2);
    assert!(
        grant(&mut m, s, 4, 1, 0).is_err(),
        "a region being revoked was handed out"
    );
    // A release naming an older epoch changes nothing.
    m.apply(p(Command::Released { regions: vec![(r, 1)] })).unwrap();
    assert!(m.regions[&r].freeing);
    m.apply(p(Command::Released { regions: vec![(r, 2)] })).unwrap();
    let Outcome::Granted(again) = grant(&mut m, s, 5, 1, 7).unwrap() else {
        panic!()
    };
    assert_eq!(again[0].region, r);
    assert_eq!(again[0].epoch, 3);
}

#[test]
fn an_ungranted_request_may_be_applied_again() {
    let (mut m, s) = cluster();
    let Outcome::Granted(g) = grant(&mut m, s, 1, 2, 0).unwrap() else {
        panic!()
    };
    m.apply(p(Command::Ungrant {
        session: s,
        seq: 1,
        regions: g.iter().map(|x| (x.region, x.token)).collect(),
    }))
    .unwrap();
    assert!(m.regions.values().all(|r| r.owner.is_none()));
    let Outcome::Granted(g2) = grant(&mut m, s, 1, 2, 40).unwrap() else {
        panic!()
    };
    assert_ne!(g2[0].token, g[0].token, "applied afresh");
    // Epochs moved on: the undelivered grant's epoch is never reused.
    assert!(g2.iter().all(|x| x.epoch >= 1));
    for x in &g2 {
        if let Some(old) = g.iter().find(|o| o.region == x.region) {
            assert!(x.epoch > old.epoch);
        }
    }
}

#[test]
fn a_dead_node_takes_its_regions_and_tells_their_owners_once() {
    let (mut m, s) = cluster();
    let Outcome::Granted(g) = grant(&mut m, s, 1, 8, 0).unwrap() else {
        panic!()
    };
    let node = g[0].node;
    for _ in 0..2 {
        m.apply(p(Command::NodeGone { node, why: Gone::Dead })).unwrap();
    }
    assert_eq!(m.nodes[&node].state, NodeState::Dead);
    let events = &m.computes[&s.id].events;
    assert_eq!(events.len(), 1, "declared dead once");
    let EventKind::NodeDead { regions, .. } = &events[0].kind else {
        panic!()
    };
    assert_eq!(regions.len(), 4);
    for r in regions {
        assert_eq!(m.regions[r].owner, None);
        assert_eq!(m.regions[r].epoch, 2);
    }
}

#[test]
fn a_dead_compute_node_loses_its_regions_through_a_revoke() {
    let (mut m, s) = cluster();
    grant(&mut m, s, 1, 3, 0).unwrap();
    m.apply(p(Command::ComputeDead { compute: s.id })).unwrap();
    assert!(matches!(m.check_session(&s), Err(RemoteError::Unknown)));
    let freeing = m.freeing();
    assert_eq!(freeing.len(), 3);
    assert!(freeing.iter().all(|f| f.2 == 2 && f.3));
    m.apply(p(Command::Released {
        regions: freeing.iter().map(|f| (f.0, f.2)).collect(),
    }))
    .unwrap();
    assert!(m.regions.values().all(|r| r.owner.is_none() && !r.freeing));
}

#[test]
fn apply_is_deterministic() {
    // The same commands from the same state give the same state, whatever
    // the clock of the machine applying them.
    let script = |m: &mut Machine, s: Session| {
        grant(m, s, 1, 3, 1).unwrap();
        m.apply(p(Command::Drain { addr: "a:1".into() })).unwrap();
        grant(m, s, 2, 2, 2).unwrap();
        m.apply(p(Command::Free {
            session: s,
            seq: 3,
            region: RegionId(1),
        }))
        .ok();
    };
    let (mut a, s) = cluster();
    let (mut b, _) = cluster();
    script(&mut a, s);
    std::thread::sleep(std::time::Duration::from_millis(5));
    script(&mut b, s);
    assert_eq!(a, b);
    assert_eq!(postcard::to_allocvec(&a).unwrap(), postcard::to_allocvec(&b).unwrap());
}

#[test]
fn import_applies_only_to_a_pristine_state() {
    let (mut old, _) = cluster();
    old.imported = true;
    let mut m = Machine::default();
    m.apply(p(Command::Import(Box::new(old.clone())))).unwrap();
    assert_eq!(m.nodes, old.nodes);
    let mut other = old.clone();
    other.nodes.clear();
    m.apply(p(Command::Import(Box::new(other)))).unwrap();
    assert_eq!(m.nodes, old.nodes, "a second import changed the state");
    let (mut used, _) = cluster();
    let before = used.clone();
    used.apply(p(Command::Import(Box::default()))).unwrap();
    assert_eq!(used.nodes, before.nodes);
}

#[test]
fn a_wrong_secret_or_a_foreign_region_is_refused() {
    let (mut m, s) = cluster();
    let Outcome::Granted(g) = grant(&mut m, s, 1, 1, 0).unwrap() else {
        panic!()
    };
    let thief = Session {
        id: s.id,
        secret: Token([1; 16]),
    };
    assert!(matches!(grant(&mut m, thief, 2, 1, 0), Err(RemoteError::Unauthorized)));
    let Outcome::ComputeRegistered(other) = m
        .apply(p(Command::RegisterCompute {
            name: "other".into(),
            secret: Token([3; 16]),
            request: 2,
        }))
        .unwrap()
    else {
        panic!()
    };
    assert!(matches!(
        m.apply(p(Command::Free {
            session: other,
            seq: 1,
            region: g[0].region
        })),
        Err(RemoteError::BadCapability { .. })
    ));
    assert_eq!(m.regions[&g[0].region].owner, Some((s.id, g[0].token)));
}
